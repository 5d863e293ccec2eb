"""Request bookkeeping for a backend that carries every message on one channel: a child's
stdin/stdout (stdio) or the 2024-11-05 HTTP+SSE transport's stream and POST endpoint.

Each front-end request gets its own id (and progress token) on this hop, so two clients both
using id 1 never see each other's replies. Replies and notifications come back in `on_message`
and find their request by that id; the transport subclasses only say how a message goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gateway import timers
from gateway.backends.base import Call, NotificationSink
from gateway.backends.era import questions
from gateway.config import Root
from gateway.errors import BackendError, BackendProtocolError, BackendTimeout, BackendUnavailable
from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Telemetry

log = logging.getLogger("gateway.backend")

# Notifications queued for one request while its client reads slowly; beyond this, progress and
# log notifications (which later ones supersede) are dropped rather than stalling the backend.
REQUEST_QUEUE = 256


class Wakeup:
    """Something one task waits on and another wakes, any number of times: a plain future per
    wait, no event or condition object."""

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        self._waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class _Pending(Wakeup):
    """One request in flight: its reply, and the messages its client has not yet been given.
    A plain future and deque: no stream or task per request."""

    __slots__ = (
        "asked",
        "client_id",
        "client_token",
        "done",
        "dropped",
        "error",
        "failure",
        "long_lived",
        "notes",
        "reply",
        "wants_logs",
    )

    def __init__(
        self,
        client_id: jsonrpc.RequestId,
        client_token: object,
        wants_logs: bool,
        long_lived: bool,
    ):
        super().__init__()
        self.client_id = client_id
        self.client_token = client_token
        self.wants_logs = wants_logs
        self.long_lived = long_lived
        # Ids of the server's questions this request is waiting for the client to answer.
        self.asked: set[object] = set()
        self.reply: Message | None = None
        self.failure = ""
        self.error: type[BackendError] = BackendUnavailable
        self.dropped = 0
        self.notes: deque[Message] = deque()
        self.done = False

    def finish(
        self,
        reply: Message | None,
        failure: str = "",
        error: type[BackendError] = BackendUnavailable,
    ) -> None:
        if self.done:
            return  # the first outcome stands: a second reply, a late timeout or failure
        self.reply, self.failure, self.error, self.done = reply, failure, error, True
        self.wake()

    def timed_out(self) -> None:
        self.finish(None)

    def push(self, note: Message) -> None:
        if self.done:
            return
        if len(self.notes) >= REQUEST_QUEUE:
            self.dropped += 1
            return
        self.notes.append(note)
        self.wake()


class Channel:
    """What stdio and HTTP+SSE backends share: ids, pending requests, message routing."""

    name: str
    transport: str

    def __init__(self, name: str, request_timeout: float) -> None:
        self.name = name
        self._request_timeout = request_timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._last_problem = "not started yet"
        # Receives notifications that belong to no request (e.g. list changes).
        self.on_notification: Callable[[str, Message], None] | None = None
        # Set for a legacy server: its requests to the client (elicitation, sampling, roots) go
        # to the one request in flight, as messages of that request; a modern one sends none.
        self.takes_requests = False
        # What `roots/list` is answered with when no client's request takes it (set by
        # era/layer.py from the backend's `roots:`).
        self.roots: tuple[Root, ...] = ()
        # Run on every new connection (child, stream) before it takes requests: the legacy
        # era's handshake. A BackendError from it drops the connection, to be made again.
        self.on_start: Callable[[], Awaitable[None]] | None = None
        # The traffic tap, when it is on (set by gateway/app/): the subclasses record each message
        # where they write or read it, with this hop's ids, as the server sees it.
        self.tap: Telemetry | None = None
        # The running loop's coarse timers, looked up once per loop (a channel is built before
        # its loop runs, and a test may run it in more than one).
        self._wheel: tuple[asyncio.AbstractEventLoop, timers.Wheel] | None = None

    @property
    def _timers(self) -> timers.Wheel:
        loop = asyncio.get_running_loop()
        held = self._wheel
        if held is None or held[0] is not loop:
            held = self._wheel = (loop, timers.wheel(loop))
        return held[1]

    # --- what a transport provides -----------------------------------------------------------

    async def _write(self, msg: Message, origin: Origin) -> None:
        """Send one message made for `origin`, waiting while the channel is backed up."""
        raise NotImplementedError

    def _put(self, msg: Message, origin: Origin) -> Awaitable[None] | None:
        """`_write` where the transport can write at once: None when the message went out
        without a wait, else what to await (a transport that always waits hands `_write`)."""
        return self._write(msg, origin)

    def _ready_now(self) -> bool:
        """Whether requests may go out now, without waiting for `_wait_ready`."""
        return False

    def _send_soon(self, msg: Message, origin: Origin) -> None:
        """Send one message without waiting (cancellations, refusals); failures are dropped."""
        raise NotImplementedError

    async def _wait_ready(self) -> None:
        raise NotImplementedError

    # --- inbound ---------------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        kind = jsonrpc.kind(msg)
        if kind is jsonrpc.Kind.RESPONSE:
            pending = self._pending.get(msg["id"]) if isinstance(msg["id"], int) else None
            if pending is None:
                log.debug("backend %s: reply for unknown id %r dropped", self.name, msg["id"])
                return
            if pending.done:
                # A second answer to one request: the first one wins, result or error.
                log.warning("backend %s: dropped a second reply to id %r", self.name, msg["id"])
                return
            msg["id"] = pending.client_id
            pending.finish(msg)
        elif kind is jsonrpc.Kind.NOTIFICATION:
            self._on_notification(msg)
        else:
            self._on_request(msg)

    def _on_request(self, msg: Message) -> None:
        # This transport does not say which request a server's question belongs to; only with
        # one request in flight is it certain (a guess could show it to the wrong user). A
        # request whose earlier question is still unanswered waits for its client, not on.
        calls = (
            [p for p in self._pending.values() if not p.long_lived and not p.asked]
            if self.takes_requests and msg["method"] != "ping"
            else []
        )
        if len(calls) == 1:
            calls[0].asked.add(msg["id"])
            calls[0].push(msg)
            return
        # Asked outside any request (start-up, idle) or for an unknown one: ping and roots/list
        # have an answer of the gateway's own (roots: the configured ones, never a client's).
        answer = questions.unattended(msg, self.roots)
        if answer is not None:
            with contextlib.suppress(BackendUnavailable):
                self._send_soon(answer, GATEWAY_ORIGIN)
        elif not self.takes_requests:
            # A modern server never sends requests (transports/stdio, Receiving Messages).
            self._refuse(msg, codes.METHOD_NOT_FOUND, "The gateway accepts no requests")
        else:
            self._refuse(
                msg, codes.INTERNAL_ERROR, "The gateway cannot tell which request this is for"
            )

    def _refuse(self, msg: Message, code: int, message: str) -> None:
        with contextlib.suppress(BackendUnavailable):
            self._send_soon(jsonrpc.error(msg["id"], code, message), GATEWAY_ORIGIN)

    def _on_notification(self, msg: Message) -> None:
        method = msg["method"]
        params = jsonrpc.params(msg)
        target: _Pending | None = None
        if method == "notifications/progress":
            token = params.get("progressToken")
            target = self._pending.get(token) if isinstance(token, int) else None
            if target is not None:
                msg["params"] = {**params, "progressToken": target.client_token}
        elif isinstance(sub := jsonrpc.meta(msg).get(meta.SUBSCRIPTION_ID), int):
            target = self._pending.get(sub)  # a listen stream's acknowledgement or notification
        elif method == "notifications/message":
            # A log message carries no request id here; it can only belong to a request that
            # asked for logs, and is delivered only when exactly one such request is in flight.
            askers = [p for p in self._pending.values() if p.wants_logs]
            target = askers[0] if len(askers) == 1 else None
        if target is None:
            if self.on_notification is not None:
                self.on_notification(self.name, msg)
            else:
                log.debug("backend %s: notification %s matched no request", self.name, method)
            return
        target.push(msg)

    def _reply_unusable(self, bid: object, detail: str) -> None:
        """The reply to `bid` came but cannot be read: its request fails now (-31003, as an
        HTTP backend's unreadable reply), instead of waiting out its timeout."""
        pending = self._pending.get(bid) if type(bid) is int else None
        if pending is None:
            return
        if pending.done:
            log.warning("backend %s: dropped a second reply to id %r", self.name, bid)
            return
        pending.finish(None, detail, BackendProtocolError)

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.finish(None, reason)

    # --- outbound --------------------------------------------------------------------------

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,
    ) -> Coroutine[Any, Any, Message]:
        # A plain function handing back the exchange: no coroutine frame of its own on every
        # request while the channel is ready (the common case).
        if not self._ready_now():
            return self._request_when_ready(msg, sink, call, long_lived, wants_logs)
        within = self._within(call, long_lived)
        return self.exchange(msg, sink, within, wants_logs=wants_logs, origin=call.origin)

    async def _request_when_ready(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        long_lived: bool,
        wants_logs: bool | None,
    ) -> Message:
        await self._wait_ready()
        within = self._within(call, long_lived)
        return await self.exchange(msg, sink, within, wants_logs=wants_logs, origin=call.origin)

    def _within(self, call: Call, long_lived: bool) -> float | None:
        """A request's deadline in seconds: its call's, or the backend's; none for a listen."""
        if long_lived:
            return None
        return self._request_timeout if call.deadline is None else call.deadline

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
        origin: Origin = GATEWAY_ORIGIN,
    ) -> Message:
        """One request, whether or not the backend is ready for others (its opening handshake
        uses this, as the gateway's own); `within` (seconds) is None for a listen stream."""
        bid = next(self._ids)
        # (jsonrpc.params and .meta inlined: on every request)
        params = found if isinstance(found := msg.get("params"), dict) else {}
        req_meta = found if isinstance(found := params.get("_meta"), dict) else {}
        token = req_meta.get(meta.PROGRESS_TOKEN)
        out = {**msg, "id": bid}
        if token is not None:
            out["params"] = {**params, "_meta": {**req_meta, meta.PROGRESS_TOKEN: bid}}
        logs = meta.LOG_LEVEL in req_meta if wants_logs is None else wants_logs
        pending = _Pending(msg["id"], token, logs, within is None)
        self._pending[bid] = pending
        # A coarse timer that finishes the request with a timeout (timers.py: an insert and a
        # delete, where a loop timer or a cancel scope costs a heap entry per request).
        timer = None if within is None else self._timers.call_later(within, pending.timed_out)
        try:
            waiting = self._put(out, origin)
            if waiting is not None:
                await waiting
            while True:
                while pending.notes:
                    await sink(pending.notes.popleft())
                if pending.done:
                    break
                await pending.wait()
        except asyncio.CancelledError:
            if not pending.done:
                self._cancel_remote(bid, "cancelled by the client", origin)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(bid, None)
        if pending.dropped:
            log.warning(
                "backend %s: %d notifications dropped for a slow client", self.name, pending.dropped
            )
        if pending.reply is None:
            if not pending.failure:
                self._cancel_remote(bid, "timed out at the gateway", origin)
                raise BackendTimeout(self.name, f"no reply within {within:g}s")
            raise pending.error(self.name, pending.failure)
        return pending.reply

    def _cancel_remote(self, bid: int, reason: str, origin: Origin) -> None:
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": bid, "reason": reason},
        }
        with contextlib.suppress(BackendUnavailable):
            self._send_soon(note, origin)

    async def notify(self, msg: Message) -> None:
        await self._wait_ready()
        await self._write(msg, GATEWAY_ORIGIN)

    async def send(self, msg: Message, call: Call) -> None:
        """Send a message outside any request, ready or not: an answer to the server's own
        request (its id is the server's), or the handshake's `notifications/initialized`.
        (A channel sends for whoever `call` is alike.)"""
        if "method" not in msg:
            for pending in self._pending.values():
                pending.asked.discard(msg.get("id"))
        await self._write(msg, call.origin)

    async def ready(self) -> None:
        await self._wait_ready()

    @property
    def in_flight(self) -> int:
        return len(self._pending)
