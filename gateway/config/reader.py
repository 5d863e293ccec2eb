"""YAML with line numbers, and the checks that turn raw values into typed ones while collecting
every problem with its file, line and dotted path."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

import yaml

from gateway.config.key import SCALAR_KINDS, Key, keys_of
from gateway.config.listeners import DEFAULT_HTTP_PORT
from gateway.config.model import _ENV_REF

# --- YAML with line numbers -------------------------------------------------------------------


class _Reader:
    """Turns a composed YAML node tree into plain values, remembering each value's line."""

    def __init__(self, source: str, env: Mapping[str, str]) -> None:
        self.source = source
        self.env = env
        self.lines: dict[tuple[str, ...], int] = {}
        # The source text of each scalar: header values and env entries are strings even when
        # YAML 1.1 would read them as booleans or numbers (`yes`, `on`, `0755`).
        self.text: dict[tuple[str, ...], str] = {}
        self.problems: list[str] = []
        self._scalars = yaml.SafeLoader("")

    def value(self, node: yaml.Node, path: tuple[str, ...]) -> Any:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in out:
                    self.problem(path + (key,), "appears twice", key_node.start_mark.line + 1)
                out[key] = self.value(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(v, path + (str(i),)) for i, v in enumerate(node.value)]
        scalar = self._scalars.construct_object(node)
        if isinstance(scalar, str):
            scalar = self.interpolate(scalar, path)
        self.text[path] = scalar if isinstance(scalar, str) else str(node.value)
        return scalar

    def interpolate(self, text: str, path: tuple[str, ...]) -> str:
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in self.env:
                return self.env[name]
            if default is not None:
                return default
            self.problem(path, f"environment variable {name} is not set")
            return ""

        return _ENV_REF.sub(sub, text)

    def problem(self, path: tuple[str, ...], message: str, line: int | None = None) -> None:
        where = line if line is not None else self._nearest_line(path)
        dotted = ".".join(path) or "(top level)"
        self.problems.append(f"{self.source}:{where}: {dotted}: {message}")

    def _nearest_line(self, path: tuple[str, ...]) -> int:
        while path and path not in self.lines:
            path = path[:-1]
        return self.lines.get(path, 1)


# --- validation -------------------------------------------------------------------------------


class _Check:
    def __init__(self, reader: _Reader) -> None:
        self.r = reader

    def mapping(
        self, value: Any, path: tuple[str, ...], keys: set[str] | None = None
    ) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.r.problem(path, "must be a mapping")
            return {}
        if keys is not None:
            allowed = ", ".join(sorted(keys))
            for key in value.keys() - keys:
                self.r.problem(path + (key,), f"unknown key (expected one of: {allowed})")
        return value

    def scalars(
        self, body: Mapping[str, Any], path: tuple[str, ...], cls: type, skip: Collection[str] = ()
    ) -> dict[str, Any]:
        """Every plain key declared on `cls`'s fields, read as declared (`field`), by field name:
        the loader reads the sections within, and the keys in `skip` under a rule of its own."""
        return {
            name: self.field(body, path, name, key)
            for name, key in keys_of(cls).items()
            if key.kind in SCALAR_KINDS and name not in skip
        }

    def field(self, body: Mapping[str, Any], path: tuple[str, ...], name: str, key: Key) -> Any:
        """`body[name]` checked as the table's `key` says, its default when absent."""
        value, where = body.get(name), path + (name,)
        if key.kind == "string":
            return self.string(value, where, None if key.default is None else str(key.default))
        if key.kind == "number":
            return self.number(value, where, float(key.default or 0))
        if key.kind == "count":
            return self.count(value, where, int(key.default or 0), int(key.minimum or 0))
        if key.kind == "port":
            return int(key.default or 0) if value is None else self.port(value, where)
        if key.kind == "boolean":
            return self.boolean(value, where, bool(key.default))
        if key.kind == "strings":
            return self.strings(value, where)
        if key.kind == "string_map":
            return self.string_map(value, where)
        raise ValueError(f"{key.kind} is not a scalar kind")  # the loader reads sections itself

    def string(self, value: Any, path: tuple[str, ...], default: str | None = None) -> str | None:
        if value is None:
            return default
        if not isinstance(value, str):
            self.r.problem(path, "must be a string")
            return default
        return value

    def number(self, value: Any, path: tuple[str, ...], default: float) -> float:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            self.r.problem(path, "must be a positive number")
            return default
        return float(value)

    def port(self, value: Any, path: tuple[str, ...]) -> int:
        if value is None:
            return DEFAULT_HTTP_PORT
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            self.r.problem(path, "must be a port number from 0 to 65535")
            return DEFAULT_HTTP_PORT
        return value

    def count(self, value: Any, path: tuple[str, ...], default: int, minimum: int = 1) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.r.problem(path, f"must be a whole number of at least {minimum}")
            return default
        return value

    def boolean(self, value: Any, path: tuple[str, ...], default: bool = False) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.r.problem(path, "must be true or false")
            return default
        return value

    def strings(self, value: Any, path: tuple[str, ...]) -> tuple[str, ...]:
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            self.r.problem(path, "must be a list of strings")
            return ()
        return tuple(str(v) for v in value)

    def string_map(self, value: Any, path: tuple[str, ...]) -> dict[str, str]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.r.problem(path, "must be a mapping of names to strings")
            return {}
        out: dict[str, str] = {}
        for key, item in value.items():
            if isinstance(item, (dict, list)) or item is None:
                self.r.problem(path + (key,), "must be a string")
            else:
                out[key] = item if isinstance(item, str) else self.r.text[path + (key,)]
        return out
