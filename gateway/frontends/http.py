"""The Streamable HTTP front end (basic/transports/streamable-http), an aiohttp application.

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

from aiohttp import web

from gateway import errors
from gateway.config import HttpListen
from gateway.core.dispatcher import Dispatcher
from gateway.frontends.ops import Operations, add_operations
from gateway.protocol import codes, headers, jsonrpc, meta, sse
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Origin

log = logging.getLogger("gateway.http")

DISPATCHER = web.AppKey("dispatcher", Dispatcher)
LISTEN = web.AppKey("listen", HttpListen)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
TRACE_HEADERS = ("traceparent", "tracestate")
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
# A reply that comes within this window goes out as plain JSON; after it, the response turns into
# an SSE stream so that idle-timeouts of intermediaries see bytes during long calls.
JSON_WINDOW = 10.0
KEEPALIVE_INTERVAL = 15.0


def make_app(
    dispatcher: Dispatcher, listen: HttpListen, ops: Operations | None = None
) -> web.Application:
    app = web.Application(client_max_size=listen.max_body_bytes)
    app[DISPATCHER] = dispatcher
    app[LISTEN] = listen
    app.router.add_route("*", listen.path, handle)
    if ops is not None:
        add_operations(app, ops)
    return app


def _reply(status: int, msg: Message | None = None, **extra: str) -> web.Response:
    if msg is None:
        return web.Response(status=status, headers=extra)
    return web.Response(
        status=status, body=jsonrpc.encode(msg), content_type="application/json", headers=extra
    )


def _reject(
    request: web.Request,
    reason: str,
    status: int,
    code: int,
    message: str,
    id_: jsonrpc.RequestId | None = None,
) -> web.Response:
    request.app[DISPATCHER].telemetry.stats.rejections[reason] += 1
    return _reply(status, jsonrpc.error(id_, code, message))


@functools.lru_cache(maxsize=256)
def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guard(request: web.Request, listen: HttpListen) -> web.Response | None:
    """DNS-rebinding protection (streamable-http, Security & Endpoint)."""
    origin = request.headers.get("Origin")
    if origin is not None and origin not in listen.allowed_origins:
        host = urlsplit(origin).hostname or ""
        if not _is_loopback(host):
            return _reject(
                request, "origin", 403, codes.INVALID_REQUEST, f"Origin {origin!r} is not allowed"
            )
    if _is_loopback(listen.host):
        host = _hostname(request.host)
        if not _is_loopback(host) and host not in listen.allowed_hosts:
            return _reject(
                request, "host", 403, codes.INVALID_REQUEST, f"Host {request.host!r} is not allowed"
            )
    return None


# Header values repeat from request to request: parse each distinct one once (bounded caches).
@functools.lru_cache(maxsize=256)
def _hostname(host_header: str) -> str:
    return urlsplit("//" + host_header).hostname or ""


@functools.lru_cache(maxsize=256)
def _media_type(content_type: str) -> str:
    # aiohttp's `request.content_type` parses the header afresh for every request.
    return content_type.split(";")[0].strip().lower()


def _accepts(request: web.Request) -> bool:
    # Accept is a list field: several header lines mean the same as one comma-separated line.
    return _accepts_value(",".join(request.headers.getall("Accept", [])))


@functools.lru_cache(maxsize=256)
def _accepts_value(accept: str) -> bool:
    kinds = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "*/*" in kinds:
        return True
    return "application/json" in kinds and "text/event-stream" in kinds


async def handle(request: web.Request) -> web.StreamResponse:
    listen = request.app[LISTEN]
    refused = _guard(request, listen)
    if refused is not None:
        return refused
    if request.method != "POST":
        request.app[DISPATCHER].telemetry.stats.rejections["method_not_allowed"] += 1
        return _reply(405, Allow="POST")
    if _media_type(request.headers.get("Content-Type", "")) != "application/json":
        return _reject(
            request,
            "media_type",
            415,
            codes.INVALID_REQUEST,
            "Content-Type must be application/json",
        )
    if not _accepts(request):
        return _reject(
            request,
            "not_acceptable",
            406,
            codes.INVALID_REQUEST,
            "Accept must list application/json and text/event-stream",
        )
    too_big = f"Body over {listen.max_body_bytes} bytes"
    if request.content_length is not None and request.content_length > listen.max_body_bytes:
        return _reject(request, "size", 413, codes.INVALID_REQUEST, too_big)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _reject(request, "size", 413, codes.INVALID_REQUEST, too_big)
    dispatcher = request.app[DISPATCHER]
    dispatcher.telemetry.stats.bytes["frontend", "in"] += len(body)
    msg = jsonrpc.decode(body)
    if isinstance(msg, jsonrpc.Invalid):
        return _reject(request, "invalid_request", 400, msg.code, msg.message, msg.id)
    kind = jsonrpc.kind(msg)
    if kind is jsonrpc.Kind.RESPONSE:
        return _reject(
            request,
            "invalid_request",
            400,
            codes.INVALID_REQUEST,
            "Clients must not send responses",
            msg["id"],
        )
    if kind is jsonrpc.Kind.NOTIFICATION:
        await dispatcher.notify(msg)
        return _reply(202)
    if msg["method"] == "initialize":
        # A legacy client: name the versions we serve, its only diagnostic (basic/versioning).
        dispatcher.telemetry.stats.rejections["unsupported_version"] += 1
        reply = meta.unsupported_version(msg["id"], jsonrpc.params(msg).get("protocolVersion"))
        return _reply(400, reply)
    mismatch = await _check_headers(request, msg, dispatcher)
    if mismatch is not None:
        return _reject(
            request,
            "header_mismatch",
            400,
            codes.HEADER_MISMATCH,
            f"Header mismatch: {mismatch}",
            msg["id"],
        )
    return await _answer(request, msg, dispatcher)


def _origin(request: web.Request) -> Origin:
    trace = {k: v for k in TRACE_HEADERS if (v := request.headers.get(k)) is not None}
    return Origin("http", request.remote, trace, request.headers)


async def _check_headers(request: web.Request, msg: Message, dispatcher: Dispatcher) -> str | None:
    param_specs = None
    if msg["method"] == "tools/call":
        name = jsonrpc.params(msg).get("name")
        if isinstance(name, str):
            param_specs = await dispatcher.param_headers(name)
    return headers.check(lambda h: request.headers.getall(h, []), msg, param_specs)


async def _answer(request: web.Request, msg: Message, dispatcher: Dispatcher) -> web.StreamResponse:
    """Answer with JSON if the reply comes quickly and alone, else as an SSE stream.

    The request is handled in this task: no extra task, queue or cancel scope per request on the
    common path. Only a request still running when the JSON window closes gets a helper task,
    which turns the reply into a stream and keeps it alive."""
    relay = _Relay(request)
    timer = asyncio.get_running_loop().call_later(JSON_WINDOW, relay.window_closed)
    try:
        reply = await dispatcher.handle(msg, relay.note, _origin(request))
    finally:
        timer.cancel()
        await relay.stop_keepalive()
    return await relay.finish(reply)


def _count_out(request: web.Request, data: bytes) -> bytes:
    request.app[DISPATCHER].telemetry.stats.bytes["frontend", "out"] += len(data)
    return data


class _Relay:
    """The reply of one request: a JSON body, or an SSE stream once there is something to send
    before the reply (a notification, or a keep-alive after the JSON window)."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._stream: web.StreamResponse | None = None
        self._lock: asyncio.Lock | None = None  # made on first use: most replies never stream
        self._keepalive: asyncio.Task[None] | None = None

    async def _write(self, data: bytes) -> None:
        # Notifications and keep-alives come from two tasks; each event goes out whole.
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._stream is None:
                self._stream = web.StreamResponse(status=200, headers=SSE_HEADERS)
                await self._stream.prepare(self._request)
            await self._stream.write(data)

    async def note(self, note: Message) -> None:
        try:
            await self._write(_count_out(self._request, sse.event(jsonrpc.encode(note))))
        except ConnectionResetError:
            # The client has gone: that cancels its request, as a disconnect does.
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)

    def window_closed(self) -> None:
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        # Bytes on the wire now, then at every interval, so idle-timeouts of intermediaries
        # never cut a long call.
        await self._write(sse.KEEPALIVE)
        while True:
            await asyncio.sleep(KEEPALIVE_INTERVAL)
            await self._write(sse.KEEPALIVE)

    async def stop_keepalive(self) -> None:
        task = self._keepalive
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionResetError):
                await task

    async def finish(self, reply: Message) -> web.StreamResponse:
        body = _count_out(self._request, jsonrpc.encode(reply))
        if self._stream is None:
            return web.Response(
                status=errors.http_status(reply), body=body, content_type="application/json"
            )
        await self._write(sse.event(body))
        await self._stream.write_eof()
        return self._stream
