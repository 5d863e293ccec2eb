"""A small HTTP/1.1 server for the gateway's listeners (the MCP endpoint and the operator routes).

Why not aiohttp's server: in the benchmark (bench/README.md) its request machinery alone cost
more than half of the gateway's whole hop (about 55 ms of CPU per 1000 requests with a canned
handler, against about 17 for a bare protocol on the same parser). The wire parsing is httptools
(llhttp); what is written here is connection management: one task per request, responses in
request order, keep-alive, flow control, limits, and a graceful close.

A handler gets a `Request` and returns a `Reply`, or returns None after answering through
`Request.stream()` (a chunked response it writes piece by piece). A client that disconnects
cancels its request's task, so work for a caller that has gone stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from email.utils import formatdate
from functools import lru_cache
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

log = logging.getLogger("gateway.http")

# Requests parsed ahead of the one being answered (pipelining) before we stop reading the socket.
PIPELINE_DEPTH = 16
# HTTP/1.1 keep-alive connections with nothing to do are closed after this long, as are
# connections whose request has not fully arrived in that time (a slow or stuck sender).
IDLE_TIMEOUT = 75.0
# The request line and header fields together; a longer head gets 431 (RFC 6585 5). llhttp
# itself would buffer a header of any size.
MAX_HEAD = 64 * 1024
# After answering a request whose body we stopped reading (413, 400), the rest of the input is
# read and dropped this long before the connection closes, so that the client is not reset
# before it has read the answer.
LINGER = 2.0
# Content codings a request body may use; anything else is refused (RFC 9110 15.5.16).
_INFLATE_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 0}
JSON = "application/json"


class Reply:
    """A whole response: status, body and headers (Content-Length and Date are added)."""

    __slots__ = ("body", "content_type", "headers", "status")

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: Iterable[tuple[str, str]] = (),
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers


Handler = Callable[["Request"], Awaitable[Reply | None]]


class Headers:
    """A request's header fields in arrival order; lookups ignore case, repeats are kept."""

    __slots__ = ("_index", "raw")

    def __init__(self, raw: list[tuple[str, str]]) -> None:
        self.raw = raw
        index: dict[str, list[str]] = {}
        for name, value in raw:
            key = name.lower()
            values = index.get(key)
            if values is None:
                index[key] = [value]
            else:
                values.append(value)
        self._index = index

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._index.get(name.lower())
        return default if values is None else values[0]

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._index

    def getall(self, name: str) -> list[str]:
        """Every value of the field, in order (the list is shared: do not change it)."""
        return self._index.get(name.lower(), [])

    def items(self) -> list[tuple[str, str]]:
        return self.raw


class Request:
    __slots__ = (
        "_conn",
        "body",
        "chunked",
        "headers",
        "keep_alive",
        "method",
        "path",
        "refusal",
        "remote",
        "streamed",
        "too_big",
    )

    def __init__(
        self,
        conn: _Connection,
        method: str,
        path: str,
        headers: Headers,
        body: bytes,
        keep_alive: bool,
        too_big: bool,
    ) -> None:
        self._conn = conn
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        # The body exceeded the server's limit: `body` is empty and the rest was not read.
        self.too_big = too_big
        self.remote = conn.remote
        self.streamed: Stream | None = None
        # HTTP/1.0 has no chunked coding: a streamed reply to it ends by closing the connection.
        self.chunked = True
        # A request the server answers itself (status, why): it never reaches a handler.
        self.refusal: tuple[int, str] | None = None

    @property
    def host(self) -> str:
        return self.headers.get("host") or ""

    def stream(self, status: int, headers: Iterable[tuple[str, str]]) -> Stream:
        """Start a response whose body the handler writes as it goes (chunked)."""
        assert self.streamed is None, "one response per request"
        if not self.chunked or self._conn.closing:
            self.keep_alive = False
        self.streamed = Stream(
            self._conn, status, headers, self.keep_alive, self.chunked, self.method == "HEAD"
        )
        return self.streamed


class Stream:
    """A response body written piece by piece. Writes wait while the client reads slowly, and
    raise ConnectionResetError once it has gone."""

    def __init__(
        self,
        conn: _Connection,
        status: int,
        headers: Iterable[tuple[str, str]],
        keep_alive: bool,
        chunked: bool,
        head_only: bool = False,
    ) -> None:
        self._conn = conn
        self._chunked = chunked
        self._head_only = head_only  # the answer to HEAD: the head, and no body
        self.ended = False
        conn.write(_head(status, headers, None if chunked else -1, keep_alive=keep_alive))

    async def write(self, data: bytes) -> None:
        if not data or self._head_only:
            return
        conn = self._conn
        conn.write(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if conn.paused:
            await conn.drain()

    async def end(self) -> None:
        if not self.ended:
            self.ended = True
            if self._chunked and not self._head_only:
                self._conn.write(b"0\r\n\r\n")


@lru_cache(maxsize=64)
def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_date_cache: tuple[int, bytes] = (0, b"")


def _date() -> bytes:
    # One formatting per second, not per response.
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode())
    return _date_cache[1]


