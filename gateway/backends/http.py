"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on a pooled keep-alive session. The mirrored headers are derived
from the body actually sent; nothing the front-end client sent in its own headers is copied.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio

from gateway.backends import http1
from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, HttpTarget
from gateway.errors import (
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
    SessionExpired,
)
from gateway.protocol import codes, headers, jsonrpc, sse
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

TRACE_HEADERS = ("traceparent", "tracestate")
SSE = "text/event-stream"
SESSION_HEADER = "Mcp-Session-Id"
# Fixed for every request: the two media types we accept and the one we send.
FIXED_HEADERS = (
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)
# Open connections kept per backend; more concurrent calls queue for a free connection.
POOL_SIZE = 100
# Shutdown waits this long for a legacy session's DELETE.
END_SESSION_TIMEOUT = 1.0
# A JSON reply larger than this is refused rather than buffered whole.
MAX_REPLY_BYTES = 64 * 1024 * 1024


class HttpBackend:
    transport = "http"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, HttpTarget)
        self._stats = stats or Stats()
        self._up = False
        self.name = config.name
        self._url = config.target.url
        http1.Target(self._url)  # a malformed URL fails here, at start-up
        self._fixed = http1.encode_headers((*FIXED_HEADERS, *config.target.headers.items()))
        self._custom = http1.encode_headers(config.target.headers.items())
        # The mirrored headers repeat from call to call (method, version, tool name): derive,
        # validate and encode each distinct set once.
        self._mirrored = functools.lru_cache(maxsize=1024)(self._mirror)
        self._request_timeout = config.request_timeout
        self._connect_timeout = config.connect_timeout
        self._pool: http1.Pool | None = None
        # Listen streams stay open indefinitely; they get their own unbounded pool so they can
        # never use up the connections that calls need.
        self._streams: http1.Pool | None = None
        # The legacy era (set by era.py): a session id the server gives at `initialize`, sent on
        # every request with the agreed version; None while the backend is modern.
        self._legacy: _LegacyHeaders | None = None
        self.takes_requests = False
        self.on_notification: Callable[[str, Message], None] | None = None

    async def run(self) -> None:
        self._pool = http1.Pool(self._url, limit=POOL_SIZE, connect_timeout=self._connect_timeout)
        self._streams = http1.Pool(self._url, limit=None, connect_timeout=self._connect_timeout)
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(END_SESSION_TIMEOUT):
                await self._end_session()
            pools = (self._pool, self._streams)
            self._pool = self._streams = None
            for pool in pools:
                await pool.close()

    # --- the legacy era (2025-11-25 transports, Session Management) -------------------------

    def begin_session(self) -> None:
        """Legacy from now on, with no session yet (before `initialize`)."""
        self._legacy = _LegacyHeaders(self._fixed, self._custom)

    def agreed(self, version: str) -> None:
        assert self._legacy is not None
        self._legacy.version = version
        self._legacy.encode()

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
        return await self._post(self._pool, msg, sink, (), within)

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        """The legacy session's GET stream, until it ends: its notifications to `deliver`.
        False if the server offers none (405)."""
        pool, legacy = self._streams, self._legacy
        if pool is None or legacy is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            resp = await pool.request(legacy.stream_headers, b"", method="GET")
        except (http1.ConnectFailed, http1.Disconnected) as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None
        try:
            if resp.status == 405:
                return False
            self._check_session(resp, legacy)
            if resp.status != 200 or resp.content_type != SSE:
                raise BackendProtocolError(self.name, f"GET stream answered HTTP {resp.status}")
            decoder = sse.Decoder()
            async for chunk in resp.chunks():
                for data in decoder.feed(chunk):
                    event = jsonrpc.decode(data, keep=True)
                    if isinstance(event, jsonrpc.Invalid):
                        continue
                    if jsonrpc.kind(event) is jsonrpc.Kind.NOTIFICATION:
                        deliver(self.name, event)
                    elif jsonrpc.kind(event) is jsonrpc.Kind.REQUEST:
                        await self._refuse_unrelated(event)
            return True
        except http1.HttpClientError as exc:
            raise BackendUnavailable(self.name, f"GET stream failed: {exc}") from None
        finally:
            resp.abort()

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
        legacy, pool = self._legacy, self._pool
        if legacy is None or legacy.session_id is None or pool is None:
            return
        try:
            resp = await pool.request(legacy.stream_headers, b"", method="DELETE")
            resp.abort()
        except http1.HttpClientError:
            pass

    def _check_session(self, resp: http1.Response, legacy: _LegacyHeaders) -> None:
        if resp.status == 404 and legacy.session_id is not None:
            raise SessionExpired(self.name, "the server no longer knows the session")
        session_id = resp.headers.get("mcp-session-id")
        if session_id is not None and session_id != legacy.session_id:
            legacy.session_id = session_id
            legacy.encode()

    def _headers(self, msg: Message, param_headers: tuple[ParamHeader, ...]) -> str:
        if self._legacy is not None:
            return self._legacy.headers + _trace_headers(msg)
        try:
            out = self._mirrored(headers.mirrored_fields(msg))
            if param_headers:
                out += http1.encode_headers(headers.derive_params(msg, param_headers).items())
        except ValueError as exc:
            raise BackendProtocolError(self.name, f"cannot mirror the request: {exc}") from None
        # Trace context travels in headers too, for HTTP-aware tracing.
        return out + _trace_headers(msg)

    def _mirror(self, fields: tuple[str, str | None, str | None]) -> str:
        return self._fixed + http1.encode_headers(headers.derive_base(*fields).items())

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        param_headers: tuple[ParamHeader, ...] = (),
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,  # (each reply stream carries its own request's logs)
    ) -> Coroutine[Any, Any, Message]:
        # A plain function that hands back _post's coroutine: one coroutine frame less on every
        # request. A listen stream has no deadline.
        if long_lived:
            return self._post(self._streams, msg, sink, param_headers)
        return self._post(self._pool, msg, sink, param_headers, self._request_timeout)

    async def notify(self, msg: Message) -> None:
        pool = self._pool
        if pool is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            resp = await pool.request(
                self._headers(msg, ()), jsonrpc.encode(msg), within=self._request_timeout
            )
            try:
                if self._legacy is not None:
                    self._check_session(resp, self._legacy)
                await resp.read(MAX_REPLY_BYTES)
            finally:
                resp.release()
        except TimeoutError:
            raise BackendTimeout(self.name, "notification not accepted in time") from None
        except http1.HttpClientError as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None

    async def _post(
        self,
        pool: http1.Pool | None,
        msg: Message,
        sink: NotificationSink,
        param_headers: tuple[ParamHeader, ...],
        within: float | None = None,
    ) -> Message:
        if pool is None:
            raise BackendUnavailable(self.name, "not started")
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        try:
            resp = await pool.request(self._headers(msg, param_headers), body, within=within)
        except (http1.ConnectFailed, http1.Disconnected) as exc:
            self._up = False
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None
        except (http1.HttpProtocolError, TimeoutError) as exc:
            raise self._failure(exc, within) from None
        self._up = True
        if self._legacy is not None:
            try:
                self._check_session(resp, self._legacy)
            except SessionExpired:
                resp.release()
                raise
        try:
            if resp.complete and resp.content_type != SSE:
                reply = self._json_reply(resp, resp.body(MAX_REPLY_BYTES), msg)  # the common case
            else:
                reply = await self._read_reply(resp, msg, sink)
        except BaseException as exc:
            # Closing (not releasing) the connection is what tells the backend that this
            # request is cancelled (streamable-http, Cancellation).
            resp.abort()
            if isinstance(exc, (http1.HttpProtocolError, TimeoutError)):
                raise self._failure(exc, within) from None
            raise
        resp.release()
        return reply

    def _failure(self, exc: Exception, within: float | None) -> Exception:
        if isinstance(exc, TimeoutError):
            return BackendTimeout(self.name, f"no reply within {within or 0:g}s")
        return BackendProtocolError(self.name, str(exc))

    @property
    def up(self) -> bool:
        return self._up

    async def _read_reply(
        self, resp: http1.Response, msg: Message, sink: NotificationSink
    ) -> Message:
        try:
            if resp.content_type == SSE:
                return await self._read_stream(resp, msg, sink)
            body = await resp.read(MAX_REPLY_BYTES)
        except http1.Disconnected as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None
        return self._json_reply(resp, body, msg)

    def _json_reply(self, resp: http1.Response, body: bytes, msg: Message) -> Message:
        self._stats.bytes["backend", "in"] += len(body)
        reply = jsonrpc.decode(body, keep=True) if body else None
        if isinstance(reply, dict) and "method" not in reply:  # (decoded: a response)
            return self._own(reply, msg)
        detail = f"HTTP {resp.status}"
        if resp.status >= 500 or resp.status in (401, 403, 404, 405):
            raise BackendUnavailable(self.name, f"{detail} without a JSON-RPC reply")
        raise BackendProtocolError(self.name, f"{detail}: the reply is not a JSON-RPC response")

    async def _read_stream(
        self, resp: http1.Response, msg: Message, sink: NotificationSink
    ) -> Message:
        decoder = sse.Decoder()
        async for chunk in resp.chunks():
            self._stats.bytes["backend", "in"] += len(chunk)
            for data in decoder.feed(chunk):
                reply = await self._on_event(data, msg, sink)
                if reply is not None:
                    return reply
        for data in decoder.close():
            reply = await self._on_event(data, msg, sink)
            if reply is not None:
                return reply
        raise BackendUnavailable(self.name, "the stream ended before the reply")

    async def _on_event(self, data: bytes, msg: Message, sink: NotificationSink) -> Message | None:
        event = jsonrpc.decode(data, keep=True)
        if isinstance(event, jsonrpc.Invalid):
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
    """The headers of a legacy session, encoded once per change."""

    def __init__(self, fixed: str, custom: str) -> None:
        self._fixed = fixed
        self._custom = custom
        self.version: str | None = None
        self.session_id: str | None = None
        self.headers = fixed
        self.stream_headers = ""
        self.encode()

    def encode(self) -> None:
        fields: list[tuple[str, str]] = []
        if self.version is not None:
            fields.append((headers.PROTOCOL_VERSION, self.version))
        if self.session_id is not None:
            fields.append((SESSION_HEADER, self.session_id))
        self.headers = self._fixed + http1.encode_headers(fields)
        accept = ("Accept", "text/event-stream")
        self.stream_headers = self._custom + http1.encode_headers([accept, *fields])


def _trace_headers(msg: Message) -> str:
    fields = jsonrpc.meta(msg)
    if "traceparent" not in fields and "tracestate" not in fields:
        return ""
    found = [(k, fields[k]) for k in TRACE_HEADERS if isinstance(fields.get(k), str)]
    try:
        return http1.encode_headers(found)
    except ValueError:
        return ""  # not a header value: the context still travels in `_meta`
