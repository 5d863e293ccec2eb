"""Whether a backend can be reached, and the background retries while it cannot.

A backend that cannot be reached (command not found, connection refused, a child that exits
before it serves) is marked down at once: its requests fail at once with `BackendDown`
(-31001, naming it) instead of each waiting out a timeout, lists skip it (the dispatcher's
`fail_open`), and it is retried in the background with capped exponential backoff and jitter.
The log says so once per change of state (down, up again), not once per retry.

A stdio child is retried by its own supervisor (stdio.py), which reports to a `Health`; any
other transport is wrapped in `Guarded`, which notices an unreachable backend from the errors
its requests get and retries it with a discovery request.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import Any

import anyio

from gateway import __version__
from gateway.backends.base import GATEWAY_CALL, Backend, Call, Layer, NotificationSink
from gateway.errors import BackendDown, BackendError, BackendUnavailable
from gateway.protocol import meta
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

# Retries of a backend that is down: the first soon (a backend started at the same time as the
# gateway is often just late), doubling to a ceiling so that a dead one costs next to nothing,
# each spread by a random share so that many gateways do not retry in step. No config keys:
# nothing an operator tunes changes what these bound (a request never waits for a retry).
FIRST_RETRY = 1.0
MAX_RETRY = 60.0
JITTER = 0.2
# The doubling stops here (2**16 s is far past MAX_RETRY); only keeps the power finite.
_MAX_DOUBLINGS = 16


def retry_delay(failures: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before the next attempt after `failures` failed ones in a row (>= 1)."""
    doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
    base = min(MAX_RETRY, FIRST_RETRY * float(2**doublings))
    return base * (1 + JITTER * (2 * rand() - 1))


class Health:
    """One backend's reachability; `failed` and `recovered` are called by whatever tries it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reason: str | None = None  # why it is down; None while it is not known to be
        self.failures = 0  # failed attempts in a row
        self._changed = anyio.Event()
        # Called with True when the backend comes back (its catalog is worth loading again).
        self.on_change: Callable[[bool], None] | None = None

    @property
    def down(self) -> bool:
        return self.reason is not None

    def failed(self, reason: str, **details: Any) -> float:
        """An attempt failed: down from now (logged if it was not already); the delay before
        the next attempt. `details` go on the log record (exit code, stderr tail)."""
        self.failures += 1
        delay = retry_delay(self.failures)
        fields = {"backend": self.name, "reason": reason, **details}
        if self.reason is None:
            log.warning(
                "backend %s: down (%s); retrying in the background", self.name, reason, extra=fields
            )
            self.reason = reason
            self._notify(False)
        else:
            self.reason = reason
            log.debug("backend %s: still down (%s); next try in %.1fs", self.name, reason, delay)
        return delay

    def recovered(self) -> None:
        self.failures = 0
        if self.reason is None:
            return
        self.reason = None
        log.info("backend %s: up again", self.name, extra={"backend": self.name})
        self._notify(True)

    def refusal(self) -> BackendDown:
        return BackendDown(self.name, f"down ({self.reason}); retrying in the background")

    def _notify(self, up: bool) -> None:
        self._changed.set()
        self._changed = anyio.Event()
        if self.on_change is not None:
            self.on_change(up)

    async def changed(self) -> None:
        """Until the next change of state."""
        await self._changed.wait()

    async def wait(self, *, down: bool) -> None:
        while self.down != down:
            await self.changed()


async def _ignore(_: Message) -> None:
    return None


class Guarded(Layer[Backend]):
    """A backend (HTTP, HTTP+SSE) behind its `Health`: down when a request finds it unreachable
    (`BackendUnavailable` while the transport says it is not up), then failed at once and retried
    in the background. A `supervised` one (stdio) is retried by its transport, which reports to
    the same `Health`; here its requests only fail at once while it is down."""

    def __init__(self, inner: Backend, health: Health, *, supervised: bool = False) -> None:
        super().__init__(inner)
        self.health = health
        self._supervised = supervised

    @property
    def up(self) -> bool:
        return not self.health.down and self.inner.up

    async def run(self) -> None:
        if self._supervised:
            await self.inner.run()
            return
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.inner.run)
            tg.start_soon(self._retry)

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        health = self.health
        if health.reason is not None:
            raise health.refusal()
        try:
            return await self.inner.request(msg, sink, call, long_lived=long_lived)
        except BackendUnavailable as exc:
            refusal = self.unreachable(exc)
            if refusal is None:
                raise
            raise refusal from None  # (logged just now: not again by the caller)

    def unreachable(self, exc: BackendUnavailable) -> BackendDown | None:
        """A request found the backend unavailable: when that makes it down (an unsupervised
        transport that says it is not up), marked so and the refusal to raise in its place;
        None when `exc` goes on as it is. (A step of `request`; the fused stack's too.)"""
        if self._supervised or isinstance(exc, BackendDown) or self.inner.up:
            return None
        self.health.failed(_detail(exc))
        return self.health.refusal()

    async def notify(self, msg: Message) -> None:
        if self.health.down:
            raise self.health.refusal()
        await self.inner.notify(msg)

    async def _retry(self) -> None:
        health = self.health
        while True:
            await health.wait(down=True)
            await anyio.sleep(retry_delay(health.failures))
            try:
                await self.inner.request(_discover(), _ignore, GATEWAY_CALL)
            except BackendUnavailable as exc:
                if not self.inner.up:
                    health.failed(_detail(exc))
                    continue
            except BackendError:
                pass  # it answered, if badly: reachable, and the requests say the rest
            health.recovered()


def _discover() -> Message:
    return {
        "jsonrpc": "2.0",
        "id": "gateway-retry",
        "method": "server/discover",
        "params": {"_meta": meta.gateway_meta({"name": "mcp-gateway", "version": __version__})},
    }


def _detail(exc: BackendError) -> str:
    """The error without its "backend 'x': " prefix (the log line names the backend)."""
    text = str(exc)
    prefix = f"backend {exc.backend!r}: "
    return text.removeprefix(prefix)