def _head(
    status: int,
    headers: Iterable[tuple[str, str]],
    length: int | None,
    *,
    keep_alive: bool,
    content_type: str | None = None,
) -> bytes:
    parts = [_status_line(status), _date()]
    if content_type is not None:
        parts.append(b"Content-Type: %b\r\n" % content_type.encode("latin-1"))
    for name, value in headers:
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    if length is None:
        parts.append(b"Transfer-Encoding: chunked\r\n")
    elif length >= 0:  # -1: the body ends when the connection closes
        parts.append(b"Content-Length: %d\r\n" % length)
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


@lru_cache(maxsize=256)
def _path(target: bytes) -> str:
    if not target.startswith(b"/"):
        # absolute-form (RFC 9112 3.2.2), as a proxy-aware client may send
        target = httptools.parse_url(target).path or b"/"
    path = target.split(b"?", 1)[0].decode("latin-1")
    return unquote(path) if "%" in path else path


def _inflate(body: bytes, coding: str, limit: int) -> bytes | None:
    """The decoded body, or None when it decodes to more than `limit` bytes."""
    decoder = zlib.decompressobj(_INFLATE_WBITS[coding] or zlib.MAX_WBITS)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error:
        if coding != "deflate":
            raise
        # "deflate" is zlib-wrapped by the RFC, raw in the wild: accept both.
        decoder = zlib.decompressobj(-zlib.MAX_WBITS)
        out = decoder.decompress(body, limit + 1)
    if len(out) > limit or decoder.unconsumed_tail:
        return None
    if not decoder.eof:
        raise zlib.error("the body ends inside the compressed data")
    return out


