"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on the backend's pooled aiohttp session. The mirrored headers and
Mcp-Param-* are derived here from the body actually sent (hop.py); nothing the front-end client
sent in its own headers is copied. Closing a reply's connection, rather than returning it to
the pool, is how a request is cancelled (streamable-http, Cancellation); a legacy server is
also sent `notifications/cancelled` (2025-11-25 transports: a disconnection is not one).

Every request goes out under an id (and progress token) of the gateway's (ids.py), and only
the response with that id ends it. A legacy server's stream that ends before its response is
resumed when it can be (era/resume.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import anyio
from multidict import CIMultiDict

from gateway.backend_auth import setup as oauth_setup
from gateway.backend_auth.authorizer import GATEWAY, Authorizer, Caller
from gateway.backend_auth.failures import AuthFailed
from gateway.backends import hop, ids, safety, web
from gateway.backends.base import Call, NotificationSink
from gateway.backends.era import questions, resume
from gateway.backends.era.link import SessionLink
from gateway.backends.replicas import Replica, Replicas
from gateway.capped import TooLarge, read_capped
from gateway.config import BackendConfig, ConfigInvalid, HttpTarget
from gateway.errors import (
    BackendConnectionLost,
    BackendError,
    BackendLoginNeeded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    Refused,
    SessionExpired,
)
from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol import codes, headers, jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.proxies import env_proxy
from gateway.telemetry.api import Stats, Telemetry

log = logging.getLogger("gateway.backend")

SSE = sse.MEDIA_TYPE
SESSION_HEADER = "Mcp-Session-Id"
# Fixed for every POST: the two media types we accept and the one we send.
POST_HEADERS = (
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)
# Shutdown waits this long for a legacy session's DELETE.
END_SESSION_TIMEOUT = 1.0
# Distinct mirrored header sets kept encoded (method, version, name: few repeat).
MIRRORED_CACHE = 1024
# A session id is visible ASCII (2025-11-25 transports, Session Management): anything else
# from a server is not sent back in a header.
_SESSION_ID = re.compile(r"[\x21-\x7e]+")
# Statuses of a proxy or server in front of a replica that could not serve (with a body that is
# not JSON-RPC): the replica failed, and a request that may be repeated goes to another.
FAILED_STATUSES = frozenset({502, 503, 504})


class HttpBackend(SessionLink):
    transport = "http"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, HttpTarget)
        self._config = config
        self._stats = stats or Stats()
        self.name = config.name
        target = config.target
        # A malformed URL fails here, at start-up. Several `urls`: replicas of one server.
        self._replicas = Replicas(web.replica_urls(config), target.balance, target.eject_for)
        if not self._replicas.several:
            self._replicas.all[0].reachable = False  # (not up until a request went through)
        self._tls = web.ssl_context(config)
        self._proxy = _one_proxy(config, self._replicas)
        # Several replicas: the tools that may be repeated on another after a failure.
        self._safe = safety.SafeTools() if self._replicas.several else None
        limits = config.target.limits
        self._limits = limits
        self._custom = web.fixed_headers(config)
        self._fixed = [*self._custom, *POST_HEADERS]
        # The mirrored headers repeat from call to call (method, version, tool name): derive,
        # validate and build each distinct set once.
        self._mirrored = functools.lru_cache(maxsize=MIRRORED_CACHE)(self._mirror)
        self._tools = hop.ToolHeaders()
        self._request_timeout = config.request_timeout
        self._connect_timeout = config.connect_timeout
        self._deadlines: dict[float | None, aiohttp.ClientTimeout] = {}
        self._calls: aiohttp.ClientSession | None = None
        # Set once `run` has made the sessions: a request that comes before (a replica's own
        # listens begin with the gateway) waits for it rather than finding the backend down.
        self._started = asyncio.Event()
        self._streams: aiohttp.ClientSession | None = None
        # The legacy era (set by era/layer.py): a session id the server gives at `initialize`,
        # sent on every request with the agreed version; None while the backend is modern.
        self._legacy: _LegacyHeaders | None = None
        # Other legacy sessions on this server, on these pools (session_view), ended with it.
        self._views: set[HttpBackend] = set()
        self.takes_requests = False
        self.on_notification: Callable[[str, Message], None] | None = None
        # The traffic tap, when it is on (set by gateway/app/): each message is recorded where it is
        # written or read, below the era layer's translation.
        self.tap: Telemetry | None = None
        # Configured headers are credentials as often as not: the tap never sees them.
        self._configured = frozenset(name.lower() for name in config.target.headers)
        self._ids = itertools.count(1)
        # The sinks of the requests in flight on a legacy session: a question the server sends
        # on its GET stream belongs to the one there is, if there is only one.
        self._asking: dict[int, NotificationSink] = {}
        # Legacy requests whose reply is being read from an SSE stream, by their id on the wire:
        # a 2025-11-25 server may send the reply of a request whose stream it closed on the
        # session's standing GET stream instead of the resumed one (`_reply_elsewhere`).
        self._awaited: dict[str, asyncio.Future[Message]] = {}
        # Set once the legacy session's standing GET stream has its answer's head (or none:
        # refused, failed): the era layer lets the session's requests go after it, so a server
        # sees the stream before any call whose reply it might send there (era/layer.py).
        self.stream_ready = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        # The gateway's login to this backend (its `auth:`), shared with its session views.
        self._authorizer: Authorizer | None = oauth_setup.authorizer(config)
        if self._authorizer is not None:
            self._authorizer.on_token = self._count_token

    def _deadline(self, within: float | None) -> aiohttp.ClientTimeout:
        """A ClientTimeout per distinct deadline, built once (there are a handful)."""
        found = self._deadlines.get(within)
        if found is None:
            found = self._deadlines[within] = web.timeout(within, self._connect_timeout)
        return found

    def pool_connections(self) -> tuple[int, int]:
        """Its pooled connections (in use, idle), for /metrics."""
        return web.pool_connections(self._calls, self._streams)

    def replica_stats(self) -> list[tuple[str, int, int]] | None:
        """Per replica (several `urls` only): its address, requests in flight, failures."""
        return self._replicas.stats() if self._replicas.several else None

    async def run(self) -> None:
        config, tls, proxy = self._config, self._tls, self._proxy
        self._calls = web.session(
            config,
            limit=self._limits.max_connections,
            default_timeout=self._deadline(self._request_timeout),
            tls=tls,
            proxy=proxy,
        )
        # Listen streams stay open indefinitely: their own session without a connection limit
        # or deadline, so that they can never use up the connections that calls need.
        self._streams = web.session(
            config, limit=None, default_timeout=self._deadline(None), tls=tls, proxy=proxy
        )
        self._started.set()
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(END_SESSION_TIMEOUT):
                    async with anyio.create_task_group() as tg:
                        for each in (self, *self._views):
                            tg.start_soon(each._end_session)
                sessions = (self._calls, self._streams)
                self._calls = self._streams = None
                for session in sessions:
                    await session.close()
                if self._authorizer is not None:
                    await self._authorizer.close()

    @property
    def up(self) -> bool:
        return self._replicas.up

    @property
    def authorizer(self) -> Authorizer | None:
        return self._authorizer

    def _count_token(self, grant: str, outcome: str) -> None:
        self._stats.backend_tokens[self.name, grant, outcome] += 1

    # --- the legacy era (2025-11-25 transports, Session Management) -------------------------

    def begin_session(self) -> None:
        """Legacy from now on, with no session yet (before `initialize`)."""
        self._legacy = _LegacyHeaders(self._fixed, self._custom)
        self.stream_ready.clear()

    def forget_session(self) -> None:
        """Modern after all (its answer to `initialize` was a modern error): no session."""
        self._legacy = None

    def agreed(self, version: str) -> None:
        assert self._legacy is not None
        self._legacy.version = version
        self._legacy.encode()

    def session_view(self) -> HttpBackend:
        """The same server for another legacy session, on this backend's connection pools: a
        server speaking both eras gets one per legacy client session (era/dual.py)."""
        view = HttpBackend(self._config, self._stats)
        view._calls, view._streams = self._calls, self._streams
        view._started = self._started
        view._authorizer = self._authorizer
        view._replicas, view._safe = self._replicas, self._safe
        view.tap = self.tap
        view._views = self._views
        self._views.add(view)
        return view

    async def end_session(self) -> None:
        """A view's session ends with its client's (`run` ends the backend's own and those of
        the views still open)."""
        self._views.discard(self)
        if self._calls is None or self._calls.closed:
            return  # the backend has stopped, and ended the session then
        with anyio.move_on_after(END_SESSION_TIMEOUT):
            await self._end_session()

    async def send(self, msg: Message, call: Call) -> None:
        await self.notify(msg, call.origin)

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message:
        if not self._started.is_set():
            await self._start()
        return await self._post(
            self._calls, msg, sink, GATEWAY_ORIGIN, within, self._deadline(within)
        )

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        """The legacy session's GET stream, until it ends: its notifications to `deliver`.
        False if the server offers none (405). A stream that had event ids is taken up again
        with `Last-Event-ID` after the server's `retry` (era/resume.py's bounds), so nothing sent
        meanwhile is lost; it returns once that fails."""
        session, legacy = self._streams, self._legacy
        if session is None or legacy is None:
            raise BackendUnavailable(self.name, "not started")
        reading = resume.Reading(sse.Decoder(self._limits.max_event_bytes))
        if not await self._watch_once(session, legacy, legacy.stream_headers, reading, deliver):
            return False
        failed = 0
        while failed < resume.MAX_ATTEMPTS and (last := resume.last_event_id(reading.decoder)):
            await anyio.sleep(resume.delay(reading.decoder, self._limits.max_resume_delay))
            reading.decoder = reading.decoder.resumed()
            before = reading.messages
            sent = legacy.stream_headers.copy()
            sent[resume.LAST_EVENT_ID] = last
            try:
                await self._watch_once(session, legacy, sent, reading, deliver)
            except SessionExpired:
                raise
            except BackendError as exc:
                log.info("backend %s: resuming the GET stream failed (%s)", self.name, exc)
            failed = 0 if reading.messages > before else failed + 1
        return True

    async def _watch_once(
        self,
        session: aiohttp.ClientSession,
        legacy: _LegacyHeaders,
        sent: CIMultiDict[str],
        reading: resume.Reading,
        deliver: Callable[[str, Message], None],
    ) -> bool:
        replica = self._pinned(legacy)
        try:
            resp = await self._open(replica, session, "GET", sent, None, None)
        except BackendError as exc:
            if not self._replicas.several:
                raise
            raise self._session_lost(legacy, exc, True) from None
        finally:
            self.stream_ready.set()
        try:
            if resp.status == 405:
                return False
            self._check_session(resp, legacy)
            if resp.status != 200 or resp.content_type != SSE:
                raise BackendProtocolError(self.name, f"GET stream answered HTTP {resp.status}")
            decoder = reading.decoder
            async for chunk in resp.content.iter_any():
                self._stats.bytes["backend", "in"] += len(chunk)
                for data in decoder.feed(chunk):
                    if not data:
                        continue  # (the priming event: an id, a `retry`, no message)
                    reading.messages += 1
                    event = jsonrpc.decode(data, keep=True)
                    if isinstance(event, jsonrpc.Invalid):
                        continue
                    if self.tap is not None:
                        self.tap.record("backend", "in", event, backend=self.name)
                    kind = jsonrpc.kind(event)
                    if kind is jsonrpc.Kind.NOTIFICATION:
                        deliver(self.name, event)
                    elif kind is jsonrpc.Kind.REQUEST:
                        await self._on_stream_request(event)
                    elif kind is jsonrpc.Kind.RESPONSE:
                        self._reply_elsewhere(event)
            return True
        except sse.EventTooLarge as exc:
            raise BackendProtocolError(self.name, f"GET stream: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            if resume.last_event_id(reading.decoder) is not None:
                return True  # (broken, but it can be resumed)
            raise web.failure(self.name, exc, None) from None
        finally:
            resp.close()

    def _reply_elsewhere(self, reply: Message) -> None:
        """A response on the session's standing GET stream: the reply of a request whose own
        stream ended without it, if one is awaited under its id (some servers send it on
        whatever GET stream comes next); anything else is dropped."""
        id_ = reply.get("id")
        waiter = self._awaited.get(id_) if isinstance(id_, str) else None
        if waiter is None or waiter.done():
            self._stray(id_)
            return
        waiter.set_result(reply)

    async def _on_stream_request(self, request: Message) -> None:
        """A question on the GET stream names no request (2025-11-25 servers may send one
        there while a call runs): it goes to the request in flight when there is exactly one,
        as on stdio, since a guess could show one user's question to another."""
        if request.get("method") != "ping" and len(self._asking) == 1:
            (sink,) = self._asking.values()
            await sink(request)
            return
        await self._refuse_unrelated(request)

    async def _refuse_unrelated(self, request: Message) -> None:
        """A request on the GET stream belongs to no client request: only ping and roots/list
        (with the configured roots) are answered."""
        refusal = "The gateway answers questions only within a request"
        await self.notify(questions.refuse_unattended(request, self._config.roots, refusal))

    async def _end_session(self) -> None:
        """A legacy session the gateway no longer needs is ended with DELETE (2025-11-25
        transports, Session Management); a server that refuses (405) just lets it expire."""
        legacy, session = self._legacy, self._calls
        if legacy is None or legacy.session_id is None or session is None:
            return
        sent = legacy.stream_headers
        if self._authorizer is not None:
            sent = sent.copy()
            with contextlib.suppress(AuthFailed):
                header = await self._authorizer.authorization(GATEWAY)
                if header is not None:
                    sent["Authorization"] = header
        try:
            resp = await web.send(session, "DELETE", self._pinned(legacy).url, sent)
            resp.close()
        except (aiohttp.ClientError, TimeoutError):
            pass

    def _check_session(self, resp: aiohttp.ClientResponse, legacy: _LegacyHeaders) -> None:
        if resp.status == 404 and legacy.session_id is not None:
            raise SessionExpired(self.name, "the server no longer knows the session")
        session_id = resp.headers.get(SESSION_HEADER)
        if session_id is not None and session_id != legacy.session_id:
            if _SESSION_ID.fullmatch(session_id) is None:
                raise BackendProtocolError(self.name, "the session id is not visible ASCII")
            legacy.session_id = session_id
            legacy.encode()

    # --- requests ----------------------------------------------------------------------------

    def _headers(self, msg: Message) -> CIMultiDict[str]:
        legacy = self._legacy
        if legacy is not None:
            base = legacy.headers
            extra = hop.trace_headers(msg)
        else:
            fields = headers.mirrored_fields(msg)
            try:
                base = self._mirrored(fields)
            except ValueError as exc:
                raise Refused(codes.INVALID_REQUEST, f"cannot be sent over HTTP: {exc}") from None
            # Trace context travels in headers too, for HTTP-aware tracing.
            extra = hop.trace_headers(msg)
            if fields[0] == "tools/call" and self._tools:
                extra += self._tools.params(msg, fields[2])
        if not extra:
            return base  # shared: aiohttp copies what it is given
        out = base.copy()
        out.extend(extra)
        return out

    def _shown(self, sent: CIMultiDict[str]) -> list[tuple[str, str]]:
        """A POST's headers as the tap records them: without the configured ones."""
        return [(k, v) for k, v in sent.items() if k.lower() not in self._configured]

    def _mirror(self, fields: tuple[str, str | None, str | None]) -> CIMultiDict[str]:
        return CIMultiDict([*self._fixed, *hop.mirrored(*fields).items()])

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,  # (each reply stream carries its own request's logs)
    ) -> Coroutine[Any, Any, Message]:
        # A plain function that hands back _post's coroutine: one coroutine frame less on every
        # request. A listen stream has no deadline.
        if not self._started.is_set():
            return self._after_start(msg, sink, call.origin, long_lived)
        if long_lived:
            return self._post(self._streams, msg, sink, call.origin, None)
        within = self._request_timeout if call.deadline is None else call.deadline
        if within == self._request_timeout:
            return self._post(self._calls, msg, sink, call.origin, within)
        # (A deadline set above for this one request: resilience.py.)
        deadline = web.timeout(within, self._connect_timeout)
        return self._post(self._calls, msg, sink, call.origin, within, deadline)

    async def _start(self) -> None:
        """Until `run` has begun, within connect_timeout (then the request finds it not
        started)."""
        with anyio.move_on_after(self._connect_timeout):
            await self._started.wait()

    async def _after_start(
        self, msg: Message, sink: NotificationSink, origin: Origin, long_lived: bool
    ) -> Message:
        """A request made before `run` began: sent once it has."""
        await self._start()
        if long_lived:
            return await self._post(self._streams, msg, sink, origin, None)
        return await self._post(self._calls, msg, sink, origin, self._request_timeout)

    async def notify(self, msg: Message, origin: Origin = GATEWAY_ORIGIN) -> None:
        """Made for `origin` (its token, where callers have one); by default the gateway's own."""
        session = self._calls
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            sent = self._headers(msg)
        except Refused as exc:
            log.warning("backend %s: notification not sent: %s", self.name, exc)
            return
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        if self.tap is not None:
            self.tap.record("backend", "out", msg, backend=self.name, headers=self._shown(sent))
        resp, replica = await self._open_post(
            msg,
            session,
            sent,
            body,
            self._request_timeout,
            None,
            web.caller(self._authorizer, origin),
        )
        replica.in_flight -= 1
        try:
            if self._legacy is not None:
                self._check_session(resp, self._legacy)
            await self._read_body(resp)
        except BaseException as exc:
            resp.close()
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise web.failure(self.name, exc, self._request_timeout) from None
            raise
        resp.release()

    async def _open(
        self,
        replica: Replica,
        session: aiohttp.ClientSession,
        method: str,
        sent: CIMultiDict[str],
        body: bytes | None,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None = None,
        *,
        whose: Caller = GATEWAY,
    ) -> aiohttp.ClientResponse:
        """Send one request to `replica` with `whose` token (web.caller: the gateway's own for
        what is everyone's alike); its response once the head has arrived."""
        if self._authorizer is not None:
            return await self._open_authorized(
                self._authorizer, replica, session, method, sent, body, within, deadline, whose
            )
        return await self._open_once(replica, session, method, sent, body, within, deadline)

    async def _open_once(
        self,
        replica: Replica,
        session: aiohttp.ClientSession,
        method: str,
        sent: CIMultiDict[str],
        body: bytes | None,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        try:
            resp = await web.send(session, method, replica.url, sent, body, deadline)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = web.failure(self.name, exc, within)
            if isinstance(error, BackendUnavailable | BackendConnectionLost):
                self._replicas.failed(replica, unreachable=isinstance(error, BackendUnavailable))
            raise error from None
        self._replicas.reached(replica)
        return resp

    def _pinned(self, legacy: _LegacyHeaders) -> Replica:
        """The replica of a legacy session (the one that answered its `initialize`)."""
        return legacy.replica or self._replicas.all[0]

    async def _open_post(
        self,
        msg: Message,
        session: aiohttp.ClientSession,
        sent: CIMultiDict[str],
        body: bytes,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None,
        whose: Caller,
    ) -> tuple[aiohttp.ClientResponse, Replica]:
        """A POST sent to a replica: its response (head) and that replica, counted in flight
        until the caller is done with it. Several replicas: a legacy session's request to its
        own; any other to the balancer's pick, and after a failure before any reply to the
        next one, if nothing was sent or the request may be repeated (safety.py)."""
        replicas, legacy = self._replicas, self._legacy
        if not replicas.several or (legacy is not None and legacy.replica is not None):
            replica = replicas.all[0] if legacy is None else self._pinned(legacy)
            if legacy is not None and legacy.lost:
                raise SessionExpired(self.name, "the session's replica failed")
            replica.in_flight += 1
            try:
                resp = await self._open(
                    replica, session, "POST", sent, body, within, deadline, whose=whose
                )
            except BaseException as exc:
                replica.in_flight -= 1
                if legacy is not None and replicas.several:
                    raise self._session_lost(legacy, exc, self._repeatable(msg)) from None
                raise
            if legacy is not None and replicas.several and self._failed(replica, resp):
                legacy.lost = True
                if self._repeatable(msg):
                    replica.in_flight -= 1
                    resp.close()
                    status = BackendUnavailable(self.name, f"HTTP {resp.status}")
                    raise self._session_lost(legacy, status, True)
            return resp, replica  # (a failure's reply says why: _json_reply)
        failure: BaseException | None = None
        for replica in replicas.candidates():
            replica.in_flight += 1
            try:
                resp = await self._open(
                    replica, session, "POST", sent, body, within, deadline, whose=whose
                )
            except (BackendUnavailable, BackendConnectionLost) as exc:
                replica.in_flight -= 1
                if isinstance(exc, BackendLoginNeeded | SessionExpired) or (
                    isinstance(exc, BackendConnectionLost) and not self._repeatable(msg)
                ):
                    raise
                failure = exc
                log.info("backend %s: replica %s failed (%s)", self.name, replica.label, exc)
                continue
            except BaseException:
                replica.in_flight -= 1
                raise
            if self._failed(replica, resp) and self._repeatable(msg):
                replica.in_flight -= 1
                resp.close()
                failure = BackendUnavailable(self.name, f"HTTP {resp.status} from a replica")
                log.info("backend %s: replica %s failed (%s)", self.name, replica.label, failure)
                continue
            if legacy is not None:
                legacy.replica = replica  # (its `initialize`: the session lives there)
            return resp, replica
        assert failure is not None
        raise failure

    def _failed(self, replica: Replica, resp: aiohttp.ClientResponse) -> bool:
        """Whether a replica's answer is a failure of the replica (a 502/503/504 whose body is
        not JSON-RPC): it is then ejected for a while."""
        if resp.status not in FAILED_STATUSES or resp.content_type in ("application/json", SSE):
            return False
        self._replicas.failed(replica, unreachable=False)
        return True

    def _repeatable(self, msg: Message) -> bool:
        """Whether `msg` may be sent again after a failure that may have let it run; a legacy
        `initialize` may (a session opened on a failed replica is only left to expire)."""
        names = self._safe.names if self._safe is not None else ()
        return msg.get("method") == "initialize" or safety.may_repeat(msg, names)

    def _session_lost(
        self, legacy: _LegacyHeaders, exc: BaseException, repeatable: bool
    ) -> BaseException:
        """A legacy session's replica failed: the session is given up. A request that was not
        sent, or may be repeated, is SessionExpired, which the era layer answers as any lost
        session: a new `initialize` (on another replica) and the request sent again."""
        if not isinstance(exc, BackendUnavailable | BackendConnectionLost):
            return exc
        if isinstance(exc, BackendLoginNeeded | SessionExpired):
            return exc
        legacy.lost = True
        if isinstance(exc, BackendUnavailable) or repeatable:
            log.info("backend %s: a legacy session's replica failed (%s)", self.name, exc)
            return SessionExpired(self.name, f"the session's replica failed ({exc})")
        return exc

    async def _open_authorized(
        self,
        authorizer: Authorizer,
        replica: Replica,
        session: aiohttp.ClientSession,
        method: str,
        sent: CIMultiDict[str],
        body: bytes | None,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None,
        whose: Caller,
    ) -> aiohttp.ClientResponse:
        """`_open` with the gateway's token, renewed when the backend refuses it."""

        def send(headers: CIMultiDict[str]) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
            return self._open_once(replica, session, method, headers, body, within, deadline)

        return await web.send_with_token(self.name, authorizer, whose, send, sent)

    async def _post(
        self,
        session: aiohttp.ClientSession | None,
        msg: Message,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None = None,
    ) -> Message:
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        out, sent = ids.outbound(msg, f"{ids.PREFIX}{next(self._ids)}")
        headers = self._headers(out)
        body = jsonrpc.encode(out)
        self._stats.bytes["backend", "out"] += len(body)
        if self.tap is not None:
            self.tap.record("backend", "out", out, backend=self.name, headers=self._shown(headers))
        # (Registered before the POST is answered: a server may ask before it replies at all.)
        asking = id(sent)
        if self.takes_requests and "id" in msg:
            self._asking[asking] = sink
        auth = self._authorizer
        whose = GATEWAY if auth is None else web.caller(auth, origin, web.shared(msg))
        try:
            resp, replica = await self._open_post(
                msg, session, headers, body, within, deadline, whose
            )
        except (asyncio.CancelledError, BackendTimeout):
            self._asking.pop(asking, None)
            self._cancel_legacy(sent, msg, origin)  # (it went out: the server may be at it)
            raise
        except BaseException:
            self._asking.pop(asking, None)
            raise
        # A listen stream (no deadline) lasts as long as its client, mostly idle: not counted
        # as in flight on its replica, or least_in_flight would shun replicas with listeners.
        counted = within is not None
        if not counted:
            replica.in_flight -= 1
        try:
            if self._legacy is not None:
                self._check_session(resp, self._legacy)
            if resp.content_type == SSE:
                reply = await self._read_stream(resp, sent, sink, origin, within)
            else:
                reply = self._json_reply(resp.status, await self._read_body(resp), sent)
        except BaseException as exc:
            # Closing (not releasing) the connection is what tells the backend that this
            # request is cancelled (streamable-http, Cancellation).
            resp.close()
            if isinstance(exc, asyncio.CancelledError | TimeoutError | BackendTimeout):
                self._cancel_legacy(sent, msg, origin)
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise web.failure(self.name, exc, within) from None
            raise
        finally:
            self._asking.pop(asking, None)
            if counted:
                replica.in_flight -= 1
        resp.release()
        if msg.get("method") == "tools/list":
            self._tools.learn(reply)
            if self._safe is not None:
                self._safe.learn(reply)
        return reply

    def _cancel_legacy(self, sent: ids.Sent, msg: Message, origin: Origin) -> None:
        """A legacy server learns that a request is given up only from `notifications/cancelled`
        (2025-11-25: a disconnection is not a cancellation), naming the id it was sent; never
        for `initialize` (basic/utilities/cancellation)."""
        if self._legacy is None or msg.get("method") == "initialize":
            return
        note: Message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": sent.wire, "reason": "cancelled by the client"},
        }
        task = asyncio.get_running_loop().create_task(self._notify_quietly(note, origin))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _notify_quietly(self, note: Message, origin: Origin) -> None:
        with contextlib.suppress(BackendError):
            await self.notify(note, origin)

    async def _read_body(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, refused past `limits.max_reply_bytes` (`capped.read_capped`)."""
        limit = self._limits.max_reply_bytes
        try:
            body = await read_capped(resp, limit)
        except TooLarge:
            raise BackendProtocolError(self.name, f"a reply over {limit} bytes") from None
        self._stats.bytes["backend", "in"] += len(body)
        return body

    def _json_reply(self, status: int, body: bytes, sent: ids.Sent) -> Message:
        reply = jsonrpc.decode(body, keep=True) if body else None
        if self.tap is not None and isinstance(reply, dict):
            self.tap.record("backend", "in", reply, backend=self.name)
        if isinstance(reply, dict) and "method" not in reply:  # (decoded: a response)
            if ids.answers(reply, sent):
                return ids.restore(reply, sent)
            self._stray(reply.get("id"))
            raise BackendProtocolError(self.name, "the reply's id is not the request's")
        detail = f"HTTP {status}"
        if status >= 500 or status in (401, 403, 404, 405):
            raise BackendUnavailable(self.name, f"{detail} without a JSON-RPC reply")
        raise BackendProtocolError(self.name, f"{detail}: the reply is not a JSON-RPC response")

    def _stray(self, id_: object) -> None:
        log.warning(
            "backend %s: dropped a reply for id %r, not the one it was sent", self.name, id_
        )

    async def _read_stream(
        self,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
    ) -> Message:
        """The events of a streamed reply until the response; each event is bounded by
        `limits.max_event_bytes`, and (but for a listen stream, which has no end) all of them
        together by `limits.max_reply_bytes`, across resumptions too."""
        if self._legacy is None:
            return await self._read_reply(resp, sent, sink, origin, within, None)
        # Awaited from the start: the reply may come on the standing stream before this one's
        # end is read.
        waiter: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._awaited[sent.wire] = waiter
        try:
            return await self._read_reply(resp, sent, sink, origin, within, waiter)
        finally:
            del self._awaited[sent.wire]

    async def _read_reply(
        self,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
        elsewhere: asyncio.Future[Message] | None,
    ) -> Message:
        started = anyio.current_time()
        reading = resume.Reading(sse.Decoder(self._limits.max_event_bytes))
        bounded = within is not None
        legacy = self._legacy
        try:
            reply = await self._read_events(resp, reading, sent, sink, bounded)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            unresumable = legacy is None or resume.last_event_id(reading.decoder) is None
            if unresumable and (elsewhere is None or not elsewhere.done()):
                raise  # (the request may have run: -31005)
            reply = None
        if reply is not None:
            return reply
        if elsewhere is not None and elsewhere.done():
            return ids.restore(elsewhere.result(), sent)
        if reading.strays:
            raise BackendProtocolError(self.name, "the stream ended with replies to other ids")
        if legacy is None:
            # The modern era has no resumption (2026-07-28 streamable-http).
            raise BackendConnectionLost(self.name, "the stream ended before the reply")
        resp.close()
        left = None if within is None else within - (anyio.current_time() - started)

        async def attempt(last_id: str, remaining: float | None) -> Message | None:
            return await self._resume_once(legacy, last_id, remaining, reading, sent, sink, origin)

        limits = self._limits
        resuming = resume.resume(
            self.name,
            reading,
            attempt,
            left,
            attempts=limits.max_resumptions,
            longest=limits.max_resume_delay,
        )
        if elsewhere is None:
            return await resuming
        return await self._first_of(resuming, elsewhere, sent)

    @staticmethod
    async def _first_of(
        resuming: Coroutine[Any, Any, Message], elsewhere: asyncio.Future[Message], sent: ids.Sent
    ) -> Message:
        """The reply from the resumed stream, or from the standing one if it comes there first
        (the resumption is then given up)."""
        task = asyncio.ensure_future(resuming)
        try:
            await asyncio.wait((task, elsewhere), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, BackendError):
                    await task
        if elsewhere.done():
            return ids.restore(elsewhere.result(), sent)
        return task.result()

    async def _resume_once(
        self,
        legacy: _LegacyHeaders,
        last_id: str,
        within: float | None,
        reading: resume.Reading,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
    ) -> Message | None:
        """One GET taking up a request's stream (2025-11-25 transports, Resumability and
        Redelivery): the response if it came on it."""
        session = self._streams
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        headers = legacy.stream_headers.copy()
        headers[resume.LAST_EVENT_ID] = last_id
        deadline = web.timeout(within, self._connect_timeout)
        whose = web.caller(self._authorizer, origin)
        try:
            resp = await self._open(
                self._pinned(legacy), session, "GET", headers, None, within, deadline, whose=whose
            )
        except BackendTimeout:
            raise
        except BackendError:
            return None  # (cannot connect, or broken before the head: a GET may go again)
        try:
            self._check_session(resp, legacy)
            if resume.final(resp.status):
                raise BackendConnectionLost(
                    self.name, f"the stream ended before the reply; resuming: HTTP {resp.status}"
                )
            if resp.status != 200 or resp.content_type != SSE:
                return None
            return await self._read_events(resp, reading, sent, sink, within is not None)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            return None  # (broken again: perhaps resumed again)
        finally:
            resp.close()

    async def _read_events(
        self,
        resp: aiohttp.ClientResponse,
        reading: resume.Reading,
        sent: ids.Sent,
        sink: NotificationSink,
        bounded: bool,
    ) -> Message | None:
        """One connection's events: the response when it came, None when the stream ended."""
        decoder = reading.decoder
        limit = self._limits.max_reply_bytes if bounded else None
        try:
            async for chunk in resp.content.iter_any():
                reading.received += len(chunk)
                self._stats.bytes["backend", "in"] += len(chunk)
                if limit is not None and reading.received > limit:
                    raise BackendProtocolError(self.name, f"a streamed reply over {limit} bytes")
                events = decoder.feed(chunk)
                for at, data in enumerate(events):
                    reply = await self._on_event(data, reading, sent, sink)
                    if reply is not None:
                        self._after_reply(events[at + 1 :])
                        return reply
            for data in decoder.close():
                reply = await self._on_event(data, reading, sent, sink)
                if reply is not None:
                    return reply
        except sse.EventTooLarge as exc:
            raise BackendProtocolError(self.name, str(exc)) from None
        return None

    def _after_reply(self, events: list[bytes]) -> None:
        """What came with the response, after it: a second response is dropped (logged); the
        rest of the stream is never read (its connection is closed, not reused)."""
        for data in events:
            event = jsonrpc.decode(data) if data else None
            if isinstance(event, dict) and jsonrpc.kind(event) is jsonrpc.Kind.RESPONSE:
                log.warning("backend %s: dropped a second reply on one stream", self.name)

    async def _on_event(
        self, data: bytes, reading: resume.Reading, sent: ids.Sent, sink: NotificationSink
    ) -> Message | None:
        if not data:
            return None  # (an event that only carries an id or `retry`: the priming event)
        reading.messages += 1
        event = jsonrpc.decode(data, keep=True)
        if isinstance(event, jsonrpc.Invalid):
            if event.response and event.id == sent.wire:  # the reply is there but unusable
                raise BackendProtocolError(self.name, event.message)
            log.warning("backend %s: dropped an SSE event that is not JSON-RPC", self.name)
            return None
        if self.tap is not None:
            self.tap.record("backend", "in", event, backend=self.name)
        kind = jsonrpc.kind(event)
        if kind is jsonrpc.Kind.RESPONSE:
            if ids.answers(event, sent):
                return ids.restore(event, sent)
            reading.strays += 1
            self._stray(event.get("id"))
            return None
        if kind is jsonrpc.Kind.NOTIFICATION:
            if event["method"] == "notifications/progress":
                note = ids.progress(event, sent)
                if note is None:
                    log.debug("backend %s: progress for another request dropped", self.name)
                    return None
                event = note
            await sink(event)
        elif self.takes_requests:
            await sink(event)  # (a legacy server's questions about this request)
        return None


