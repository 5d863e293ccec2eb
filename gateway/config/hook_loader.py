"""Reading `hooks:` lists (gateway/config/hooks.py) with line-numbered problems."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.config import keys
from gateway.config.hooks import (
    _USE,
    BUILT_INS,
    DEFAULT_METHODS,
    LIMIT_ACTIONS,
    MAX_TIMEOUT,
    METHODS,
    ON_ERROR,
    REDACT_KINDS,
    STAGES,
    HookConfig,
)
from gateway.config.reader import _Check


def hooks(c: _Check, raw: Any, path: tuple[str, ...]) -> tuple[HookConfig, ...]:
    """A `hooks:` list, each entry checked (its own keys, and those of its built-in)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.r.problem(path, "must be a list of hooks ({use: ...} each)")
        return ()
    return tuple(_hook(c, item, path + (str(i),)) for i, item in enumerate(raw))


def _hook(c: _Check, raw: Any, path: tuple[str, ...]) -> HookConfig:
    body = c.mapping(raw, path, keys.names("hook"))
    values = c.scalars(body, path, HookConfig)
    values["options"] = values.pop("with")  # (the file's name for the field)
    use = values["use"] = values["use"] or ""
    values["methods"] = values["methods"] or DEFAULT_METHODS
    values["max_result_tokens"] = values["max_result_tokens"] or None  # (absent: 0)
    if values["on"] is None:
        values["on"] = "result" if use in BUILT_INS else "both"
    if not _USE.match(use):
        c.r.problem(path + ("use",), "must name redact, output_limit, an entry point or m:f")
    for name, allowed in (("on", STAGES), ("on_error", ON_ERROR), ("action", LIMIT_ACTIONS)):
        if values[name] not in allowed:
            c.r.problem(path + (name,), f"must be one of {', '.join(allowed)}")
    if use in BUILT_INS and values["on"] != "result":
        c.r.problem(path + ("on",), f"{use} acts on results only")
    for i, method in enumerate(values["methods"]):
        if method not in METHODS:
            c.r.problem(path + ("methods", str(i)), f"must be one of {', '.join(METHODS)}")
    if not 0 < values["timeout"] <= MAX_TIMEOUT:
        c.r.problem(path + ("timeout",), f"must be more than 0 and at most {MAX_TIMEOUT:g}")
    _built_in_keys(c, body, path, use, values)
    return HookConfig(**values)


def _built_in_keys(
    c: _Check, body: Mapping[str, Any], path: tuple[str, ...], use: str, values: dict[str, Any]
) -> None:
    """The built-ins' keys: each only with its built-in, and checked as it will use them."""
    own = {
        "output_limit": {"max_result_bytes", "max_result_tokens", "action", "marker"},
        "redact": {"kinds", "patterns"},
    }
    for built_in, names in own.items():
        for name in names & body.keys():
            if use != built_in:
                c.r.problem(path + (name,), f"only applies to use: {built_in}")
    if use == "output_limit":
        try:
            values["marker"].format(omitted=0, total=0, limit=0)
        except (KeyError, IndexError, ValueError):
            c.r.problem(path + ("marker",), "may hold only {omitted}, {total} and {limit}")
    if use == "redact":
        for i, kind in enumerate(values["kinds"]):
            if kind not in REDACT_KINDS:
                why = f"must be one of {', '.join(REDACT_KINDS)}"
                c.r.problem(path + ("kinds", str(i)), why)
        for kind, pattern in values["patterns"].items():
            try:
                re.compile(pattern)
            except re.error as exc:
                c.r.problem(path + ("patterns", kind), f"is not a regular expression ({exc})")
    if use in BUILT_INS and body.get("with") is not None:
        c.r.problem(path + ("with",), "is for hooks of your own (the built-ins have their keys)")