_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _error_body(message: str) -> bytes:
    return b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"%b"}}' % message.encode()


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs them one at a time, answers in order."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._queue: deque[Request] = deque()
        self._drain_waiter: asyncio.Future[None] | None = None
        self.paused = False
        self._reading = True
        self.closing = False  # no more requests: close once the current one is answered
        self._ignoring = False  # the rest of the input is discarded (answered early)
        self._in_body = False  # between the end of a head and the end of its message
        self._head_bytes = 0  # bytes received while a head was incomplete
        # the message being parsed
        self._url = b""
        self._raw_headers: list[tuple[str, str]] = []
        self._headers = Headers([])
        self._body: list[bytes] = []
        self._continue = False  # a 100 (Continue) waits for the responses ahead of it
        self._size = 0
        self.began = 0.0  # loop time a message began arriving; 0 when between messages
        self.last_done = 0.0

    # --- transport callbacks ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) else None
        self.last_done = self._loop.time()
        self._server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._server.forget(self)
        self._queue.clear()
        if self._task is not None:
            self._task.cancel()
        self._wake_writer(ConnectionResetError("client disconnected"))

    def data_received(self, data: bytes) -> None:
        if self._ignoring:
            return
        if not self._in_body:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._decline_upgrade(data[upgrade.args[0] :])
        except httptools.HttpParserError as exc:
            self._refuse(400, f"Malformed HTTP request: {exc}")
            return
        if not self._in_body and self._head_bytes > MAX_HEAD and not self._ignoring:
            self._refuse(431, f"Request head over {MAX_HEAD} bytes")

    def eof_received(self) -> None:
        """The client ended its side. On TCP that looks the same whether it half-closed or went
        away; as with aiohttp's server it counts as gone: the connection closes and any request
        of its being answered is cancelled (MCP clients do not half-close)."""
        return None

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._wake_writer(None)

    # --- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._raw_headers = []
        self._body = []
        self._size = 0
        self._continue = False
        self.began = self._loop.time()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_body = True
        self._head_bytes = 0
        self._headers = Headers(self._raw_headers)
        self._raw_headers = []  # trailer fields land here, unread (RFC 9110 6.5.1)
        if self._parser.should_upgrade():
            return  # parsed again without the offer: see _decline_upgrade
        fields = self._headers
        declared = fields.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else 0
        expect = fields.get("expect")
        if length > self._server.max_body:
            self._too_big()
        elif (
            expect is not None
            and expect.strip().lower() == "100-continue"
            and self._transport is not None
            and self._parser.get_http_version() != "1.0"
        ):
            # (RFC 9110 10.1.1: an HTTP/1.0 request's expectation is ignored)
            if self._task is None:
                self._transport.write(_CONTINUE)
            else:
                self._continue = True  # sent once the earlier responses are (RFC 9112 9.3.2)

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > self._server.max_body:
            self._too_big()
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._continue = False
        self._in_body = False
        if self._ignoring or self._parser.should_upgrade():
            return
        self._deliver(self._request(b"".join(self._body), too_big=False))

    # --- requests -----------------------------------------------------------------------------

    def _request(self, body: bytes, *, too_big: bool) -> Request:
        parser = self._parser
        keep_alive = parser.should_keep_alive() and not too_big and not self.closing
        headers = self._headers
        self.began = 0.0
        refusal = None
        coding = headers.get("content-encoding")
        if coding is not None and not too_big:
            coding = coding.strip().lower()
            if coding in _INFLATE_WBITS:
                if body:
                    try:
                        inflated = _inflate(body, coding, self._server.max_body)
                    except zlib.error:
                        inflated, keep_alive = b"", False
                    too_big = inflated is None
                    body = inflated or b""
            elif coding != "identity":
                refusal = (415, f"Content-Encoding {coding!r} is not supported")
        method = parser.get_method().decode("latin-1")
        request = Request(self, method, _path(self._url), headers, body, keep_alive, too_big)
        if parser.get_http_version() == "1.0":
            request.chunked = False
        elif len(headers.getall("host")) != 1:
            refusal = (400, "An HTTP/1.1 request has exactly one Host header")  # RFC 9112 3.2
        if refusal is not None:
            request.refusal = refusal
            request.keep_alive = False
        return request

    def _too_big(self) -> None:
        """Answer now, without reading the rest of the body, then close the connection."""
        if self._ignoring:
            return
        self._ignoring = True
        self._deliver(self._request(b"", too_big=True))

    def _decline_upgrade(self, rest: bytes) -> None:
        """An Upgrade we do not act on (RFC 9110 7.8): llhttp stops at the end of the head and
        takes what follows (the body too) for the new protocol. The head is parsed again without
        the offer, so that the request is served, body and all, and the connection goes on."""
        method = self._parser.get_method()
        if method == b"CONNECT":
            self._refuse(501, "CONNECT is not supported")
            return
        version = self._parser.get_http_version().encode()
        lines = [b"%b %b HTTP/%b" % (method, self._url, version)]
        for name, value in self._headers.raw:
            lowered = name.lower()
            if lowered == "connection":
                value = ",".join(t for t in value.split(",") if t.strip().lower() != "upgrade")
            if lowered != "upgrade" and value.strip():
                lines.append(f"{name}: {value}".encode("latin-1"))
        self._parser = httptools.HttpRequestParser(self)
        self.data_received(b"\r\n".join(lines) + b"\r\n\r\n" + rest)

    def _deliver(self, request: Request) -> None:
        if self._task is None:
            self._task = self._loop.create_task(self._serve(request))
        else:
            self._queue.append(request)
            if len(self._queue) >= PIPELINE_DEPTH and self._reading and self._transport:
                self._reading = False
                self._transport.pause_reading()

    async def _serve(self, request: Request) -> None:
        try:
            while True:
                await self._answer(request)
                if self._transport is None or not request.keep_alive:
                    break
                if self.paused and not await self._drained_in_time():
                    break
                if not self._queue:
                    break
                request = self._queue.popleft()
                if not self._reading and self._transport is not None:
                    self._reading = True
                    self._transport.resume_reading()
        finally:
            self._task = None
            self.last_done = self._loop.time()
        if self._transport is not None and (not request.keep_alive or self.closing):
            self._close()
        elif self._continue and self._transport is not None:
            self._continue = False
            self._transport.write(_CONTINUE)

    async def _drained_in_time(self) -> bool:
        """Wait for a slow reader to take the answer before reading on; one that takes nothing
        for the idle timeout is dropped (the idle sweep never sees a connection with a task)."""
        try:
            await asyncio.wait_for(self.drain(), self._server.idle_timeout)
        except TimeoutError:
            if self._transport is not None:
                self._transport.abort()
            return False
        return True

    def _close(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if self._ignoring and transport.can_write_eof():
            # The client may still be sending what we stopped reading: end our side, drop what
            # comes, then close, so that its unread data cannot reset the answer away.
            transport.write_eof()
            self._loop.call_later(LINGER, transport.close)
        else:
            transport.close()

    async def _answer(self, request: Request) -> None:
        try:
            if request.refusal is not None:
                status, why = request.refusal
                reply: Reply | None = Reply(status, _error_body(why), JSON)
            else:
                reply = await self._server.route(request)
        except asyncio.CancelledError:
            if self._transport is not None:
                self._transport.close()
            raise
        except Exception as exc:
            if self._transport is None and isinstance(exc, ConnectionError):
                return  # the client has gone (a write to it failed): nothing is left to answer
            log.exception("unhandled error answering %s %s", request.method, request.path)
            if request.streamed is not None:
                request.keep_alive = False  # the response cannot be completed: end it by closing
                return
            reply = Reply(500)
        if request.streamed is not None:
            await request.streamed.end()
            return
        if reply is None:
            reply = Reply(500)
        if self.closing:
            request.keep_alive = False  # the connection ends after this: say so (RFC 9112 9.6)
        body = reply.body
        headers = reply.headers
        if request.keep_alive and not request.chunked:
            headers = (*headers, ("Connection", "keep-alive"))  # HTTP/1.0 closes by default
        head = _head(
            reply.status,
            headers,
            len(body),
            keep_alive=request.keep_alive,
            content_type=reply.content_type,
        )
        self.write(head + body if request.method != "HEAD" else head)

    def _refuse(self, status: int, message: str) -> None:
        """Input we cannot take (unparseable, a head too large). With nothing being answered it
        gets `status` and the connection closes; otherwise the connection closes after the
        request being answered, and what came after it gets no answer."""
        self._ignoring = True
        self.closing = True
        body = _error_body(message.replace('"', "'"))
        data = _head(status, (), len(body), keep_alive=False, content_type=JSON)
        if self._task is None and self._transport is not None:
            self._transport.write(data + body)
            self._close()
        else:
            self._queue.clear()

    # --- writing ------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._transport is None:
            raise ConnectionResetError("client disconnected")
        self._transport.write(data)

    async def drain(self) -> None:
        if self._transport is None:
            raise ConnectionResetError("client disconnected")
        if self.paused:
            if self._drain_waiter is None:
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)

    def _wake_writer(self, exc: Exception | None) -> None:
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)
                waiter.exception()  # retrieved here, so an unawaited waiter is not logged

    # --- life cycle ---------------------------------------------------------------------------

    def close_if_idle(self, now: float, timeout: float) -> None:
        if self._transport is None or self._task is not None:
            return
        since = self.began or self.last_done
        if now - since >= timeout:
            self._transport.close()

    def shut(self) -> None:
        """Take no further requests; close now if nothing is being answered."""
        self.closing = True
        self._queue.clear()
        if self._task is None and self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()

    @property
    def task(self) -> asyncio.Task[None] | None:
        return self._task


