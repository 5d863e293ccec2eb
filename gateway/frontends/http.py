"""The Streamable HTTP front end (basic/transports/streamable-http), on aiohttp's request and
response objects, served by `listener.py`.

Checks run cheapest first: origin and host (on every path of the listener: DNS rebinding could
read /metrics too), method, media types, framing, the body (size, coding, arrival), JSON,
mirrored headers; only then does the dispatcher see the message. A reply goes out as one JSON
body unless the backend streams request-scoped notifications first, in which case it becomes an
SSE stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import HttpVersion11, hdrs, web

from gateway import errors, timers
from gateway.backend_auth.desk import LoginDesk
from gateway.caller_auth.authenticator import Authenticator
from gateway.caller_auth.identity import Identity
from gateway.config import HttpListen
from gateway.core.bus import Bus
from gateway.core.dispatcher import Dispatcher
from gateway.core.ratelimit import retry_after_header
from gateway.frontends import guard
from gateway.frontends import logins as login_routes
from gateway.frontends.bearer import Bearer, identity_of
from gateway.frontends.bodies import BodyError
from gateway.frontends.legacy.front import LEGACY_VERSIONS, LegacyFront
from gateway.frontends.legacy.records import SessionRecords, SessionsUnavailable
from gateway.frontends.legacy.stores import (
    HttpSession,
    SessionsFull,
    SessionStore,
    SharedSessionStore,
    owner_of,
)
from gateway.frontends.listener import CLOSE, CUT, Handler, read_body, start_stream
from gateway.frontends.ops import Operations, operation_routes
from gateway.origin import Origin
from gateway.protocol import codes, headers, jsonrpc, meta, sse
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

SSE_HEADERS = (
    ("Content-Type", "text/event-stream"),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),
)
JSON = "application/json"
SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
# A notification with a request's method is not accepted (streamable-http, Sending Messages: an
# HTTP error and an error without an id); the dispatcher counts and logs it.
REQUEST_AS_NOTIFICATION = "A request method sent as a notification is not accepted"
# A reply that comes within this window goes out as plain JSON; after it, the response turns into
# an SSE stream so that idle-timeouts of intermediaries see bytes during long calls.
JSON_WINDOW = 10.0
KEEPALIVE_INTERVAL = 15.0


def json_response(status: int, msg: Message, **extra: str) -> web.Response:
    return web.Response(status=status, body=jsonrpc.encode(msg), content_type=JSON, headers=extra)


# The errors whose status tells the client when to come back (429, 503): Retry-After, from the
# delay the error carries in `data.retryAfter`.
RETRY_LATER = frozenset(
    {codes.RATE_LIMITED, codes.GATEWAY_OVERLOADED, codes.SHARED_STATE_UNAVAILABLE}
)
# When a client refused for want of room for another legacy session may try again: sessions
# end by DELETE or idle expiry, not on a schedule, so this is a client's pace, not a promise.
SESSIONS_FULL_RETRY = 5.0
# A session's state a request changes, which the other replicas must see (cluster.redis).
SESSION_STATE_METHODS = frozenset(
    {"logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)


def _reply_headers(reply: Message) -> dict[str, str] | None:
    if jsonrpc.error_code(reply) in RETRY_LATER:
        data = reply["error"].get("data")
        delay = data.get("retryAfter") if isinstance(data, dict) else None
        if isinstance(delay, int | float) and not isinstance(delay, bool):
            return {hdrs.RETRY_AFTER: retry_after_header(delay)}
    return None


def refused(status: int, message: str, **extra: str) -> web.Response:
    """A refusal before any message was read: a JSON-RPC error without an id."""
    return json_response(status, jsonrpc.error(None, codes.INVALID_REQUEST, message), **extra)


# What a request's screening found: (metric reason, HTTP status, message); None when it passed.
Verdict = tuple[str, int, str] | None
_TYPE_REFUSED: Verdict = ("media_type", 415, "Content-Type must be application/json")
_ACCEPT_REFUSED: Verdict = (
    "not_acceptable",
    406,
    "Accept must list application/json and text/event-stream",
)
_GUARD_REFUSED: dict[str, Verdict] = {
    "origin": ("origin", 403, "The request's Origin is not allowed"),
    "host": ("host", 403, "The request's Host is not allowed"),
}


def _screen(
    listen: HttpListen,
    origin: str | None,
    host: str,
    target_host: str | None,
    content_type: str,
    accept: str,
) -> tuple[Verdict, Verdict]:
    """The checks on a request's header fields, cheapest first: (the origin and host guard,
    the media types of a POST). Pure, so the endpoint caches it: the fields repeat from request
    to request."""
    why = guard.refusal(
        origin,
        host,
        target_host,
        allowed_origins=listen.allowed_origins,
        allowed_hosts=listen.allowed_hosts,
        check_host=guard.checks_host(listen.host, listen.allowed_hosts),
    )
    media = None
    if content_type.split(";")[0].strip().lower() != JSON:
        media = _TYPE_REFUSED
    elif not _accepts_value(accept):
        media = _ACCEPT_REFUSED
    return (None if why is None else _GUARD_REFUSED[why]), media


def _accepts_value(accept: str) -> bool:
    # Accept is a list field: several header lines mean the same as one comma-separated line.
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "*/*" in kinds:
        return True
    return "application/json" in kinds and "text/event-stream" in kinds


@dataclass(frozen=True)
class SharedSessions:
    """Where legacy sessions are kept when the replicas share them (cluster.redis)."""

    records: SessionRecords
    bus: Bus


class Endpoint:
    """The MCP endpoint of one HTTP listener, and the listener's other routes (the operator
    endpoints, when given): `handle` is the listener's one handler."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        listen: HttpListen,
        ops: Operations | None = None,
        auth: Authenticator | None = None,
        logins: LoginDesk | None = None,
        shared: SharedSessions | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.listen = listen
        self._path = listen.path
        self._max_body = listen.max_body_bytes
        self._body_timeout = listen.limits.body_timeout
        self._routes: dict[str, Handler] = operation_routes(ops) if ops is not None else {}
        self._stats = dispatcher.telemetry.stats
        self._legacy = LegacyFront(dispatcher)
        # With cluster.redis, legacy sessions are the replicas' (their records in Redis); else
        # this process's alone, with no Redis call on their path.
        self._shared: SharedSessionStore | None = None
        self.sessions = SessionStore(listen.session_idle_timeout)
        if shared is not None:
            self._shared = SharedSessionStore(
                listen.session_idle_timeout, shared.records, shared.bus, self._legacy
            )
            self.sessions = self._shared
        self._timers = timers.wheel()  # (made within the running loop, by the app)
        self._screen = functools.lru_cache(maxsize=512)(functools.partial(_screen, listen))
        # With `auth:`, every request on the endpoint needs a bearer token (frontends/bearer.py);
        # the protected resource metadata is served beside the operator routes.
        self._bearer = None if auth is None else Bearer(auth, listen.path, self._stats)
        if self._bearer is not None:
            self._routes.update(self._bearer.routes())
        if logins is not None:  # per-user backend logins (frontends/logins.py)
            self._routes.update(login_routes.routes(logins))

    def closing(self) -> None:
        """The listener is about to close: end the legacy sessions' GET streams, so that they
        finish like any response (a session's requests in flight get the listener's grace)."""
        self.sessions.end_streams()

    def close(self) -> None:
        """End every legacy session (what still runs in one is cancelled)."""
        self.sessions.close_all()

    def _reject(
        self,
        reason: str,
        status: int,
        code: int,
        message: str,
        id_: jsonrpc.RequestId | None = None,
    ) -> web.Response:
        self._stats.rejections[reason] += 1
        return json_response(status, jsonrpc.error(id_, code, message))

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        fields = request.headers
        target = request.raw_path
        origin = fields.get(hdrs.ORIGIN)
        if origin is not None:
            # Several Origin fields are judged together (as one list, which is no origin),
            # never by the first alone: a later one may be the page's real origin.
            origin = guard.one_field(fields.getall(hdrs.ORIGIN))
        guarded, media = self._screen(
            origin,
            fields.get(hdrs.HOST, ""),
            None if target.startswith("/") else guard.target_authority(target),
            fields.get(hdrs.CONTENT_TYPE, ""),
            ",".join(fields.getall(hdrs.ACCEPT, headers.NO_VALUES)),
        )
        if guarded is not None:
            return self._reject(guarded[0], guarded[1], codes.INVALID_REQUEST, guarded[2])
        if target != self._path and request.path != self._path:  # (decoded: `/m%63p?x=1`)
            return await self._other(request)
        if self._bearer is not None:
            refusal = await self._bearer.check(request)
            if refusal is not None:
                return refusal
        session_id = fields.get(SESSION_HEADER)
        if request.method != "POST":
            if session_id is not None and request.method in ("GET", "DELETE"):
                return await self._session_method(request, session_id)
            self._stats.rejections["method_not_allowed"] += 1
            why = "The MCP endpoint takes POST; GET and DELETE only in a legacy session"
            return refused(405, why, Allow="POST")
        if media is not None:
            return self._reject(media[0], media[1], codes.INVALID_REQUEST, media[2])
        if hdrs.TRANSFER_ENCODING in fields:
            return await self._transfer_coded(request, session_id)
        try:
            body = await read_body(request, self._max_body, self._body_timeout)
        except BodyError as exc:
            response = self._reject(exc.reason, exc.status, codes.INVALID_REQUEST, exc.message)
            response.force_close()  # what is left of the body is not read: the framing is lost
            return response
        return await self._message(request, body, session_id)

    async def _other(self, request: web.BaseRequest) -> web.StreamResponse:
        route = self._routes.get(request.path)
        if route is None:
            return refused(404, "Not Found")
        return await route(request)

    async def _transfer_coded(
        self, request: web.BaseRequest, session_id: str | None
    ) -> web.StreamResponse:
        """A body in a transfer coding: chunked alone is understood (RFC 9112 6.1: 501
        otherwise, over all the field's lines), and an HTTP/1.0 message with one has faulty
        framing: it is answered, then the connection closes."""
        codings = ",".join(request.headers.getall(hdrs.TRANSFER_ENCODING)).split(",")
        if [coding.strip(" \t").lower() for coding in codings] != ["chunked"]:
            response = self._reject(
                "framing", 501, codes.INVALID_REQUEST, "Only the chunked transfer coding is served"
            )
            response.force_close()
            return response
        close = request.version < HttpVersion11
        if close:
            request[CLOSE] = True
        try:
            body = await read_body(request, self._max_body, self._body_timeout)
        except BodyError as exc:
            response = self._reject(exc.reason, exc.status, codes.INVALID_REQUEST, exc.message)
            response.force_close()
            return response
        answer = await self._message(request, body, session_id)
        if close:
            answer.force_close()
        return answer

    async def _message(
        self, request: web.BaseRequest, body: bytes, session_id: str | None
    ) -> web.StreamResponse:
        self._stats.bytes["frontend", "in"] += len(body)
        msg = jsonrpc.decode(body)
        if isinstance(msg, jsonrpc.Invalid):
            return self._reject("invalid_request", 400, msg.code, msg.message, msg.id)
        kind = jsonrpc.kind(msg)
        if session_id is not None and not meta.is_modern(msg):
            # (a request with modern `_meta` is served statelessly, whatever it sends along)
            return await self._in_session(request, session_id, msg, kind)
        fields = request.headers
        dispatcher = self.dispatcher
        if kind is not jsonrpc.Kind.REQUEST:
            return await self._not_a_request(msg, kind, fields)
        if meta.is_legacy_opening(msg):
            return await self._open_session(request, msg)
        # (the caller matters here only when a policy may hide tools from it)
        identity = _origin(request).identity if dispatcher.policed else None
        specs = _param_specs(msg, dispatcher, identity)
        if isinstance(specs, str):  # a tool the table does not know (yet)
            specs = await dispatcher.param_headers(specs, identity)
        mismatch = headers.check(fields, msg, specs)
        if mismatch is not None:
            return self._reject(
                "header_mismatch",
                400,
                codes.HEADER_MISMATCH,
                f"Header mismatch: {mismatch}",
                msg["id"],
            )
        return await self._answer(request, msg)

    async def _not_a_request(
        self, msg: Message, kind: jsonrpc.Kind, fields: headers.HeaderFields
    ) -> web.StreamResponse:
        """A notification, or a response (which clients must not send): both are checked
        against their mirrored headers as a request is."""
        id_ = msg.get("id") if kind is jsonrpc.Kind.RESPONSE else None
        mismatch = headers.check(fields, msg)
        if mismatch is not None:
            message = f"Header mismatch: {mismatch}"
            return self._reject("header_mismatch", 400, codes.HEADER_MISMATCH, message, id_)
        if kind is jsonrpc.Kind.RESPONSE:
            why = "Clients must not send responses"
            return self._reject("invalid_request", 400, codes.INVALID_REQUEST, why, id_)
        if not self.dispatcher.accepts_notification(msg):
            return refused(400, REQUEST_AS_NOTIFICATION)
        await self.dispatcher.notify(msg)
        return web.Response(status=202)

    # --- legacy sessions (2025-11-25 transports, Session Management) -------------------------

    def _no_session(self) -> web.Response:
        self._stats.rejections["unknown_session"] += 1
        return refused(404, "Unknown or ended session")

    def _sessions_full(self, id_: jsonrpc.RequestId | None) -> web.Response:
        self._stats.rejections["sessions_full"] += 1
        error = errors.Overloaded(SESSIONS_FULL_RETRY, "Too many open sessions; try again later")
        return self._reply_error(errors.to_wire(error, id_))

    def _unavailable(self, exc: SessionsUnavailable, id_: jsonrpc.RequestId | None) -> web.Response:
        """Redis holds the session and does not answer: 503 with Retry-After (the session may
        be fine), never a 404 that would make the client start over."""
        self._stats.rejections["sessions_unavailable"] += 1
        return self._reply_error(errors.to_wire(exc, id_))

    def _reply_error(self, reply: Message) -> web.Response:
        return self._reply(reply, self._stats_out(jsonrpc.encode(reply)))

    def _stats_out(self, body: bytes) -> bytes:
        return _count_out(self._stats, body)

    async def _open_session(self, request: web.BaseRequest, msg: Message) -> web.StreamResponse:
        try:
            session = self.sessions.open(_owner(request))
        except SessionsUnavailable as exc:
            return self._unavailable(exc, msg["id"])
        if session is None:
            return self._sessions_full(msg["id"])
        reply = await self._legacy.handle(session, msg, _drop, _origin(request))
        if not session.initialized:
            self.sessions.end(session)  # the handshake failed: no session to speak of
            return self._reply(reply, jsonrpc.encode(reply), errors.LEGACY_HTTP_STATUS)
        if self._shared is not None:
            try:
                await self._shared.opened(session)
            except SessionsUnavailable as exc:
                self.sessions.end(session)  # no record: no replica could serve it
                return self._unavailable(exc, msg["id"])
        return json_response(200, reply, **{SESSION_HEADER: session.id})

    async def _session(
        self, request: web.BaseRequest, session_id: str, id_: jsonrpc.RequestId | None
    ) -> HttpSession | web.Response:
        """The session a request names, or the response that refuses it (404, or 503 when its
        record cannot be read)."""
        shared = self._shared
        if shared is None:  # (one process: no await)
            session = self.sessions.get(session_id, _owner(request))
        else:
            try:
                session = await shared.lookup(session_id, _owner(request))
            except SessionsUnavailable as exc:
                return self._unavailable(exc, id_)
            except SessionsFull:
                return self._sessions_full(id_)
        return self._no_session() if session is None else session

    async def _in_session(
        self, request: web.BaseRequest, session_id: str, msg: Message, kind: jsonrpc.Kind
    ) -> web.StreamResponse:
        session = await self._session(request, session_id, msg.get("id"))
        if not isinstance(session, HttpSession):
            return session
        version = request.headers.get(VERSION_HEADER)
        if version is not None and version not in LEGACY_VERSIONS:
            return self._reject(
                "unsupported_version",
                400,
                codes.INVALID_REQUEST,
                f"{VERSION_HEADER} {version!r} is not a version of this session",
            )
        shared = self._shared
        if kind is jsonrpc.Kind.RESPONSE:
            # An answer to a question we asked; anything else is dropped. Shared: a question
            # of another replica's (its id names it) is passed on to it.
            if not self._legacy.answer(session, msg) and shared is not None:
                await shared.answer_elsewhere(session, msg)
            return web.Response(status=202)
        if kind is jsonrpc.Kind.NOTIFICATION:
            if not self.dispatcher.accepts_notification(msg):
                return refused(400, REQUEST_AS_NOTIFICATION)
            await self._legacy.notify(session, msg)
            if shared is not None and msg["method"] == "notifications/cancelled":
                # The request may run on another replica (where it was sent).
                request_id = jsonrpc.params(msg).get("requestId")
                if isinstance(request_id, str | int) and request_id not in session.in_flight:
                    await shared.cancel_elsewhere(session, request_id)
            return web.Response(status=202)
        if msg["method"] == "initialize":
            return self._reject(
                "invalid_request", 400, codes.INVALID_REQUEST, "The session is already open"
            )
        return await self._answer_in_session(request, session, msg)

    async def _answer_in_session(
        self, request: web.BaseRequest, session: HttpSession, msg: Message
    ) -> web.StreamResponse:
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
            if CUT in request:
                reply = _cut_off(id_)  # (the session's work ends with the session)
            elif task is not None and task.cancelling():
                raise  # this connection is going; the work goes on in the session
            else:
                reply = jsonrpc.error(id_, codes.INTERNAL_ERROR, "Request cancelled")
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        if self._shared is not None and msg["method"] in SESSION_STATE_METHODS:
            saved = await self._share_state(session, msg["method"], reply)
            if saved is not None:
                return saved
        return await self._finish(relay, reply, errors.LEGACY_HTTP_STATUS)

    async def _share_state(
        self, session: HttpSession, method: str, reply: Message
    ) -> web.Response | None:
        """What the request changed, into the session's record (cluster.redis); the response
        that replaces the reply when that failed."""
        assert self._shared is not None
        if "error" in reply:
            return None
        try:
            if not await self._shared.save(session):
                return self._no_session()
        except SessionsUnavailable as exc:
            return self._unavailable(exc, reply.get("id"))
        if method != "logging/setLevel":
            await self._shared.subscriptions_changed(session)
        return None

    async def _session_method(
        self, request: web.BaseRequest, session_id: str
    ) -> web.StreamResponse:
        session = await self._session(request, session_id, None)
        if not isinstance(session, HttpSession):
            return session
        if request.method == "DELETE":
            if self._shared is None:
                self.sessions.end(session)
            else:
                try:
                    await self._shared.delete(session)
                except SessionsUnavailable as exc:
                    return self._unavailable(exc, None)
            return web.Response(status=204)
        if "text/event-stream" not in (request.headers.get(hdrs.ACCEPT) or ""):
            return self._reject(
                "not_acceptable", 406, codes.INVALID_REQUEST, "Accept must list text/event-stream"
            )
        if session.streaming:
            return self._reject(
                "conflict", 409, codes.INVALID_REQUEST, "The session's stream is already open"
            )
        return await self._stream_session(request, session)

    async def _stream_session(
        self, request: web.BaseRequest, session: HttpSession
    ) -> web.StreamResponse:
        """The session's GET stream: the messages the gateway starts for it (list changes,
        resource updates), with keep-alives between; it ends when the session does."""
        session.streaming = True
        shared = self._shared
        if shared is not None:
            shared.stream_opened(session, _origin(request).within(session))
        touched = time.monotonic()
        stream = web.StreamResponse(headers=SSE_HEADERS)
        try:
            stream = await start_stream(request, SSE_HEADERS)
            await stream.write(sse.KEEPALIVE)
            while True:
                if shared is not None and time.monotonic() - touched > shared.touch_interval:
                    # An open stream is use: its record must not expire meanwhile (and one
                    # gone, the message of its end lost, ends the session's copy here).
                    touched = time.monotonic()
                    with contextlib.suppress(SessionsUnavailable):
                        if not await shared.touch(session):
                            shared.end(session)
                try:
                    msg = await asyncio.wait_for(session.outbox.get(), KEEPALIVE_INTERVAL)
                except TimeoutError:
                    await stream.write(sse.KEEPALIVE)
                    continue
                if msg is None:
                    break
                await stream.write(_count_out(self._stats, sse.event(jsonrpc.encode(msg))))
            await stream.write_eof()
        except ConnectionResetError:
            pass  # the client has gone; the session stays for its next GET
        finally:
            session.streaming = False
            if shared is not None:
                shared.stream_closed(session)
        return stream

    async def _finish(
        self, relay: _Relay, reply: Message, table: Mapping[int, int] = errors.HTTP_STATUS
    ) -> web.StreamResponse:
        body = relay.count_out(jsonrpc.encode(reply))
        if relay.stream is None:
            return self._reply(reply, body, table)
        return await relay.finish_stream(body)

    def _reply(
        self, reply: Message, body: bytes, table: Mapping[int, int] = errors.HTTP_STATUS
    ) -> web.Response:
        """A reply as one JSON body, with the status its error calls for (errors.http_status,
        by `table`: a legacy session's replies keep fewer statuses) and the headers that status
        carries."""
        status = errors.http_status(reply, table)
        extra = None if status == 200 else self._status_headers(status, reply)
        return web.Response(status=status, body=body, content_type=JSON, headers=extra)

    def _status_headers(self, status: int, reply: Message) -> dict[str, str] | None:
        """403 for want of scopes: the insufficient_scope challenge, so a client can step up;
        429 and 503: when to retry."""
        if status == 403 and self._bearer is not None:
            return self._bearer.reply_headers(reply)
        return _reply_headers(reply)

    async def _answer(self, request: web.BaseRequest, msg: Message) -> web.StreamResponse:
        """Answer with JSON if the reply comes quickly and alone, else as an SSE stream.

        The request is handled in this task: no extra task, queue or cancel scope per request
        on the common path. Only a request still running when the JSON window closes gets a
        helper task, which turns the reply into a stream and keeps it alive."""
        relay = _Relay(request, self._stats)
        timer = self._timers.call_later(JSON_WINDOW, relay.window_closed)
        try:
            reply = await self.dispatcher.handle(msg, relay.note, _origin(request))
        except asyncio.CancelledError:
            if CUT not in request:
                raise  # the client has gone
            reply = _cut_off(msg["id"])
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        if relay.stream is None:  # the common case, without a coroutine
            return self._reply(reply, relay.count_out(jsonrpc.encode(reply)))
        return await self._finish(relay, reply)


