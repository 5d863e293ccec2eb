"""The common top of a backend's stack in one coroutine frame.

A request passes the overload bound, the CLIENT observation, the first try of the resilience
layer and the health guard (app/wiring.py `build_stack`), each a `Layer` whose `request` is a
coroutine frame, and every frame of the chain is suspended and resumed at every wait of the
request (bench/README, issue 34). `FusedBackend` takes the same steps in one frame: each layer
exposes its steps as plain methods (`Bound.queue`/`release`, `InstrumentedBackend.observe` and
`carried`, `Resilient.retry`/`passed`, `Guarded.unreachable`), so their logic is written once.
It is built over the separate chain (`inner`), which serves what the fusion leaves out: a
listen stream, `up`, `run`, `notify`, and the retries after a failed first try (through the
resilience layer and the guard as they are). Built only where the resilience layer, if any,
has no tool timeouts and no breaker: a first try is then the guard's request as it is.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.core.instrument import InstrumentedBackend, carried
from gateway.core.overload import Bound
from gateway.errors import BackendError, BackendUnavailable
from gateway.protocol.jsonrpc import Message


class _Health(Protocol):
    @property
    def reason(self) -> str | None: ...

    def refusal(self) -> BackendError: ...


class Guard(Protocol):
    """What the fusion takes of the health guard (backends/health.py `Guarded`)."""

    @property
    def health(self) -> _Health: ...

    @property
    def inner(self) -> Backend: ...

    def unreachable(self, exc: BackendUnavailable) -> BackendError | None: ...


class Retries(Protocol):
    """What the fusion takes of the resilience layer (backends/resilience.py `Resilient`)."""

    async def retry(
        self, msg: Message, sink: NotificationSink, call: Call, failed: BackendError, started: float
    ) -> Message: ...

    def passed(self, msg: Message, reply: Message) -> None: ...


class FusedBackend(Layer[Backend]):
    """Bound, observation, first try and guard in one frame, over the separate chain `inner`
    (whose top is the `BoundedBackend` of `bound`)."""

    def __init__(
        self,
        inner: Backend,
        bound: Bound,
        instrumented: InstrumentedBackend,
        retries: Retries | None,
        guard: Guard,
    ) -> None:
        super().__init__(inner)
        self.bound = bound
        self._instrumented = instrumented
        self._retries = retries
        self._guard = guard
        self._health = guard.health
        self._below = guard.inner

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        if long_lived:  # (a listen stream: no bound, no retries; the chain as it is)
            return await self.inner.request(msg, sink, call, long_lived=True)
        bound = self.bound
        if bound.busy < bound.limit:
            bound.busy += 1
        else:
            await bound.queue()
        try:
            observed = call.observation.route(msg, self.name) or self._instrumented.observe(
                msg, call
            )
            reply: Message | None = None
            try:
                if carrier := observed.carrier():
                    msg = carried(carrier, msg)
                retries = self._retries
                started = time.monotonic() if retries is not None else 0.0  # (Resilient's clock)
                try:
                    health = self._health
                    if health.reason is not None:
                        raise health.refusal()
                    try:
                        reply = await self._below.request(msg, sink, call)
                    except BackendUnavailable as exc:
                        refusal = self._guard.unreachable(exc)
                        if refusal is None:
                            raise
                        raise refusal from None  # (logged by the guard: not again)
                except BackendError as exc:
                    if retries is None:
                        raise
                    reply = await retries.retry(msg, sink, call, exc, started)
                if retries is not None:
                    retries.passed(msg, reply)
            except anyio.get_cancelled_exc_class():
                # The client went away (or the gateway stopped waiting): not the backend's failure.
                observed.cancel()
                raise
            except BaseException:
                observed.end(None)
                raise
            observed.end(reply)
            return reply
        finally:
            bound.release()
