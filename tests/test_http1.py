"""The HTTP/1.1 client (gateway/backends/http1.py) against real servers on 127.0.0.1.

Every server here is a raw asyncio stream server written in this file, so each test controls the
reply byte for byte, sees every connection accepted and every close, and counts requests per
connection. Every wait is on an event, bounded by BOUND; the only timed waits are the client's
own deadlines (`within`, `connect_timeout`) and STALL_CHECK.
"""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import pytest

from gateway.backends import http1
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
)

pytestmark = pytest.mark.anyio

# Large enough for every body a test reads whole, except where the limit itself is under test.
LIMIT = 64 * 1024
# How long a test lets a stalled transfer run to show that it stays stalled: there is no event
# for "nothing more happens", and unthrottled loopback moves the whole body in a fraction of it.
STALL_CHECK = 0.3
# Bounds a wait that a regression (a slot lost, a deadline dropped) would turn into a hang; far
# above what it takes when the client works, below BOUND so that such a failure stays cheap.
HANG_BOUND = 2.0


# --- a scripted server --------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    head: bytes
    body: bytes

    @property
    def raw(self) -> bytes:
        return self.head + self.body


class Peer:
    """One accepted connection, from the server's side."""

    def __init__(
        self, server: Server, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.index = index
        self.reader = reader
        self.writer = writer
        self.requests: list[Request] = []
        # The client closed its end (EOF or reset) while we were reading.
        self.closed = False

    async def read_request(self) -> Request | None:
        """The next request, or None once the client has closed the connection."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            body = await self.reader.readexactly(_content_length(head))
        except (asyncio.IncompleteReadError, ConnectionError):
            await self._saw_close()
            return None
        request = Request(head, body)
        self.requests.append(request)
        self.server.requests.append(request)
        await self.server.changed()
        return request

    async def wait_closed_by_client(self) -> None:
        with suppress(ConnectionError):
            while await self.reader.read(65536):
                pass
        await self._saw_close()

    async def send(self, *parts: bytes) -> None:
        for part in parts:
            self.writer.write(part)
            await self.writer.drain()

    async def trickle(self, data: bytes) -> None:
        """One byte per write, yielding between writes, so that the client's parser meets every
        possible split of the reply (the loop polls the client's socket on each iteration)."""
        for i in range(len(data)):
            self.writer.write(data[i : i + 1])
            await self.writer.drain()
            for _ in range(3):
                await anyio.lowlevel.checkpoint()

    async def _saw_close(self) -> None:
        self.closed = True
        await self.server.changed()


Handler = Callable[[Peer], Awaitable[None]]


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Server:
    """Runs `handler` for each connection; the connection is closed when the handler returns.

    Counts connections (`peers`, `live`, `max_live`) and requests; `until(predicate)` waits for
    a state the test expects. An exception in a handler fails the test when the server exits.
    """

    def __init__(self, handler: Handler, *, sock: socket.socket | None = None) -> None:
        self._handler = handler
        self._sock = sock
        self._tasks: set[asyncio.Task[Any]] = set()
        self._errors: list[BaseException] = []
        self._cond = asyncio.Condition()
        self.peers: list[Peer] = []
        self.requests: list[Request] = []
        self.live = 0
        self.max_live = 0
        self.port = 0

    async def __aenter__(self) -> Server:
        if self._sock is not None:
            self._server = await asyncio.start_server(self._serve, sock=self._sock)
        else:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._server.close()
        await self._server.wait_closed()
        if self._errors and exc is None:
            raise self._errors[0]

    def url(self, path: str = "/mcp") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def changed(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def until(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(BOUND):
            async with self._cond:
                await self._cond.wait_for(predicate)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = Peer(self, len(self.peers), reader, writer)
        self.peers.append(peer)
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        # Cancellation comes only from __aexit__ and ends the handler quietly: asyncio's stream
        # server reports a handler task that ends cancelled as an error.
        try:
            await self.changed()
            await self._handler(peer)
        except (ConnectionError, asyncio.CancelledError):
            pass  # several tests abort the client's end mid-reply
        except Exception as exc:
            self._errors.append(exc)
        finally:
            writer.close()  # after what was written has been sent: a close-delimited end
            try:
                await writer.wait_closed()
            except (ConnectionError, asyncio.CancelledError):
                writer.transport.abort()
            self.live -= 1
            self._tasks.discard(task)
            with suppress(asyncio.CancelledError):
                await self.changed()


def head(*lines: str, status: str = "200 OK", version: str = "1.1") -> bytes:
    return "".join(f"{line}\r\n" for line in (f"HTTP/{version} {status}", *lines, "")).encode()


def reply(body: bytes, *lines: str, status: str = "200 OK", version: str = "1.1") -> bytes:
    return head(*lines, f"Content-Length: {len(body)}", status=status, version=version) + body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def pattern(size: int) -> bytes:
    """Bytes that are not all alike, so a dropped or reordered piece changes the digest."""
    return (bytes(range(251)) * (size // 251 + 1))[:size]


async def echo(peer: Peer) -> None:
    while (request := await peer.read_request()) is not None:
        await peer.send(reply(request.body))


async def hold(peer: Peer) -> None:
    """Reads the request and never answers."""
    await peer.read_request()
    await peer.wait_closed_by_client()


@asynccontextmanager
async def client(
    url: str, *, limit: int | None = None, connect_timeout: float = BOUND
) -> AsyncIterator[http1.Pool]:
    pool = http1.Pool(url, limit=limit, connect_timeout=connect_timeout)
    try:
        yield pool
    finally:
        await pool.close()
        # An aborted transport closes its socket in a callback; let it run before the loop ends.
        for _ in range(3):
            await anyio.lowlevel.checkpoint()


async def exchange(pool: http1.Pool, body: bytes, *, within: float | None = None) -> bytes:
    resp = await pool.request("", body, within=within)
    try:
        return await resp.read(LIMIT)
    finally:
        resp.release()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def stalled_listener() -> Iterator[socket.socket]:
    """A listening socket whose accept queue is full: Linux drops further SYNs, so a connect to
    it stays pending (the kernel retries the SYN) until the socket listens with room to spare."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname())
    try:
        yield listener
    finally:
        filler.close()
        listener.close()


# --- what is sent --------------------------------------------------------------------------------


async def test_the_request_is_sent_exactly() -> None:
    async with Server(echo) as server, client(server.url("/path?q")) as pool:
        headers = http1.encode_headers([("Content-Type", "application/json"), ("X-Trace", "a b")])
        resp = await pool.request(headers, b'{"x":1}')
        assert await resp.read(LIMIT) == b'{"x":1}'
        resp.release()
    (request,) = server.requests
    assert request.raw == (
        b"POST /path?q HTTP/1.1\r\n"
        b"Host: 127.0.0.1:%d\r\n"
        b"Content-Type: application/json\r\n"
        b"X-Trace: a b\r\n"
        b"Content-Length: 7\r\n"
        b"\r\n"
        b'{"x":1}' % server.port
    )


@pytest.mark.parametrize(
    ("url", "request_line"),
    [
        ("http://example.com", "POST / HTTP/1.1\r\nHost: example.com\r\n"),
        ("http://example.com:80/a?b=c", "POST /a?b=c HTTP/1.1\r\nHost: example.com\r\n"),
        ("https://example.com:443/mcp", "POST /mcp HTTP/1.1\r\nHost: example.com\r\n"),
        ("https://example.com:80/mcp", "POST /mcp HTTP/1.1\r\nHost: example.com:80\r\n"),
        ("http://[::1]:8080/mcp", "POST /mcp HTTP/1.1\r\nHost: [::1]:8080\r\n"),
    ],
)
def test_request_line_and_host(url: str, request_line: str) -> None:
    assert http1.Target(url).request_line == request_line


@pytest.mark.parametrize("url", ["ftp://example.com/", "http:///path", "example.com"])
def test_target_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(ValueError):
        http1.Target(url)


def test_encode_headers() -> None:
    assert http1.encode_headers([("A", "1"), ("B-C", "x, y")]) == "A: 1\r\nB-C: x, y\r\n"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Evil", "a\r\nInjected: yes"),
        ("X-Evil", "a\nInjected: yes"),
        ("X-Evil", "a\rb"),
        ("X-Evil", "a\x00b"),
        ("X-Evil\r\nInjected", "yes"),
        ("X-Evil: yes\r\nX", "1"),
        ("X:Evil", "1"),
    ],
)
def test_encode_headers_refuses_what_could_end_a_header_line(name: str, value: str) -> None:
    with pytest.raises(ValueError):
        http1.encode_headers([("Fine", "1"), (name, value)])


# --- reply framing -------------------------------------------------------------------------------

BODY_PARTS = (b"hello", b", chunked", b" ", b"world\r\n0\r\n")
BODY = b"".join(BODY_PARTS)


def framed(framing: str) -> bytes:
    if framing == "content-length":
        return reply(BODY, "Content-Type: text/plain")
    if framing == "chunked":
        # A chunk extension and a trailer are legal and must not end up in the body.
        return (
            head("Transfer-Encoding: chunked")
            + b"%x;ext=1\r\n%s\r\n" % (len(BODY_PARTS[0]), BODY_PARTS[0])
            + b"".join(chunk(part) for part in BODY_PARTS[1:])
            + b"0\r\nX-Trailer: t\r\n\r\n"
        )
    assert framing == "close-delimited"
    return head("Content-Type: text/plain") + BODY


@pytest.mark.parametrize("reader", ["read", "chunks"])
@pytest.mark.parametrize("framing", ["content-length", "chunked", "close-delimited"])
async def test_a_reply_split_at_every_byte(framing: str, reader: str) -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            await peer.trickle(framed(framing))
            if framing == "close-delimited":
                return  # its end is the end of the connection
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        with anyio.fail_after(BOUND):
            resp = await pool.request("", b"first")
            assert resp.status == 200
            if reader == "read":
                body = await resp.read(LIMIT)
            else:
                body = b"".join([piece async for piece in resp.chunks()])
            resp.release()
            assert body == BODY
            assert await exchange(pool, b"second") == b"second"
    reused = framing != "close-delimited"
    assert len(server.peers) == (1 if reused else 2)
    assert [len(peer.requests) for peer in server.peers] == ([2] if reused else [1, 1])


async def test_status_and_headers() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(
            reply(
                b'{"ok":true}',
                "Content-Type: Application/JSON; charset=utf-8",
                "X-Dup: a",
                "x-dup: b",
                status="201 Created",
            )
        )
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        assert resp.status == 201
        assert resp.content_type == "application/json"
        assert resp.headers["x-dup"] == "a, b"
        assert resp.headers["content-length"] == "11"
        assert await resp.read(LIMIT) == b'{"ok":true}'
        resp.release()
        assert pool.connections == 1


@pytest.mark.parametrize(
    "empty",
    [
        head(status="204 No Content"),
        head("Content-Length: 0", status="202 Accepted"),
        head("Transfer-Encoding: chunked") + b"0\r\n\r\n",
    ],
    ids=["204", "content-length-0", "empty-chunked"],
)
async def test_an_empty_reply_leaves_the_connection_reusable(empty: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(empty)
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        with anyio.fail_after(BOUND):
            resp = await pool.request("", b"notification")
            assert await resp.read(LIMIT) == b""
            resp.release()
            assert await exchange(pool, b"next") == b"next"
    assert len(server.peers) == 1


# --- keep-alive ----------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection() -> None:
    async with Server(echo) as server, client(server.url()) as pool:
        bodies = [b"request %d" % i for i in range(5)]
        for body in bodies:
            assert await exchange(pool, body) == body
        assert pool.connections == 1
    assert len(server.peers) == 1
    assert [r.body for r in server.peers[0].requests] == bodies


@pytest.mark.parametrize(
    ("first", "reused"),
    [
        (reply(b"a", "Connection: close"), False),
        (reply(b"a", version="1.0"), False),
        (reply(b"a", "Connection: keep-alive", version="1.0"), True),
    ],
    ids=["connection-close", "http-1.0", "http-1.0-keep-alive"],
)
async def test_reuse_follows_what_the_reply_says(first: bytes, reused: bool) -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            await peer.send(first)
        # Not closing from this side: the client has to close it if it may not be reused.
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        assert await exchange(pool, b"one") == b"a"
        if not reused:
            await server.until(lambda: server.peers[0].closed)
        assert await exchange(pool, b"two") == b"two"
    assert len(server.peers) == (1 if reused else 2)
    assert server.peers[-1].requests[-1].body == b"two"


# --- a connection the server closed --------------------------------------------------------------


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            request = await peer.read_request()
            assert request is not None
            await peer.send(reply(request.body))
            return  # closes the kept-alive connection
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        assert await exchange(pool, b"first") == b"first"
        await server.until(lambda: server.live == 0)
        assert await exchange(pool, b"second") == b"second"
    assert len(server.peers) == 2
    assert [r.body for r in server.peers[0].requests] == [b"first"]
    assert [r.body for r in server.peers[1].requests] == [b"second"]


async def test_a_reused_connection_closed_unanswered_is_retried_once_on_a_new_one() -> None:
    """The race the retry exists for: the server closes a kept-alive connection just as the next
    request arrives on it, reading the request but never acting on it."""

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            request = await peer.read_request()
            assert request is not None
            await peer.send(reply(request.body))
            await peer.read_request()
            return
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        assert await exchange(pool, b"first") == b"first"
        assert await exchange(pool, b"second") == b"second"
    assert len(server.peers) == 2
    assert [r.body for r in server.peers[0].requests] == [b"first", b"second"]
    assert [r.body for r in server.peers[1].requests] == [b"second"]


async def test_the_retry_happens_only_once() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            request = await peer.read_request()
            assert request is not None
            await peer.send(reply(request.body))
        await peer.read_request()

    async with Server(handler) as server, client(server.url()) as pool:
        assert await exchange(pool, b"first") == b"first"
        with pytest.raises(http1.Disconnected):
            await exchange(pool, b"second")
        assert pool.connections == 0
    assert len(server.peers) == 2


async def test_a_fresh_connection_closed_unanswered_is_not_retried() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()

    async with Server(handler) as server, client(server.url()) as pool:
        with pytest.raises(http1.Disconnected):
            await pool.request("", b"once")
    assert len(server.peers) == 1
    assert len(server.requests) == 1


async def test_a_reused_connection_closed_mid_reply_is_not_retried() -> None:
    """Part of a reply means the server acted on the request; sending it again could repeat it."""

    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        await peer.send(reply(request.body))
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\nContent-")

    async with Server(handler) as server, client(server.url()) as pool:
        assert await exchange(pool, b"first") == b"first"
        with pytest.raises(http1.Disconnected):
            await pool.request("", b"second")
    assert len(server.peers) == 1


# --- streaming -----------------------------------------------------------------------------------


@pytest.mark.parametrize("framing", ["chunked", "close-delimited"])
async def test_an_event_stream_arrives_piece_by_piece(framing: str) -> None:
    first = b'event: message\ndata: {"n":1}\n\n'
    rest = [b'data: {"n":2}\n\n', b'data: {"n":3}\n\n']
    go = anyio.Event()

    async def handler(peer: Peer) -> None:
        if peer.index > 0:
            await echo(peer)
            return
        await peer.read_request()
        if framing == "chunked":
            await peer.send(
                head("Content-Type: text/event-stream", "Transfer-Encoding: chunked") + chunk(first)
            )
            await go.wait()
            await peer.send(*(chunk(event) for event in rest), b"0\r\n\r\n")
            await echo(peer)
        else:
            await peer.send(head("Content-Type: text/event-stream") + first)
            await go.wait()
            await peer.send(*rest)

    async with Server(handler) as server, client(server.url()) as pool:
        with anyio.fail_after(BOUND):
            resp = await pool.request("", b"{}")
            assert resp.content_type == "text/event-stream"
            received = []
            async for piece in resp.chunks():
                # The rest is sent only once the first piece has been handed over.
                received.append(piece)
                go.set()
            assert received[0] == first
            assert b"".join(received) == first + b"".join(rest)
            resp.release()
            assert await exchange(pool, b"after") == b"after"
    assert len(server.peers) == (1 if framing == "chunked" else 2)


async def test_a_slow_consumer_stops_the_client_reading() -> None:
    size = 32 * 1024 * 1024
    body = pattern(size)
    flushed = anyio.Event()

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        peer.writer.write(head(f"Content-Length: {size}") + body)
        await peer.writer.drain()
        flushed.set()
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with anyio.move_on_after(STALL_CHECK):
            await flushed.wait()
        assert not flushed.is_set()
        # Past what the client buffers (READ_HIGH_WATER) and the kernel's socket buffers, the
        # rest must still be waiting in the server's transport.
        assert server.peers[0].writer.transport.get_write_buffer_size() > size // 2
        digest = hashlib.sha256()
        received = 0
        with anyio.fail_after(BOUND):
            async for piece in resp.chunks():
                digest.update(piece)
                received += len(piece)
            await flushed.wait()
        assert received == size
        assert digest.digest() == hashlib.sha256(body).digest()
        resp.release()
        assert await exchange(pool, b"after") == b"after"
    assert len(server.peers) == 1


# --- errors --------------------------------------------------------------------------------------


async def test_connection_refused() -> None:
    async with client(f"http://127.0.0.1:{free_port()}/") as pool:
        with pytest.raises(http1.ConnectFailed):
            await pool.request("", b"")
        assert pool.connections == 0


async def test_a_connect_that_does_not_complete_in_time() -> None:
    with stalled_listener() as listener:
        port = listener.getsockname()[1]
        async with client(f"http://127.0.0.1:{port}/", connect_timeout=0.05) as pool:
            with anyio.fail_after(BOUND), pytest.raises(http1.ConnectFailed):
                await pool.request("", b"")
            assert pool.connections == 0


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    ],
    ids=["status-code", "status-line", "content-length", "header-line", "two-lengths"],
)
async def test_a_malformed_head(garbage: bytes) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(garbage)
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        with pytest.raises(http1.HttpProtocolError):
            await pool.request("", b"")
        assert pool.connections == 0
        await server.until(lambda: server.peers[0].closed)


async def test_a_malformed_body() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head("Transfer-Encoding: chunked") + chunk(b"fine"))
        await peer.send(b"zz\r\n")
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with anyio.fail_after(BOUND), pytest.raises(http1.HttpProtocolError):
            async for _ in resp.chunks():
                pass
        await server.until(lambda: server.peers[0].closed)


@pytest.mark.parametrize("reader", ["read", "chunks"])
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_the_server_closing_mid_body(framing: str, reader: str) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        if framing == "content-length":
            await peer.send(head("Content-Length: 10") + b"abcd")
        else:
            await peer.send(head("Transfer-Encoding: chunked") + b"a\r\nabcd")

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with anyio.fail_after(BOUND), pytest.raises(http1.Disconnected):
            if reader == "read":
                await resp.read(LIMIT)
            else:
                async for _ in resp.chunks():
                    pass
        resp.release()
        assert pool.connections == 0
    assert len(server.peers) == 1


async def test_a_body_over_the_limit() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply(b"x" * 100))
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with pytest.raises(http1.HttpProtocolError):
            await resp.read(99)
        resp.abort()
        await server.until(lambda: server.peers[0].closed)


async def test_a_body_over_the_limit_fails_before_it_ends() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head("Transfer-Encoding: chunked") + chunk(b"x" * 100))
        await peer.wait_closed_by_client()  # the body never ends

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with anyio.fail_after(BOUND), pytest.raises(http1.HttpProtocolError):
            await resp.read(99)
        resp.abort()
        await server.until(lambda: server.peers[0].closed)


async def test_a_deadline_passing_while_waiting_for_the_head() -> None:
    async with Server(hold) as server, client(server.url()) as pool:
        with anyio.fail_after(BOUND), pytest.raises(TimeoutError):
            await pool.request("", b"", within=0.05)
        await server.until(lambda: server.peers[0].closed)
        assert pool.connections == 0
    assert len(server.requests) == 1


@pytest.mark.parametrize("reader", ["read", "chunks"])
async def test_a_deadline_passing_while_reading_the_body(reader: str) -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head("Transfer-Encoding: chunked") + chunk(b"partial"))
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"", within=0.3)
        received = []
        with anyio.fail_after(BOUND), pytest.raises(TimeoutError):
            if reader == "read":
                await resp.read(LIMIT)
            else:
                async for piece in resp.chunks():
                    received.append(piece)
        await server.until(lambda: server.peers[0].closed)
        assert pool.connections == 0
    if reader == "chunks":
        assert received == [b"partial"]


async def test_release_keeps_a_finished_connection_and_abort_closes_it() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply(b"whole"))
        await peer.read_request()
        await peer.send(reply(b"whole again"))
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        assert await resp.read(LIMIT) == b"whole"
        resp.release()
        assert pool.connections == 1
        resp = await pool.request("", b"")
        assert await resp.read(LIMIT) == b"whole again"
        resp.abort()
        assert pool.connections == 0
        await server.until(lambda: server.peers[0].closed)
    assert len(server.peers) == 1


@pytest.mark.parametrize("end", ["release", "abort"])
async def test_a_reply_left_unfinished_closes_the_connection(end: str) -> None:
    """Whatever the reply still owes would otherwise be read as the next request's reply."""

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head("Content-Length: 100") + b"start")
        await peer.wait_closed_by_client()

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        if end == "release":
            resp.release()
        else:
            resp.abort()
        assert pool.connections == 0
        await server.until(lambda: server.peers[0].closed)


async def test_cancelling_the_caller_closes_the_connection() -> None:
    async with Server(hold) as server, client(server.url()) as pool:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pool.request, "", b"")
            await server.until(lambda: len(server.requests) == 1)
            tg.cancel_scope.cancel()
        await server.until(lambda: server.peers[0].closed)
        assert pool.connections == 0


async def test_a_closed_pool() -> None:
    async with Server(echo) as server, client(server.url()) as pool:
        held = await pool.request("", b"held")
        assert await exchange(pool, b"idle") == b"idle"
        assert pool.connections == 2
        await pool.close()
        await server.until(lambda: all(peer.closed for peer in server.peers))
        assert pool.connections == 0
        with pytest.raises(http1.ConnectFailed):
            await pool.request("", b"late")
        held.release()
    assert len(server.peers) == 2
    assert [r.body for r in server.requests] == [b"held", b"idle"]


# --- the pool's limit ----------------------------------------------------------------------------


async def test_the_limit_bounds_concurrent_connections() -> None:
    go = anyio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await go.wait()
            await peer.send(reply(request.body))

    results: dict[int, bytes] = {}

    async def call(i: int) -> None:
        results[i] = await exchange(pool, b"call %d" % i)

    async with Server(handler) as server, client(server.url(), limit=2) as pool:
        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(call, i)
                await server.until(lambda: len(server.requests) == 2)
                await anyio.wait_all_tasks_blocked()
                assert len(server.peers) == 2
                go.set()
    assert results == {i: b"call %d" % i for i in range(6)}
    assert len(server.peers) == 2
    assert server.max_live == 2


async def test_a_cancelled_waiter_does_not_keep_its_place() -> None:
    async with Server(echo) as server, client(server.url(), limit=1) as pool:
        held = await pool.request("", b"held")
        async with anyio.create_task_group() as tg:
            tg.start_soon(exchange, pool, b"given up")
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
        assert await held.read(LIMIT) == b"held"
        held.release()
        with anyio.fail_after(BOUND):
            assert await exchange(pool, b"next") == b"next"
    assert len(server.peers) == 1
    assert [r.body for r in server.requests] == [b"held", b"next"]


async def test_a_waiter_cancelled_after_being_handed_a_connection_passes_it_on() -> None:
    async with Server(echo) as server, client(server.url(), limit=1) as pool:
        held = await pool.request("", b"held")
        assert await held.read(LIMIT) == b"held"
        # Plain asyncio tasks: anyio would defer a cancel aimed at a task whose wait is already
        # over, and the window between the hand-over and the resumption is the case here.
        handed = asyncio.create_task(exchange(pool, b"handed"))
        after = asyncio.create_task(exchange(pool, b"after"))
        await anyio.wait_all_tasks_blocked()
        held.release()  # hands the connection to `handed`, which has not resumed yet
        handed.cancel()
        with anyio.fail_after(BOUND):
            assert await after == b"after"
        with pytest.raises(asyncio.CancelledError):
            await handed
    assert len(server.peers) == 1
    assert [r.body for r in server.requests] == [b"held", b"after"]


async def test_a_waiter_whose_deadline_passes_does_not_keep_its_place() -> None:
    async with Server(echo) as server, client(server.url(), limit=1) as pool:
        held = await pool.request("", b"held")
        with anyio.fail_after(BOUND), pytest.raises(TimeoutError):
            await pool.request("", b"late", within=0.05)
        assert await held.read(LIMIT) == b"held"
        held.release()
        with anyio.fail_after(BOUND):
            assert await exchange(pool, b"next") == b"next"
    assert len(server.peers) == 1


async def test_a_slot_freed_by_a_closed_connection_goes_to_a_waiter() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await hold(peer)
        else:
            await echo(peer)

    async with Server(handler) as server, client(server.url(), limit=1) as pool:
        results: list[bytes] = []

        async def queued() -> None:
            results.append(await exchange(pool, b"queued"))

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                held = anyio.CancelScope()

                async def holder() -> None:
                    with held:
                        await pool.request("", b"held")

                tg.start_soon(holder)
                await server.until(lambda: len(server.requests) == 1)
                tg.start_soon(queued)
                await anyio.wait_all_tasks_blocked()
                held.cancel()  # closes the held connection, freeing the only slot
        assert results == [b"queued"]
    assert len(server.peers) == 2


# --- recorded bugs -------------------------------------------------------------------------------


async def test_read_of_a_body_over_the_read_high_water_mark() -> None:
    size = 3 * http1.READ_HIGH_WATER
    body = pattern(size)

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply(body))
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        resp = await pool.request("", b"")
        with anyio.fail_after(HANG_BOUND):
            assert await resp.read(4 * size) == body
        resp.release()


async def test_a_newcomer_cannot_take_the_slot_handed_to_a_waiter() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            await peer.send(head("Content-Length: 10") + b"part")
            await peer.wait_closed_by_client()
        else:
            await echo(peer)

    async with Server(handler) as server, client(server.url(), limit=1) as pool:
        results: list[bytes] = []

        async def queued() -> None:
            results.append(await exchange(pool, b"queued"))

        held = await pool.request("", b"held")
        async with anyio.create_task_group() as tg:
            tg.start_soon(queued)
            await anyio.wait_all_tasks_blocked()
            # The queued task is woken; before it runs, this task asks for a connection itself.
            held.abort()
            with anyio.fail_after(BOUND):
                results.append(await exchange(pool, b"newcomer"))
        assert sorted(results) == [b"newcomer", b"queued"]
    # One connection for the held request, one shared by the other two.
    assert len(server.peers) == 2


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # slow, and not about the loop
async def test_cancelling_a_connecting_request_wakes_a_waiter() -> None:
    with stalled_listener() as listener:
        port = listener.getsockname()[1]
        async with client(f"http://127.0.0.1:{port}/", limit=1) as pool:
            served = anyio.Event()

            async def queued() -> None:
                assert await exchange(pool, b"queued") == b"queued"
                served.set()

            with anyio.fail_after(HANG_BOUND):
                async with anyio.create_task_group() as tg:
                    connecting = anyio.CancelScope()

                    async def connect() -> None:
                        with connecting:
                            await pool.request("", b"cancelled")

                    tg.start_soon(connect)
                    await anyio.wait_all_tasks_blocked()
                    tg.start_soon(queued)
                    await anyio.wait_all_tasks_blocked()
                    # Listening with room first, so that a new connect gets through at once.
                    async with Server(echo, sock=listener):
                        connecting.cancel()  # the slot is free again: the waiter's turn
                        await served.wait()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_within_bounds_connecting() -> None:
    with stalled_listener() as listener:
        port = listener.getsockname()[1]
        async with client(f"http://127.0.0.1:{port}/", connect_timeout=1.0) as pool:
            with anyio.fail_after(BOUND), pytest.raises(TimeoutError):
                await pool.request("", b"", within=0.05)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_deadline_that_passed_while_connecting_still_applies() -> None:
    with stalled_listener() as listener:
        port = listener.getsockname()[1]
        async with client(f"http://127.0.0.1:{port}/") as pool:
            timed_out = anyio.Event()

            async def call() -> None:
                with pytest.raises(TimeoutError):
                    await pool.request("", b"", within=0.05)
                timed_out.set()

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(call)
                    await anyio.wait_all_tasks_blocked()
                    # The kernel retries the SYN about a second later and it then gets through,
                    # long after the deadline; the server takes the request and never answers.
                    async with Server(hold, sock=listener):
                        await timed_out.wait()


async def test_an_interim_reply_is_skipped() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(head("Link: </style.css>; rel=preload", status="103 Early Hints"))
        # Let the client take in the interim reply on its own before the final one follows.
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        await peer.send(reply(b"final"))
        await echo(peer)

    async with Server(handler) as server, client(server.url()) as pool:
        with anyio.fail_after(BOUND):
            resp = await pool.request("", b"")
            assert resp.status == 200
            assert await resp.read(LIMIT) == b"final"
            resp.release()


async def test_closing_the_pool_fails_a_queued_request() -> None:
    async with Server(echo) as server, client(server.url(), limit=1) as pool:
        held = await pool.request("", b"held")
        outcome: list[BaseException | bytes] = []

        async def queued() -> None:
            try:
                outcome.append(await exchange(pool, b"queued"))
            except http1.ConnectFailed as exc:
                outcome.append(exc)

        with anyio.fail_after(BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(queued)
                await anyio.wait_all_tasks_blocked()
                await pool.close()
        held.release()
        assert [type(o) for o in outcome] == [http1.ConnectFailed]
    assert [r.body for r in server.requests] == [b"held"]
