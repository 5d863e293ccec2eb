"""One exchange with a Streamable HTTP backend (basic/transports/streamable-http): a POST out,
its reply in.

The headers are derived here from the body actually sent (hop.py): the fixed ones, the mirrored
ones (each distinct set built once) and `Mcp-Param-*`; nothing the front-end client sent in its
own headers is copied. The POST goes to a replica (replicas.py: failover decided at the
response head) under the backend's login when it has one (`auth:`: web.send_with_token sends
again once a refused token is renewed). The reply is read whole as JSON, or as an SSE stream
until the response carrying the request's id, bounded by `limits` (capped.py, sse.py). Closing
a reply's connection, rather than returning it to the pool, is how a request is cancelled
(streamable-http, Cancellation).

Every request goes out under an id (and progress token) of the gateway's (ids.py), and only
the response with that id ends it. While a legacy session is open, the era layer has handed
the backend a `Session` (era/http_session.py): its headers replace the mirrored ones, its
replica takes every request, and it reads a stream that may have to be resumed.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
from multidict import CIMultiDict

from gateway.backend_auth import setup as oauth_setup
from gateway.backend_auth.seam import GATEWAY, Caller
from gateway.backends import hop, ids, safety, web
from gateway.backends.base import NotificationSink
from gateway.backends.replicas import Replica, Replicas
from gateway.capped import TooLarge, read_capped
from gateway.config import BackendConfig, HttpTarget
from gateway.errors import (
    BackendConnectionLost,
    BackendLoginNeeded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    Refused,
    SessionExpired,
)
from gateway.origin import Origin
from gateway.protocol import codes, headers, jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats, Telemetry

if TYPE_CHECKING:
    from gateway.backend_auth.authorizer import Authorizer

log = logging.getLogger("gateway.backend")

SSE = sse.MEDIA_TYPE
# Fixed for every POST: the two media types we accept and the one we send.
POST_HEADERS = (
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)
# Distinct mirrored header sets kept encoded (method, version, name: few repeat).
MIRRORED_CACHE = 1024
# Statuses of a proxy or server in front of a replica that could not serve (with a body that is
# not JSON-RPC): the replica failed, and a request that may be repeated goes to another.
FAILED_STATUSES = frozenset({502, 503, 504})


class Reading:
    """One reply stream across its connections: the decoder of the current one (which carries
    the last event id and `retry` over to the next), the bytes so far, and the messages."""

    __slots__ = ("decoder", "messages", "received", "strays")

    def __init__(self, decoder: sse.Decoder) -> None:
        self.decoder = decoder
        self.received = 0
        self.messages = 0
        self.strays = 0  # replies under an id that was not sent: the backend is out of step


class Session(Protocol):
    """A legacy session on the backend (2025-11-25 transports, Session Management), handed over
    by the era layer between `initialize` and its end (era/http_session.py): what each exchange
    asks of it. None while the backend is modern."""

    # A POST's headers: the fixed ones, the agreed version and the session id.
    headers: CIMultiDict[str]
    # Several replicas: the one the session lives on, and whether it failed since (the session
    # is then given up: SessionExpired).
    replica: Replica | None
    lost: bool

    def pinned(self) -> Replica:
        """The replica of the session (the one that answered its `initialize`)."""
        ...

    def check(self, resp: aiohttp.ClientResponse) -> None:
        """A response's head: the session id it gives, or SessionExpired (404)."""
        ...

    def lose(self, exc: BaseException, repeatable: bool) -> BaseException:
        """What to raise for `exc`, the failure of the session's replica."""
        ...

    async def read_stream(
        self,
        resp: aiohttp.ClientResponse,
        sent: ids.Sent,
        sink: NotificationSink,
        origin: Origin,
        within: float | None,
    ) -> Message:
        """A streamed reply, resumed when it breaks off, or taken from the standing stream."""
        ...

    def cancel(self, sent: ids.Sent, msg: Message, origin: Origin) -> None:
        """A request given up: the server is told (a disconnection is not a cancellation)."""
        ...

    async def end(self) -> None:
        """DELETE the session (shutdown)."""
        ...


