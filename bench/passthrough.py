"""Bare pass-through baselines: the least any HTTP proxy in Python must cost.

    python -m bench.passthrough --upstream URL [--client raw|aiohttp] [--port 0]
    python -m bench.passthrough --client stdio [--port 0] -- CMD [ARG...]

An aiohttp server on 127.0.0.1 that forwards each POST body unchanged to the upstream and
returns the upstream's status, body and content type. `raw` forwards with a minimal
hand-rolled keep-alive pool; `aiohttp` with a pooled aiohttp.ClientSession (what any
aiohttp-based proxy pays, the gateway included: the floor of its HTTP->HTTP targets). `stdio`
is the thinnest HTTP->stdio bridge (the floor of the HTTP->stdio targets): one child spawned
from the command after `--`, each POST's JSON-RPC message written to it as one line under an id
of the bridge's own, its reply line sent back as the response. Prints
`READY http://127.0.0.1:<port>/mcp` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import httptools
import orjson
from aiohttp import web

from bench import run

# Request headers a Streamable HTTP server may act on; everything else is hop-local.
FORWARD = ("Content-Type", "Accept", "MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")
SESSION = "Mcp-Session-Id"
Upstream = tuple[int, bytes | None, bytes | None, bytes]  # status, content type, session, body
Forward = Callable[[bytes, dict[str, str]], Awaitable[Upstream]]


class UpstreamError(Exception):
    pass


class RawConn(asyncio.Protocol):
    """One keep-alive connection to the upstream, carrying one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[Upstream] | None = None
        self._body: list[bytes] = []
        self._ctype: bytes | None = None
        self._session: bytes | None = None
        self.reusable = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.reusable = False
        self._fail("upstream closed the connection")

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.reusable = False
            self._fail("unparsable upstream response")
            if self.transport is not None:
                self.transport.abort()

    def _fail(self, why: str) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamError(why))

    def request(self, data: bytes) -> asyncio.Future[Upstream]:
        assert self.transport is not None
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._waiter

    def on_message_begin(self) -> None:
        self._body = []
        self._ctype = None
        self._session = None

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            self._ctype = value
        elif lowered == b"mcp-session-id":
            self._session = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.reusable = self._parser.should_keep_alive()
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            reply = (self._parser.get_status_code(), self._ctype, self._session)
            waiter.set_result((*reply, b"".join(self._body)))


