"""A backend wrapped so that every request it carries is a CLIENT observation whose trace context
travels with the request (`_meta` on every transport; the HTTP backend also mirrors it into
headers). The traffic tap is not here: below this the era layer translates for a legacy backend
and the transport renumbers, so the transports record what they write and read."""

from __future__ import annotations

import anyio

from gateway.backends.base import Backend, Call, Layer, NotificationSink
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Observation, Telemetry


class InstrumentedBackend(Layer[Backend]):
    def __init__(
        self, inner: Backend, telemetry: Telemetry, address: tuple[str, int] | None = None
    ) -> None:
        super().__init__(inner)
        self._telemetry = telemetry
        self._address = address

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        observed = call.observation.route(msg, self.name) or self.observe(msg, call)
        reply: Message | None = None
        try:
            if carrier := observed.carrier():
                msg = carried(carrier, msg)
            reply = await self.inner.request(msg, sink, call, long_lived=long_lived)
        except anyio.get_cancelled_exc_class():
            # The client went away (or the gateway stopped waiting): not the backend's failure.
            observed.cancel()
            raise
        except BaseException:
            observed.end(None)
            raise
        observed.end(reply)
        return reply

    # The steps of `request`, also taken by the fused stack (core/fused.py) in its frame.

    def observe(self, msg: Message, call: Call) -> Observation:
        """The request's CLIENT observation, begun (where its client request's observation
        does not keep it: `Observation.route`, tried first)."""
        return self._telemetry.client(
            msg, self.name, self.transport, self._address, call.observation
        )


def carried(carrier: dict[str, str], msg: Message) -> Message:
    """The request with an observation's trace context (`carrier`, not empty) in its `_meta`."""
    params = jsonrpc.params(msg)
    return {**msg, "params": {**params, "_meta": {**jsonrpc.meta(msg), **carrier}}}
