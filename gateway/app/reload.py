"""What a config reload may change while the gateway runs, and what it reports."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.dispatcher import Dispatcher
from gateway.core.ratelimit import RateLimiter


def _carry_over(dispatcher: Dispatcher, limiter: RateLimiter | None) -> None:
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
    {"backends", "namespacing", "on_backend_failure", "policy", "rate_limits", "shutdown"}
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
