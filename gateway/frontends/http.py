"""The Streamable HTTP front end (basic/transports/streamable-http), an aiohttp application.

Checks run cheapest first: origin and host, method, media types, size, JSON, mirrored headers;
only then does the dispatcher see the message. A reply goes out as one JSON body unless the
backend streams request-scoped notifications first, in which case it becomes an SSE stream.
"""

from __future__ import annotations

import ipaddress
import logging
from urllib.parse import urlsplit

import anyio
from aiohttp import web

from gateway import errors
from gateway.config import HttpListen
from gateway.core.dispatcher import Dispatcher
from gateway.protocol import codes, headers, jsonrpc, meta, sse
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.http")

DISPATCHER = web.AppKey("dispatcher", Dispatcher)
LISTEN = web.AppKey("listen", HttpListen)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
# Notifications buffered between a backend and a slow SSE reader before the backend side waits.
STREAM_BUFFER = 64


def make_app(dispatcher: Dispatcher, listen: HttpListen) -> web.Application:
    app = web.Application(client_max_size=listen.max_body_bytes)
    app[DISPATCHER] = dispatcher
    app[LISTEN] = listen
    app.router.add_route("*", listen.path, handle)
    return app


def _reply(status: int, msg: Message | None = None, **extra: str) -> web.Response:
    if msg is None:
        return web.Response(status=status, headers=extra)
    return web.Response(
        status=status, body=jsonrpc.encode(msg), content_type="application/json", headers=extra
    )


def _reject(
    status: int, code: int, message: str, id_: jsonrpc.RequestId | None = None
) -> web.Response:
    return _reply(status, jsonrpc.error(id_, code, message))


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
            return _reject(403, codes.INVALID_REQUEST, f"Origin {origin!r} is not allowed")
    if _is_loopback(listen.host):
        host = urlsplit("//" + request.host).hostname or ""
        if not _is_loopback(host) and host not in listen.allowed_hosts:
            return _reject(403, codes.INVALID_REQUEST, f"Host {request.host!r} is not allowed")
    return None


def _accepts(request: web.Request) -> bool:
    kinds = {
        part.split(";")[0].strip().lower() for part in request.headers.get("Accept", "").split(",")
    }
    if "*/*" in kinds:
        return True
    return "application/json" in kinds and "text/event-stream" in kinds


async def handle(request: web.Request) -> web.StreamResponse:
    listen = request.app[LISTEN]
    refused = _guard(request, listen)
    if refused is not None:
        return refused
    if request.method != "POST":
        return _reply(405, Allow="POST")
    if request.content_type != "application/json":
        return _reject(415, codes.INVALID_REQUEST, "Content-Type must be application/json")
    if not _accepts(request):
        return _reject(
            406, codes.INVALID_REQUEST, "Accept must list application/json and text/event-stream"
        )
    if request.content_length is not None and request.content_length > listen.max_body_bytes:
        return _reject(413, codes.INVALID_REQUEST, f"Body over {listen.max_body_bytes} bytes")
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _reject(413, codes.INVALID_REQUEST, f"Body over {listen.max_body_bytes} bytes")
    msg = jsonrpc.decode(body)
    if isinstance(msg, jsonrpc.Invalid):
        return _reject(400, msg.code, msg.message, msg.id)
    kind = jsonrpc.kind(msg)
    if kind is jsonrpc.Kind.RESPONSE:
        return _reject(400, codes.INVALID_REQUEST, "Clients must not send responses", msg["id"])
    dispatcher = request.app[DISPATCHER]
    if kind is jsonrpc.Kind.NOTIFICATION:
        await dispatcher.notify(msg)
        return _reply(202)
    if msg["method"] == "initialize":
        # A legacy client: name the versions we serve, its only diagnostic (basic/versioning).
        reply = meta.unsupported_version(msg["id"], jsonrpc.params(msg).get("protocolVersion"))
        return _reply(400, reply)
    mismatch = await _check_headers(request, msg, dispatcher)
    if mismatch is not None:
        return _reject(400, codes.HEADER_MISMATCH, f"Header mismatch: {mismatch}", msg["id"])
    return await _answer(request, msg, dispatcher)


async def _check_headers(request: web.Request, msg: Message, dispatcher: Dispatcher) -> str | None:
    param_specs = None
    if msg["method"] == "tools/call":
        name = jsonrpc.params(msg).get("name")
        if isinstance(name, str):
            param_specs = await dispatcher.param_headers(name)
    return headers.check(lambda h: request.headers.getall(h, []), msg, param_specs)


async def _answer(request: web.Request, msg: Message, dispatcher: Dispatcher) -> web.StreamResponse:
    send, recv = anyio.create_memory_object_stream[tuple[bool, Message]](STREAM_BUFFER)

    async def sink(note: Message) -> None:
        await send.send((False, note))

    async def work() -> None:
        async with send:
            reply = await dispatcher.handle(msg, sink)
            await send.send((True, reply))

    response: web.StreamResponse
    async with anyio.create_task_group() as tg, recv:
        tg.start_soon(work)
        final, first = await recv.receive()
        if final:
            response = _reply(errors.http_status(first), first)
        else:
            response = web.StreamResponse(status=200, headers=SSE_HEADERS)
            await response.prepare(request)
            await response.write(sse.event(jsonrpc.encode(first)))
            async for _, item in recv:
                await response.write(sse.event(jsonrpc.encode(item)))
            await response.write_eof()
    return response
