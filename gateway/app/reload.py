"""What a config reload may change while the gateway runs, and what it reports."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import anyio

from gateway.app.wiring import Wired, check_hooks, login_desk
from gateway.config import BackendConfig, Config
from gateway.core.dispatcher import Dispatcher
from gateway.core.ratelimit import RateLimiter
from gateway.telemetry.api import Stats

if TYPE_CHECKING:
    from gateway.caller_auth.authenticator import Authenticator

log = logging.getLogger("gateway")


def carry_over(dispatcher: Dispatcher, limiter: RateLimiter | None) -> None:
    """A reload keeps the buckets of every limit it did not change (the replica's own; the
    shared ones are in Redis and stay anyway)."""
    shared = dispatcher.shared_limiter
    before = dispatcher.limiter or (shared.local if shared is not None else None)
    if limiter is not None and before is not None:
        limiter.carry_over(before)


# The sections a reload applies; every other one (listen addresses, TLS, `auth:`, telemetry,
# tap, audit, overload, cluster) is what the running process was built around, so a change
# there is logged as needing a restart and left as it was, never half-applied.
RELOADED = frozenset(
    {
        "backends",
        "namespacing",
        "on_backend_failure",
        "policy",
        "rate_limits",
        "shutdown",
        "tool_search",
        "servers",
    }
)
# What a removed backend is given beyond its request timeout to finish what it was sent (the
# timeout's own error takes that long to come back through the layers).
RETIRE_MARGIN = 1.0


@dataclass(frozen=True)
class Reloaded:
    """What one applied reload changed, by backend name, and the sections left for a restart."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    kept: tuple[str, ...]
    needs_restart: tuple[str, ...]


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


def needs_restart(old: Config, new: Config) -> tuple[str, ...]:
    """The sections that changed but are not reloaded: left as they were, and logged."""
    return tuple(
        f.name
        for f in fields(Config)
        if f.name not in RELOADED | {"source"} and getattr(old, f.name) != getattr(new, f.name)
    )


@dataclass(frozen=True)
class Plan:
    """How a reload turns the running backends into the configured ones."""

    wired: list[Wired]  # the new set, in config order
    added: list[str]
    changed: list[str]
    fresh: list[Wired]  # wired for this reload: added, or replacing a changed one
    leaving: list[Wired]  # removed, or replaced


def plan(
    current: list[Wired], backends: Iterable[BackendConfig], wire: Callable[[BackendConfig], Wired]
) -> Plan:
    """A backend whose config is unchanged is kept as it runs; any other is wired anew."""
    by_name = {w.config.name: w for w in current}
    wired: list[Wired] = []
    added: list[str] = []
    changed: list[str] = []
    for config in backends:
        same = by_name.get(config.name)
        if same is not None and same.config == config:
            wired.append(same)  # its child, connections and listen streams stay
            continue
        (changed if same is not None else added).append(config.name)
        wired.append(wire(config))
    fresh = [w for w in wired if w.config.name in added or w.config.name in changed]
    leaving = [w for w in current if w not in wired]
    return Plan(wired, added, changed, fresh, leaving)


def report(done: Plan, restart: tuple[str, ...]) -> Reloaded:
    removed = tuple(w.config.name for w in done.leaving if w.config.name not in done.changed)
    return Reloaded(
        added=tuple(done.added),
        removed=removed,
        changed=tuple(done.changed),
        kept=tuple(w.config.name for w in done.wired if w not in done.fresh),
        needs_restart=restart,
    )


def record(done: Reloaded, source: str, stats: Stats) -> None:
    """The reload's counts (metrics) and its log lines."""
    for change in ("added", "removed", "changed"):
        stats.reloaded_backends[change] += len(getattr(done, change))
    log.info(
        "config reloaded from %s: added %s; removed %s; changed %s; kept %s",
        source,
        _names(done.added),
        _names(done.removed),
        _names(done.changed),
        _names(done.kept),
    )
    if done.needs_restart:
        log.warning(
            "reload: %s changed, which needs a restart; left as it was",
            ", ".join(done.needs_restart),
        )


async def retire_all(leaving: list[Wired]) -> None:
    """Removed (and replaced) backends no longer route anything new; what they were sent
    finishes first, bounded by their request timeout."""
    async with anyio.create_task_group() as tg:
        for w in leaving:
            tg.start_soon(retire, w)


async def retire(wired: Wired) -> None:
    name = wired.config.name
    with anyio.move_on_after(wired.config.request_timeout + RETIRE_MARGIN) as waited:
        await wired.bound.drained()
    if waited.cancelled_caught:
        log.warning("backend %s: requests still in flight after its request timeout", name)
    # Its run ends as at shutdown (a stdio child: stdin closed, SIGTERM, SIGKILL).
    wired.scope.cancel()
    await wired.stopped.wait()
    log.info("backend %s stopped (no longer in the config, or changed)", name)


def reload_problems(
    new: Config, stdio_server: str | None, desk: bool, authenticator: Authenticator | None
) -> list[str]:
    """What the loader cannot know: whether a running process can serve `new` (its stdio front
    end's virtual server still there; a login desk only if it started with one; hooks that
    load). `desk`: whether it did. Empty: it can."""
    problems = check_hooks(new)
    if stdio_server is not None and stdio_server not in {s.name for s in new.servers}:
        problems.append(f"{new.source}: servers.{stdio_server} is served on stdio (run --server)")
    if not desk and login_desk(new, authenticator) is not None:
        problems.append(
            f"{new.source}: a per_user backend needs the login desk, which is set up "
            "at start-up (with the listener's auth:): restart to add the first one"
        )
    return problems
