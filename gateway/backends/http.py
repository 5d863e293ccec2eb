"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on the backend's pooled aiohttp session. The mirrored headers and
Mcp-Param-* are derived here from the body actually sent (hop.py); nothing the front-end client
sent in its own headers is copied. Closing a reply's connection, rather than returning it to
the pool, is how a request is cancelled (streamable-http, Cancellation).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import anyio
from multidict import CIMultiDict

from gateway.backends import hop, web
from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, HttpTarget
from gateway.errors import (
    BackendProtocolError,
    BackendUnavailable,
    Refused,
    SessionExpired,
)
from gateway.protocol import codes, headers, jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

SSE = "text/event-stream"
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


class HttpBackend:
    transport = "http"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, HttpTarget)
        self._config = config
        self._stats = stats or Stats()
        self._up = False
        self.name = config.name
        self._url = web.target_url(config)  # a malformed URL fails here, at start-up
        self._tls = web.ssl_context(config)
        self._proxy = web.env_proxy(config, self._url)
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
        self._streams: aiohttp.ClientSession | None = None
        # The legacy era (set by era.py): a session id the server gives at `initialize`, sent on
        # every request with the agreed version; None while the backend is modern.
        self._legacy: _LegacyHeaders | None = None
        # Other legacy sessions on this server, on these pools (session_view), ended with it.
        self._views: set[HttpBackend] = set()
        self.takes_requests = False
        self.on_notification: Callable[[str, Message], None] | None = None

    def _deadline(self, within: float | None) -> aiohttp.ClientTimeout:
        """A ClientTimeout per distinct deadline, built once (there are a handful)."""
        found = self._deadlines.get(within)
        if found is None:
            found = self._deadlines[within] = web.timeout(within, self._connect_timeout)
        return found

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

    @property
    def up(self) -> bool:
        return self._up

    # --- the legacy era (2025-11-25 transports, Session Management) -------------------------

    def begin_session(self) -> None:
        """Legacy from now on, with no session yet (before `initialize`)."""
        self._legacy = _LegacyHeaders(self._fixed, self._custom)

    def agreed(self, version: str) -> None:
        assert self._legacy is not None
        self._legacy.version = version
        self._legacy.encode()

    def session_view(self) -> HttpBackend:
        """The same server for another legacy session, on this backend's connection pools: a
        server speaking both eras gets one per legacy client session (dual.py)."""
        view = HttpBackend(self._config, self._stats)
        view._calls, view._streams = self._calls, self._streams
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

    async def send(self, msg: Message) -> None:
        await self.notify(msg)

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message:
        return await self._post(self._calls, msg, sink, within, self._deadline(within))

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        """The legacy session's GET stream, until it ends: its notifications to `deliver`.
        False if the server offers none (405)."""
        session, legacy = self._streams, self._legacy
        if session is None or legacy is None:
            raise BackendUnavailable(self.name, "not started")
        resp = await self._open(session, "GET", legacy.stream_headers, None, None)
        try:
            if resp.status == 405:
                return False
            self._check_session(resp, legacy)
            if resp.status != 200 or resp.content_type != SSE:
                raise BackendProtocolError(self.name, f"GET stream answered HTTP {resp.status}")
            decoder = sse.Decoder(self._limits.max_event_bytes)
            async for chunk in resp.content.iter_any():
                self._stats.bytes["backend", "in"] += len(chunk)
                for data in decoder.feed(chunk):
                    event = jsonrpc.decode(data, keep=True)
                    if isinstance(event, jsonrpc.Invalid):
                        continue
                    if jsonrpc.kind(event) is jsonrpc.Kind.NOTIFICATION:
                        deliver(self.name, event)
                    elif jsonrpc.kind(event) is jsonrpc.Kind.REQUEST:
                        await self._refuse_unrelated(event)
            return True
        except sse.EventTooLarge as exc:
            raise BackendProtocolError(self.name, f"GET stream: {exc}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise web.failure(self.name, exc, None) from None
        finally:
            resp.close()

    async def _refuse_unrelated(self, request: Message) -> None:
        """A request on the GET stream belongs to no client request: only ping is answered."""
        if request.get("method") == "ping":
            await self.send(jsonrpc.result(request["id"], {}))
        else:
            refusal = "The gateway answers questions only within a request"
            await self.send(jsonrpc.error(request["id"], codes.METHOD_NOT_FOUND, refusal))

    async def _end_session(self) -> None:
        """A legacy session the gateway no longer needs is ended with DELETE (2025-11-25
        transports, Session Management); a server that refuses (405) just lets it expire."""
        legacy, session = self._legacy, self._calls
        if legacy is None or legacy.session_id is None or session is None:
            return
        try:
            resp = await web.send(session, "DELETE", self._url, legacy.stream_headers)
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

    def _mirror(self, fields: tuple[str, str | None, str | None]) -> CIMultiDict[str]:
        return CIMultiDict([*self._fixed, *hop.mirrored(*fields).items()])

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,  # (each reply stream carries its own request's logs)
    ) -> Coroutine[Any, Any, Message]:
        # A plain function that hands back _post's coroutine: one coroutine frame less on every
        # request. A listen stream has no deadline.
        if long_lived:
            return self._post(self._streams, msg, sink, None)
        return self._post(self._calls, msg, sink, self._request_timeout)

    async def notify(self, msg: Message) -> None:
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
        resp = await self._open(session, "POST", sent, body, self._request_timeout)
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
        session: aiohttp.ClientSession,
        method: str,
        sent: CIMultiDict[str],
        body: bytes | None,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None = None,
    ) -> aiohttp.ClientResponse:
        """Send one request; its response once the head has arrived."""
        try:
            resp = await web.send(session, method, self._url, sent, body, deadline)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = web.failure(self.name, exc, within)
            if isinstance(error, BackendUnavailable):
                self._up = False
            raise error from None
        self._up = True
        return resp

    async def _post(
        self,
        session: aiohttp.ClientSession | None,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        deadline: aiohttp.ClientTimeout | None = None,
    ) -> Message:
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        sent = self._headers(msg)
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        resp = await self._open(session, "POST", sent, body, within, deadline)
        try:
            if self._legacy is not None:
                self._check_session(resp, self._legacy)
            if resp.content_type == SSE:
                reply = await self._read_stream(resp, msg, sink, within is not None)
            else:
                reply = self._json_reply(resp.status, await self._read_body(resp), msg)
        except BaseException as exc:
            # Closing (not releasing) the connection is what tells the backend that this
            # request is cancelled (streamable-http, Cancellation).
            resp.close()
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise web.failure(self.name, exc, within) from None
            raise
        resp.release()
        if msg.get("method") == "tools/list":
            self._tools.learn(reply)
        return reply

    async def _read_body(self, resp: aiohttp.ClientResponse) -> bytes:
        """The whole body, refused past `limits.max_reply_bytes`: with one await when its
        length is known (aiohttp's parser then reads no more than it)."""
        limit = self._limits.max_reply_bytes
        length = resp.content_length
        if length is not None and length <= limit:
            body = await resp.read()
        elif length is not None:
            raise BackendProtocolError(self.name, f"a reply over {limit} bytes")
        else:
            parts: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise BackendProtocolError(self.name, f"a reply over {limit} bytes")
                parts.append(chunk)
            body = b"".join(parts)
        self._stats.bytes["backend", "in"] += len(body)
        return body

    def _json_reply(self, status: int, body: bytes, msg: Message) -> Message:
        reply = jsonrpc.decode(body, keep=True) if body else None
        if isinstance(reply, dict) and "method" not in reply:  # (decoded: a response)
            return self._own(reply, msg)
        detail = f"HTTP {status}"
        if status >= 500 or status in (401, 403, 404, 405):
            raise BackendUnavailable(self.name, f"{detail} without a JSON-RPC reply")
        raise BackendProtocolError(self.name, f"{detail}: the reply is not a JSON-RPC response")

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, msg: Message, sink: NotificationSink, bounded: bool
    ) -> Message:
        """The events of a streamed reply until the response; each event is bounded by
        `limits.max_event_bytes`, and (but for a listen stream, which has no end) all of them
        together by `limits.max_reply_bytes`."""
        decoder = sse.Decoder(self._limits.max_event_bytes)
        limit = self._limits.max_reply_bytes if bounded else None
        received = 0
        try:
            async for chunk in resp.content.iter_any():
                received += len(chunk)
                self._stats.bytes["backend", "in"] += len(chunk)
                if limit is not None and received > limit:
                    raise BackendProtocolError(self.name, f"a streamed reply over {limit} bytes")
                for data in decoder.feed(chunk):
                    reply = await self._on_event(data, msg, sink)
                    if reply is not None:
                        return reply
            for data in decoder.close():
                reply = await self._on_event(data, msg, sink)
                if reply is not None:
                    return reply
        except sse.EventTooLarge as exc:
            raise BackendProtocolError(self.name, str(exc)) from None
        raise BackendUnavailable(self.name, "the stream ended before the reply")

    async def _on_event(self, data: bytes, msg: Message, sink: NotificationSink) -> Message | None:
        event = jsonrpc.decode(data, keep=True)
        if isinstance(event, jsonrpc.Invalid):
            if event.response:  # the reply is there but cannot be used
                raise BackendProtocolError(self.name, event.message)
            log.warning("backend %s: dropped an SSE event that is not JSON-RPC", self.name)
            return None
        kind = jsonrpc.kind(event)
        if kind is jsonrpc.Kind.RESPONSE:
            return self._own(event, msg)
        if kind is jsonrpc.Kind.NOTIFICATION or self.takes_requests:
            await sink(event)  # (a legacy server's questions about this request too)
        return None

    def _own(self, reply: Message, msg: Message) -> Message:
        if "error" in reply and reply.get("id") is None:
            # Errors the backend raised before reading the id (header checks, parse errors).
            reply["id"] = msg["id"]
        elif reply.get("id") != msg.get("id"):
            raise BackendProtocolError(self.name, "the reply's id is not the request's")
        return reply


class _LegacyHeaders:
    """The headers of a legacy session, built once per change."""

    def __init__(self, fixed: list[tuple[str, str]], custom: list[tuple[str, str]]) -> None:
        self._fixed = fixed
        self._custom = custom
        self.version: str | None = None
        self.session_id: str | None = None
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
