"""What counts as a secret or personal data in a text: one table of value patterns, and the
walk that applies it to a message's strings, shared by the `redact` hook (gateway/hooks/
redact.py) and the traffic tap (`tap.redact_secrets`, telemetry/tap.py), whose marker for a
redacted value (telemetry/records.py `REDACTED`) is this module's too. Pure: stdlib `re` only.

The patterns look for the shape of a credential (a cloud key's prefix, a token's alphabet and
length, a PEM block) or of personal data (an e-mail address, a card number that passes the Luhn
check). A shape is all they see: a secret with no recognisable shape (a plain password, a
key without prefix) passes, and a string that merely has the shape is redacted too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Final

# What a recording or a redacted text shows instead of a value.
REDACTED: Final = "[redacted]"

# kind -> pattern. The kind names the counters and audit lines (never the value). Word
# boundaries keep a key's prefix inside a longer word from matching.
PATTERNS: Final[Mapping[str, str]] = {
    "private_key": (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"[\s\S]{0,16384}?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
    ),
    # AWS access key ids: long-term (AKIA), temporary (ASIA) and the other documented prefixes.
    "aws_access_key": r"\b(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
    "aws_secret_key": r"(?i:aws_secret_access_key|aws_secret_key)\s*[:=]\s*[\"']?[A-Za-z0-9/+]{40}",
    "github_token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b",
    "slack_token": r"\bxox[abposre]-[A-Za-z0-9-]{10,255}",
    "openai_key": r"\bsk-(?:proj-|ant-(?:api\d\d-)?|svcacct-)?[A-Za-z0-9_-]{20,255}",
    "google_api_key": r"\bAIza[0-9A-Za-z_-]{35}\b",
    "jwt": r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "bearer_token": r"(?i:\bbearer)\s+[A-Za-z0-9._~+/-]{16,}=*",
    "email": (
        r"\b[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+"
        r"[A-Za-z]{2,63}\b"
    ),
    # 13 to 19 digits, maybe grouped by spaces or dashes; kept only if the Luhn check passes.
    "card_number": r"\b\d(?:[ -]?\d){12,18}\b",
}
KINDS: Final = tuple(PATTERNS)
# No kind matches fewer characters (an e-mail address, `a@b.cd`): shorter strings (a block's
# `type`, a role) are not looked at, unless the config adds patterns of its own.
SHORTEST: Final = 6
# Kinds a match must also pass a check for (the pattern alone matches too much).
_CHECKED: Final = frozenset({"card_number"})


# What a text must hold for a kind's pattern to be worth running: a literal (any one found, a
# C-speed `in`), or a check as quick. A pattern starting with a word boundary or a character
# class is tried at every position of the text (~20 us a KB each); the guards make a text with
# none of them cost a few microseconds a KB (bench/redact_cost.py).
_AWS: Final = re.compile(r"A[A-Z]{2}A")


def _any(*literals: str, within: str = "") -> Callable[[str], bool]:
    """Any of `literals` in a text; `within`: a character each holds, looked for first (one
    character is a memchr, ~20 times faster than a search for two or more). Spelt out by
    count: a generator per text costs more than the searches."""
    if len(literals) == 1:
        (one,) = literals
        found: Callable[[str], bool] = lambda text: one in text  # noqa: E731
    else:
        first, second = literals
        found = lambda text: first in text or second in text  # noqa: E731
    if within:
        return lambda text: within in text and found(text)
    return found


_NO_DIGITS = bytes(range(48, 58))


def _digits(text: str) -> bool:
    """At least 13 digits (a card number's fewest), counted by deleting them from the text's
    bytes (one C loop), no regex scan."""
    data = text.encode("utf-8", "surrogatepass")
    return len(data) - len(data.translate(None, _NO_DIGITS)) >= 13


_GUARDS: Final[Mapping[str, Callable[[str], bool]]] = {
    "private_key": _any("PRIVATE KEY"),
    # Every prefix of the pattern has the shape A??A; a literal-led regex skips along the text.
    "aws_access_key": lambda text: _AWS.search(text) is not None,
    "aws_secret_key": _any("ecret_", "ECRET_", within="_"),
    "github_token": _any("gh", "github_pat_", within="_"),
    "slack_token": _any("xox", within="-"),
    "openai_key": _any("sk-", within="-"),
    "google_api_key": _any("AIza"),
    "jwt": _any("eyJ"),
    "bearer_token": _any("earer", "EARER"),
    "email": _any("@"),
    "card_number": _digits,
}


def luhn(digits: str) -> bool:
    """The Luhn checksum of a card number (ISO/IEC 7812), separators ignored."""
    total = 0
    for i, ch in enumerate(reversed([d for d in digits if d.isdigit()])):
        n = ord(ch) - 48
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


class Scanner:
    """The patterns of `kinds` (and `extra`, kind -> pattern, always run), each behind its
    guard, in the table's order (a PEM block first: its body could look like other tokens)."""

    def __init__(self, kinds: tuple[str, ...] = KINDS, extra: Mapping[str, str] = {}) -> None:
        self._steps: list[tuple[str, Callable[[str], bool] | None, re.Pattern[str]]]
        self._steps = [(k, _GUARDS.get(k), re.compile(PATTERNS[k])) for k in KINDS if k in kinds]
        self._steps += [(k, None, re.compile(p)) for k, p in extra.items()]
        self.kinds = tuple(k for k, _, _ in self._steps)
        self._shortest = 0 if extra else SHORTEST  # (the config's may match anything)

    def redact(self, text: str, counts: Counter[str]) -> str:
        """`text` with each match replaced by `[redacted:KIND]`, counted in `counts` (which
        tell whether anything was)."""
        if len(text) < self._shortest:
            return text
        for kind, guard, regex in self._steps:
            if guard is not None and not guard(text):
                continue
            text = regex.sub(_Swap(kind, counts), text)
        return text


class _Swap:
    """One kind's replacement: counted, and checked where the kind needs it."""

    __slots__ = ("checked", "counts", "kind", "marker")

    def __init__(self, kind: str, counts: Counter[str]) -> None:
        self.kind = kind
        self.counts = counts
        self.checked = kind in _CHECKED
        self.marker = f"[redacted:{kind}]"

    def __call__(self, m: re.Match[str]) -> str:
        if self.checked and not luhn(m.group(0)):
            return m.group(0)
        self.counts[self.kind] += 1
        return self.marker


# Members never scanned: metadata; and in a block with a `mimeType`, its base64 payload (an
# image's or audio's `data`, a resource's `blob`), which no text pattern belongs in.
_META = "_meta"
_PAYLOADS = frozenset({"blob", "data"})


def redact_values(value: Any, scanner: Scanner, counts: Counter[str]) -> Any:
    """`value` (a message, a result: what orjson produced) with its strings redacted, counted
    by kind in `counts`; copies only the containers it changes, the same object if none."""
    if isinstance(value, str):
        before = counts.total()
        out = scanner.redact(value, counts)
        return out if counts.total() != before else value
    if isinstance(value, dict):
        changed: dict[str, Any] | None = None
        payload = "mimeType" in value
        for key, item in value.items():
            if key == _META or (payload and key in _PAYLOADS):
                continue
            new = redact_values(item, scanner, counts)
            if new is not item:
                changed = dict(value) if changed is None else changed
                changed[key] = new
        return value if changed is None else changed
    if isinstance(value, list):
        copied: list[Any] | None = None
        for i, item in enumerate(value):
            new = redact_values(item, scanner, counts)
            if new is not item:
                copied = list(value) if copied is None else copied
                copied[i] = new
        return value if copied is None else copied
    return value
