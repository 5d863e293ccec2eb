"""Calls on a legacy backend held for client input (basic/patterns/mrtr).

A request the backend sends mid-call (elicitation, sampling, roots) ends the client's call
with an `input_required` result whose sealed `requestState` names the held backend call; the
client's retry answers the held request and waits on for the final result. The call runs in a
task of its own meanwhile, so it outlives the client request that started it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from gateway.backends.base import Call, NotificationSink
from gateway.backends.channel import Wakeup
from gateway.backends.era import questions
from gateway.backends.era.link import Link
from gateway.backends.era.translate import INPUT_METHODS, required_capability, to_modern
from gateway.config import Root
from gateway.errors import BackendError, Refused
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

# How long a call held for client input waits for the client's retry.
HOLD_TTL = 120.0
# The refusal of a retry whose held call is not here. The reason most worth telling (to an
# operator whose load balancer spreads one client's requests over replicas, or who restarted
# the gateway) is the one the client cannot see: the call lives in one gateway process.
UNKNOWN_STATE = (
    "requestState is unknown, expired or not yours (a call held for a legacy backend "
    "continues only in the gateway process that started it)"
)


class Sealer:
    """Tamper-proof, caller-bound, expiring `requestState` tokens (basic/patterns/mrtr: the
    client sends the state back; it must not be able to forge or reuse someone else's).

    The key stays the process's own even under `cluster.secrets`: the state names a call held
    in this process's memory, which no other replica could continue, so a shared key would
    buy nothing, and it would let whoever learnt a cluster secret re-seal someone else's
    handle (readable in the payload) for themselves. A retry that reaches another replica
    is refused like any unknown state (-32602), saying where the call lives."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def seal(self, handle: str, caller: str, expires: float) -> str:
        payload = orjson.dumps([handle, caller, expires])
        mac = hmac.new(self._key, payload, hashlib.sha256).digest()
        return f"{_b64(payload)}.{_b64(mac)}"

    def open(self, token: str, caller: str, now: float) -> str | None:
        """The handle in `token` if it is ours, unexpired and `caller`'s; else None."""
        try:
            payload_text, mac_text = token.split(".")
            payload = base64.urlsafe_b64decode(payload_text + "==")
            mac = base64.urlsafe_b64decode(mac_text + "==")
        except ValueError:
            return None
        expected = hmac.new(self._key, payload, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            return None
        handle, owner, expires = orjson.loads(payload)
        if owner != caller or now >= expires:
            return None
        return str(handle)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


class HeldCall(Wakeup):
    """A request on a legacy backend, which may outlive the client request that started it
    while it waits for the client's answers."""

    def __init__(self, calls: HeldCalls, link: Link, made_for: Call, capabilities: object) -> None:
        super().__init__()
        self._calls = calls
        self.link = link
        # The client request that started it: what its answers to the backend are sent for.
        self.made_for = made_for
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        # Given when the call is first held (`HeldCalls._hold`): most calls finish without
        # asking anything, and need neither a random handle nor the caller's digest.
        self.handle = ""
        self.caller = ""
        self.sink: NotificationSink | None = None
        self.asks: dict[str, Message] = {}
        self.task: asyncio.Task[Message] | None = None
        self.missing: dict[str, Any] | None = None  # a capability the client lacks
        self.expiry: asyncio.TimerHandle | None = None

    def finished(self, task: asyncio.Task[Message]) -> None:
        if not task.cancelled():
            task.exception()  # read by whoever attends; a call nobody came back for is not logged
        self.wake()

    async def on_message(self, msg: Message) -> None:
        """What the backend sends during the call: its questions, progress, logs."""
        method = msg.get("method")
        if "id" not in msg:
            if method == meta.RESOURCE_UPDATED or str(method).endswith("/list_changed"):
                self._calls.unsolicited(self._calls.name, msg)  # for listens, not this call
            elif self.sink is not None:
                await self.sink(msg)
            return
        if method == "ping":
            await self.link.send(jsonrpc.result(msg["id"], {}), self.made_for)
            return
        capability = INPUT_METHODS.get(str(method))
        if capability is None or capability not in self.capabilities:
            answer = questions.unattended(msg, self._calls.roots)
            if answer is not None:
                # roots/list from a client without roots (the gateway's own catalog requests
                # among them): the configured roots, as outside any request.
                await self.link.send(answer, self.made_for)
                return
            if capability is not None and self.missing is None:
                # The client is told what it lacks (basic/patterns/mrtr), as from a modern server.
                self.missing = required_capability(capability, jsonrpc.params(msg))
                self.wake()
            refusal = f"The client cannot answer {method}"
            await self.link.send(
                jsonrpc.error(msg["id"], codes.METHOD_NOT_FOUND, refusal), self.made_for
            )
            return
        self.asks[f"{self._calls.name}-{msg['id']}"] = msg
        self.wake()


class HeldCalls:
    """The calls of one backend that wait for their clients' answers, by handle."""

    def __init__(
        self,
        name: str,
        unsolicited: Callable[[str, Message], None],
        roots: tuple[Root, ...] = (),
    ) -> None:
        self.name = name
        # The backend's configured `roots:`, for a roots/list no client of the call can answer.
        self.roots = roots
        # Where change notifications that arrive inside a call go (the listens).
        self.unsolicited = unsolicited
        self._held: dict[str, HeldCall] = {}
        self._sealer = Sealer()
        self._background: set[asyncio.Task[None]] = set()  # held so they are not collected

    def __len__(self) -> int:
        return len(self._held)

    def new(self, link: Link, made_for: Call, capabilities: object) -> HeldCall:
        return HeldCall(self, link, made_for, capabilities)

    def start(self, call: HeldCall, task: asyncio.Task[Message]) -> None:
        call.task = task
        task.add_done_callback(call.finished)

    async def attend(self, call: HeldCall, msg: Message) -> Message:
        """Wait for the call to finish or to ask the client something."""
        assert call.task is not None
        try:
            while True:
                if call.missing is not None:
                    self.cancel(call)
                    return jsonrpc.error(
                        msg["id"],
                        codes.MISSING_REQUIRED_CLIENT_CAPABILITY,
                        "The request needs a capability the client did not declare",
                        {"requiredCapabilities": call.missing},
                    )
                if call.task.done():
                    return to_modern(call.task.result(), msg["id"])
                if call.asks:
                    return self._hold(call, msg["id"])
                await call.wait()
        except asyncio.CancelledError:
            if call.handle not in self._held:
                self.cancel(call)
            raise

    def _hold(self, call: HeldCall, id_: jsonrpc.RequestId) -> Message:
        call.sink = None  # progress while nobody waits is dropped
        if not call.handle:
            call.handle = secrets.token_urlsafe(16)
            call.caller = call.made_for.origin.caller()
        self._held[call.handle] = call
        loop = asyncio.get_running_loop()
        if call.expiry is not None:
            call.expiry.cancel()
        call.expiry = loop.call_later(HOLD_TTL, self._expire, call.handle)
        requests = {
            key: {"method": ask["method"], "params": ask.get("params") or {}}
            for key, ask in call.asks.items()
        }
        state = self._sealer.seal(call.handle, call.caller, time.time() + HOLD_TTL)
        result = {"resultType": "input_required", "inputRequests": requests, "requestState": state}
        return jsonrpc.result(id_, result)

    async def resume(self, msg: Message, sink: NotificationSink, retry: Call) -> Message:
        """A retry carrying `requestState`: answer the held call's questions (for the retry's
        caller, who may present a refreshed token), attend it again."""
        caller = retry.origin.caller()
        params = jsonrpc.params(msg)
        state = params.get("requestState")
        handle = self._sealer.open(state, caller, time.time()) if isinstance(state, str) else None
        call = self._held.pop(handle, None) if handle is not None else None
        if call is None:
            raise Refused(codes.INVALID_PARAMS, UNKNOWN_STATE)
        if call.expiry is not None:
            call.expiry.cancel()
            call.expiry = None
        answers = params.get("inputResponses")
        answers = answers if isinstance(answers, dict) else {}
        for key, ask in list(call.asks.items()):
            if key in answers:
                del call.asks[key]
                answer = {"jsonrpc": "2.0", "id": ask["id"], "result": answers[key]}
                await call.link.send(answer, retry)
        call.sink = sink
        return await self.attend(call, msg)

    def cancel(self, call: HeldCall) -> None:
        """Give the call up (the transport sends the backend `notifications/cancelled` under
        the id it gave the request: channel.py, http_session.py)."""
        if call.task is not None:
            call.task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _expire(self, handle: str) -> None:
        call = self._held.pop(handle, None)
        if call is None:
            return
        log.info("backend %s: a call held for client input expired", self.name)
        self._spawn(self._abandon(call))

    async def _abandon(self, call: HeldCall) -> None:
        for ask in call.asks.values():
            await _send_quietly(
                call.link,
                jsonrpc.error(ask["id"], codes.INTERNAL_ERROR, "No answer in time"),
                call.made_for,
            )
        self.cancel(call)


async def _send_quietly(link: Link, msg: Message, call: Call) -> None:
    with contextlib.suppress(BackendError):
        await link.send(msg, call)