class Server:
    """Serves `routes` (path -> handler) on one listening socket."""

    def __init__(
        self,
        routes: Mapping[str, Handler],
        *,
        max_body: int = 1024 * 1024,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.routes = dict(routes)
        self.max_body = max_body
        self.idle_timeout = idle_timeout
        self.connections: set[_Connection] = set()
        self.loop = asyncio.get_running_loop()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._emptied: asyncio.Event | None = None  # set when closing and the last one is gone

    def forget(self, conn: _Connection) -> None:
        self.connections.discard(conn)
        if not self.connections and self._emptied is not None:
            self._emptied.set()

    async def start(self, host: str, port: int) -> int:
        """Listen; the port bound (useful with port 0)."""
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True
        )
        self._schedule_sweep()
        return int(self._server.sockets[0].getsockname()[1])

    async def route(self, request: Request) -> Reply | None:
        handler = self.routes.get(request.path)
        if handler is None:
            return Reply(404, _error_body("Not Found"), JSON)
        return await handler(request)

    def _schedule_sweep(self) -> None:
        # One timer for all connections instead of one per request.
        self._sweeper = self.loop.call_later(min(self.idle_timeout / 4, 5.0), self._sweep)

    def _sweep(self) -> None:
        now = self.loop.time()
        for conn in list(self.connections):
            conn.close_if_idle(now, self.idle_timeout)
        self._schedule_sweep()

    async def close(self, grace: float) -> None:
        """Stop listening, let requests being answered finish within `grace` seconds, then cancel
        what is left and close every connection."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shut()
        tasks = {conn.task for conn in self.connections if conn.task is not None}
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        # Requests still running are cancelled; connections that finished theirs have a moment
        # more to hand the last bytes over before they are cut.
        for conn in list(self.connections):
            if conn.task is not None:
                conn.abort()
        left = {conn.task for conn in self.connections if conn.task is not None}
        if left:
            await asyncio.wait(left, timeout=1.0)
        if self.connections:
            self._emptied = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._emptied.wait(), 1.0)
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
