"""Reads `pins:` (top level) and a backend's `pins:` into their config objects."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.pins import (
    DEFAULT_PIN_FILE,
    DEFAULT_PIN_MODE,
    PIN_MODES,
    BackendPins,
    PinsConfig,
)
from gateway.config.reader import _Check


def pins(c: _Check, raw: Any, beside: Callable[[str], Path]) -> PinsConfig | None:
    """The top-level `pins:` (None when absent: nothing is pinned)."""
    if raw is None:
        return None
    path = ("pins",)
    body = c.mapping(raw, path, keys.names("pins"))
    t = keys.table("pins")
    file = c.field(body, path, "file", t["file"]) or DEFAULT_PIN_FILE
    mode = _mode(c, body, path) or DEFAULT_PIN_MODE
    return PinsConfig(
        file=str(beside(file)),
        on_change=mode,
        poll_interval=c.field(body, path, "poll_interval", t["poll_interval"]),
        notify_wait=c.field(body, path, "notify_wait", t["notify_wait"]),
    )


def backend_pins(c: _Check, raw: Any, path: tuple[str, ...]) -> BackendPins | None:
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("backend_pins"))
    return BackendPins(on_change=_mode(c, body, path))


def _mode(c: _Check, body: dict[str, Any], path: tuple[str, ...]) -> str | None:
    mode = body.get("on_change")
    if mode is None:
        return None
    if mode not in PIN_MODES:
        c.r.problem(path + ("on_change",), f"must be one of {', '.join(PIN_MODES)}")
        return None
    return str(mode)
