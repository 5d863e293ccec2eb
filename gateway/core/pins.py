"""Tool-definition pinning, the pure part (docs/trusting-tools/pinning.md): what a definition's
digest covers, the pin file's format, what a definition that differs from its pin gets, and
what changed between the two.

A digest is SHA-256 over a definition's canonical JSON (keys sorted at every level, no
whitespace), so key order and formatting never count as a change; it covers what a model or a
user is shown of the item and what decides how it is called (`COVERED`), not `_meta`, icons or
other fields a server may vary without changing what the tool does. The pin file keeps each
pinned definition beside its digest: `pins diff` shows what changed, and a reviewer reads the
file's own history in version control.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import jsonrpc

# The lists pinned (LIST_KEYS' keys), each item's identifying field, and the fields a digest
# covers. Resources are not pinned: they are data, and change as data does.
NAME_FIELD: Mapping[str, str] = {
    "tools": "name",
    "prompts": "name",
    "resourceTemplates": "uriTemplate",
}
COVERED: Mapping[str, tuple[str, ...]] = {
    "tools": ("name", "title", "description", "inputSchema", "outputSchema", "annotations"),
    "prompts": ("name", "title", "description", "arguments"),
    "resourceTemplates": ("uriTemplate", "name", "title", "description", "mimeType"),
}
KINDS = tuple(NAME_FIELD)
# How the pin file says which version of this format it is.
FORMAT = 1

BLOCK, WARN, ALLOW = "block", "warn", "allow"
# A definition's standing against the pins: the same as its pin, different, or not pinned.
PINNED, CHANGED, NEW = "pinned", "changed", "new"
# The metric's outcomes (`mcp_gateway_pin_changes_total`): what a change got, and approvals.
OUTCOMES = {BLOCK: "blocked", WARN: "warned", ALLOW: "allowed"}
APPROVED = "approved"


class PinFileInvalid(ValueError):
    """The pin file is not one this gateway wrote (its text names where)."""


@dataclass(frozen=True)
class Pin:
    digest: str
    definition: Mapping[str, Any]


# One backend's pins: by kind (KINDS), then by name (a template's uriTemplate).
BackendPins = Mapping[str, Mapping[str, Pin]]
# The pin file: by backend.
PinSet = Mapping[str, BackendPins]


def definition(kind: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """What of an item its digest covers (absent fields stay absent)."""
    return {k: item[k] for k in COVERED[kind] if k in item}


def canonical(value: Any) -> bytes:
    """JSON with keys sorted at every level and no whitespace."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        # (a lone surrogate orjson will not write: the lenient encoder, over sorted keys)
        return jsonrpc.dumps(_sorted(value))


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def digest_of(covered: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(canonical(covered)).hexdigest()


def pin(kind: str, item: Mapping[str, Any]) -> Pin:
    covered = definition(kind, item)
    return Pin(digest_of(covered), covered)


def name_of(kind: str, item: Mapping[str, Any]) -> str | None:
    name = item.get(NAME_FIELD[kind])
    return name if isinstance(name, str) else None


def current(lists: Mapping[str, Iterable[Mapping[str, Any]]]) -> dict[str, dict[str, Pin]]:
    """A backend's definitions as it lists them now (lists by KINDS' keys), as pins."""
    out: dict[str, dict[str, Pin]] = {}
    for kind in KINDS:
        for item in lists.get(kind, ()):
            name = name_of(kind, item)
            if name is not None:
                out.setdefault(kind, {})[name] = pin(kind, item)
    return out


def standing(pins: BackendPins | None, kind: str, name: str, digest: str) -> str:
    """PINNED, CHANGED or NEW."""
    found = (pins or {}).get(kind, {}).get(name)
    if found is None:
        return NEW
    return PINNED if found.digest == digest else CHANGED


def serves(mode: str, status: str) -> bool:
    """Whether a definition of this standing is shown and callable under `mode`."""
    return status == PINNED or mode != BLOCK


# --- the pin file -----------------------------------------------------------------------------


def parse(data: bytes, source: str = "pin file") -> dict[str, dict[str, dict[str, Pin]]]:
    """A pin file's pins; raises PinFileInvalid for anything else. A digest is checked against
    its definition: a hand-edited definition must not pass for the one approved."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise PinFileInvalid(f"{source}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != FORMAT:
        raise PinFileInvalid(f"{source}: not a pin file (version {FORMAT})")
    backends = doc.get("backends", {})
    if not isinstance(backends, dict):
        raise PinFileInvalid(f"{source}: backends must be a mapping")
    out: dict[str, dict[str, dict[str, Pin]]] = {}
    for backend, kinds in backends.items():
        if not isinstance(kinds, dict):
            raise PinFileInvalid(f"{source}: backends.{backend} must be a mapping")
        for kind, items in kinds.items():
            if kind not in NAME_FIELD or not isinstance(items, dict):
                raise PinFileInvalid(f"{source}: backends.{backend}.{kind} is not a pinned list")
            for name, entry in items.items():
                where = f"{source}: backends.{backend}.{kind}.{name}"
                covered = entry.get("definition") if isinstance(entry, dict) else None
                if not isinstance(covered, dict):
                    raise PinFileInvalid(f"{where}: needs a definition")
                found = digest_of(covered)
                if entry.get("digest") != found:
                    raise PinFileInvalid(f"{where}: its digest is not its definition's")
                out.setdefault(backend, {}).setdefault(kind, {})[name] = Pin(found, covered)
    return out


def dump(pins: PinSet) -> bytes:
    """The pin file's text: sorted and indented, so that a change is a readable diff."""
    doc = {
        "version": FORMAT,
        "backends": {
            backend: {
                kind: {
                    name: {"digest": p.digest, "definition": p.definition}
                    for name, p in items.items()
                }
                for kind, items in kinds.items()
                if items
            }
            for backend, kinds in pins.items()
        },
    }
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def approve(
    pins: PinSet, backend: str, now: BackendPins, only: str | None = None
) -> dict[str, dict[str, dict[str, Pin]]]:
    """The pins with `backend`'s current definitions (`now`) accepted: all of them (what it no
    longer lists is dropped), or only the item named `only` (of any kind)."""
    out = {b: {k: dict(items) for k, items in kinds.items()} for b, kinds in pins.items()}
    if only is None:
        out[backend] = {kind: dict(items) for kind, items in now.items()}
        return out
    mine = out.setdefault(backend, {})
    for kind, items in now.items():
        if only in items:
            mine.setdefault(kind, {})[only] = items[only]
    return out


# --- what changed -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    kind: str
    name: str
    status: str  # CHANGED, NEW, or "removed"
    lines: tuple[str, ...] = ()  # what changed, for a reader


REMOVED = "removed"


def changes(pinned: BackendPins | None, now: BackendPins) -> list[Change]:
    """What differs between a backend's pins and its definitions now, item by item."""
    out: list[Change] = []
    pinned = pinned or {}
    for kind in KINDS:
        old, new = pinned.get(kind, {}), now.get(kind, {})
        for name in sorted(old.keys() | new.keys()):
            before, after = old.get(name), new.get(name)
            if after is None:
                out.append(Change(kind, name, REMOVED))
            elif before is None:
                out.append(Change(kind, name, NEW, describe_new(after.definition)))
            elif before.digest != after.digest:
                lines = explain(before.definition, after.definition)
                out.append(Change(kind, name, CHANGED, tuple(lines)))
    return out


def describe_new(covered: Mapping[str, Any]) -> tuple[str, ...]:
    text = covered.get("description")
    return tuple(f"+ {line}" for line in str(text).splitlines()) if text else ()


def explain(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """A definition's changes: its description as a unified diff, every other field by the
    JSON pointer of what was added, removed or changed."""
    lines: list[str] = []
    old_text, new_text = before.get("description"), after.get("description")
    if old_text != new_text:
        import difflib  # (only `pins diff` and a change's log line: not every gateway's start)

        lines.extend(
            difflib.unified_diff(
                str(old_text or "").splitlines(),
                str(new_text or "").splitlines(),
                "description (pinned)",
                "description (now)",
                lineterm="",
            )
        )
    rest_before = {k: v for k, v in before.items() if k != "description"}
    rest_after = {k: v for k, v in after.items() if k != "description"}
    lines.extend(_fields(rest_before, rest_after, ""))
    return lines


def _fields(before: Any, after: Any, at: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for k in sorted(before.keys() | after.keys()):
            where = f"{at}/{_escape(k)}"
            if k not in after:
                out.append(f"removed {where}")
            elif k not in before:
                out.append(f"added {where}: {_short(after[k])}")
            else:
                out.extend(_fields(before[k], after[k], where))
        return out
    if canonical(before) == canonical(after):
        return []
    return [f"changed {at or '/'}: {_short(before)} -> {_short(after)}"]


def _escape(k: str) -> str:
    return k.replace("~", "~0").replace("/", "~1")


def _short(value: Any, limit: int = 120) -> str:
    text = canonical(value).decode(errors="replace")
    return text if len(text) <= limit else text[: limit - 3] + "..."