class RawPool:
    """Idle connections are reused last-in first-out; a new one is opened when none is idle,
    so the pool grows to the peak concurrency and stays there."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"only http:// upstreams are supported: {url}")
        self.host = parts.hostname
        self.port = parts.port or 80
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n".encode()
        self.idle: list[RawConn] = []

    async def forward(self, body: bytes, headers: dict[str, str]) -> Upstream:
        conn = self.idle.pop() if self.idle else None
        if conn is None or conn.transport is None:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(RawConn, self.host, self.port)
        lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        data = b"%s%sContent-Length: %d\r\n\r\n%s" % (self.head, lines.encode(), len(body), body)
        try:
            reply = await conn.request(data)
        except BaseException:
            if conn.transport is not None:
                conn.transport.abort()
            raise
        if conn.reusable and conn.transport is not None:
            self.idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return reply

    async def close(self) -> None:
        for conn in self.idle:
            if conn.transport is not None:
                conn.transport.close()
        self.idle.clear()


def _upstream(status: int, ctype: str | None, session: str | None, data: bytes) -> Upstream:
    return (
        status,
        None if ctype is None else ctype.encode(),
        None if session is None else session.encode(),
        data,
    )


class AiohttpClient:
    def __init__(self, url: str) -> None:
        self.url = url
        self.session: aiohttp.ClientSession | None = None

    async def forward(self, body: bytes, headers: dict[str, str]) -> Upstream:
        if self.session is None:
            # No connection cap: the raw pool has none either.
            connector = aiohttp.TCPConnector(limit=0)
            self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        async with self.session.post(self.url, data=body, headers=headers) as resp:
            data = await resp.read()
            return _upstream(
                resp.status, resp.headers.get("Content-Type"), resp.headers.get(SESSION), data
            )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def make_app(forward: Forward) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {name: request.headers[name] for name in FORWARD if name in request.headers}
        if SESSION in request.headers:
            headers[SESSION] = request.headers[SESSION]
        try:
            status, ctype, session, data = await forward(body, headers)
        except (OSError, UpstreamError, aiohttp.ClientError) as exc:
            return web.Response(status=502, text=f"upstream failed: {exc}")
        out: dict[str, str] = {}
        if ctype is not None:
            out["Content-Type"] = ctype.decode()
        if session is not None:
            out[SESSION] = session.decode()
        return web.Response(status=status, body=data, headers=out)

    app = web.Application()
    app.router.add_post("/mcp", handle)
    return app


# The one session a legacy client is given: one child serves every client, so there is nothing
# for sessions to tell apart; the client only needs an id to send back.
BRIDGE_SESSION = {SESSION: "stdio-bridge"}


class StdioBridge:
    """One child process behind every HTTP client. Each request goes out under an id of the
    bridge's own (clients' ids collide: the bench's 64 clients count from the same numbers) and
    one reader task hands each reply line to the request waiting for that id."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.ids = itertools.count(1)
        self.waiting: dict[int, tuple[Any, asyncio.Future[bytes]]] = {}
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=1 << 20,
        )
        self.reader = asyncio.create_task(self._read())

    def _write(self, msg: dict[str, Any]) -> None:
        if self.reader is None or self.reader.done():
            raise UpstreamError("the child has exited")
        assert self.proc is not None and self.proc.stdin is not None
        # No drain: the clients bound what is in flight, so the pipe never backs up far.
        self.proc.stdin.write(orjson.dumps(msg) + b"\n")

    def send(self, msg: dict[str, Any]) -> None:
        """A notification or a reply: nothing comes back for it."""
        self._write(msg)

    def call(self, msg: dict[str, Any]) -> asyncio.Future[bytes]:
        """The child's reply to a request, with the client's own id back in it."""
        rid = next(self.ids)
        waiter: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.waiting[rid] = (msg["id"], waiter)
        msg["id"] = rid
        try:
            self._write(msg)
        except UpstreamError:
            del self.waiting[rid]
            raise
        return waiter

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stdout, waiting = self.proc.stdout, self.waiting
        while line := await stdout.readline():
            try:
                msg = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            # The child's own requests and notifications have no waiting request: dropped.
            rid = msg.get("id") if isinstance(msg, dict) else None
            entry = waiting.pop(rid, None) if isinstance(rid, int) else None
            if entry is not None and not entry[1].done():
                msg["id"] = entry[0]
                entry[1].set_result(orjson.dumps(msg))
        for _, waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(UpstreamError("the child exited"))
        waiting.clear()

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the stdio way to ask a server to exit
            try:
                await asyncio.wait_for(self.proc.wait(), 3.0)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


def stdio_app(bridge: StdioBridge) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            msg = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.Response(status=400, text="not JSON")
        if not isinstance(msg, dict):
            return web.Response(status=400, text="one JSON-RPC message per POST")
        try:
            if "id" not in msg:
                bridge.send(msg)
                return web.Response(status=202)
            reply = await bridge.call(msg)
        except UpstreamError as exc:
            return web.Response(status=502, text=f"upstream failed: {exc}")
        # A legacy client's handshake: the child answers it, the bridge names the session.
        headers = BRIDGE_SESSION if msg.get("method") == "initialize" else None
        return web.Response(body=reply, content_type="application/json", headers=headers)

    app = web.Application()
    app.router.add_post("/mcp", handle)
    return app


async def serve(app: web.Application, port: int, close: Callable[[], Awaitable[None]]) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    bound = runner.addresses[0][1]
    sys.stdout.write(f"READY http://127.0.0.1:{bound}/mcp\n")
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await close()


async def serve_http(upstream: str, client: str, port: int) -> None:
    forwarder: RawPool | AiohttpClient
    forwarder = RawPool(upstream) if client == "raw" else AiohttpClient(upstream)
    await serve(make_app(forwarder.forward), port, forwarder.close)


async def serve_stdio(argv: list[str], port: int) -> None:
    bridge = StdioBridge(argv)
    await bridge.start()
    await serve(stdio_app(bridge), port, bridge.close)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.passthrough", description=__doc__)
    parser.add_argument("--upstream", help="the MCP endpoint to forward to (raw, aiohttp)")
    parser.add_argument("--client", choices=["raw", "aiohttp", "stdio"], default="raw")
    parser.add_argument("--port", type=int, default=0)
    words = list(sys.argv[1:] if argv is None else argv)
    # The child's command keeps its own options, so it is cut off before argparse looks.
    command: list[str] = []
    if "--" in words:
        at = words.index("--")
        words, command = words[:at], words[at + 1 :]
    args = parser.parse_args(words)
    if args.client == "stdio":
        if not command:
            parser.error("--client stdio needs the child's command after --")
        run(serve_stdio(command, args.port))
        return
    if args.upstream is None or command:
        parser.error(f"--client {args.client} needs --upstream URL and no command")
    run(serve_http(args.upstream, args.client, args.port))


if __name__ == "__main__":
    main()
