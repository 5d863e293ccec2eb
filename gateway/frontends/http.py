"""The Streamable HTTP front end (basic/transports/streamable-http), served by `server.py`.

Checks run cheapest first: origin and host, method, media types, size, JSON, mirrored headers;
only then does the dispatcher see the message. A reply goes out as one JSON body unless the
backend streams request-scoped notifications first, in which case it becomes an SSE stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
from urllib.parse import urlsplit

from gateway import errors, timers
from gateway.config import HttpListen
from gateway.core.dispatcher import Dispatcher
from gateway.core.legacy import LEGACY_VERSIONS, LegacyFront, is_legacy_opening, is_modern
from gateway.frontends.ops import Operations, operation_routes
from gateway.frontends.server import Handler, Reply, Request, Stream
from gateway.frontends.sessions import HttpSession, SessionStore, owner_of
from gateway.protocol import codes, headers, jsonrpc, sse
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Origin, Stats

log = logging.getLogger("gateway.http")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SSE_HEADERS = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
JSON = "application/json"
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
# A reply that comes within this window goes out as plain JSON; after it, the response turns into
# an SSE stream so that idle-timeouts of intermediaries see bytes during long calls.
JSON_WINDOW = 10.0
KEEPALIVE_INTERVAL = 15.0


def routes(
    dispatcher: Dispatcher, listen: HttpListen, ops: Operations | None = None
) -> dict[str, Handler]:
    """The listener's routes: the MCP endpoint, and the operator endpoints when given."""
    endpoint = Endpoint(dispatcher, listen)
    out: dict[str, Handler] = dict(operation_routes(ops)) if ops is not None else {}
    out[listen.path] = endpoint.handle
    return out


def _reply(status: int, msg: Message | None = None, **extra: str) -> Reply:
    if msg is None:
        return Reply(status, headers=extra.items())
    return Reply(status, jsonrpc.encode(msg), JSON, extra.items())


@functools.lru_cache(maxsize=256)
def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# What a request's screening found: (metric reason, HTTP status, message); None when it passed.
Verdict = tuple[str, int, str] | None
_TYPE_REFUSED: Verdict = ("media_type", 415, "Content-Type must be application/json")
_ACCEPT_REFUSED: Verdict = (
    "not_acceptable",
    406,
    "Accept must list application/json and text/event-stream",
)


def _guard(origin: str | None, host_header: str, listen: HttpListen) -> Verdict:
    """DNS-rebinding protection (streamable-http, Security & Endpoint)."""
    if (
        origin is not None
        and origin not in listen.allowed_origins
        and not _is_loopback(urlsplit(origin).hostname or "")
    ):
        return "origin", 403, f"Origin {origin!r} is not allowed"
    if _is_loopback(listen.host):
        host = urlsplit("//" + host_header).hostname or ""
        if not _is_loopback(host) and host not in listen.allowed_hosts:
            return "host", 403, f"Host {host_header!r} is not allowed"
    return None


def _screen(
    listen: HttpListen, origin: str | None, host: str, content_type: str, accept: str
) -> tuple[Verdict, Verdict]:
    """The checks on a request's header fields, cheapest first: (the origin and host guard,
    the media types of a POST). Pure, so the endpoint caches it: the fields repeat from request
    to request."""
    media = None
    if content_type.split(";")[0].strip().lower() != JSON:
        media = _TYPE_REFUSED
    elif not _accepts_value(accept):
        media = _ACCEPT_REFUSED
    return _guard(origin, host, listen), media


def _accepts_value(accept: str) -> bool:
    # Accept is a list field: several header lines mean the same as one comma-separated line.
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "*/*" in kinds:
        return True
    return "application/json" in kinds and "text/event-stream" in kinds


