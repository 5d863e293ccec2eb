"""The legacy session endpoint (2025-11-25 basic/transports, Session Management), on the
Streamable HTTP listener: `initialize` opens a session named by `Mcp-Session-Id`; a POST naming
it runs in the session; GET opens its stream of the messages the gateway starts for it; DELETE
ends it. The modern endpoint (frontends/http.py) screens every request first and hands a legacy
one over here; the replies leave as a modern request's do (frontends/replies.py), with a legacy
session's fewer statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import hdrs, web

from gateway import errors
from gateway.core.bus import Bus
from gateway.core.dispatcher import Dispatcher
from gateway.frontends import replies
from gateway.frontends.bearer import identity_of, origin_of
from gateway.frontends.legacy.front import LEGACY_VERSIONS, LegacyFront
from gateway.frontends.legacy.records import SessionRecords, SessionsUnavailable
from gateway.frontends.legacy.stores import (
    HttpSession,
    Sessions,
    SessionsFull,
    SessionStore,
    SharedSessionStore,
    owner_of,
)
from gateway.frontends.listener import CUT, start_stream
from gateway.frontends.replies import (
    REQUEST_AS_NOTIFICATION,
    SSE_HEADERS,
    Relay,
    Replies,
    cut_off,
    json_response,
    refused,
)
from gateway.protocol import codes, jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.timers import Wheel

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
# When a client refused for want of room for another legacy session may try again: sessions
# end by DELETE or idle expiry, not on a schedule, so this is a client's pace, not a promise.
SESSIONS_FULL_RETRY = 5.0
# A session's state a request changes, which the other replicas must see (cluster.redis).
SESSION_STATE_METHODS = frozenset(
    {"logging/setLevel", "resources/subscribe", "resources/unsubscribe"}
)


class SessionEndpoint:
    """The legacy sessions of one HTTP listener: `open_session`, `in_session` and
    `session_method` are where the modern endpoint hands a legacy request over."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        replies: Replies,
        timers: Wheel,
        idle_timeout: float,
        records: SessionRecords | None = None,
        bus: Bus | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self._replies = replies
        self._reject = replies.reject
        self._reply = replies.reply
        self._timers = timers
        self._stats = dispatcher.telemetry.stats
        self._legacy = LegacyFront(dispatcher)
        # With cluster.redis, legacy sessions are the replicas' (their records in Redis); else
        # this process's alone, with no Redis call on their path. Chosen here, once: the
        # requests go through `Sessions` alike.
        self.sessions: Sessions = (
            SessionStore(idle_timeout)
            if records is None or bus is None
            else SharedSessionStore(idle_timeout, records, bus, self._legacy)
        )

    def closing(self) -> None:
        """The listener is about to close: end the sessions' GET streams, so that they finish
        like any response (a session's requests in flight get the listener's grace)."""
        self.sessions.end_streams()

    def close(self) -> None:
        """End every session (what still runs in one is cancelled)."""
        self.sessions.close_all()

    def _no_session(self) -> web.Response:
        self._stats.rejections["unknown_session"] += 1
        return refused(404, "Unknown or ended session")

    def _sessions_full(self, id_: jsonrpc.RequestId | None) -> web.Response:
        self._stats.rejections["sessions_full"] += 1
        error = errors.Overloaded(SESSIONS_FULL_RETRY, "Too many open sessions; try again later")
        return self._replies.error(errors.to_wire(error, id_))

    def _unavailable(self, exc: SessionsUnavailable, id_: jsonrpc.RequestId | None) -> web.Response:
        """Redis holds the session and does not answer: 503 with Retry-After (the session may
        be fine), never a 404 that would make the client start over."""
        self._stats.rejections["sessions_unavailable"] += 1
        return self._replies.error(errors.to_wire(exc, id_))

    async def open_session(self, request: web.BaseRequest, msg: Message) -> web.StreamResponse:
        try:
            session = self.sessions.open(_owner(request))
        except SessionsUnavailable as exc:
            return self._unavailable(exc, msg["id"])
        if session is None:
            return self._sessions_full(msg["id"])
        reply = await self._legacy.handle(session, msg, _drop, origin_of(request))
        if not session.initialized:
            self.sessions.end(session)  # the handshake failed: no session to speak of
            return self._reply(reply, jsonrpc.encode(reply), errors.LEGACY_HTTP_STATUS)
        try:
            await self.sessions.opened(session)
        except SessionsUnavailable as exc:
            self.sessions.end(session)  # no record: no replica could serve it
            return self._unavailable(exc, msg["id"])
        return json_response(200, reply, **{SESSION_HEADER: session.id})

    async def _session(
        self, request: web.BaseRequest, session_id: str, id_: jsonrpc.RequestId | None
    ) -> HttpSession | web.Response:
        """The session a request names, or the response that refuses it (404, or 503 when its
        record cannot be read)."""
        try:
            session = await self.sessions.lookup(session_id, _owner(request))
        except SessionsUnavailable as exc:
            return self._unavailable(exc, id_)
        except SessionsFull:
            return self._sessions_full(id_)
        return self._no_session() if session is None else session

    async def in_session(
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
        if kind is jsonrpc.Kind.RESPONSE:
            # An answer to a question we asked; anything else is dropped. Shared: a question
            # of another replica's (its id names it) is passed on to it.
            if not self._legacy.answer(session, msg):
                await self.sessions.answer_elsewhere(session, msg)
            return web.Response(status=202)
        if kind is jsonrpc.Kind.NOTIFICATION:
            if not self.dispatcher.accepts_notification(msg):
                return refused(400, REQUEST_AS_NOTIFICATION)
            await self._legacy.notify(session, msg)
            if msg["method"] == "notifications/cancelled":
                # Shared, the request may run on another replica (where it was sent).
                request_id = jsonrpc.params(msg).get("requestId")
                if isinstance(request_id, str | int) and request_id not in session.in_flight:
                    await self.sessions.cancel_elsewhere(session, request_id)
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
        relay = Relay(request, self._stats, cancel_when_gone=False)
        timer = relay.open_window(self._timers)
        loop = asyncio.get_running_loop()
        id_ = msg["id"]
        work = loop.create_task(self._legacy.handle(session, msg, relay.note, origin_of(request)))
        session.in_flight[id_] = work
        work.add_done_callback(lambda _: session.in_flight.pop(id_, None))
        try:
            reply = await asyncio.shield(work)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if CUT in request:
                reply = cut_off(id_)  # (the session's work ends with the session)
            elif task is not None and task.cancelling():
                raise  # this connection is going; the work goes on in the session
            else:
                reply = jsonrpc.error(id_, codes.INTERNAL_ERROR, "Request cancelled")
        finally:
            timer.cancel()
            if relay.keepalive is not None:
                await relay.stop_keepalive()
        if msg["method"] in SESSION_STATE_METHODS:
            saved = await self._share_state(session, msg["method"], reply)
            if saved is not None:
                return saved
        return await self._replies.finish(relay, reply, errors.LEGACY_HTTP_STATUS)

    async def _share_state(
        self, session: HttpSession, method: str, reply: Message
    ) -> web.Response | None:
        """What the request changed, for every replica (cluster.redis: into the session's
        record); the response that replaces the reply when that failed."""
        if "error" in reply:
            return None
        try:
            if not await self.sessions.save(session):
                return self._no_session()
        except SessionsUnavailable as exc:
            return self._unavailable(exc, reply.get("id"))
        if method != "logging/setLevel":
            await self.sessions.subscriptions_changed(session)
        return None

    async def session_method(self, request: web.BaseRequest, session_id: str) -> web.StreamResponse:
        session = await self._session(request, session_id, None)
        if not isinstance(session, HttpSession):
            return session
        if request.method == "DELETE":
            try:
                await self.sessions.delete(session)
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
        sessions = self.sessions
        sessions.stream_opened(session, origin_of(request).within(session))
        touched = time.monotonic()
        stream = web.StreamResponse(headers=SSE_HEADERS)
        try:
            stream = await start_stream(request, SSE_HEADERS)
            await stream.write(sse.KEEPALIVE)
            while True:
                if time.monotonic() - touched > sessions.touch_interval:
                    # An open stream is use: its record must not expire meanwhile (and one
                    # gone, the message of its end lost, ends the session's copy here).
                    touched = time.monotonic()
                    with contextlib.suppress(SessionsUnavailable):
                        if not await sessions.touch(session):
                            sessions.end(session)
                try:
                    msg = await asyncio.wait_for(session.outbox.get(), replies.KEEPALIVE_INTERVAL)
                except TimeoutError:
                    await stream.write(sse.KEEPALIVE)
                    continue
                if msg is None:
                    break
                await stream.write(self._replies.count_out(sse.event(jsonrpc.encode(msg))))
            await stream.write_eof()
        except ConnectionResetError:
            pass  # the client has gone; the session stays for its next GET
        finally:
            session.streaming = False
            sessions.stream_closed(session)
        return stream


async def _drop(_: Message) -> None:
    return None


def _owner(request: web.BaseRequest) -> str:
    return owner_of(identity_of(request), request.headers.get(hdrs.AUTHORIZATION))
