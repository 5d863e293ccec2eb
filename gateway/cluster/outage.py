"""The one breaker every Redis adapter calls Redis through: each call bounded by `redis_timeout`
(connecting included, so a stalled Redis costs a request that much at most), each change of
state one log line, and, where a retry interval is given, Redis not asked at all for that long
after a failure (a Redis that is down costs no request a timeout; then one call tries again and
the others meanwhile fail at once, while redis-py's pool reconnects).

What a failure means is the caller's: the rate limits decide alone, a legacy session is
refused, a login fails, a message is not sent; so the breaker raises `RedisDown` and each
adapter turns it into its own answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from redis.exceptions import RedisError

log = logging.getLogger("gateway")

T = TypeVar("T")
Clock = Callable[[], float]

# What a call to Redis fails with: redis-py's errors, the socket's, and the timeout.
FAILURES: tuple[type[Exception], ...] = (RedisError, OSError, TimeoutError)


class RedisDown(Exception):
    """Redis was not asked (a failure's retry interval runs) or did not answer; `reason` is
    redis-py's message (host and port, never the URL, which may carry the password)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _unchanged(up: bool) -> None:
    pass


class Breaker:
    """`down` is the warning logged when Redis stops answering (`%s`: the reason), `back` the
    one when it answers again (None: no line); `show` mirrors each change into the stats, and
    `up` is the state they already show (unknown, None, until a first call)."""

    def __init__(
        self,
        timeout: float,
        *,
        down: str,
        back: str | None,
        retry_interval: float | None = None,
        show: Callable[[bool], None] = _unchanged,
        failures: tuple[type[Exception], ...] = FAILURES,
        clock: Clock = time.monotonic,
        up: bool | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self._timeout = timeout
        self._down = down
        self._back = back
        self._retry_interval = retry_interval
        self._show = show
        self._failures = failures
        self._clock = clock
        self._retry_at = 0.0  # while down: when Redis is asked again
        self.up = up
        self._log = logger

    def waiting(self) -> bool:
        """Whether a failure's retry interval still runs: Redis is not to be asked now."""
        return self.up is False and self._clock() < self._retry_at

    async def call(self, command: Callable[[], Awaitable[T]]) -> T:
        if self.up is False and self._retry_interval is not None:
            now = self._clock()
            if now < self._retry_at:
                raise RedisDown("not asked while it is down")
            # This call tries Redis again; the others meanwhile fail at once.
            self._retry_at = now + self._retry_interval
        try:
            with anyio.fail_after(self._timeout):
                result = await command()
        except self._failures as exc:
            raise self._failed(exc) from None
        if self.up is not True:
            if self.up is False and self._back is not None:
                self._log.warning(self._back)
            self._state(True)
        return result

    def _failed(self, exc: Exception) -> RedisDown:
        reason = str(exc) or type(exc).__name__
        if self.up is not False:
            # Once per change of state, not per request.
            self._log.warning(self._down, reason)
            self._state(False)
        if self._retry_interval is not None:
            self._retry_at = self._clock() + self._retry_interval
        return RedisDown(reason)

    def _state(self, up: bool) -> None:
        self.up = up
        self._show(up)