class Endpoint:
    """The MCP endpoint of one HTTP listener."""

    def __init__(self, dispatcher: Dispatcher, listen: HttpListen) -> None:
        self.dispatcher = dispatcher
        self.listen = listen
        self._stats = dispatcher.telemetry.stats
        self._legacy = LegacyFront(dispatcher)
        self.sessions = SessionStore(listen.session_idle_timeout)
        self._timers = timers.wheel()  # (made within the running loop, by the app)
        self._screen = functools.lru_cache(maxsize=512)(functools.partial(_screen, listen))

    def _reject(
        self,
        reason: str,
        status: int,
        code: int,
        message: str,
        id_: jsonrpc.RequestId | None = None,
    ) -> Reply:
        self._stats.rejections[reason] += 1
        return _reply(status, jsonrpc.error(id_, code, message))

    async def handle(self, request: Request) -> Reply | None:
        listen = self.listen
        fields = request.headers
        guard, media = self._screen(
            fields.get("origin"),
            fields.get("host") or "",
            fields.get("content-type") or "",
            ",".join(fields.getall("accept")),
        )
        if guard is not None:
            return self._reject(guard[0], guard[1], codes.INVALID_REQUEST, guard[2])
        session_id = fields.get(SESSION_HEADER)
        if request.method != "POST":
            if session_id is not None and request.method in ("GET", "DELETE"):
                return await self._session_method(request, session_id)
            self._stats.rejections["method_not_allowed"] += 1
            return _reply(405, Allow="POST")
        if media is not None:
            return self._reject(media[0], media[1], codes.INVALID_REQUEST, media[2])
        if request.too_big:
            too_big = f"Body over {listen.max_body_bytes} bytes"
            return self._reject("size", 413, codes.INVALID_REQUEST, too_big)
        body = request.body
        self._stats.bytes["frontend", "in"] += len(body)
        msg = jsonrpc.decode(body)
        if isinstance(msg, jsonrpc.Invalid):
            return self._reject("invalid_request", 400, msg.code, msg.message, msg.id)
        kind = jsonrpc.kind(msg)
        if session_id is not None and not is_modern(msg):
            # (a request with modern `_meta` is served statelessly, whatever it sends along)
            return await self._in_session(request, session_id, msg, kind)
        if kind is jsonrpc.Kind.RESPONSE:
            return self._reject(
                "invalid_request",
                400,
                codes.INVALID_REQUEST,
                "Clients must not send responses",
                msg["id"],
            )
        dispatcher = self.dispatcher
        if kind is jsonrpc.Kind.NOTIFICATION:
            await dispatcher.notify(msg)
            return _reply(202)
        if is_legacy_opening(msg):
            return await self._open_session(request, msg)
        specs = _param_specs(msg, dispatcher)
        if isinstance(specs, str):  # a tool the table does not know (yet)
            specs = await dispatcher.param_headers(specs)
        mismatch = headers.check(fields.getall, msg, specs)
        if mismatch is not None:
            return self._reject(
                "header_mismatch",
                400,
                codes.HEADER_MISMATCH,
                f"Header mismatch: {mismatch}",
                msg["id"],
            )
        return await self._answer(request, msg)

    # --- legacy sessions (2025-11-25 transports, Session Management) -------------------------

    def _no_session(self) -> Reply:
        self._stats.rejections["unknown_session"] += 1
        return _reply(404, jsonrpc.error(None, codes.INVALID_REQUEST, "Unknown or ended session"))

    async def _open_session(self, request: Request, msg: Message) -> Reply | None:
        session = self.sessions.open(owner_of(request.headers.get("Authorization")))
        if session is None:
            return self._reject(
                "sessions_full",
                503,
                codes.GATEWAY_OVERLOADED,
                "Too many open sessions; try again later",
                msg["id"],
            )
        reply = await self._legacy.handle(session, msg, _drop, _origin(request))
        if not session.initialized:
            self.sessions.end(session)  # the handshake failed: no session to speak of
            return Reply(errors.http_status(reply), jsonrpc.encode(reply), JSON)
        return Reply(200, jsonrpc.encode(reply), JSON, ((SESSION_HEADER, session.id),))

    async def _in_session(
        self, request: Request, session_id: str, msg: Message, kind: jsonrpc.Kind
    ) -> Reply | None:
        session = self.sessions.get(session_id, owner_of(request.headers.get("Authorization")))
        if session is None:
            return self._no_session()
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in LEGACY_VERSIONS:
            return self._reject(
                "unsupported_version",
                400,
                codes.INVALID_REQUEST,
                f"{VERSION_HEADER} {version!r} is not a version of this session",
            )
        if kind is jsonrpc.Kind.RESPONSE:
            session.answer(msg)  # an answer to a question we asked; anything else is dropped
            return _reply(202)
        if kind is jsonrpc.Kind.NOTIFICATION:
            await self._legacy.notify(session, msg)
            return _reply(202)
        if msg["method"] == "initialize":
            return self._reject(
                "invalid_request", 400, codes.INVALID_REQUEST, "The session is already open"
            )
        return await self._answer_in_session(request, session, msg)

    async def _answer_in_session(
        self, request: Request, session: HttpSession, msg: Message
    ) -> Reply | None:
        """Like `_answer`, except that the request runs in a task of the session: a legacy
        client's disconnect does not cancel its request (only `notifications/cancelled` or the
        end of the session does), so the work is not tied to this connection."""
        relay = _Relay(request, self._stats, cancel_when_gone=False)
        loop = asyncio.get_running_loop()
        timer = self._timers.call_later(JSON_WINDOW, relay.window_closed)
        id_ = msg["id"]
        work = loop.create_task(self._legacy.handle(session, msg, relay.note, _origin(request)))
        session.in_flight[id_] = work
        work.add_done_callback(lambda _: session.in_flight.pop(id_, None))
        try:
            reply = await asyncio.shield(work)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this connection is going; the work goes on in the session
            reply = jsonrpc.error(id_, codes.INTERNAL_ERROR, "Request cancelled")
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        return await self._finish(relay, reply)

    async def _session_method(self, request: Request, session_id: str) -> Reply | None:
        session = self.sessions.get(session_id, owner_of(request.headers.get("Authorization")))
        if session is None:
            return self._no_session()
        if request.method == "DELETE":
            self.sessions.end(session)
            return _reply(204)
        if "text/event-stream" not in (request.headers.get("Accept") or ""):
            return self._reject(
                "not_acceptable", 406, codes.INVALID_REQUEST, "Accept must list text/event-stream"
            )
        if session.streaming:
            return self._reject(
                "conflict", 409, codes.INVALID_REQUEST, "The session's stream is already open"
            )
        await self._stream_session(request, session)
        return None

    async def _stream_session(self, request: Request, session: HttpSession) -> None:
        """The session's GET stream: the messages the gateway starts for it (list changes,
        resource updates), with keep-alives between; it ends when the session does."""
        session.streaming = True
        try:
            stream = request.stream(200, SSE_HEADERS)
            await stream.write(sse.KEEPALIVE)
            while True:
                try:
                    msg = await asyncio.wait_for(session.outbox.get(), KEEPALIVE_INTERVAL)
                except TimeoutError:
                    await stream.write(sse.KEEPALIVE)
                    continue
                if msg is None:
                    break
                await stream.write(_count_out(self._stats, sse.event(jsonrpc.encode(msg))))
            await stream.end()
        except ConnectionResetError:
            pass
        finally:
            session.streaming = False

    async def _finish(self, relay: _Relay, reply: Message) -> Reply | None:
        body = relay.count_out(jsonrpc.encode(reply))
        if relay.stream is None:
            return Reply(errors.http_status(reply), body, JSON)
        await relay.finish_stream(body)
        return None

    async def _answer(self, request: Request, msg: Message) -> Reply | None:
        """Answer with JSON if the reply comes quickly and alone, else as an SSE stream.

        The request is handled in this task: no extra task, queue or cancel scope per request
        on the common path. Only a request still running when the JSON window closes gets a
        helper task, which turns the reply into a stream and keeps it alive."""
        relay = _Relay(request, self._stats)
        timer = self._timers.call_later(JSON_WINDOW, relay.window_closed)
        try:
            reply = await self.dispatcher.handle(msg, relay.note, _origin(request))
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        if relay.stream is None:  # the common case, without a coroutine
            return Reply(errors.http_status(reply), relay.count_out(jsonrpc.encode(reply)), JSON)
        return await self._finish(relay, reply)


