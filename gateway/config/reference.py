"""The configuration reference page of the docs site (Markdown), made from the same key tables
as the JSON Schema (keys.py, read off the model's fields), so the two cannot disagree.

The docs build calls `markdown()` (docs/hooks.py); nothing on the gateway's own paths imports
this module.
"""

from __future__ import annotations

from collections import deque

from gateway.config.key import Key
from gateway.config.keys import ENTRIES, ONE_OF, SECTIONS

# Where each kind of nested key leads, as the file spells it under its parent.
_NESTED = frozenset({"section", "sections", "section_list", "switch", "roots"})


def _child(parent: str, name: str, key: Key) -> tuple[str, str] | None:
    """The section a nested key holds, and its path in the file."""
    base = f"{parent}.{name}" if parent else name
    if key.kind in ("section", "switch"):
        return (key.section or "", base)
    if key.kind == "sections":
        return (key.section or "", f"{base}.NAME")
    if key.kind == "section_list":
        return (key.section or "", f"{base}[]")
    if key.kind == "roots":
        return ("root", f"{base}[]")
    return None


def paths() -> dict[str, list[str]]:
    """Each section and the places in the file it is found, breadth first from the top."""
    found: dict[str, list[str]] = {"config": [""]}
    queue: deque[tuple[str, str]] = deque([("config", "")])
    while queue:
        section, at = queue.popleft()
        children = [
            c
            for name, k in SECTIONS[section].items()
            if k.kind in _NESTED and (c := _child(at, name, k)) is not None
        ]
        if section in ENTRIES:
            children.append((ENTRIES[section], f"{at}.TOOL"))
        for child, where in children:
            seen = found.setdefault(child, [])
            if where not in seen:
                seen.append(where)
                if len(seen) == 1:  # a section shared by several keys is walked once
                    queue.append((child, where))
    return found


def escape(text: str) -> str:
    """Markdown's emphasis and HTML characters escaped outside `code`, which stays as written."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):
        parts[i] = (
            parts[i].replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")
        ).replace("_", "\\_")
    return "`".join(parts)


def anchor(section: str) -> str:
    return f"section-{section.replace('_', '-')}"


def _kind(key: Key) -> str:
    if key.kind == "string":
        if key.choices:
            return "one of " + ", ".join(f"`{c}`" for c in key.choices)
        return "string" if key.pattern is None else f"string matching `{key.pattern}`"
    if key.kind == "number":
        low = "> 0" if key.minimum is None else f">= {key.minimum:g}"
        high = "" if key.maximum is None else f", <= {key.maximum:g}"
        return f"number {low}{high}"
    if key.kind == "count":
        high = "" if key.maximum is None else f", <= {key.maximum:g}"
        return f"whole number >= {int(key.minimum or 0)}{high}"
    if key.kind == "port":
        return "port (0-65535)"
    if key.kind == "boolean":
        return "true or false"
    if key.kind == "strings":
        return "list of strings"
    if key.kind == "string_map":
        return "mapping of names to strings"
    target = f"[`{key.section}`](#{anchor(key.section or '')})"
    if key.kind == "section":
        return f"section {target}"
    if key.kind == "sections":
        return f"names, each a {target}"
    if key.kind == "section_list":
        return f"list of {target}"
    if key.kind == "switch":
        return f"true, false, or a {target}"
    return "list of `file://` URIs or [`root`](#section-root) sections"


def _line(name: str, key: Key) -> str:
    facts = [_kind(key)]
    if key.required:
        facts.append("required")
    if key.default is not None:
        shown = key.default
        if isinstance(shown, bool):
            shown = str(shown).lower()
        elif isinstance(shown, float) and shown.is_integer():
            shown = int(shown)  # 300, not 300.0
        facts.append(f"default `{shown}`")
    return f"- **`{name}`** ({'; '.join(facts)}): {escape(key.doc)}"


def _title(where: str) -> str:
    return "Top level" if where == "" else f"`{where}`"


def markdown() -> str:
    """The whole page."""
    out = [
        "# Configuration reference",
        "",
        "Every key of the config file, section by section. This page is generated when the site",
        "is built, from the key declarations the loader and the JSON Schema are made from",
        "(`gateway/config/key.py`, `keys.py`; `mcp-transparent-gateway schema` prints the same",
        "as a schema), so it cannot fall behind the code. A key set to `null` counts as left out;",
        "any string may hold `${VAR}` or `${VAR:-default}`. Rules across keys (exactly one",
        "transport, `per_session` for stdio only, ...) are checked by",
        "`mcp-transparent-gateway check-config`. What the keys do, with examples, is in",
        "[Configuration](../configuration.md) and the pages it links to.",
        "",
    ]
    for section, places in paths().items():
        out.append(f"## {_title(places[0])} {{#{anchor(section)}}}")
        out.append("")
        also = ", ".join(_title(p) for p in places[1:])
        note = f"Section `{section}`" + (f"; also at {also}." if also else ".")
        exclusive = ONE_OF.get(section)
        if exclusive:
            note += " Exactly one of " + ", ".join(f"`{k}`" for k in exclusive) + "."
        if section in ENTRIES:
            note += f" Any other key names a tool and holds a [`{ENTRIES[section]}`]"
            note += f"(#{anchor(ENTRIES[section])}) section."
        out += [note, ""]
        out += [_line(name, k) for name, k in SECTIONS[section].items()]
        out.append("")
    return "\n".join(out)