class _LegacyHeaders:
    """The headers of a legacy session, built once per change."""

    def __init__(self, fixed: list[tuple[str, str]], custom: list[tuple[str, str]]) -> None:
        self._fixed = fixed
        self._custom = custom
        self.version: str | None = None
        self.session_id: str | None = None
        # Several replicas: the one the session lives on, and whether it failed since (the
        # session is then given up: SessionExpired).
        self.replica: Replica | None = None
        self.lost = False
        self.headers: CIMultiDict[str] = CIMultiDict(fixed)
        self.stream_headers: CIMultiDict[str] = CIMultiDict(custom)
        self.encode()

    def encode(self) -> None:
        fields: list[tuple[str, str]] = []
        if self.version is not None and hop.plain(self.version):
            fields.append((headers.PROTOCOL_VERSION, self.version))
        if self.session_id is not None:
            fields.append((SESSION_HEADER, self.session_id))
        self.headers = CIMultiDict([*self._fixed, *fields])
        self.stream_headers = CIMultiDict([*self._custom, ("Accept", SSE), *fields])


def _one_proxy(config: BackendConfig, replicas: Replicas) -> str | None:
    """The proxy of the backend's session (aiohttp takes one per session): replicas that
    `HTTP(S)_PROXY`/`NO_PROXY` send different ways are refused at start-up."""
    found = {env_proxy(r.url, f"backend {config.name}") for r in replicas.all}
    if len(found) > 1:
        raise ConfigInvalid(
            [f"backends.{config.name}.http.urls: the replicas must share one proxy (or none)"]
        )
    return found.pop()
