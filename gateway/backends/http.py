"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on a pooled keep-alive session. The mirrored headers are derived
from the body actually sent; nothing the front-end client sent in its own headers is copied.
"""

from __future__ import annotations

import functools
import logging

import anyio

from gateway.backends import http1
from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, HttpTarget
from gateway.errors import BackendProtocolError, BackendTimeout, BackendUnavailable
from gateway.protocol import headers, jsonrpc, sse
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

TRACE_HEADERS = ("traceparent", "tracestate")
# Fixed for every request: the two media types we accept and the one we send.
FIXED_HEADERS = (
    ("Accept", "application/json, text/event-stream"),
    ("Content-Type", "application/json"),
)
# Open connections kept per backend; more concurrent calls queue for a free connection.
POOL_SIZE = 100
# A JSON reply larger than this is refused rather than buffered whole.
MAX_REPLY_BYTES = 64 * 1024 * 1024


@functools.lru_cache(maxsize=1024)
def _encoded(fields: tuple[tuple[str, str], ...]) -> str:
    # The mirrored headers repeat from call to call (method, version, tool name): validate and
    # encode each distinct set once.
    return http1.encode_headers(fields)


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
        self._request_timeout = config.request_timeout
        self._connect_timeout = config.connect_timeout
        self._pool: http1.Pool | None = None
        # Listen streams stay open indefinitely; they get their own unbounded pool so they can
        # never use up the connections that calls need.
        self._streams: http1.Pool | None = None

    async def run(self) -> None:
        self._pool = http1.Pool(self._url, limit=POOL_SIZE, connect_timeout=self._connect_timeout)
        self._streams = http1.Pool(self._url, limit=None, connect_timeout=self._connect_timeout)
        try:
            await anyio.sleep_forever()
        finally:
            pools = (self._pool, self._streams)
            self._pool = self._streams = None
            for pool in pools:
                await pool.close()

    def _headers(self, msg: Message, param_headers: tuple[ParamHeader, ...]) -> str:
        out = headers.derive(msg, param_headers)
        trace_meta = jsonrpc.meta(msg)
        for key in TRACE_HEADERS:  # trace context travels in headers too, for HTTP-aware tracing
            if isinstance(trace_meta.get(key), str):
                out[key] = trace_meta[key]
        try:
            return self._fixed + _encoded(tuple(out.items()))
        except ValueError as exc:
            raise BackendProtocolError(self.name, f"cannot mirror the request: {exc}") from None

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        param_headers: tuple[ParamHeader, ...] = (),
        *,
        long_lived: bool = False,
    ) -> Message:
        if long_lived:
            return await self._post(self._streams, msg, sink, param_headers)
        try:
            return await self._post(self._pool, msg, sink, param_headers, self._request_timeout)
        except TimeoutError:
            raise BackendTimeout(self.name, f"no reply within {self._request_timeout:g}s") from None

    async def notify(self, msg: Message) -> None:
        pool = self._pool
        if pool is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            resp = await pool.request(
                self._headers(msg, ()), jsonrpc.encode(msg), within=self._request_timeout
            )
            try:
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
        except http1.HttpProtocolError as exc:
            raise BackendProtocolError(self.name, str(exc)) from None
        self._up = True
        try:
            reply = await self._read_reply(resp, msg, sink)
        except BaseException:
            # Closing (not releasing) the connection is what tells the backend that this
            # request is cancelled (streamable-http, Cancellation).
            resp.abort()
            raise
        resp.release()
        return reply

    @property
    def up(self) -> bool:
        return self._up

    async def _read_reply(
        self, resp: http1.Response, msg: Message, sink: NotificationSink
    ) -> Message:
        try:
            if resp.content_type == "text/event-stream":
                return await self._read_stream(resp, msg, sink)
            body = resp.body(MAX_REPLY_BYTES) if resp.complete else await resp.read(MAX_REPLY_BYTES)
        except http1.Disconnected as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None
        except http1.HttpProtocolError as exc:
            raise BackendProtocolError(self.name, str(exc)) from None
        self._stats.bytes["backend", "in"] += len(body)
        reply = jsonrpc.decode(body, keep=True) if body else None
        if isinstance(reply, dict) and jsonrpc.kind(reply) is jsonrpc.Kind.RESPONSE:
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
        if kind is jsonrpc.Kind.NOTIFICATION:
            await sink(event)
        return None

    def _own(self, reply: Message, msg: Message) -> Message:
        if "error" in reply and reply.get("id") is None:
            # Errors the backend raised before reading the id (header checks, parse errors).
            reply["id"] = msg["id"]
        elif reply.get("id") != msg.get("id"):
            raise BackendProtocolError(self.name, "the reply's id is not the request's")
        return reply
