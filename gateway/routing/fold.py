"""How a lenient server may read a name (pure): what the gateway checks a name it does not find
in a catalog against before forwarding it on a guess (docs/security/policy.md; THREAT_MODEL.md).

Hand-written servers often match names leniently: ignoring case, width and compatibility forms
(NFKC), invisible characters (zero-width space, soft hyphen, ...) and surrounding spaces. A name
the gateway does not know may then run a tool the config filters out, renames away or the policy
denies. `fold` maps a name to the form such a server compares; two names with the same fold are
one name to it. Run only when a name misses the catalog, never on a known name's path.
"""

from __future__ import annotations

import fnmatch
import re
import unicodedata
from collections.abc import Iterable

# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt): characters that render as
# nothing and that lenient matching drops. The property is stable; `unicodedata` lacks it.
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)


def fold(name: str) -> str:
    """The name as a lenient server compares it: ignorables removed, NFKC, case-folded (NFKC
    again: case folding can leave a string not in NFKC), surrounding whitespace trimmed."""
    plain = unicodedata.normalize("NFKC", _IGNORABLE.sub("", name))
    folded = unicodedata.normalize("NFKC", plain.casefold())
    return _IGNORABLE.sub("", folded).strip()


def folded_pattern(globs: Iterable[str]) -> re.Pattern[str] | None:
    """One regex matching the folds of the names the globs match (None: no globs), so a rule or
    filter written for `Secret_*` catches its fullwidth or upper-case spelling too."""
    parts = [fnmatch.translate(fold(g)) for g in globs]
    return re.compile("|".join(parts)) if parts else None
