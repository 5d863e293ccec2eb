"""What a policy rule may ask of a tool beyond its name (pure): its annotations, read as the spec
reads them, and conditions on a call's arguments at JSON pointers (RFC 6901).

Annotations become four bits (server/tools, Tool annotations): a hint the server leaves out, or
gives as anything but a boolean, takes the spec's default (readOnlyHint false, destructiveHint
true, idempotentHint false, openWorldHint true); and since destructiveHint and idempotentHint
mean something only when readOnlyHint is false, a read-only tool is taken as not destructive
and idempotent, whatever it says of them. `UNKNOWN`: a tool no catalog describes.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any, Final

from gateway.config.access import PolicyAnnotations, PolicyArgument

READ_ONLY: Final = 1
DESTRUCTIVE: Final = 2
IDEMPOTENT: Final = 4
OPEN_WORLD: Final = 8
UNKNOWN: Final = -1  # no definition to read them from
# The bit of each PolicyAnnotations field.
_BITS: Final = {
    "read_only": READ_ONLY,
    "destructive": DESTRUCTIVE,
    "idempotent": IDEMPOTENT,
    "open_world": OPEN_WORLD,
}


def _hint(annotations: Mapping[str, Any], name: str, default: bool) -> bool:
    value = annotations.get(name)
    return value if isinstance(value, bool) else default


def hints(tool: Mapping[str, Any] | None) -> int:
    """A tool definition's effective hints as bits (UNKNOWN: no definition)."""
    if tool is None:
        return UNKNOWN
    found = tool.get("annotations")
    given: Mapping[str, Any] = found if isinstance(found, dict) else {}
    bits = OPEN_WORLD if _hint(given, "openWorldHint", True) else 0
    if _hint(given, "readOnlyHint", False):
        return bits | READ_ONLY | IDEMPOTENT
    if _hint(given, "destructiveHint", True):
        bits |= DESTRUCTIVE
    if _hint(given, "idempotentHint", False):
        bits |= IDEMPOTENT
    return bits


def hint_mask(wanted: PolicyAnnotations) -> tuple[int, int]:
    """A rule's `annotations` as (the bits it looks at, the values it wants them to have)."""
    mask = want = 0
    for field, bit in _BITS.items():
        value = getattr(wanted, field)
        if value is not None:
            mask |= bit
            want |= bit if value else 0
    return mask, want


# A pointer target that is not there (a missing member, an index out of range, a step into a
# scalar): no condition holds of it.
_ABSENT: Final = object()
_INDEX = re.compile(r"0|[1-9][0-9]*")


def tokens(pointer: str) -> tuple[str, ...]:
    """A JSON pointer's reference tokens, unescaped (RFC 6901, section 4: ~1 before ~0)."""
    if pointer == "":
        return ()
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def resolve(document: object, path: tuple[str, ...]) -> object:
    """The value a pointer's tokens reach in a JSON document, or _ABSENT."""
    for token in path:
        if isinstance(document, dict):
            if token not in document:
                return _ABSENT
            document = document[token]
        elif isinstance(document, list):
            if _INDEX.fullmatch(token) is None or int(token) >= len(document):
                return _ABSENT
            document = document[int(token)]
        else:
            return _ABSENT
    return document


def same_json(value: object, wanted: str | int | float | bool) -> bool:
    """JSON equality of a scalar: of the same JSON type (true is not 1, "1" is not 1), numbers
    by value (1 is 1.0)."""
    if isinstance(wanted, bool) or isinstance(value, bool):
        return type(value) is type(wanted) and value == wanted
    if isinstance(wanted, str):
        return isinstance(value, str) and value == wanted
    return isinstance(value, int | float) and value == wanted


class Condition:
    """One `arguments:` entry, compiled."""

    __slots__ = ("equals", "glob", "path")

    def __init__(self, pointer: str, condition: PolicyArgument) -> None:
        self.path = tokens(pointer)
        self.equals = condition.equals
        self.glob = (
            None if condition.glob is None else re.compile(fnmatch.translate(condition.glob))
        )

    def holds(self, arguments: object) -> bool:
        value = resolve(arguments, self.path)
        if value is _ABSENT:
            return False
        if self.glob is not None:
            return isinstance(value, str) and self.glob.match(value) is not None
        return self.equals is not None and same_json(value, self.equals)
