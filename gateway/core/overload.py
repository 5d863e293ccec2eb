"""Overload protection: a bound on requests in flight, overall (the dispatcher's `serve`) and per
backend (`BoundedBackend`, the outermost layer of each backend), with a short FIFO queue.

Under the bound a request costs a comparison and an increment, and one decrement when it ends:
no lock (the event loop runs one task at a time), no future, no timer. Past it, the request
waits in the bound's queue (at most `max_queued`, each at most `queue_timeout`); a slot freed
while requests wait is handed to the oldest one, so the count does not drop and no newcomer can
overtake the queue. A request that finds the queue full, or waits it out, is refused (-31004)
before anything is sent on: the refusal costs the backend nothing.

Listen streams (`long_lived`) are not counted: they last as long as their client, and counting
them would let a few idle subscribers use up the slots calls need (as an HTTP backend's streams
have a connection pool of their own). They are bounded by what holds them open: the HTTP
listener's connections and the legacy sessions' cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, deque
from collections.abc import Callable

from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.config import Overload
from gateway.errors import BackendOverloaded, GatewayError, Overloaded
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway")

OVERALL = "overall"
BACKEND = "backend"
# One warning per bound at most this often (seconds): an overload refuses many requests at once.
WARN_INTERVAL = 10.0


class Bound:
    """Slots for requests in flight. The caller's fast path is its own: `if bound.busy <
    bound.limit: bound.busy += 1`, else `await bound.queue()`; either way `release()` once the
    request ends. (busy < limit implies an empty queue: slots are handed to waiters first.)"""

    __slots__ = (
        "_idle",
        "_last_warning",
        "_refusal",
        "_refused",
        "_timeout",
        "_waiters",
        "busy",
        "limit",
        "max_queued",
        "name",
        "scope",
    )

    def __init__(
        self,
        scope: str,
        name: str,
        limit: int,
        settings: Overload,
        refused: Counter[tuple[str, str]],
    ) -> None:
        self.scope = scope  # OVERALL or BACKEND
        self.name = name  # the backend's; "" overall
        self.limit = limit
        self.busy = 0
        self.max_queued = settings.max_queued
        self._timeout = settings.queue_timeout
        self._waiters: deque[asyncio.Future[bool]] = deque()
        self._refused = refused  # Stats.overloaded, by (scope, backend)
        self._last_warning = -WARN_INTERVAL
        self._idle: asyncio.Event | None = None  # set when the last slot is given back
        if scope == OVERALL:
            what = f"more than {limit} requests in flight"
            self._refusal: Callable[[], GatewayError] = lambda: Overloaded(
                settings.retry_after,
                f"Gateway overloaded ({what}); retry after {settings.retry_after:g} s",
            )
        else:
            self._refusal = lambda: BackendOverloaded(
                name,
                f"overloaded (max_in_flight {limit}); retry after {settings.retry_after:g} s",
                settings.retry_after,
            )

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def drained(self) -> None:
        """Wait until no request holds a slot or waits for one: a backend a reload removes
        finishes what it was sent before it stops (the caller bounds the wait)."""
        while self.busy or self._waiters:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

    async def queue(self) -> None:
        """Wait for a slot (the bound is full); raises the refusal when the queue is full or the
        wait ends first. On return the caller holds a slot."""
        waiters = self._waiters
        if len(waiters) >= self.max_queued:
            raise self._refuse()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        waiters.append(waiter)
        timer = loop.call_later(self._timeout, self._expire, waiter)
        try:
            granted = await waiter
        except asyncio.CancelledError:
            # Cancelled (the client went away) while waiting, or just after being handed a
            # slot: give that slot on, or leave the queue.
            if waiter.cancelled() or not waiter.result():
                self._forget(waiter)
            else:
                self.release()
            raise
        finally:
            timer.cancel()
        if not granted:
            raise self._refuse()

    def release(self) -> None:
        """A request holding a slot has ended: the slot goes to the oldest waiter, if any."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.busy -= 1
        if self._idle is not None and not self.busy:
            self._idle.set()
            self._idle = None

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            waiter.set_result(False)
            self._forget(waiter)

    def _forget(self, waiter: asyncio.Future[bool]) -> None:
        # (at most max_queued long; absent once handed a slot or expired)
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _refuse(self) -> GatewayError:
        self._refused[(self.scope, self.name)] += 1
        now = asyncio.get_running_loop().time()
        if now - self._last_warning >= WARN_INTERVAL:
            self._last_warning = now
            where = "" if self.scope == OVERALL else f"backend {self.name}: "
            log.warning(
                "%srefusing requests over max_in_flight (%d) with %d queued; %d refused so far",
                where,
                self.limit,
                len(self._waiters),
                self._refused[(self.scope, self.name)],
                extra={"scope": self.scope, "backend": self.name or None},
            )
        return self._refusal()


class BoundedBackend(Layer[Backend]):
    """A backend behind its `Bound`: a request past it waits in the queue or is refused with
    `BackendOverloaded` (-31004) without reaching the layers below; listen streams pass."""

    def __init__(self, inner: Backend, bound: Bound) -> None:
        super().__init__(inner)
        self.bound = bound

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        if long_lived:
            return await self.inner.request(msg, sink, call, long_lived=True)
        bound = self.bound
        if bound.busy < bound.limit:
            bound.busy += 1
        else:
            await bound.queue()
        try:
            return await self.inner.request(msg, sink, call)
        finally:
            bound.release()
