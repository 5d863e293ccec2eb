"""Raw HTTP backends for the HTTP backend's tests, and an HttpBackend run in-process.

Every server here is a raw asyncio stream server, so a test controls the reply byte for byte,
sees every connection accepted and every close, and counts requests per connection. Every wait
is on an event, bounded by BOUND.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway import config as gateway_config
from gateway.backends.http import HttpBackend
from gateway.config import BackendConfig
from gateway.errors import GatewayError
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats
from tests.support import until


@dataclass(frozen=True)
class Request:
    head: bytes
    body: bytes

    @property
    def raw(self) -> bytes:
        return self.head + self.body

    @property
    def request_line(self) -> bytes:
        return self.head.split(b"\r\n", 1)[0]

    @property
    def header_lines(self) -> list[bytes]:
        """Every header line as received, in order."""
        return [line for line in self.head.split(b"\r\n")[1:] if line]

    def headers(self) -> dict[str, str]:
        """Header names lowercased; a repeated header keeps its last value (tests that care
        about repeats read `header_lines`)."""
        out = {}
        for line in self.header_lines:
            name, _, value = line.partition(b":")
            out[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
        return out

    @property
    def message(self) -> Message:
        msg: Message = orjson.loads(self.body)
        return msg


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
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
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
        # Looked at with the condition held, as `Condition.wait_for` does: no change is missed.
        async with self._cond:
            await until(predicate, wake=self._cond.wait)

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
            pass  # several tests close the client's end mid-reply
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


def json_reply(body: bytes, *lines: str) -> bytes:
    return reply(body, "Content-Type: application/json", *lines)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_head() -> bytes:
    return head("Content-Type: text/event-stream", "Transfer-Encoding: chunked")


def sse_event(msg: Message) -> bytes:
    """One event as a chunk of a chunked event stream."""
    return chunk(b"event: message\r\ndata: " + orjson.dumps(msg) + b"\r\n\r\n")


def result_for(request: Request, result: dict[str, Any] | None = None) -> bytes:
    """The JSON-RPC result answering `request`."""
    msg = request.message
    body = {"jsonrpc": "2.0", "id": msg["id"], "result": result or {"resultType": "complete"}}
    return orjson.dumps(body)


async def answer(peer: Peer) -> None:
    """Answers every request on the connection with a JSON result carrying its id."""
    while (request := await peer.read_request()) is not None:
        await peer.send(json_reply(result_for(request)))


DISCOVERED: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "raw", "version": "1"},
}
TOOLS: dict[str, Any] = {
    "resultType": "complete",
    "tools": [{"name": "t", "inputSchema": {"type": "object"}}],
}


async def modern(peer: Peer) -> None:
    """Enough of a modern MCP server for a whole gateway: discovery, a one-tool list (`t`), and
    an empty result for anything else."""
    while (request := await peer.read_request()) is not None:
        method = request.message.get("method")
        if "id" not in request.message:
            await peer.send(head("Content-Length: 0", status="202 Accepted"))
            continue
        result = {"server/discover": DISCOVERED, "tools/list": TOOLS}.get(str(method))
        await peer.send(json_reply(result_for(request, result)))


async def hold(peer: Peer) -> None:
    """Reads the request and never answers."""
    await peer.read_request()
    await peer.wait_closed_by_client()


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


def backend_config(url: str, kind: str = "http", **section: object) -> BackendConfig:
    """A backend `b` at `url` as the config file would give it: `section` holds the keys of
    backends.b.http (tls, limits, headers), anything else in `_backend` of backends.b."""
    extra = section.pop("_backend", {})
    assert isinstance(extra, dict)
    text = yaml.safe_dump(
        {
            "listen": {"stdio": True},
            "backends": {"b": {kind: {"url": url, **section}, **extra}},
        }
    )
    return gateway_config.parse(text).backends[0]


@asynccontextmanager
async def running(config: BackendConfig, stats: Stats | None = None) -> AsyncIterator[HttpBackend]:
    """An HttpBackend, started (its sessions exist) and stopped with the block."""
    backend = HttpBackend(config, stats)
    async with anyio.create_task_group() as tg:
        tg.start_soon(backend.run)
        await anyio.wait_all_tasks_blocked()
        try:
            yield backend
        finally:
            tg.cancel_scope.cancel()
    # An aborted transport closes its socket in a callback; let it run before the loop ends.
    for _ in range(3):
        await anyio.lowlevel.checkpoint()


def code_of(exc: pytest.ExceptionInfo[GatewayError]) -> int:
    return exc.value.code


async def settle() -> None:
    """Let the loop take in what a raw server has just written (loopback delivers it at once;
    the client's loop reads it on its next iterations)."""
    for _ in range(10):
        await anyio.lowlevel.checkpoint()


async def ignore(_: Message) -> None:
    return None


@asynccontextmanager
async def json_rpc_server(
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A real (aiohttp) server on 127.0.0.1, over TLS with `ssl_context`, answering every POST
    to /mcp with a result carrying the request's id; yields its URL and the headers of each
    request it served."""
    seen: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        body = orjson.loads(await request.read())
        result = {"jsonrpc": "2.0", "id": body.get("id"), "result": {"resultType": "complete"}}
        return web.Response(body=orjson.dumps(result), content_type="application/json")

    app = web.Application()
    app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        scheme = "https" if ssl_context is not None else "http"
        yield f"{scheme}://127.0.0.1:{runner.addresses[0][1]}/mcp", seen
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