async def _drop(_: Message) -> None:
    return None


def _count_out(stats: Stats, data: bytes) -> bytes:
    stats.bytes["frontend", "out"] += len(data)
    return data


def _origin(request: Request) -> Origin:
    return Origin("http", request.remote, request.headers.raw)


def _param_specs(msg: Message, dispatcher: Dispatcher) -> tuple[ParamHeader, ...] | str | None:
    """The `x-mcp-header` annotations to check a request's Mcp-Param-* headers against: None
    when there are none to check, or the tool's name when the route table must be refreshed to
    know them (the common case is decided without a coroutine)."""
    if msg["method"] != "tools/call":
        return None
    name = jsonrpc.params(msg).get("name")
    if not isinstance(name, str):
        return None
    route = dispatcher.catalogs.table.tool(name)
    return route.param_headers if route is not None else name


class _Relay:
    """The reply of one request: a JSON body, or an SSE stream once there is something to send
    before the reply (a notification, or a keep-alive after the JSON window)."""

    def __init__(self, request: Request, stats: Stats, *, cancel_when_gone: bool = True) -> None:
        self._request = request
        self._stats = stats
        self._cancel_when_gone = cancel_when_gone
        self.stream: Stream | None = None
        self._lock: asyncio.Lock | None = None  # made on first use: most replies never stream
        self.keepalive: asyncio.Task[None] | None = None

    def count_out(self, data: bytes) -> bytes:
        return _count_out(self._stats, data)

    async def _write(self, data: bytes) -> None:
        # Notifications and keep-alives come from two tasks; each event goes out whole.
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.stream is None:
                self.stream = self._request.stream(200, SSE_HEADERS)
            await self.stream.write(data)

    async def note(self, note: Message) -> None:
        try:
            await self._write(self.count_out(sse.event(jsonrpc.encode(note))))
        except ConnectionResetError:
            if not self._cancel_when_gone:
                return  # a legacy request outlives its connection; what it says is lost
            # The client has gone: that cancels its request, as a disconnect does.
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

    def window_closed(self) -> None:
        self.keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        # Bytes on the wire now, then at every interval, so idle-timeouts of intermediaries
        # never cut a long call.
        await self._write(sse.KEEPALIVE)
        while True:
            await asyncio.sleep(KEEPALIVE_INTERVAL)
            await self._write(sse.KEEPALIVE)

    async def stop_keepalive(self) -> None:
        task = self.keepalive
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                await task

    async def finish_stream(self, body: bytes) -> None:
        """The reply as the stream's last event."""
        assert self.stream is not None
        await self._write(sse.event(body))
        await self.stream.end()
