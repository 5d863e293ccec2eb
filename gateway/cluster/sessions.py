"""`frontends.legacy.records.SessionRecords` in Redis: one JSON string per legacy session, under
`mcp-gateway:session:<digest of the id>`, expiring after the session's idle timeout (every
read renews it: GETEX; every write sets it: SET ... XX PX).

Unlike the rate limits, a session cannot be decided without Redis: its record is the session.
So a call that fails or takes longer than `redis_timeout` raises `SessionsUnavailable`, and for
`redis_retry_interval` after that Redis is not asked at all (the next requests fail at once,
then one tries again: redis-py's pool reconnects). Each change of state is one log line and
`mcp_gateway_redis_sessions_up`; every refusal counts in
`mcp_gateway_rejections_total{reason="sessions_unavailable"}` (frontends/legacy/endpoint.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import orjson

from gateway.cluster.connection import connect
from gateway.cluster.outage import Breaker, RedisDown
from gateway.frontends.legacy.records import Record, SessionsUnavailable, valid
from gateway.telemetry.api import Stats

PREFIX = "mcp-gateway:session:"

T = TypeVar("T")
Clock = Callable[[], float]


class RedisSessions:
    def __init__(
        self,
        url: str,
        ttl: float,
        timeout: float,
        retry_interval: float,
        stats: Stats,
        clock: Clock = time.monotonic,
    ) -> None:
        # No retries inside redis-py, as for the buckets: a failure is reported at once, and
        # the pool reconnects on the next try.
        self._client = connect(url, timeout)
        self._ttl_ms = max(1, math.ceil(ttl * 1000))
        self._retry_interval = retry_interval
        self._stats = stats
        self._breaker = Breaker(
            timeout,
            down="redis: a legacy session record could not be read or written (%s); legacy"
            " sessions are refused (503) until it answers"
            f" (tried again every {retry_interval:g} s)",
            back="redis: reachable again; legacy sessions are served again",
            retry_interval=retry_interval,
            show=self._show,
            clock=clock,
            up=stats.sessions_redis_up,
        )

    def check(self) -> None:
        if self._breaker.waiting():
            raise SessionsUnavailable(self._retry_interval)

    async def create(self, key: str, record: Record) -> None:
        data = orjson.dumps(record)
        await self._call(lambda: self._client.set(PREFIX + key, data, px=self._ttl_ms, nx=True))

    async def load(self, key: str) -> Record | None:
        data = await self._call(lambda: self._client.getex(PREFIX + key, px=self._ttl_ms))
        if data is None:
            return None
        try:
            return valid(orjson.loads(data))
        except orjson.JSONDecodeError:
            return None

    async def save(self, key: str, record: Record) -> bool:
        data = orjson.dumps(record)
        done = await self._call(
            lambda: self._client.set(PREFIX + key, data, px=self._ttl_ms, xx=True)
        )
        return bool(done)

    async def touch(self, key: str) -> bool:
        return bool(await self._call(lambda: self._client.pexpire(PREFIX + key, self._ttl_ms)))

    async def delete(self, key: str) -> None:
        await self._call(lambda: self._client.delete(PREFIX + key))

    async def _call(self, command: Callable[[], Awaitable[T]]) -> T:
        try:
            return await self._breaker.call(command)
        except RedisDown:
            raise SessionsUnavailable(self._retry_interval) from None

    def _show(self, up: bool) -> None:
        self._stats.sessions_redis_up = up

    async def close(self) -> None:
        await self._client.aclose()
