"""A backend of either protocol era, shown to the engine as a modern one (basic/versioning,
Backward Compatibility with Initialization-Based Versions).

The era is probed once (`server/discover`, waiting up to `connect_timeout` for the answer;
anything but a recognised modern answer means legacy) unless the config pins it, and remembered
until the backend fails to open under it. A modern error to the `initialize` that follows
(e.g. -32020 for the missing MCP-Protocol-Version header) still proves a modern server: it is
served modern, with a discovery result made from its answers if it has no `server/discover`
of its own (discovery.py).
A legacy backend gets an `initialize` handshake (after every child restart; again when an HTTP
backend has forgotten the session) and each request is translated on the way:

- the modern `_meta` fields go (the session carries them); results gain `resultType`;
- `server/discover` is answered from the `initialize` result;
- a request the backend sends mid-call (elicitation, sampling, roots) ends the client's call
  with an `input_required` result whose sealed `requestState` names the held backend call; the
  client's retry answers the held request and waits on for the final result;
- `subscriptions/listen` is served from the session's own change notifications and
  `resources/subscribe`.

A modern backend costs one comparison per request here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from gateway import __version__
from gateway.backends import discovery, questions
from gateway.backends.base import NotificationSink
from gateway.backends.channel import Channel, Wakeup
from gateway.config import BackendConfig
from gateway.errors import (
    BackendError,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    Refused,
    SessionExpired,
)
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import SERVING

log = logging.getLogger("gateway.backend")

# How long a call held for client input waits for the client's retry.
HOLD_TTL = 120.0
GATEWAY_INFO = {"name": "mcp-gateway", "version": __version__}
# What the gateway offers a legacy backend on behalf of all its clients; a client without the
# capability gets no question, and the backend an error for it, but for roots: those are always
# answered, with the backend's `roots:` where no client's can be asked. No `listChanged`: the
# gateway never tells a backend its roots changed (a client's change reaches a backend with the
# next question asked in that client's request).
GATEWAY_CAPABILITIES: dict[str, Any] = {
    "elicitation": {"form": {}, "url": {}},
    "sampling": {},
    "roots": {},
}
# Server-to-client requests and the client capability each needs.
INPUT_METHODS = {
    "elicitation/create": "elicitation",
    "sampling/createMessage": "sampling",
    "roots/list": "roots",
}
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
LIST_FLAGS = meta.LIST_FLAGS
ACKNOWLEDGED = meta.ACKNOWLEDGED
UPDATED = meta.RESOURCE_UPDATED
# The GET stream is opened again after it ends: quick first, doubling to a ceiling, reset once a
# stream has lasted a while.
FIRST_RETRY = 0.1
MAX_RETRY = 10.0
STABLE_AFTER = 30.0
# Change notifications queued for one listen whose client reads slowly; beyond, they are dropped.
LISTEN_QUEUE = 256


class Link(Protocol):
    """What the era layer needs of a transport (stdio, HTTP, HTTP+SSE)."""

    name: str
    transport: str
    on_notification: Callable[[str, Message], None] | None
    takes_requests: bool

    @property
    def up(self) -> bool: ...

    async def run(self) -> None: ...

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,
    ) -> Message: ...

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message: ...

    async def notify(self, msg: Message) -> None: ...

    async def send(self, msg: Message) -> None: ...


@dataclass
class LegacySession:
    version: str
    capabilities: dict[str, Any]
    server_info: dict[str, Any]
    instructions: str | None


class Sealer:
    """Tamper-proof, caller-bound, expiring `requestState` tokens (basic/patterns/mrtr: the
    client sends the state back; it must not be able to forge or reuse someone else's)."""

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


def is_modern_answer(reply: Message) -> bool:
    """A DiscoverResult, or an error only a modern server sends."""
    return discovery.is_discover_result(reply) or discovery.is_modern_error(reply)


def to_legacy(msg: Message) -> Message:
    """The request without the modern era's per-request fields (the session carries them)."""
    params = jsonrpc.params(msg)
    out_params = {k: v for k, v in params.items() if k not in ("inputResponses", "requestState")}
    fields = {
        k: v for k, v in jsonrpc.meta(msg).items() if not k.startswith("io.modelcontextprotocol/")
    }
    if fields:
        out_params["_meta"] = fields
    else:
        out_params.pop("_meta", None)
    out = {k: v for k, v in msg.items() if k != "params"}
    if out_params or "params" in msg:
        out["params"] = out_params
    return out


def required_capability(capability: str, params: dict[str, Any]) -> dict[str, Any]:
    """The `requiredCapabilities` of a question the client cannot answer."""
    if capability == "elicitation":
        return {"elicitation": {params.get("mode") if params.get("mode") == "url" else "form": {}}}
    return {capability: {}}


def discover_result(session: LegacySession) -> dict[str, Any]:
    result: dict[str, Any] = {
        "resultType": "complete",
        "supportedVersions": [meta.MODERN_VERSION],
        "capabilities": session.capabilities,
        "_meta": {meta.SERVER_INFO: session.server_info},
    }
    if session.instructions is not None:
        result["instructions"] = session.instructions
    return result


async def _ignore(_: Message) -> None:
    return None


class _Call(Wakeup):
    """A request on a legacy backend, which may outlive the client request that started it
    while it waits for the client's answers."""

    def __init__(self, era: EraBackend, caller: str, capabilities: object) -> None:
        super().__init__()
        self._era = era
        self.caller = caller
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        self.handle = secrets.token_urlsafe(16)
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
            if method == UPDATED or str(method).endswith("/list_changed"):
                self._era.unsolicited(self._era.name, msg)  # for listens, not this call
            elif self.sink is not None:
                await self.sink(msg)
            return
        if method == "ping":
            await self._era.inner.send(jsonrpc.result(msg["id"], {}))
            return
        capability = INPUT_METHODS.get(str(method))
        if capability is None or capability not in self.capabilities:
            answer = questions.unattended(msg, self._era.roots)
            if answer is not None:
                # roots/list from a client without roots (the gateway's own catalog requests
                # among them): the configured roots, as outside any request.
                await self._era.inner.send(answer)
                return
            if capability is not None and self.missing is None:
                # The client is told what it lacks (basic/patterns/mrtr), as from a modern server.
                self.missing = required_capability(capability, jsonrpc.params(msg))
                self.wake()
            refusal = f"The client cannot answer {method}"
            await self._era.inner.send(jsonrpc.error(msg["id"], codes.METHOD_NOT_FOUND, refusal))
            return
        self.asks[f"{self._era.name}-{msg['id']}"] = msg
        self.wake()


class _Listener:
    def __init__(self, flags: dict[str, bool], uris: set[str]) -> None:
        self.flags = flags
        self.uris = uris
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue(LISTEN_QUEUE)

    def offer(self, note: Message | None) -> None:
        """A notification (dropped when the client is too far behind), or None: the end, which
        must arrive, so it takes the place of the oldest queued notification if need be."""
        if note is None and self.queue.full():
            self.queue.get_nowait()
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(note)


class EraBackend:
    """Wraps a transport; see the module docstring."""

    def __init__(self, inner: Link, config: BackendConfig) -> None:
        self.inner = inner
        self.name = inner.name
        self.transport = inner.transport
        self._pinned = config.era != "auto"
        self.roots = config.roots
        self.era: str | None = None if config.era == "auto" else config.era
        # stdio and HTTP+SSE open once per connection (on_start); HTTP on first use.
        self._channel = isinstance(inner, Channel)
        self._open_timeout = config.connect_timeout + config.request_timeout
        # A legacy server may stay silent on a method it does not know (transports/stdio,
        # Backward Compatibility); a slow starter is silent too until it has started. The
        # probe waits as long as the backend is given to start.
        self._probe_timeout = config.connect_timeout
        # Modern without a `server/discover` of its own: the versions its error named (or
        # None), and the discovery result made for it once.
        self._no_discover: list[str] | None = None
        self._made_discover: dict[str, Any] | None = None
        self.session: LegacySession | None = None
        self._opening: asyncio.Lock | None = None
        self._level: str | None = None
        self._held: dict[str, _Call] = {}
        self._listeners: set[_Listener] = set()
        self._subscribed: dict[str, int] = {}
        self._sealer = Sealer()
        self._background: set[asyncio.Task[None]] = set()  # held so they are not collected
        # A legacy session is open / has ended (HTTP's GET stream follows them).
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()
        # Receives the backend's notifications that belong to no request (list changes).
        self.on_notification: Callable[[str, Message], None] | None = None
        inner.on_notification = self.unsolicited
        if isinstance(inner, Channel):
            inner.on_start = self._open_channel
            inner.roots = config.roots

    @property
    def up(self) -> bool:
        return self.inner.up

    async def run(self) -> None:
        if self._channel:
            await self.inner.run()
            return
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.inner.run())
            tg.create_task(self._watch())

    async def _watch(self) -> None:
        """HTTP: a legacy session's GET stream, where its change notifications come."""
        delay = FIRST_RETRY
        while True:
            await self.opened.wait()
            started = time.monotonic()
            try:
                offered = await self.inner.watch(self.unsolicited)  # type: ignore[attr-defined]
            except SessionExpired:
                if self.session is not None:
                    self._session_ended()
                continue  # the next request opens a new session
            except BackendError as exc:
                log.info("backend %s: GET stream lost (%s)", self.name, exc)
                offered = True
            if time.monotonic() - started > STABLE_AFTER:
                delay = FIRST_RETRY
            if not offered:
                # No GET stream on this server: changes come only inside calls.
                await self.ended.wait()
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY)

    # --- opening -----------------------------------------------------------------------------

    async def _open_channel(self) -> None:
        """Before a (re)started stdio child or SSE connection takes requests."""
        self._session_ended()
        if self.era == "modern" and not self._pinned:
            self.era = None  # the era is the server process's: a new one is asked again
        if self.era == "modern":
            return
        if self.era is None:
            self.era = await self._probe()
            if self.era == "modern":
                log.info("backend %s: speaks the modern era", self.name)
                return
        try:
            await self._handshake()
        except BackendError:
            if not self._pinned:
                self.era = None  # probe again next time: it may have changed
            raise

    async def _settle(self) -> None:
        """HTTP: probe and open the session on first use (and after it has expired)."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self.era is None:
                self.era = await self._probe()
                if self.era == "modern":
                    log.info("backend %s: speaks the modern era", self.name)
            if self.era == "legacy" and self.session is None:
                try:
                    await self._handshake()
                except BackendError:
                    if not self._pinned:
                        self.era = None
                    raise

    async def _probe(self) -> str:
        self._no_discover = self._made_discover = None
        msg: Message = {
            "jsonrpc": "2.0",
            "id": "gateway-probe",
            "method": "server/discover",
            "params": {"_meta": meta.gateway_meta(GATEWAY_INFO)},
        }
        try:
            reply = await self.inner.exchange(msg, _ignore, self._probe_timeout)
        except (BackendTimeout, BackendProtocolError):
            return "legacy"
        except BackendUnavailable:
            if self._channel or not self.inner.up:
                raise  # not reached at all: nothing learnt
            return "legacy"  # an HTTP refusal without a modern error
        if discovery.is_modern_error(reply):
            self._no_discover = discovery.supported_versions(reply)
            return "modern"
        return "modern" if discovery.is_discover_result(reply) else "legacy"

    def _proven_modern(self, reply: Message) -> bool:
        """A modern error to `initialize` (basic/versioning: a recognised modern error means a
        modern server, however the probe went): modern from now on, unless pinned legacy."""
        if self._pinned or not discovery.is_modern_error(reply):
            return False
        self.era = "modern"
        self._no_discover = discovery.supported_versions(reply) or []
        self._made_discover = None
        end = getattr(self.inner, "end_session", None)
        if end is not None:
            end()
        log.info(
            "backend %s: speaks the modern era (its answer to initialize: %s)",
            self.name,
            jsonrpc.error_code(reply),
        )
        return True

    async def _handshake(self) -> None:
        self._session_ended()
        begin = getattr(self.inner, "begin_session", None)
        if begin is not None:
            begin()
        init: Message = {
            "jsonrpc": "2.0",
            "id": "gateway-initialize",
            "method": "initialize",
            "params": {
                "protocolVersion": meta.LEGACY_VERSIONS[0],
                "capabilities": GATEWAY_CAPABILITIES,
                "clientInfo": GATEWAY_INFO,
            },
        }
        reply = await self.inner.exchange(init, _ignore, self._open_timeout)
        result = reply.get("result")
        if not isinstance(result, dict):
            if self._proven_modern(reply):
                return
            raise BackendProtocolError(self.name, f"initialize failed: {reply.get('error')}")
        version = result.get("protocolVersion")
        if version not in meta.LEGACY_VERSIONS:
            raise BackendProtocolError(self.name, f"initialize answered version {version!r}")
        caps, info = result.get("capabilities"), result.get("serverInfo")
        instructions = result.get("instructions")
        session = LegacySession(
            str(version),
            caps if isinstance(caps, dict) else {},
            info if isinstance(info, dict) else {},
            instructions if isinstance(instructions, str) else None,
        )
        agreed = getattr(self.inner, "agreed", None)
        if agreed is not None:
            agreed(session.version)
        await self.inner.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        self.inner.takes_requests = True
        self.session = session
        self.ended.clear()
        self.opened.set()
        log.info(
            "backend %s: legacy session open (version %s, server %s)",
            self.name,
            version,
            session.server_info.get("name"),
        )

    def _session_ended(self) -> None:
        """The backend forgot the session (restart, expiry): what hung on it ends."""
        self.session = None
        self._level = None
        self._subscribed.clear()
        self.opened.clear()
        self.ended.set()
        for listener in self._listeners:
            listener.offer(None)

    async def _reopen(self, stale: LegacySession) -> None:
        """Open a new session in place of `stale` (once, however many requests found it gone)."""
        if self.session is stale:
            self._session_ended()
        await self._settle()

    # --- requests ----------------------------------------------------------------------------

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        *,
        long_lived: bool = False,
    ) -> Message:
        if self.era == "modern":
            if self._no_discover is not None and msg["method"] == "server/discover":
                return await self._discover_for(msg)
            try:
                return await self.inner.request(msg, sink, long_lived=long_lived)
            except BackendUnavailable:
                if not self._pinned and not self._channel:
                    self.era = None  # remembered until it fails: ask again next time
                raise
        if isinstance(self.inner, Channel):
            await self.inner.ready()
        elif self.era is None or self.session is None:
            await self._settle()
        if self.era == "modern":
            return await self.request(msg, sink, long_lived=long_lived)
        return await self._legacy(msg, sink)

    async def _discover_for(self, msg: Message) -> Message:
        """`server/discover` of a modern backend that serves none (discovery.py)."""
        made = self._made_discover
        if made is None:
            try:
                reply = await self.inner.request(msg, _ignore)
            except BackendUnavailable:
                if not self.inner.up:
                    raise
                reply = {}  # (HTTP 404 without a JSON-RPC body)
            if discovery.is_discover_result(reply):
                self._no_discover = None  # it has one after all (it was only slow to start)
                return reply
            ask = functools.partial(self.inner.request, sink=_ignore)
            made = await discovery.synthesise(ask, GATEWAY_INFO, self._no_discover or None)
            self._made_discover = made
        return jsonrpc.result(msg["id"], copy.deepcopy(made))

    async def notify(self, msg: Message) -> None:
        if self.era == "modern":
            await self.inner.notify(msg)
            return
        if not self._channel and (self.era is None or self.session is None):
            await self._settle()
        await self.inner.notify(to_legacy(msg) if self.era == "legacy" else msg)

    async def _legacy(self, msg: Message, sink: NotificationSink) -> Message:
        session = self.session
        if session is None:
            raise BackendUnavailable(self.name, "the legacy session is not open")
        method = msg["method"]
        if method == "server/discover":
            return jsonrpc.result(msg["id"], discover_result(session))
        if method == "subscriptions/listen":
            return await self._listen(msg, sink, session)
        params = jsonrpc.params(msg)
        caller = SERVING.get()[1].caller()
        if "requestState" in params:
            return await self._resume(msg, sink, caller)
        fields = jsonrpc.meta(msg)
        level = fields.get(meta.LOG_LEVEL)
        if isinstance(level, str):
            await self._lower_level(level, session)
        call = _Call(self, caller, fields.get(meta.CLIENT_CAPABILITIES))
        call.sink = sink
        # (The transport gives the request an id of the gateway's on the backend's session,
        # and tells the backend when it is given up: channel.py, http.py.)
        out = to_legacy(msg)
        call.task = asyncio.get_running_loop().create_task(
            self._run_call(out, call, isinstance(level, str), session)
        )
        call.task.add_done_callback(call.finished)
        return await self._attend(call, msg)

    async def _run_call(
        self,
        out: Message,
        call: _Call,
        wants_logs: bool,
        session: LegacySession,
    ) -> Message:
        try:
            return await self.inner.request(out, call.on_message, wants_logs=wants_logs)
        except SessionExpired:
            await self._reopen(session)
            return await self.inner.request(out, call.on_message, wants_logs=wants_logs)

    async def _attend(self, call: _Call, msg: Message) -> Message:
        """Wait for the call to finish or to ask the client something."""
        assert call.task is not None
        try:
            while True:
                if call.missing is not None:
                    self._cancel(call)
                    return jsonrpc.error(
                        msg["id"],
                        codes.MISSING_REQUIRED_CLIENT_CAPABILITY,
                        "The request needs a capability the client did not declare",
                        {"requiredCapabilities": call.missing},
                    )
                if call.task.done():
                    return self._complete(call.task.result(), msg["id"])
                if call.asks:
                    return self._hold(call, msg["id"])
                await call.wait()
        except asyncio.CancelledError:
            if call.handle not in self._held:
                self._cancel(call)
            raise

    def _complete(self, reply: Message, id_: jsonrpc.RequestId) -> Message:
        reply["id"] = id_
        result = reply.get("result")
        if isinstance(result, dict) and "resultType" not in result:
            jsonrpc.changed(reply)
            result["resultType"] = "complete"
        return reply

    def _hold(self, call: _Call, id_: jsonrpc.RequestId) -> Message:
        call.sink = None  # progress while nobody waits is dropped
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

    async def _resume(self, msg: Message, sink: NotificationSink, caller: str) -> Message:
        params = jsonrpc.params(msg)
        state = params.get("requestState")
        handle = self._sealer.open(state, caller, time.time()) if isinstance(state, str) else None
        call = self._held.pop(handle, None) if handle is not None else None
        if call is None:
            raise Refused(codes.INVALID_PARAMS, "requestState is unknown, expired or not yours")
        if call.expiry is not None:
            call.expiry.cancel()
            call.expiry = None
        answers = params.get("inputResponses")
        answers = answers if isinstance(answers, dict) else {}
        for key, ask in list(call.asks.items()):
            if key in answers:
                del call.asks[key]
                await self.inner.send({"jsonrpc": "2.0", "id": ask["id"], "result": answers[key]})
        call.sink = sink
        return await self._attend(call, msg)

    def _cancel(self, call: _Call) -> None:
        """Give the call up (the transport sends the backend `notifications/cancelled` under
        the id it gave the request)."""
        if call.task is not None:
            call.task.cancel()

    async def _unattended(self, msg: Message) -> None:
        """The sink of a request the gateway makes on its own once the session is open: a
        question it receives is answered as one asked outside any request."""
        if "id" in msg and "method" in msg:
            refusal = "The gateway answers only ping and roots/list itself"
            await self._send_quietly(questions.refuse_unattended(msg, self.roots, refusal))

    async def _send_quietly(self, msg: Message) -> None:
        with contextlib.suppress(BackendError):
            await self.inner.send(msg)

    def _expire(self, handle: str) -> None:
        call = self._held.pop(handle, None)
        if call is None:
            return
        log.info("backend %s: a call held for client input expired", self.name)
        task = asyncio.get_running_loop().create_task(self._abandon(call))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abandon(self, call: _Call) -> None:
        for ask in call.asks.values():
            await self._send_quietly(
                jsonrpc.error(ask["id"], codes.INTERNAL_ERROR, "No answer in time")
            )
        self._cancel(call)

    async def _lower_level(self, level: str, session: LegacySession) -> None:
        """Logging is per session in the legacy era: the most verbose level any request asked
        for (each request still gets only the messages routed to it)."""
        if "logging" not in session.capabilities or level not in LOG_LEVELS:
            return
        if self._level is not None and LOG_LEVELS.index(level) >= LOG_LEVELS.index(self._level):
            return
        self._level = level
        set_level: Message = {
            "jsonrpc": "2.0",
            "id": "gateway-set-level",
            "method": "logging/setLevel",
            "params": {"level": level},
        }
        with contextlib.suppress(BackendError):
            await self.inner.request(set_level, self._unattended)

    # --- change notifications -------------------------------------------------------------

    def unsolicited(self, backend: str, note: Message) -> None:
        """A notification outside any request: to the listens that want it, and upwards."""
        method = note.get("method")
        params = jsonrpc.params(note)
        for listener in self._listeners:
            if method == UPDATED:
                if params.get("uri") in listener.uris:
                    listener.offer(note)
            elif any(listener.flags.get(f) and m == method for f, (_, m) in LIST_FLAGS.items()):
                listener.offer(note)
        if self.on_notification is not None:
            self.on_notification(backend, note)

    async def _listen(
        self, msg: Message, sink: NotificationSink, session: LegacySession
    ) -> Message:
        wanted = jsonrpc.params(msg).get("notifications")
        wanted = wanted if isinstance(wanted, dict) else {}
        caps = session.capabilities
        flags = {
            flag: True
            for flag, (capability, _) in LIST_FLAGS.items()
            if wanted.get(flag) is True and _capability(caps, capability, "listChanged")
        }
        uris: set[str] = set()
        if _capability(caps, "resources", "subscribe"):
            for uri in wanted.get("resourceSubscriptions") or ():
                if isinstance(uri, str) and await self._subscribe(uri):
                    uris.add(uri)
        listener = _Listener(flags, uris)
        self._listeners.add(listener)
        try:
            honoured: dict[str, Any] = dict(flags)
            if uris:
                honoured["resourceSubscriptions"] = sorted(uris)
            ack_meta = {meta.SUBSCRIPTION_ID: msg["id"]}
            await sink(
                {
                    "jsonrpc": "2.0",
                    "method": ACKNOWLEDGED,
                    "params": {"_meta": ack_meta, "notifications": honoured},
                }
            )
            while True:
                note = await listener.queue.get()
                if note is None:
                    raise BackendUnavailable(self.name, "the legacy session ended")
                await sink(note)
        finally:
            self._listeners.discard(listener)
            for uri in uris:
                await self._unsubscribe(uri)

    async def _subscribe(self, uri: str) -> bool:
        count = self._subscribed.get(uri, 0)
        if count == 0:
            subscribe = _subscription("resources/subscribe", uri)
            reply = await self.inner.request(subscribe, self._unattended)
            if "error" in reply:
                return False
        self._subscribed[uri] = count + 1
        return True

    async def _unsubscribe(self, uri: str) -> None:
        count = self._subscribed.get(uri, 0)
        if count > 1:
            self._subscribed[uri] = count - 1
            return
        if count == 0:
            return  # the session ended meanwhile: nothing is subscribed any more
        del self._subscribed[uri]
        with contextlib.suppress(BackendError):
            await asyncio.shield(
                self.inner.request(_subscription("resources/unsubscribe", uri), self._unattended)
            )


def _subscription(method: str, uri: str) -> Message:
    return {
        "jsonrpc": "2.0",
        "id": f"gateway-{method.split('/')[1]}",
        "method": method,
        "params": {"uri": uri},
    }


def _capability(caps: dict[str, Any], name: str, feature: str) -> bool:
    declared = caps.get(name)
    return isinstance(declared, dict) and bool(declared.get(feature))
