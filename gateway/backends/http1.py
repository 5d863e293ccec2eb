"""A small HTTP/1.1 client for talking to HTTP backends: pooled keep-alive connections, one
request per connection at a time, Content-Length / chunked / close-delimited bodies.

Why not aiohttp's ClientSession: in the benchmark (bench/README.md) its per-request machinery cost
more CPU than the whole rest of the gateway's hop. The wire parsing is httptools (llhttp), so what
is written here is only connection management: one future per request in the common case.

Errors: `ConnectFailed` (nothing was sent), `Disconnected` (the connection broke during the
exchange), `TimeoutError` (the deadline passed), `HttpProtocolError` (unparseable reply).
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway import timers

# A streamed body buffered beyond this stops reading from the socket until the consumer catches
# up, so a slow consumer applies backpressure to the backend instead of growing memory.
READ_HIGH_WATER = 1024 * 1024
# Header values we send must not be able to end the header line early.
_UNSAFE_VALUE = re.compile(r"[\r\n\x00]")
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class HttpClientError(Exception):
    pass


class ConnectFailed(HttpClientError):
    pass


class Disconnected(HttpClientError):
    pass


class HttpProtocolError(HttpClientError):
    pass


class Target:
    """Where requests go, split once: the request line and Host header are fixed per URL."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        default_port = parts.port is None or parts.port == (443 if self.tls else 80)
        host_header = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if not default_port:
            host_header += f":{parts.port}"
        self.request_line = f"POST {target} HTTP/1.1\r\nHost: {host_header}\r\n"


def encode_headers(headers: Iterable[tuple[str, str]]) -> str:
    lines = []
    for name, value in headers:
        if _UNSAFE_VALUE.search(value) or not _TOKEN.fullmatch(name):
            raise ValueError(f"header {name!r} cannot be sent as given")
        lines.append(f"{name}: {value}\r\n")
    return "".join(lines)


