"""The config's JSON Schema (Draft 2020-12), made from the loader's own key tables (keys.py,
derived from the model's fields).

`mcp-transparent-gateway schema` prints it; gateway/config/schema.json is the same text shipped in
the package (`make schema` writes it; a test fails when the two differ). `${VAR}` is substituted in
string values only, and the loader reads a substituted value as a string, so a number or
boolean key takes no `${VAR}`: the schema says the same. A string key with a pattern or a fixed
set of values also accepts any string holding a `${VAR}`, whose value is only known at load
time. A key set to null is read as left out, so every key may be null.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import orjson

from gateway.config.key import Key
from gateway.config.keys import ENTRIES, ONE_OF, SECTIONS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# What the loader substitutes (model._ENV_REF), found anywhere in a string.
_ENV_PATTERN = r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}"
_SCALAR = {"type": ["string", "number", "integer", "boolean"]}


def _string(key: Key) -> dict[str, Any]:
    if key.choices:
        exact: dict[str, Any] = {"enum": list(key.choices)}
    elif key.pattern is not None:
        exact = {"type": "string", "pattern": key.pattern}
    else:
        return {"type": "string"}
    return {"anyOf": [exact, {"type": "string", "pattern": _ENV_PATTERN}]}


def _ref(section: str | None) -> dict[str, Any]:
    return {"$ref": f"#/$defs/{section}"}


def _key(key: Key) -> dict[str, Any]:
    out: dict[str, Any]
    if key.kind == "string":
        out = _string(key)
    elif key.kind == "number":
        out = {"type": "number"}
        if key.minimum is None:
            out["exclusiveMinimum"] = 0
        else:
            out["minimum"] = key.minimum
    elif key.kind == "count":
        out = {"type": "integer", "minimum": int(key.minimum or 0)}
    elif key.kind == "port":
        out = {"type": "integer", "minimum": 0, "maximum": 65535}
    elif key.kind == "boolean":
        out = {"type": "boolean"}
    elif key.kind == "strings":
        out = {"type": "array", "items": {"type": ["string", "number", "boolean"]}}
    elif key.kind == "string_map":
        out = {"type": "object", "additionalProperties": _SCALAR}
    elif key.kind == "section":
        out = _ref(key.section)
    elif key.kind == "sections":
        out = {"type": "object", "additionalProperties": _ref(key.section)}
    elif key.kind == "section_list":
        out = {"type": "array", "items": _ref(key.section)}
    elif key.kind == "value":
        out = dict(_SCALAR)
    elif key.kind == "switch":
        out = {"anyOf": [{"type": "boolean"}, _ref(key.section)]}
    else:  # roots
        uri = {"type": "string", "pattern": "^file://"}
        out = {"type": "array", "items": {"anyOf": [uri, _ref("root")]}}
    if key.maximum is not None:
        out["maximum"] = key.maximum
    out = _nullable(out)
    # A $ref's siblings are annotations in 2020-12, so a description may sit beside it.
    out["description"] = key.doc
    if key.default is not None:
        out["default"] = key.default
    return out


def _nullable(out: dict[str, Any]) -> dict[str, Any]:
    """The loader reads a key set to null (`cwd:`, `tls: ~`) as a key left out."""
    if isinstance(out.get("type"), str):
        return {**out, "type": [out["type"], "null"]}
    if isinstance(out.get("type"), list):
        return {**out, "type": [*out["type"], "null"]}
    if "anyOf" in out:
        return {**out, "anyOf": [*out["anyOf"], {"type": "null"}]}
    return out  # a $ref: each section is an object or null itself


def _section(name: str, table: dict[str, Key]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": ["object", "null"],
        "properties": {k: _key(v) for k, v in table.items()},
        "additionalProperties": _ref(ENTRIES[name]) if name in ENTRIES else False,
    }
    required = [k for k, v in table.items() if v.required]
    if required:
        out["required"] = required
    exclusive = ONE_OF.get(name)
    if exclusive is not None:
        # Exactly one (a backend's transport, a rule's effect): each alternative requires one
        # and forbids the others.
        out["oneOf"] = [
            {"required": [t], "not": {"anyOf": [{"required": [o]} for o in exclusive if o != t]}}
            for t in exclusive
        ]
    return out


def schema() -> dict[str, Any]:
    """The schema of a config file (pure)."""
    return {
        "$schema": DRAFT,
        "title": "mcp-gateway config",
        "description": "`mcp-transparent-gateway check-config` also checks the rules across keys.",
        "$ref": "#/$defs/config",
        "$defs": {name: _section(name, table) for name, table in SECTIONS.items()},
    }


def schema_text() -> str:
    """The schema as the shipped file holds it: indented JSON, one final newline."""
    return orjson.dumps(schema(), option=orjson.OPT_INDENT_2).decode() + "\n"


def shipped_text() -> str:
    """gateway/config/schema.json as installed."""
    return resources.files("gateway.config").joinpath("schema.json").read_text(encoding="utf-8")
