"""The cluster's pins (`pins:` with `cluster.redis`; docs/trusting-tools/pinning.md): the pin
file's text under one Redis key, which every replica takes as the pins in force. The first replica
of a fresh cluster seeds it from its file (SET NX: one seed wins); an approval (the CLI's, or a
replica's file changed) writes it, and the bus tells the other replicas to read it again.

Every call goes through the breaker (bounded by `redis_timeout`, one line per change of state)
and reports whether Redis answered rather than raising: a replica that cannot reach Redis keeps
the pins it has.
"""

from __future__ import annotations

import logging

from gateway.cluster.connection import connect
from gateway.cluster.outage import Breaker, RedisDown

log = logging.getLogger("gateway.pins")

KEY = "mcp-gateway:pins"


class RedisPins:
    def __init__(self, url: str, timeout: float, key: str = KEY) -> None:
        self._redis = connect(url, timeout)
        self._key = key
        self._breaker = Breaker(
            timeout,
            down="redis: the cluster's pins not reached (%s); this replica keeps its own",
            back="redis: the cluster's pins reached again",
            logger=log,
        )

    async def read(self) -> tuple[bool, bytes | None]:
        """(whether Redis answered, the pin file's text it holds: None if none)."""
        try:
            found = await self._breaker.call(lambda: self._redis.get(self._key))
        except RedisDown:
            return False, None
        return True, found if isinstance(found, bytes) else None

    async def seed(self, text: bytes) -> bool:
        """Store `text` unless the cluster has pins already; whether Redis answered."""
        try:
            await self._breaker.call(lambda: self._redis.set(self._key, text, nx=True))
        except RedisDown:
            return False
        return True

    async def write(self, text: bytes) -> bool:
        try:
            await self._breaker.call(lambda: self._redis.set(self._key, text))
        except RedisDown:
            return False
        return True

    async def close(self) -> None:
        await self._redis.aclose()
