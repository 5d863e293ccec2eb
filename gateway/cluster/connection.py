"""How every part of `gateway/shared` connects to Redis."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def connect(url: str, timeout: float, *, read_timeout: bool = True) -> Redis:
    """A redis-py client (its pool connects on first use) with no retries of its own: a
    failure is reported at once, the caller decides what it costs, and the pool reconnects at
    the next call. `read_timeout=False` for a connection that waits for what Redis pushes (a
    subscription), where a quiet Redis is not a failed one."""
    return Redis.from_url(
        url,
        socket_timeout=timeout if read_timeout else None,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
