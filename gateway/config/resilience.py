"""A backend's resilience settings: each tool's own timeout (`tools.TOOL.timeout`), the retries
of requests that cannot have effects (`retries:`), and its circuit breaker (`breaker:`)."""

from __future__ import annotations

from typing import Any

from gateway.config import keys
from gateway.config.model import BreakerSettings, RetrySettings
from gateway.config.reader import _Check

Path_ = tuple[str, ...]


def tool_timeouts(c: _Check, raw: Any, path: Path_) -> dict[str, float]:
    """The keys of `tools:` besides allow and deny name tools, each a mapping of its settings."""
    body = c.mapping(raw, path)
    filters, t = keys.names("tools"), keys.table("tool")
    out: dict[str, float] = {}
    for name, section in body.items():
        if name in filters:
            continue
        where = path + (name,)
        if not isinstance(section, dict):
            c.r.problem(where, "must be a mapping of the tool's settings (e.g. timeout)")
            continue
        entry = c.mapping(section, where, keys.names("tool"))
        if entry.get("timeout") is not None:
            out[str(name)] = c.field(entry, where, "timeout", t["timeout"])
    return out


def retries(c: _Check, raw: Any, path: Path_) -> RetrySettings:
    body = c.mapping(raw, path, keys.names("retries"))
    return RetrySettings(**c.scalars(body, path, RetrySettings))


def breaker(c: _Check, raw: Any, path: Path_) -> BreakerSettings | None:
    """Off unless asked for: `true` takes the defaults."""
    if raw is None or raw is False:
        return None
    if raw is True:
        return BreakerSettings()
    if not isinstance(raw, dict):
        c.r.problem(path, "must be true, false or a mapping of the breaker's settings")
        return None
    body = c.mapping(raw, path, keys.names("breaker"))
    return BreakerSettings(**c.scalars(body, path, BreakerSettings))