class HttpExchange:
    """What every exchange of one backend shares: its replicas, login, limits and the caches
    of headers; `HttpBackend` (http.py) adds the pools and the backend's life."""

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, HttpTarget)
        self.stats = stats or Stats()
        self.name = config.name
        target = config.target
        # A malformed URL fails here, at start-up. Several `urls`: replicas of one server.
        self.replicas = Replicas(web.replica_urls(config), target.balance, target.eject_for)
        if not self.replicas.several:
            self.replicas.all[0].reachable = False  # (not up until a request went through)
        # Several replicas: the tools that may be repeated on another after a failure.
        self._safe = safety.SafeTools() if self.replicas.several else None
        self.limits = config.target.limits
        self.custom = web.fixed_headers(config)
        self.fixed = [*self.custom, *POST_HEADERS]
        # The mirrored headers repeat from call to call (method, version, tool name): derive,
        # validate and build each distinct set once.
        self._mirrored = functools.lru_cache(maxsize=MIRRORED_CACHE)(self._mirror)
        self._tools = hop.ToolHeaders()
        self.connect_timeout = config.connect_timeout
        # The legacy era (set by era/http_session.py): a session id the server gives at
        # `initialize`, sent on every request with the agreed version; None while modern.
        self.session: Session | None = None
        self.takes_requests = False
        # The traffic tap, when it is on (set by gateway/app/): each message is recorded where it is
        # written or read, below the era layer's translation.
        self.tap: Telemetry | None = None
        # Configured headers are credentials as often as not: the tap never sees them.
        self._configured = frozenset(name.lower() for name in config.target.headers)
        self._ids = itertools.count(1)
        # The sinks of the requests in flight on a legacy session: a question the server sends
        # on its GET stream belongs to the one there is, if there is only one.
        self.asking: dict[int, NotificationSink] = {}
        # The gateway's login to this backend (its `auth:`), shared with its session views.
        self._authorizer: Authorizer | None = oauth_setup.authorizer(config)

    @property
    def authorizer(self) -> Authorizer | None:
        return self._authorizer

    # --- the request's headers ---------------------------------------------------------------

    def _headers(self, msg: Message) -> CIMultiDict[str]:
        session = self.session
        if session is not None:
            base = session.headers
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
        return CIMultiDict([*self.fixed, *hop.mirrored(*fields).items()])

    # --- sending: a replica, the token loop --------------------------------------------------

    def open(
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
    ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
        """Send one request to `replica` with `whose` token (web.caller: the gateway's own for
        what is everyone's alike); its response once the head has arrived. (A plain function
        handing back the coroutine that sends: no frame of its own on every request.)"""
        if self._authorizer is not None:
            return self._open_authorized(
                self._authorizer, replica, session, method, sent, body, within, deadline, whose
            )
        return self._open_once(replica, session, method, sent, body, within, deadline)

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
            try:
                resp = await web.request(session, method, replica.url, sent, body, deadline)
            except web.StaleConnection:  # (nothing was sent: another pooled connection)
                resp = await web.send(session, method, replica.url, sent, body, deadline)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = web.failure(self.name, exc, within)
            if isinstance(error, BackendUnavailable | BackendConnectionLost):
                self.replicas.failed(replica, unreachable=isinstance(error, BackendUnavailable))
            raise error from None
        self.replicas.reached(replica)
        return resp

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
        replicas, legacy = self.replicas, self.session
        if not replicas.several or (legacy is not None and legacy.replica is not None):
            replica = replicas.all[0] if legacy is None else legacy.pinned()
            if legacy is not None and legacy.lost:
                raise SessionExpired(self.name, "the session's replica failed")
            replica.in_flight += 1
            try:
                resp = await self.open(
                    replica, session, "POST", sent, body, within, deadline, whose=whose
                )
            except BaseException as exc:
                replica.in_flight -= 1
                if legacy is not None and replicas.several:
                    raise legacy.lose(exc, self._repeatable(msg)) from None
                raise
            if legacy is not None and replicas.several and self._failed(replica, resp):
                legacy.lost = True
                if self._repeatable(msg):
                    replica.in_flight -= 1
                    resp.close()
                    status = BackendUnavailable(self.name, f"HTTP {resp.status}")
                    raise legacy.lose(status, True)
            return resp, replica  # (a failure's reply says why: _json_reply)
        failure: BaseException | None = None
        for replica in replicas.candidates():
            replica.in_flight += 1
            try:
                resp = await self.open(
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
        self.replicas.failed(replica, unreachable=False)
        return True

    def _repeatable(self, msg: Message) -> bool:
        """Whether `msg` may be sent again after a failure that may have let it run; a legacy
        `initialize` may (a session opened on a failed replica is only left to expire)."""
        names = self._safe.names if self._safe is not None else ()
        return msg.get("method") == "initialize" or safety.may_repeat(msg, names)

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
        """`open` with the gateway's token, renewed when the backend refuses it."""

        def send(headers: CIMultiDict[str]) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
            return self._open_once(replica, session, method, headers, body, within, deadline)

        return await web.send_with_token(self.name, authorizer, whose, send, sent)

    # --- one exchange ------------------------------------------------------------------------

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
        self.stats.bytes["backend", "out"] += len(body)
        if self.tap is not None:
            self.tap.record("backend", "out", out, backend=self.name, headers=self._shown(headers))
        # (Registered before the POST is answered: a server may ask before it replies at all.)
        asking = id(sent)
        if self.takes_requests and "id" in msg:
            self.asking[asking] = sink
        auth = self._authorizer
        whose = GATEWAY if auth is None else web.caller(auth, origin, web.shared(msg))
        try:
            if auth is None and self.session is None and not self.replicas.several:
                # The common case in this frame: one replica, no login, no legacy session.
                replica = self.replicas.all[0]
                replica.in_flight += 1
                try:
                    resp = await self._open_once(
                        replica, session, "POST", headers, body, within, deadline
                    )
                except BaseException:
                    replica.in_flight -= 1
                    raise
            else:
                resp, replica = await self._open_post(
                    msg, session, headers, body, within, deadline, whose
                )
        except (asyncio.CancelledError, BackendTimeout):
            self.asking.pop(asking, None)
            self._cancel(sent, msg, origin)  # (it went out: the server may be at work on it)
            raise
        except BaseException:
            self.asking.pop(asking, None)
            raise
        # A listen stream (no deadline) lasts as long as its client, mostly idle: not counted
        # as in flight on its replica, or least_in_flight would shun replicas with listeners.
        counted = within is not None
        if not counted:
            replica.in_flight -= 1
        try:
            if self.session is not None:
                self.session.check(resp)
            if resp.content_type == SSE:
                reply = await self._read_stream(resp, sent, sink, origin, within)
            else:
                reply = self._json_reply(resp.status, await self.read_body(resp), sent)
        except BaseException as exc:
            # Closing (not releasing) the connection is what tells the backend that this
            # request is cancelled (streamable-http, Cancellation).
            resp.close()
            if isinstance(exc, asyncio.CancelledError | TimeoutError | BackendTimeout):
                self._cancel(sent, msg, origin)
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise web.failure(self.name, exc, within) from None
            raise
        finally:
            self.asking.pop(asking, None)
            if counted:
                replica.in_flight -= 1
        resp.release()
        if msg.get("method") == "tools/list":
            self._tools.learn(reply)
            if self._safe is not None:
                self._safe.learn(reply)
        return reply

    def _cancel(self, sent: ids.Sent, msg: Message, origin: Origin) -> None:
        """A modern server learns that a request is given up from its closed connection alone;
        a legacy session tells its server (era/http_session.py)."""
        if self.session is not None:
            self.session.cancel(sent, msg, origin)

    # --- reading the reply -------------------------------------------------------------------

    async def read_body(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, refused past `limits.max_reply_bytes` (`capped.read_capped`)."""
        limit = self.limits.max_reply_bytes
        try:
            body = await read_capped(resp, limit)
        except TooLarge:
            raise BackendProtocolError(self.name, f"a reply over {limit} bytes") from None
        self.stats.bytes["backend", "in"] += len(body)
        return body

    def _json_reply(self, status: int, body: bytes, sent: ids.Sent) -> Message:
        reply = jsonrpc.decode(body, keep=True) if body else None
        if self.tap is not None and isinstance(reply, dict):
            self.tap.record("backend", "in", reply, backend=self.name)
        if isinstance(reply, dict) and "method" not in reply:  # (decoded: a response)
            if ids.answers(reply, sent):
                return ids.restore(reply, sent)
            self.stray(reply.get("id"))
            raise BackendProtocolError(self.name, "the reply's id is not the request's")
        detail = f"HTTP {status}"
        if status >= 500 or status in (401, 403, 404, 405):
            raise BackendUnavailable(self.name, f"{detail} without a JSON-RPC reply")
        raise BackendProtocolError(self.name, f"{detail}: the reply is not a JSON-RPC response")

    def stray(self, id_: object) -> None:
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
        together by `limits.max_reply_bytes`. The modern era has no resumption (2026-07-28
        streamable-http): a stream that ends before the reply fails the request."""
        if self.session is not None:
            return await self.session.read_stream(resp, sent, sink, origin, within)
        reading = Reading(sse.Decoder(self.limits.max_event_bytes))
        reply = await self.read_events(resp, reading, sent, sink, within is not None)
        if reply is not None:
            return reply
        if reading.strays:
            raise BackendProtocolError(self.name, "the stream ended with replies to other ids")
        raise BackendConnectionLost(self.name, "the stream ended before the reply")

    async def read_events(
        self,
        resp: aiohttp.ClientResponse,
        reading: Reading,
        sent: ids.Sent,
        sink: NotificationSink,
        bounded: bool,
    ) -> Message | None:
        """One connection's events: the response when it came, None when the stream ended."""
        decoder = reading.decoder
        limit = self.limits.max_reply_bytes if bounded else None
        try:
            async for chunk in resp.content.iter_any():
                reading.received += len(chunk)
                self.stats.bytes["backend", "in"] += len(chunk)
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
        self, data: bytes, reading: Reading, sent: ids.Sent, sink: NotificationSink
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
            self.stray(event.get("id"))
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
