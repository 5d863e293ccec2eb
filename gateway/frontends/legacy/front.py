"""Legacy clients (2025-11-25 and earlier: `initialize`, sessions) served by the modern engine.

A legacy client's session holds what a modern request carries in `_meta`: the protocol version,
client info and capabilities, and the log level it set. Each of its requests is given that
`_meta` and handled by the dispatcher like a modern request, so a legacy client sees the same
merged, namespaced server as a modern one (basic/versioning, Backward Compatibility). What only
the legacy era has (`initialize`, `ping`, `logging/setLevel`) is answered here.

Transports own the session's life: stdio has one per process, HTTP one per `Mcp-Session-Id`.

The traffic tap records a session's messages here, as they crossed the client's hop (the
`initialize`, requests without the `_meta` given them, the questions asked of the client and
its answers); what is handed to the dispatcher in the client's name goes untapped (`serve`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.core.dispatcher import Dispatcher
from gateway.origin import STDIO_ORIGIN, LegacyClient, Origin
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.telemetry.api import tapped

log = logging.getLogger("gateway.legacy")

Deliver = Callable[[Message], Awaitable[None]]
# The dispatcher's sink (backends.base.NotificationSink), named here: front ends do not import
# the backends' package.
NotificationSink = Callable[[Message], Awaitable[None]]

# Legacy revisions we serve, newest first (basic/lifecycle, Version Negotiation: a server that
# does not support the requested version answers with the latest it supports).
LEGACY_VERSIONS = meta.LEGACY_VERSIONS
# Revision assumed for an HTTP request without MCP-Protocol-Version (2025-11-25 transports,
# Protocol Version Header).
HTTP_DEFAULT_VERSION = "2025-03-26"
# Rounds of client input one request may take (a backend asking forever is refused).
MAX_INPUT_ROUNDS = 8
# How long a question to the client (elicitation, sampling, roots) may wait for its answer: a
# person may be answering it.
ASK_TIMEOUT = 600.0
# Notifications of the watch that are not for the client.
ACKNOWLEDGED = meta.ACKNOWLEDGED
WATCH_ID = "mcp-gateway-watch"
# How long `resources/subscribe` waits for the session's new watch to be acknowledged before it
# answers all the same (the listen's own wait for its backends is core/listen.py ACK_TIMEOUT).
WATCH_SETTLE = 10.0
# Change notifications a legacy session gets without asking (it subscribes to resources).
WATCH_FLAGS = {"toolsListChanged": True, "promptsListChanged": True, "resourcesListChanged": True}
# Capabilities a legacy client is shown. `extensions` came with 2026-07-28, but hosts of the
# initialize era negotiate extensions there (MCP Apps: Client<>Server Capability Negotiation),
# and a client that knows no such member ignores it.
LEGACY_CAPABILITIES = frozenset(
    {"tools", "prompts", "resources", "logging", "completions", "experimental", "extensions"}
)
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


@dataclass
class Session:
    """What the legacy handshake established, and the requests in flight on it."""

    version: str = ""
    client_info: dict[str, Any] = field(default_factory=dict)
    client_capabilities: dict[str, Any] = field(default_factory=dict)
    log_level: str | None = None
    initialized: bool = False  # `initialize` answered (the client's notification is optional)
    in_flight: dict[RequestId, asyncio.Task[Message]] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    # Requests the gateway made of the client, by the id it gave them, until answered.
    asked: dict[RequestId, asyncio.Future[Message]] = field(default_factory=dict)
    _ask_ids: itertools.count[int] = field(default_factory=itertools.count)
    # What the ids of those requests start with; replicas sharing sessions put their own id in
    # it, so an answer names the one replica whose question it is (stores.py).
    ask_prefix: str = "mcp-gateway-"
    # Where the gateway sends the session messages it starts (list changes, resource updates):
    # stdout on stdio, the session's GET stream on HTTP. None: nowhere (nothing is watched).
    deliver: Deliver | None = None
    subscribed: set[str] = field(default_factory=set)  # resource URIs (resources/subscribe)
    watcher: asyncio.Task[None] | None = None  # the modern listen that feeds `deliver`
    # Names the session to backends that keep a child per client (origin.ClientSession).
    key: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    # The session as the backends see it: a backend speaking both eras keeps a legacy session
    # of its own for it (its server-to-client requests then reach this client), ended with it.
    client: LegacyClient = field(default_factory=LegacyClient)

    def answer(self, response: Message) -> bool:
        """A response from the client; True if it answered one of our questions."""
        waiter = self.asked.pop(response.get("id"), None)  # type: ignore[arg-type]
        if waiter is None or waiter.done():
            return False
        waiter.set_result(response)
        return True

    def next_ask_id(self) -> str:
        return f"{self.ask_prefix}{next(self._ask_ids)}"

    def cancel(self, request_id: object) -> None:
        if isinstance(request_id, (str, int)):
            task = self.in_flight.get(request_id)
            if task is not None:
                task.cancel()

    def close(self) -> None:
        self.ended.set()
        for task in self.in_flight.values():
            task.cancel()
        for waiter in self.asked.values():
            waiter.cancel()
        if self.watcher is not None:
            self.watcher.cancel()
        self.client.close()


def negotiate(requested: object) -> str:
    return requested if requested in LEGACY_VERSIONS else LEGACY_VERSIONS[0]


class LegacyFront:
    """Answers a legacy session's requests; transports hand over each message with its session."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._telemetry = dispatcher.telemetry

    async def handle(
        self, session: Session, msg: Message, sink: NotificationSink, origin: Origin = STDIO_ORIGIN
    ) -> Message:
        """The reply to one request of the session; never raises except for cancellation."""
        telemetry = self._telemetry
        if not telemetry.tapping:
            return await self._handle(session, msg, sink, origin)
        telemetry.record("frontend", "in", msg, headers=origin.headers)
        sink = tapped(telemetry, sink, "frontend", "out", None)
        reply = await self._handle(session, msg, sink, origin)
        telemetry.record("frontend", "out", reply)
        return reply

    def answer(self, session: Session, response: Message) -> bool:
        """A response from the client; True if it answered one of the session's questions."""
        if self._telemetry.tapping:
            self._telemetry.record("frontend", "in", response)
        return session.answer(response)

    async def _handle(
        self, session: Session, msg: Message, sink: NotificationSink, origin: Origin
    ) -> Message:
        session.last_used = time.monotonic()
        origin = origin.within(session)  # what it leads to is the session's (its watch too)
        method = msg["method"]
        id_ = msg["id"]
        if method == "initialize":
            return await self._initialize(session, msg, origin)
        if method == "ping":
            return jsonrpc.result(id_, {})
        if not session.initialized:
            return jsonrpc.error(id_, codes.INVALID_REQUEST, "The session is not initialized")
        if method == "logging/setLevel":
            level = jsonrpc.params(msg).get("level")
            if level not in LOG_LEVELS:
                return jsonrpc.error(id_, codes.INVALID_PARAMS, f"Unknown log level: {level!r}")
            session.log_level = str(level)
            return jsonrpc.result(id_, {})
        if method in ("resources/subscribe", "resources/unsubscribe"):
            uri = jsonrpc.params(msg).get("uri")
            if not isinstance(uri, str):
                return jsonrpc.error(id_, codes.INVALID_PARAMS, "params.uri must be a string")
            if method == "resources/subscribe":
                session.subscribed.add(uri)
            else:
                session.subscribed.discard(uri)
            settled = self.watch(session, origin)
            if settled is not None:
                # Answered once the new watch is in place (or has failed): an update after the
                # answer is one the client hears.
                with anyio.move_on_after(WATCH_SETTLE):
                    await settled.wait()
            return jsonrpc.result(id_, {})
        return await self._forward(session, msg, sink, origin)

    def watch(self, session: Session, origin: Origin = STDIO_ORIGIN) -> asyncio.Event | None:
        """(Re)start the session's watch: one modern `subscriptions/listen` through the
        dispatcher for list changes and the subscribed resources, whose notifications go to the
        session as its era has them (no subscription id). The watch it replaces goes on until
        the new one is acknowledged, so no change in between is lost (one heard by both may
        reach the client twice: change notifications say "look again", harmless to repeat).
        Returns an event set once the new watch is acknowledged or has ended (None: there is
        nowhere to deliver to, so nothing is watched)."""
        if session.deliver is None:
            return None
        loop = asyncio.get_running_loop()
        # The session's own (backends/era/dual.py: over stdio its changes come from where its
        # calls go).
        origin = origin.for_legacy(session.client)
        settled = asyncio.Event()
        session.watcher = loop.create_task(
            self._watch(session, session.deliver, origin, settled, session.watcher)
        )
        return settled

    async def _watch(
        self,
        session: Session,
        deliver: Deliver,
        origin: Origin,
        settled: asyncio.Event,
        previous: asyncio.Task[None] | None,
    ) -> None:
        try:
            wanted: dict[str, Any] = dict(WATCH_FLAGS)
            if session.subscribed:
                wanted["resourceSubscriptions"] = sorted(session.subscribed)
            listen = self.modern(
                session,
                {
                    "jsonrpc": "2.0",
                    "id": WATCH_ID,
                    "method": "subscriptions/listen",
                    "params": {"notifications": wanted},
                },
            )

            async def relay(note: Message) -> None:
                method = note.get("method")
                if method == ACKNOWLEDGED:
                    if previous is not None:
                        previous.cancel()  # this watch hears everything from now on
                    settled.set()
                    return
                if not isinstance(method, str):
                    return
                params = dict(jsonrpc.params(note))
                fields = {k: v for k, v in jsonrpc.meta(note).items() if k != meta.SUBSCRIPTION_ID}
                params.pop("_meta", None)
                if fields:
                    params["_meta"] = fields
                out: Message = {"jsonrpc": "2.0", "method": method, "params": params}
                if self._telemetry.tapping:
                    self._telemetry.record("frontend", "out", out)
                try:
                    await deliver(out)
                except (ConnectionError, OSError) as exc:
                    log.debug("legacy session: a change notification was not delivered: %s", exc)

            reply = await self._dispatcher.serve(listen, relay, origin)
            if "error" in reply:
                log.info("legacy session: change notifications unavailable: %s", reply["error"])
        finally:
            settled.set()
            if previous is not None:
                previous.cancel()  # (a chain of replaced watches ends with the newest)

    async def _forward(
        self, session: Session, msg: Message, sink: NotificationSink, origin: Origin
    ) -> Message:
        """The request, handled as a modern one. A backend result asking for client input
        (basic/patterns/mrtr) becomes requests to the client on its session; their answers go
        back to the backend in a retry (`inputResponses`, `requestState`), so the legacy client
        sees server-to-client requests and then its call complete, as in its own era."""
        modern = self.modern(session, msg)
        # Marked as the session's, out of band (not in `_meta`, which is the wire's): where a
        # backend speaks both eras, the request goes to it in the legacy era.
        origin = origin.for_legacy(session.client)
        for _ in range(MAX_INPUT_ROUNDS):
            reply = await self._dispatcher.serve(modern, sink, origin)
            result = reply.get("result")
            if not (isinstance(result, dict) and result.get("resultType") == "input_required"):
                return legacy_reply(reply)
            answers = await self._ask(session, result.get("inputRequests"), sink)
            if "error" in answers:
                return jsonrpc.error(msg["id"], **answers["error"])
            params = {**jsonrpc.params(modern), "inputResponses": answers["result"]}
            params.pop("requestState", None)
            if isinstance(result.get("requestState"), str):
                params["requestState"] = result["requestState"]
            modern = {**modern, "params": params}
        return jsonrpc.error(
            msg["id"], codes.INTERNAL_ERROR, f"The backend asked for input {MAX_INPUT_ROUNDS} times"
        )

    async def _ask(
        self, session: Session, requests: object, sink: NotificationSink
    ) -> dict[str, Any]:
        """Each input request as a request to the client, in turn: {"result": answers by key},
        or {"error": {code, message}} for the first that failed."""
        if not isinstance(requests, dict) or not requests:
            return _failed(codes.INTERNAL_ERROR, "The backend asked for input without requests")
        answers: dict[str, Any] = {}
        loop = asyncio.get_running_loop()
        for key, request in requests.items():
            if not isinstance(request, dict) or not isinstance(request.get("method"), str):
                return _failed(codes.INTERNAL_ERROR, f"Input request {key!r} is malformed")
            ask_id = session.next_ask_id()
            waiter: asyncio.Future[Message] = loop.create_future()
            session.asked[ask_id] = waiter
            question: Message = {"jsonrpc": "2.0", "id": ask_id, "method": request["method"]}
            if isinstance(request.get("params"), dict):
                question["params"] = request["params"]
            try:
                await sink(question)
                with anyio.fail_after(ASK_TIMEOUT):
                    response = await waiter
            except TimeoutError:
                return _failed(codes.INTERNAL_ERROR, f"No answer to {request['method']} in time")
            finally:
                session.asked.pop(ask_id, None)
            if isinstance(response.get("result"), dict):
                answers[str(key)] = response["result"]
                continue
            error = response.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            return _failed(
                code if isinstance(code, int) else codes.INTERNAL_ERROR,
                message if isinstance(message, str) else "The client could not answer",
            )
        return {"result": answers}

    async def notify(self, session: Session, msg: Message) -> None:
        """A notification of the session (`notifications/cancelled` is the transport's)."""
        if self._telemetry.tapping:
            self._telemetry.record("frontend", "in", msg)
        session.last_used = time.monotonic()
        method = msg["method"]
        if method == "notifications/initialized":
            return
        if method == "notifications/cancelled":
            session.cancel(jsonrpc.params(msg).get("requestId"))
            return
        if method == "notifications/roots/list_changed":
            # Not relayed: a backend asking again would ask outside this client's requests, and
            # get the configured roots, not this client's (docs/behaviour/protocol.md, Roots).
            return
        await self._dispatcher.pass_on(self.modern(session, msg))

    def modern(self, session: Session, msg: Message) -> Message:
        """The request as a modern client would send it: the session's fields in `_meta`."""
        params = jsonrpc.params(msg)
        fields = dict(jsonrpc.meta(msg))
        fields[meta.PROTOCOL_VERSION] = meta.MODERN_VERSION
        fields[meta.CLIENT_INFO] = session.client_info
        # The shapes of elicitation, sampling and roots are the same in both eras; a backend's
        # input requests reach the client as requests on its session (`_forward`).
        fields[meta.CLIENT_CAPABILITIES] = session.client_capabilities
        if session.log_level is not None:
            fields[meta.LOG_LEVEL] = session.log_level
        return {**msg, "params": {**params, "_meta": fields}}

    async def _initialize(self, session: Session, msg: Message, origin: Origin) -> Message:
        id_ = msg["id"]
        if session.initialized:
            return jsonrpc.error(id_, codes.INVALID_REQUEST, "The session is already initialized")
        params = jsonrpc.params(msg)
        info = params.get("clientInfo")
        caps = params.get("capabilities")
        session.version = negotiate(params.get("protocolVersion"))
        session.client_info = info if isinstance(info, dict) else {}
        session.client_capabilities = without_tasks(caps) if isinstance(caps, dict) else {}
        discover: Message = {
            "jsonrpc": "2.0",
            "id": id_,
            "method": "server/discover",
            "params": {"_meta": meta.gateway_meta(session.client_info)},
        }
        found = await self._dispatcher.serve(discover, _drop, origin)
        result = found.get("result")
        if not isinstance(result, dict):
            return found
        session.initialized = True
        self.watch(session, origin)
        result_meta = result.get("_meta")
        server_info = result_meta.get(meta.SERVER_INFO) if isinstance(result_meta, dict) else None
        out: dict[str, Any] = {
            "protocolVersion": session.version,
            "capabilities": legacy_capabilities(result.get("capabilities")),
            "serverInfo": server_info or {"name": "mcp-gateway", "version": ""},
        }
        if isinstance(result.get("instructions"), str):
            out["instructions"] = result["instructions"]
        return jsonrpc.result(id_, out)


