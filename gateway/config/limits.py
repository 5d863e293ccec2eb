"""The sections on who may call how often, how much may run at once, what is written down about
it, and how the process stops: `rate_limits:`, `overload:`, `audit:` and `shutdown:`."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.config import keys
from gateway.config.model import _REDACT_PATH
from gateway.config.operations import (
    AUDIT_STDERR,
    JSON_WINDOW,
    AuditConfig,
    Overload,
    Rate,
    RateLimits,
    Shutdown,
)
from gateway.config.reader import _Check

Path_ = tuple[str, ...]


def rate_limits(c: _Check, raw: Any, path: Path_ = ("rate_limits",)) -> RateLimits | None:
    """`rate_limits:` (or a virtual server's, at `path`)."""
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("rate_limits"))
    tools: dict[str, Rate] = {}
    for name, section in c.mapping(body.get("tools"), path + ("tools",)).items():
        found = _rate(c, section, path + ("tools", name))
        if found is not None:
            tools[name] = found
    return RateLimits(
        per_identity=_rate(c, body.get("per_identity"), path + ("per_identity",)),
        per_tool=_rate(c, body.get("per_tool"), path + ("per_tool",)),
        overall=_rate(c, body.get("overall"), path + ("overall",)),
        tools=tools,
        **c.scalars(body, path, RateLimits),
    )


def overload(c: _Check, raw: Any) -> Overload:
    """Always on: absent, every bound has its default."""
    path = ("overload",)
    body = c.mapping(raw, path, keys.names("overload"))
    queue_timeout = c.field(body, path, "queue_timeout", keys.table("overload")["queue_timeout"])
    if queue_timeout >= JSON_WINDOW:
        # Past the window the HTTP reply has become a stream with status 200: the refusal
        # could no longer be the 503 with Retry-After a load balancer and a client act on.
        why = f"must be below {JSON_WINDOW:g} s (an HTTP reply turns into a stream then)"
        c.r.problem(path + ("queue_timeout",), why)
        queue_timeout = Overload.queue_timeout
    values = c.scalars(body, path, Overload, skip={"queue_timeout"})
    return Overload(queue_timeout=queue_timeout, **values)


def shutdown(c: _Check, raw: Any) -> Shutdown:
    path = ("shutdown",)
    body = c.mapping(raw, path, keys.names("shutdown"))
    values = c.scalars(body, path, Shutdown, skip={"pre_stop_delay"})
    value = body.get("pre_stop_delay")
    if value is None:
        return Shutdown(**values)
    # 0 is a valid delay (none), unlike the positive numbers `c.field` reads.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        c.r.problem(path + ("pre_stop_delay",), "must be a number of seconds, 0 or more")
        return Shutdown(**values)
    return Shutdown(pre_stop_delay=float(value), **values)


def _rate(c: _Check, raw: Any, path: Path_) -> Rate | None:
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("rate"))
    t = keys.table("rate")
    if body.get("rate") is None:
        c.r.problem(path + ("rate",), "is required (requests per second)")
        return None
    rate = c.field(body, path, "rate", t["rate"])
    # A bucket must hold one request at least, or a slow rate would refuse everything.
    burst = c.count(body.get("burst"), path + ("burst",), max(1, math.ceil(rate)), 1)
    return Rate(rate=rate, burst=burst)


def audit(c: _Check, raw: Any, beside: Callable[[str], Path]) -> AuditConfig | None:
    if raw is None:
        return None
    path = ("audit",)
    body = c.mapping(raw, path, keys.names("audit"))
    t = keys.table("audit")
    target = c.field(body, path, "path", t["path"])
    if not target:
        c.r.problem(path + ("path",), f"is required ({AUDIT_STDERR!r} or a file)")
    elif target != AUDIT_STDERR:
        target = str(beside(target))
    redact = c.field(body, path, "redact", t["redact"])
    for i, rule in enumerate(redact):
        if not _REDACT_PATH.fullmatch(rule):
            c.r.problem(path + ("redact", str(i)), "must be a dotted path like params.arguments.*")
    values = c.scalars(body, path, AuditConfig, skip={"path", "redact"})
    return AuditConfig(path=target or "", redact=redact, **values)
