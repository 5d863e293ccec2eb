"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on a pooled keep-alive session. The mirrored headers are derived
from the body actually sent; nothing the front-end client sent in its own headers is copied.
"""

from __future__ import annotations

import logging

import aiohttp
import anyio

from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, HttpTarget
from gateway.errors import BackendProtocolError, BackendTimeout, BackendUnavailable
from gateway.protocol import headers, jsonrpc, sse
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

ACCEPT = "application/json, text/event-stream"
TRACE_HEADERS = ("traceparent", "tracestate")
# Open connections kept per backend; more concurrent calls queue for a free connection.
POOL_SIZE = 100
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
        self._static_headers = dict(config.target.headers)
        self._request_timeout = config.request_timeout
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout, sock_connect=config.connect_timeout
        )
        self._session: aiohttp.ClientSession | None = None
        # Listen streams stay open indefinitely; they get their own unpooled session so they
        # can never use up the connections that calls need.
        self._streams: aiohttp.ClientSession | None = None

    async def run(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL_SIZE), timeout=self._timeout
        )
        self._streams = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=self._timeout
        )
        try:
            await anyio.sleep_forever()
        finally:
            sessions = (self._session, self._streams)
            self._session = self._streams = None
            with anyio.CancelScope(shield=True):
                for session in sessions:
                    await session.close()

    def _headers(self, msg: Message, param_headers: tuple[ParamHeader, ...]) -> dict[str, str]:
        out = dict(self._static_headers)
        out.update(headers.derive(msg, param_headers))
        trace_meta = jsonrpc.meta(msg)
        for key in TRACE_HEADERS:  # trace context travels in headers too, for HTTP-aware tracing
            if isinstance(trace_meta.get(key), str):
                out[key] = trace_meta[key]
        out["Accept"] = ACCEPT
        out["Content-Type"] = "application/json"
        return out

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
            with anyio.fail_after(self._request_timeout):
                return await self._post(self._session, msg, sink, param_headers)
        except TimeoutError:
            raise BackendTimeout(self.name, f"no reply within {self._request_timeout:g}s") from None

    async def notify(self, msg: Message) -> None:
        session = self._session
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            with anyio.fail_after(self._request_timeout):
                async with session.post(
                    self._url, data=jsonrpc.encode(msg), headers=self._headers(msg, ())
                ) as resp:
                    await resp.read()
        except TimeoutError:
            raise BackendTimeout(self.name, "notification not accepted in time") from None
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None

    async def _post(
        self,
        session: aiohttp.ClientSession | None,
        msg: Message,
        sink: NotificationSink,
        param_headers: tuple[ParamHeader, ...],
    ) -> Message:
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        try:
            async with session.post(
                self._url, data=body, headers=self._headers(msg, param_headers)
            ) as resp:
                self._up = True
                try:
                    return await self._read_reply(resp, msg, sink)
                except BaseException:
                    # Closing (not releasing) the connection is what tells the backend that
                    # this request is cancelled (streamable-http, Cancellation).
                    resp.close()
                    raise
        except aiohttp.ClientConnectionError as exc:
            self._up = False
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None
        except aiohttp.ClientError as exc:
            raise BackendUnavailable(self.name, f"connection failed: {exc}") from None

    @property
    def up(self) -> bool:
        return self._up

    async def _read_reply(
        self, resp: aiohttp.ClientResponse, msg: Message, sink: NotificationSink
    ) -> Message:
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype == "text/event-stream":
            return await self._read_stream(resp, msg, sink)
        body = await resp.content.read(MAX_REPLY_BYTES + 1)
        self._stats.bytes["backend", "in"] += len(body)
        if len(body) > MAX_REPLY_BYTES:
            raise BackendProtocolError(self.name, f"reply over {MAX_REPLY_BYTES} bytes")
        reply = jsonrpc.decode(body) if body else None
        if isinstance(reply, dict) and jsonrpc.kind(reply) is jsonrpc.Kind.RESPONSE:
            return self._own(reply, msg)
        detail = f"HTTP {resp.status} {resp.reason or ''}".strip()
        if resp.status >= 500 or resp.status in (401, 403, 404, 405):
            raise BackendUnavailable(self.name, f"{detail} without a JSON-RPC reply")
        raise BackendProtocolError(self.name, f"{detail}: the reply is not a JSON-RPC response")

    async def _read_stream(
        self, resp: aiohttp.ClientResponse, msg: Message, sink: NotificationSink
    ) -> Message:
        decoder = sse.Decoder()
        async for chunk in resp.content.iter_any():
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
        event = jsonrpc.decode(data)
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