def _cut_off(id_: jsonrpc.RequestId) -> Message:
    """The reply of a request the listener cut at the end of its grace (CUT). Its handler's
    cancellation is handled here, so the reply can still be written."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    why = "The gateway is shutting down; the request ran past the shutdown grace"
    return jsonrpc.error(id_, codes.GATEWAY_SHUTTING_DOWN, why)


async def _drop(_: Message) -> None:
    return None


def _count_out(stats: Stats, data: bytes) -> bytes:
    stats.bytes["frontend", "out"] += len(data)
    return data


def _origin(request: web.BaseRequest) -> Origin:
    return Origin("http", request.remote, request.headers, identity=identity_of(request))


def _owner(request: web.BaseRequest) -> str:
    return owner_of(identity_of(request), request.headers.get(hdrs.AUTHORIZATION))


def _param_specs(
    msg: Message, dispatcher: Dispatcher, identity: Identity | None
) -> tuple[ParamHeader, ...] | str | None:
    """The `x-mcp-header` annotations to check a request's Mcp-Param-* headers against: None
    when there are none to check (or the policy hides the tool from the caller, whose call is
    then refused as an unknown tool's), or the tool's name when the route table must be
    refreshed to know them (the common case is decided without a coroutine)."""
    if msg["method"] != "tools/call":
        return None
    name = jsonrpc.params(msg).get("name")
    if not isinstance(name, str):
        return None
    route = dispatcher.catalogs.table.tool(name)
    if route is None:
        return name
    return route.param_headers if dispatcher.shows_tool(route, identity) else None


class _Relay:
    """The reply of one request: a JSON body, or an SSE stream once there is something to send
    before the reply (a notification, or a keep-alive after the JSON window)."""

    def __init__(
        self, request: web.BaseRequest, stats: Stats, *, cancel_when_gone: bool = True
    ) -> None:
        self._request = request
        self._stats = stats
        self._cancel_when_gone = cancel_when_gone
        self.stream: web.StreamResponse | None = None
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
                self.stream = await start_stream(self._request, SSE_HEADERS)
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

    async def finish_stream(self, body: bytes) -> web.StreamResponse:
        """The reply as the stream's last event (lost if the client has gone meanwhile)."""
        stream = self.stream
        assert stream is not None
        with contextlib.suppress(ConnectionResetError):
            await self._write(sse.event(body))
            await stream.write_eof()
        return stream
