"""Raw HTTP/1.1 clients and in-process listeners for the listener tests.

Every raw client is an asyncio stream that writes request bytes by hand and parses the reply
itself, so a test controls the request byte for byte (pipelining, split writes, garbage) and sees
exactly what the gateway framed. Every wait is on an event or a read, bounded by BOUND.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import orjson
import yaml

from gateway.app import Gateway
from gateway.config import ListenerLimits, parse
from gateway.frontends.listener import Handler, Listener
from tests.support import BOUND, META, sdk_stdio_command


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    version: str = "HTTP/1.1"
    body: bytes = b""
    # The payload of each chunk, when the body was chunked.
    chunks: list[bytes] | None = None

    def get(self, name: str) -> str | None:
        values = self.getall(name)
        return values[0] if values else None

    def getall(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def json(self) -> Any:
        assert self.get("Content-Type") == "application/json", (self.status, self.headers)
        return orjson.loads(self.body)

    @property
    def closes(self) -> bool:
        """Whether the response says the connection ends after it (RFC 9112 9.6)."""
        connection = (self.get("Connection") or "").lower()
        return connection == "close" or (self.version == "HTTP/1.0" and connection != "keep-alive")


class Client:
    """One connection, from the client's side: writes bytes, parses what comes back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, *parts: bytes) -> None:
        for part in parts:
            self.writer.write(part)
            await self.writer.drain()

    async def read_head(self) -> Response:
        with anyio.fail_after(BOUND):
            head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        version, status, *_ = status_line.split(" ", 2)
        headers = []
        for line in lines:
            name, _, value = line.partition(":")
            headers.append((name, value.strip()))
        return Response(int(status), headers, version)

    async def read_chunk(self) -> bytes:
        """The next chunk's payload; b"" for the last chunk (its trailer section is read)."""
        with anyio.fail_after(BOUND):
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                while await self.reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return b""
            data = await self.reader.readexactly(size)
            assert await self.reader.readexactly(2) == b"\r\n"
        return data

    async def response(self, method: str = "POST") -> Response:
        """The next response, whole; interim (1xx) responses are returned on their own."""
        resp = await self.read_head()
        te = resp.get("Transfer-Encoding")
        length = resp.get("Content-Length")
        if resp.status < 200 or method == "HEAD" or resp.status in (204, 304):
            return resp
        if te is not None:
            assert te.lower() == "chunked"
            assert length is None  # RFC 9112 6.2: never both
            resp.chunks = []
            while chunk := await self.read_chunk():
                resp.chunks.append(chunk)
            resp.body = b"".join(resp.chunks)
        elif length is not None:
            with anyio.fail_after(BOUND):
                resp.body = await self.reader.readexactly(int(length))
        else:
            resp.body = await self.rest()
        return resp

    async def rest(self) -> bytes:
        """Everything until the server closes the connection (a reset counts as a close)."""
        data = []
        with anyio.fail_after(BOUND), suppress(ConnectionError):
            while piece := await self.reader.read(65536):
                data.append(piece)
        return b"".join(data)

    async def closed_by_server(self) -> bool:
        """Whether the server closed the connection with nothing more sent."""
        return await self.rest() == b""

    async def close(self) -> None:
        self.writer.close()
        with suppress(ConnectionError):
            await self.writer.wait_closed()

    def abort(self) -> None:
        self.writer.transport.abort()


@dataclass
class Serving:
    """A listener (or a gateway's) on 127.0.0.1, and the raw clients a test opened to it."""

    port: int
    listener: Listener | None = None
    clients: list[Client] = field(default_factory=list)
    tls: ssl.SSLContext | None = None

    async def connect(self) -> Client:
        with anyio.fail_after(BOUND):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1",
                self.port,
                ssl=self.tls,
                server_hostname="127.0.0.1" if self.tls else None,
            )
        client = Client(reader, writer)
        self.clients.append(client)
        return client

    async def exchange(self, data: bytes, method: str = "POST") -> Response:
        """One request on a connection of its own."""
        client = await self.connect()
        await client.send(data)
        resp = await client.response(method)
        await client.close()
        return resp

    def abort_all(self) -> None:
        for client in self.clients:
            client.abort()


