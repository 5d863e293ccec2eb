"""How a config key is declared: field metadata on the model's dataclasses (a leaf module).

Each key is declared once, on the field it fills: `field_name: int = key("count", "doc.",
default, minimum=1)`. From those fields `gateway.config.keys` derives each section's key set
(the loader's unknown-key check), each scalar's kind, default and bounds (`_Check.field`) and the
JSON Schema (`gateway.config.schema`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

# string: a string; number: a positive number; count: a whole number >= minimum; port: 0-65535;
# boolean; strings: a list of scalars read as strings; string_map: names to scalars read as
# strings; section: a mapping described by SECTIONS[section]; sections: names to such mappings;
# roots: a list of file:// URIs or `root` sections; section_list: a list of such mappings;
# switch: true, false, or such a mapping (meaning on); value: one string, number or boolean, kept
# as YAML typed it.
Kind = Literal[
    "string",
    "number",
    "count",
    "port",
    "boolean",
    "strings",
    "string_map",
    "section",
    "sections",
    "section_list",
    "roots",
    "switch",
    "value",
]

# The kinds `_Check.field` reads; the others are sections the loaders read themselves.
SCALAR_KINDS = frozenset({"string", "number", "count", "port", "boolean", "strings", "string_map"})


@dataclass(frozen=True)
class Key:
    kind: Kind
    doc: str
    default: str | int | float | bool | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None  # count: the least whole number; number: the least value
    maximum: float | None = None
    pattern: str | None = None  # a string's regular expression (the loader checks it itself)
    section: str | None = None  # section, sections, section_list, switch: the name in SECTIONS
    required: bool = False


# Words and patterns several keys share.
URL_PATTERN = r"^https?://"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
PEM = "A PEM file, relative to the config file."

# The metadata entries holding a field's Key, and where in the file a key sits that is not in
# the section its dataclass reads (`fan_out.grace` fills Config.fan_out_grace).
KEY = "gateway.config.key"
AT = "gateway.config.key.at"
NAME = "gateway.config.key.name"
_FROM_FIELD: Any = object()


def key(
    kind: Kind,
    doc: str,
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    shown: Any = _FROM_FIELD,
    choices: tuple[str, ...] = (),
    minimum: float | None = None,
    maximum: float | None = None,
    pattern: str | None = None,
    section: str | None = None,
    required: bool = False,
    secret: bool = False,
    kw_only: bool = False,
    at: str | None = None,
    name: str | None = None,
) -> Any:
    """A dataclass field that is also a config key. The key's default (the loader's, and the
    schema's) is the field's when that is a scalar other than "", else none; `shown` overrides
    it where the file's default is not the model's. A `secret` is never in a repr; `kw_only`
    lets a required key follow keys with defaults (the file's order); `at` ("section.name")
    places a key whose section is not its dataclass's; `name` is the file's name for a field
    named otherwise."""
    if shown is _FROM_FIELD:
        plain = isinstance(default, (str, int, float, bool)) and default != ""
        shown = default if plain else None
    spec = Key(kind, doc, shown, choices, minimum, maximum, pattern, section, required)
    meta: dict[str, Any] = {KEY: spec}
    if at is not None:
        meta[AT] = at
    if name is not None:
        meta[NAME] = name
    if factory is not None:
        return dataclasses.field(
            default_factory=factory, repr=not secret, kw_only=kw_only, metadata=meta
        )
    return dataclasses.field(default=default, repr=not secret, kw_only=kw_only, metadata=meta)


def keys_of(cls: type, section: str | None = None) -> dict[str, Key]:
    """The keys declared on a dataclass's fields, in their order (the schema's order): those of
    its own section, or (`section`) those placed `at` that section."""
    out: dict[str, Key] = {}
    for f in dataclasses.fields(cls):
        if KEY not in f.metadata:
            continue
        at = f.metadata.get(AT)
        if section is None and at is None:
            out[f.metadata.get(NAME, f.name)] = f.metadata[KEY]
        elif section is not None and at is not None and at.startswith(section + "."):
            out[at[len(section) + 1 :]] = f.metadata[KEY]
    return out