# What a modern result carries for the modern era only: a legacy client never sees them.
MODERN_RESULT_META = frozenset({meta.SERVER_INFO, meta.PROTOCOL_VERSION, meta.SUBSCRIPTION_ID})
# Result members of the modern era only (`resultType`; the cache hints of lists, reads and
# discovery, server/utilities/caching): 2025-11-25 results have none of them.
MODERN_RESULT_FIELDS = ("resultType", "ttlMs", "cacheScope")


def legacy_reply(reply: Message) -> Message:
    """A modern reply as a legacy client gets it: without the modern-only members
    (`MODERN_RESULT_FIELDS`) and `_meta` keys. The reply is changed in place."""
    result = reply.get("result")
    if type(result) is not dict:
        return reply
    fields = result.get("_meta")
    modern_fields = type(fields) is dict and not MODERN_RESULT_META.isdisjoint(fields)
    if not modern_fields and not any(f in result for f in MODERN_RESULT_FIELDS):
        return reply
    jsonrpc.changed(reply)
    for name in MODERN_RESULT_FIELDS:
        result.pop(name, None)
    if modern_fields:
        assert isinstance(fields, dict)
        kept = {k: v for k, v in fields.items() if k not in MODERN_RESULT_META}
        if kept:
            result["_meta"] = kept
        else:
            del result["_meta"]
    return reply


async def _drop(_: Message) -> None:
    return None


def _failed(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def without_tasks(caps: dict[str, Any]) -> dict[str, Any]:
    """A legacy client's capabilities as backends are told them: never the Tasks extension,
    whose task handles, polling and ids a 2025-11-25 client does not know (its own tasks are
    another design), whatever it declares; other extensions pass."""
    extensions = caps.get("extensions")
    if not isinstance(extensions, dict) or TASKS_EXTENSION not in extensions:
        return caps
    kept = {k: v for k, v in extensions.items() if k != TASKS_EXTENSION}
    return {**caps, "extensions": kept}


def legacy_capabilities(modern: object) -> dict[str, Any]:
    """Server capabilities as a legacy client reads them: never the Tasks extension, which is
    kept off for that era (`without_tasks`)."""
    if not isinstance(modern, dict):
        return {}
    shown = {k: v for k, v in modern.items() if k in LEGACY_CAPABILITIES and isinstance(v, dict)}
    return without_tasks(shown)