LIMITS = ListenerLimits(max_body_bytes=64 * 1024)


@asynccontextmanager
async def listening(handler: Handler, limits: ListenerLimits = LIMITS) -> AsyncIterator[Serving]:
    listener = Listener(handler, limits)
    serving = Serving(await listener.start("127.0.0.1", 0), listener)
    try:
        yield serving
    finally:
        serving.abort_all()
        with anyio.CancelScope(shield=True):
            await listener.close(0)
            # An aborted transport closes its socket in a callback; let it run first.
            for _ in range(3):
                await anyio.lowlevel.checkpoint()


def request(
    body: bytes | None = b"",
    *headers: str,
    method: str = "POST",
    target: str = "/mcp",
    version: str = "1.1",
    host: str | None = "127.0.0.1",
) -> bytes:
    """A request with a Content-Length body; with body=None, only the head (for framing by
    hand: chunked, or a body sent later)."""
    lines = [f"{method} {target} HTTP/{version}"]
    if host is not None:
        lines.append(f"Host: {host}")
    lines.extend(headers)
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return "".join(f"{line}\r\n" for line in (*lines, "")).encode() + (body or b"")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def pattern(size: int) -> bytes:
    """Bytes that are not all alike, so a dropped or reordered piece changes the digest."""
    return (bytes(range(251)) * (size // 251 + 1))[:size]


async def wait(event: asyncio.Event) -> None:
    with anyio.fail_after(BOUND):
        await event.wait()


# --- the gateway in-process, over raw HTTP --------------------------------------------------------

MCP_HEADERS = (
    "Content-Type: application/json",
    "Accept: application/json, text/event-stream",
    "MCP-Protocol-Version: 2026-07-28",
)


def echo_call(text: str = "hi", id_: int | str = 1) -> dict[str, Any]:
    params = {"name": "echo", "arguments": {"text": text}, "_meta": META}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


def mcp_request(
    msg: Mapping[str, Any], *extra: str, mirror: bool = True, body: bool | None = True, **kw: Any
) -> bytes:
    """A POST of `msg` with the media types and (if `mirror`) its mirrored headers; with
    body=None only the head, without Content-Length (for a body framed by hand)."""
    fields = list(MCP_HEADERS)
    if mirror and "method" in msg:
        fields.append(f"Mcp-Method: {msg['method']}")
        if msg["method"] == "tools/call":
            fields.append(f"Mcp-Name: {msg['params']['name']}")
    return request(orjson.dumps(msg) if body else None, *fields, *extra, **kw)


def gateway_config(http: Mapping[str, Any] | None = None, **listen: Any) -> str:
    command = sdk_stdio_command()
    backend = {"stdio": {"command": command[0], "args": command[1:]}}
    http_section = {"host": "127.0.0.1", "port": 0, "path": "/mcp", **(http or {})}
    return yaml.safe_dump(
        {"listen": {"http": http_section, **listen}, "backends": {"sdk": backend}}
    )


@asynccontextmanager
async def gateway(http: Mapping[str, Any] | None = None, **listen: Any) -> AsyncIterator[Gateway]:
    """A gateway on 127.0.0.1 with the SDK test server over stdio as its backend."""
    async with Gateway(parse(gateway_config(http, **listen))) as gw:
        yield gw


def port_of(url: str) -> int:
    return int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])


async def served(url: str, text: str = "served", ssl_context: ssl.SSLContext | None = None) -> None:
    """A well-behaved client's echo call over aiohttp: it gets its answer."""
    msg = echo_call(text)
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "echo",
    }
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                url, data=orjson.dumps(msg), headers=headers, ssl=ssl_context or True
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
            reply = await resp.json()
    assert reply["result"]["content"][0]["text"] == text, reply
