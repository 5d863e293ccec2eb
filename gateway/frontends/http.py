"""The Streamable HTTP front end (basic/transports/streamable-http), on aiohttp's request and
response objects, served by `listener.py`.

Checks run cheapest first: origin and host (on every path of the listener: DNS rebinding could
read /metrics too), method, media types, framing, the body (size, coding, arrival), JSON,
mirrored headers; only then does the dispatcher see the message. A reply goes out as one JSON
body unless the backend streams request-scoped notifications first, in which case it becomes an
SSE stream (replies.py). A legacy client's request (its `initialize`, or one naming its
session) is handed to the legacy wing's session endpoint (legacy/endpoint.py) once screened.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import HttpVersion11, hdrs, web

from gateway import timers
from gateway.caller_auth.identity import Identity
from gateway.config import HttpListen
from gateway.core.bus import Bus
from gateway.core.dispatcher import Dispatcher
from gateway.frontends import guard
from gateway.frontends import logins as login_routes
from gateway.frontends.bearer import Bearer, origin_of
from gateway.frontends.bodies import BodyError
from gateway.frontends.legacy.endpoint import SESSION_HEADER, SessionEndpoint
from gateway.frontends.legacy.records import SessionRecords
from gateway.frontends.listener import CLOSE, CUT, Handler, body_now, read_body
from gateway.frontends.ops import Operations, operation_routes
from gateway.frontends.replies import (
    JSON,
    REQUEST_AS_NOTIFICATION,
    Relay,
    Replies,
    cut_off,
    refused,
)
from gateway.protocol import codes, headers, jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message

if TYPE_CHECKING:
    from gateway.backend_auth.desk import LoginDesk

    # (a type only: the authenticator is made, and PyJWT loaded, only under `auth:`)
    from gateway.caller_auth.authenticator import Authenticator

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
        # Virtual servers' endpoints on this listener, by path (app/servers.py): only a request
        # for another path than this endpoint's looks here.
        self._mounted: dict[str, Handler] = {}
        self._stats = dispatcher.telemetry.stats
        self._timers = timers.wheel()  # (made within the running loop, by the app)
        self._screen = functools.lru_cache(maxsize=512)(functools.partial(_screen, listen))
        # With `auth:`, every request on the endpoint needs a bearer token (frontends/bearer.py);
        # the protected resource metadata is served beside the operator routes.
        self._bearer = None if auth is None else Bearer(auth, listen.path, self._stats)
        if self._bearer is not None:
            self._routes.update(self._bearer.routes())
        if logins is not None:  # per-user backend logins (frontends/logins.py)
            self._routes.update(login_routes.routes(logins))
        # (bound once: the hot path calls them as it called the endpoint's own methods)
        self._replies = Replies(self._stats, self._bearer)
        self._reject = self._replies.reject
        self._reply = self._replies.reply
        self._finish = self._replies.finish
        # Legacy clients' sessions (frontends/legacy/endpoint.py): kept in this process, or,
        # with cluster.redis, the replicas' (their records in Redis).
        idle = listen.session_idle_timeout
        if shared is None:
            self._legacy = SessionEndpoint(dispatcher, self._replies, self._timers, idle)
        else:
            self._legacy = SessionEndpoint(
                dispatcher, self._replies, self._timers, idle, shared.records, shared.bus
            )

    def mount(self, path: str, endpoint: Endpoint) -> None:
        """Serve a virtual server's endpoint at `path` on this endpoint's listener, and its
        protected resource metadata where this endpoint serves none."""
        self._mounted[path] = endpoint.handle
        for where, handler in endpoint.metadata_routes().items():
            self._routes.setdefault(where, handler)

    def unmount(self, path: str, endpoint: Endpoint) -> None:
        if self._mounted.get(path) == endpoint.handle:
            del self._mounted[path]
        for where, handler in endpoint.metadata_routes().items():
            if self._routes.get(where) == handler:
                del self._routes[where]

    def metadata_routes(self) -> dict[str, Handler]:
        """Where this endpoint's protected resource metadata is served (none without auth)."""
        return self._bearer.routes() if self._bearer is not None else {}

    def closing(self) -> None:
        """The listener is about to close: end the legacy sessions' GET streams, so that they
        finish like any response (a session's requests in flight get the listener's grace)."""
        self._legacy.closing()

    def close(self) -> None:
        """End every legacy session (what still runs in one is cancelled)."""
        self._legacy.close()

    def handle(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        """The listener's handler. A plain function handing back what answers the request:
        the common request (screened here, its body come with its head) costs no coroutine
        frame of its own on top of `_message`'s."""
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
            return _now(self._reject(guarded[0], guarded[1], codes.INVALID_REQUEST, guarded[2]))
        if target != self._path and request.path != self._path:  # (decoded: `/m%63p?x=1`)
            return self._other(request)
        if self._bearer is not None:
            return self._authorized(self._bearer, request, media)
        return self._admitted(request, media)

    async def _authorized(
        self, bearer: Bearer, request: web.BaseRequest, media: Verdict
    ) -> web.StreamResponse:
        refusal = await bearer.check(request)
        if refusal is not None:
            return refusal
        return await self._admitted(request, media)

    def _admitted(self, request: web.BaseRequest, media: Verdict) -> Awaitable[web.StreamResponse]:
        """A request to the MCP endpoint from a caller let in (or with no auth to pass)."""
        fields = request.headers
        session_id = fields.get(SESSION_HEADER)
        if request.method != "POST":
            if session_id is not None and request.method in ("GET", "DELETE"):
                return self._legacy.session_method(request, session_id)
            self._stats.rejections["method_not_allowed"] += 1
            why = "The MCP endpoint takes POST; GET and DELETE only in a legacy session"
            return _now(refused(405, why, Allow="POST"))
        if media is not None:
            return _now(self._reject(media[0], media[1], codes.INVALID_REQUEST, media[2]))
        if hdrs.TRANSFER_ENCODING in fields:
            return self._transfer_coded(request, session_id)
        try:
            body = body_now(request, self._max_body)  # (the usual case: no coroutine)
        except BodyError as exc:
            return _now(self._unreadable(exc))
        if body is None:
            return self._arriving(request, session_id)
        return self._message(request, body, session_id)

    async def _arriving(
        self, request: web.BaseRequest, session_id: str | None
    ) -> web.StreamResponse:
        try:
            body = await read_body(request, self._max_body, self._body_timeout)
        except BodyError as exc:
            return self._unreadable(exc)
        return await self._message(request, body, session_id)

    def _unreadable(self, exc: BodyError) -> web.Response:
        response = self._reject(exc.reason, exc.status, codes.INVALID_REQUEST, exc.message)
        response.force_close()  # what is left of the body is not read: the framing is lost
        return response

    async def _other(self, request: web.BaseRequest) -> web.StreamResponse:
        mounted = self._mounted.get(request.path)
        if mounted is not None:
            return await mounted(request)
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
            return self._unreadable(exc)
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
            return await self._legacy.in_session(request, session_id, msg, kind)
        fields = request.headers
        dispatcher = self.dispatcher
        if kind is not jsonrpc.Kind.REQUEST:
            return await self._not_a_request(msg, kind, fields)
        if meta.is_legacy_opening(msg):
            return await self._legacy.open_session(request, msg)
        # (the caller matters here only when a policy may hide tools from it)
        identity = origin_of(request).identity if dispatcher.policed else None
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
        # The answer: JSON if the reply comes quickly and alone, else an SSE stream. Handled in
        # this task (no extra task, queue or cancel scope per request on the common path; the
        # answer is here, not in a method of its own, to spare every request a frame): only a
        # request still running when the JSON window closes gets a helper task, which turns the
        # reply into a stream and keeps it alive.
        relay = Relay(request, self._stats)
        timer = relay.open_window(self._timers)
        try:
            reply = await self.dispatcher.handle(msg, relay.note, origin_of(request))
        except asyncio.CancelledError:
            if CUT not in request:
                raise  # the client has gone
            reply = cut_off(msg["id"])
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        if relay.stream is None:  # the common case, without a coroutine
            return self._reply(reply, relay.count_out(jsonrpc.encode(reply)))
        return await self._finish(relay, reply)

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


async def _now(response: web.StreamResponse) -> web.StreamResponse:
    """A response already made, as `handle` hands back every answer: awaitable."""
    return response


def _param_specs(
    msg: Message, dispatcher: Dispatcher, identity: Identity | None
) -> tuple[ParamHeader, ...] | str | None:
    """The `x-mcp-header` annotations to check a request's Mcp-Param-* headers against: None
    when there are none to check (or the policy hides the tool from the caller, whose call is
    then refused as an unknown tool's), or the tool's name when the route table must be
    refreshed to know them (the common case is decided without a coroutine)."""
    if msg["method"] != "tools/call":
        return None
    params = msg.get("params")  # (`jsonrpc.params` inlined: see Dispatcher._dispatch)
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str):
        return None
    route = dispatcher.catalogs.table.tool(name)
    if route is None:
        return name
    return route.param_headers if dispatcher.shows_tool(route, identity) else None