@functools.lru_cache(maxsize=64)
def _media_type(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


class Response:
    """One reply. Read it whole with `read`, or as it arrives with `chunks`; then `release` it
    (the connection goes back to the pool) or `abort` it (the connection is closed, which is how
    an HTTP request is cancelled)."""

    def __init__(self, conn: _Connection, deadline: _Deadline) -> None:
        self._conn = conn
        self._deadline = deadline
        self.status = conn.status
        self.headers = conn.headers

    @property
    def content_type(self) -> str:
        return _media_type(self.headers.get("content-type", ""))

    @property
    def complete(self) -> bool:
        """The whole body has arrived (small replies come with their head)."""
        return self._conn.complete

    async def read(self, limit: int) -> bytes:
        """The whole body; raises HttpProtocolError past `limit` bytes."""
        conn = self._conn
        while not conn.complete:
            if conn.buffered > limit:
                raise HttpProtocolError(f"body over {limit} bytes")
            conn.resume()  # `limit` bounds what is buffered here, not the high-water mark
            await conn.wait()
        return self.body(limit)

    def body(self, limit: int) -> bytes:
        """The whole body of a `complete` reply, without a coroutine."""
        conn = self._conn
        body = b"".join(conn.body)
        conn.body.clear()
        if len(body) > limit:
            raise HttpProtocolError(f"body over {limit} bytes")
        return body

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.body:
                data = b"".join(conn.body)
                conn.body.clear()
                conn.drained()
                yield data
            elif conn.complete:
                return
            else:
                await conn.wait()

    def release(self) -> None:
        self._deadline.cancel()
        self._conn.finish()

    def abort(self) -> None:
        self._deadline.cancel()
        self._conn.close()


class _Deadline:
    """Fails what an exchange waits on (a pool slot or its connection) when time is up."""

    def __init__(self, wheel: timers.Wheel, timeout: float | None) -> None:
        self.waiting_on: _Connection | asyncio.Future[_Connection | None] | None = None
        self.expired = False
        # A coarse timer: nearly every deadline is cancelled long before it is due.
        if timeout is None:
            self.at = math.inf
            self._timer: timers.Timer | None = None
        else:
            self._timer = wheel.call_later(timeout, self._expire)
            self.at = self._timer.due

    def _expire(self) -> None:
        self.expired = True
        target = self.waiting_on
        if isinstance(target, _Connection):
            target.fail(TimeoutError())
        elif target is not None and not target.done():
            target.set_exception(TimeoutError())

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _Connection(asyncio.Protocol):
    """One keep-alive connection; its parser callbacks record the reply of the current request."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._loop = pool.loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._paused = False
        self._interim = False
        self._length_known = False
        self.closed = False
        self.used = False
        self.got_bytes = False
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.buffered = 0

    # --- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(HttpProtocolError("unexpected protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(HttpProtocolError(f"malformed HTTP reply: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self.head_done and not self.complete and not self._length_known and exc is None:
            # A body delimited by the end of the connection has ended.
            self.complete = True
            self._wake()
        elif not self.complete:
            self._fail(Disconnected(f"connection closed: {exc}" if exc else "connection closed"))

    # --- httptools callbacks -----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        previous = self.headers.get(key)
        self.headers[key] = text if previous is None else f"{previous}, {text}"

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim reply (100 Continue, 103 Early Hints): the real one follows.
            self._interim = True
            self.headers = {}
            return
        self.status = status
        self.head_done = True
        self._length_known = (
            "content-length" in self.headers
            or "chunked" in self.headers.get("transfer-encoding", "").lower()
        )
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > READ_HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.keep_alive = self._parser.should_keep_alive()
        self.complete = True
        self._wake()

    # --- used by the pool and Response ------------------------------------------------------

    def start(self, data: bytes) -> None:
        assert self._transport is not None
        self.used = True
        self.got_bytes = self.head_done = self.complete = self._length_known = False
        self.status = 0
        self.headers = {}
        self.body = []
        self.buffered = 0
        self._error = None
        if self.closed:
            # The backend closed it while it sat idle: fail the exchange the same way.
            self._error = Disconnected("connection closed while idle")
            return
        self._transport.write(data)

    async def wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def drained(self) -> None:
        self.buffered = 0
        self.resume()

    def resume(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()

    def fail(self, exc: BaseException) -> None:
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            if self._error is not None:
                waiter.set_exception(self._error)
            else:
                waiter.set_result(None)

    def finish(self) -> None:
        if self.complete and self.keep_alive and not self.closed and not self._paused:
            self._pool.put_back(self)
        else:
            self.close()

    def close(self) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._transport is not None:
            self._transport.abort()


class Pool:
    """Keep-alive connections to one origin; at most `limit` at once (None: no limit). Callers
    beyond the limit wait in order for a released connection."""

    def __init__(
        self,
        url: str,
        *,
        limit: int | None,
        connect_timeout: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.target = Target(url)
        self.loop = asyncio.get_running_loop()
        self._wheel = timers.wheel(self.loop)
        self._limit = limit
        self._connect_timeout = connect_timeout
        self._ssl = (ssl_context or ssl.create_default_context()) if self.target.tls else None
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._connecting = 0
        self._queue: deque[asyncio.Future[_Connection | None]] = deque()
        self._closed = False

    async def request(
        self, headers: str, body: bytes, *, within: float | None = None, method: str = "POST"
    ) -> Response:
        """Send a request (a POST unless `method` says otherwise) and return once the reply's
        head has arrived.

        `headers` is the encoded header block (see `encode_headers`) without Host and
        Content-Length. `within` (seconds) bounds the whole exchange, the body included: past
        it, whatever is being awaited raises TimeoutError and the connection is closed. A reused
        connection the backend closed before answering is retried once on a new connection: the
        backend cannot have acted on a request it never read."""
        line = self.target.request_line
        if method != "POST":
            line = method + line[4:]
        data = f"{line}{headers}Content-Length: {len(body)}\r\n\r\n".encode() + body
        # A timer rather than a cancel scope: it costs one heap entry, and it fails only what
        # this exchange is waiting on.
        deadline = _Deadline(self._wheel, within)
        try:
            # An idle connection is taken without a coroutine; only waiting needs one.
            conn = self._idle_connection() or await self._acquire(deadline)
            for retry in (True, False):
                reused = conn.used
                deadline.waiting_on = conn
                conn.start(data)
                try:
                    while not conn.head_done:
                        await conn.wait()
                except Disconnected:
                    if not (retry and reused and not conn.got_bytes):
                        raise
                    conn = await self._acquire(deadline)
                    continue
                except BaseException:
                    conn.close()
                    raise
                return Response(conn, deadline)
            raise AssertionError("unreachable")
        except BaseException:
            deadline.cancel()
            raise

    async def _acquire(self, deadline: _Deadline) -> _Connection:
        conn = await self._take(deadline)
        if deadline.expired or self._closed:
            # Time ran out (or the pool closed) between being handed a connection and resuming.
            self.put_back(conn)
            raise TimeoutError if deadline.expired else ConnectFailed("client closed")
        return conn

    def _idle_connection(self) -> _Connection | None:
        while self._idle and not self._closed:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        return None

    async def _take(self, deadline: _Deadline) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        if self._closed:
            raise ConnectFailed("client closed")
        if self._limit is None or len(self._open) + self._connecting < self._limit:
            self._connecting += 1
            return await self._connect(deadline)
        waiter: asyncio.Future[_Connection | None] = self.loop.create_future()
        self._queue.append(waiter)
        deadline.waiting_on = waiter
        try:
            handed = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # What we were handed (a connection, or a reserved slot) goes to the next in line.
                self._hand_on(waiter.result())
            raise
        if handed is None:  # a slot reserved for us: open a connection in it
            return await self._connect(deadline)
        return handed

    async def _connect(self, deadline: _Deadline) -> _Connection:
        """Open a connection in a slot already counted in `_connecting`."""
        connected = False
        try:
            limit = min(self.loop.time() + self._connect_timeout, deadline.at)
            async with asyncio.timeout_at(limit):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self),
                    self.target.host,
                    self.target.port,
                    ssl=self._ssl,
                )
            connected = True
        except TimeoutError:
            if self.loop.time() >= deadline.at:
                raise  # the exchange's own deadline, not the connect timeout
            raise ConnectFailed("connect timed out") from None
        except OSError as exc:
            raise ConnectFailed(str(exc) or type(exc).__name__) from None
        finally:
            self._connecting -= 1
            if not connected:
                self._free_slot()  # whoever waits next may try in our place
        self._open.add(conn)
        return conn

    def put_back(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        self._hand_on(conn)

    def _hand_on(self, conn: _Connection | None) -> None:
        """Give a connection, or a reserved slot (None), to the first live waiter."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)
        else:
            self._connecting -= 1  # nobody wanted the reserved slot

    def _free_slot(self) -> None:
        if self._closed or not self._queue:
            return
        # Reserved now, so that a request arriving before the woken waiter runs cannot take
        # the same slot and push the pool over its limit.
        self._connecting += 1
        self._hand_on(None)

    def forget(self, conn: _Connection) -> None:
        if conn in self._open:
            self._open.discard(conn)
            self._free_slot()

    @property
    def connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        self._closed = True
        # Waiters first: closing connections must not hand their slots to anyone.
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectFailed("client closed"))
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
