"""Reads a `tool_search:` section (top level, and a virtual server's) into a ToolSearchConfig."""

from __future__ import annotations

from typing import Any

from gateway.config import keys
from gateway.config.reader import _Check
from gateway.config.search import SEARCH_MODES, ToolSearchConfig


def tool_search(c: _Check, raw: Any, path: tuple[str, ...] = ("tool_search",)) -> ToolSearchConfig:
    body = c.mapping(raw, path, keys.names("tool_search"))
    mode = body.get("mode", "off")
    if isinstance(mode, bool):
        # YAML 1.1 reads a bare `on`/`off` as a boolean: take it as the word that was written.
        mode = "on" if mode else "off"
    if mode not in SEARCH_MODES:
        c.r.problem(path + ("mode",), f"must be one of {', '.join(SEARCH_MODES)}")
        mode = "off"
    return ToolSearchConfig(mode=mode, **c.scalars(body, path, ToolSearchConfig, skip={"mode"}))
