"""The HTTP/1.1 server (gateway/frontends/server.py) against raw sockets on 127.0.0.1.

Every client here is an asyncio stream that writes request bytes by hand and parses the reply
itself, so each test controls the request byte for byte (pipelining, split writes, garbage) and
sees exactly what the server framed. Every wait is on an event or a read, bounded by BOUND (flow
control has no event: `until` polls it, yielding to the loop); the only timed waits are the
server's own (its idle timeout, the grace of a close).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import logging
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import anyio
import orjson
import pytest

from gateway.frontends.server import (
    MAX_HEAD,
    PIPELINE_DEPTH,
    Handler,
    Headers,
    Reply,
    Request,
    Server,
    Stream,
)
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
)

pytestmark = pytest.mark.anyio

# Large enough for every body a test sends, except where the limit itself is under test.
LIMIT = 64 * 1024
# Short enough that a test waits for the idle sweep without slowing the suite.
IDLE = 0.2


# --- a raw client -------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes = b""
    # The payload of each chunk, when the body was chunked.
    chunks: list[bytes] | None = None

    def get(self, name: str) -> str | None:
        values = self.getall(name)
        return values[0] if values else None

    def getall(self, name: str) -> list[str]:
        return [v for n, v in self.headers if n.lower() == name.lower()]

    def json(self) -> Any:
        return orjson.loads(self.body)


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
        version, status, _ = status_line.split(" ", 2)
        assert version == "HTTP/1.1"  # what the server speaks, whatever the client's version
        headers = []
        for line in lines:
            name, _, value = line.partition(":")
            headers.append((name, value.strip()))
        return Response(int(status), headers)

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
        if resp.status < 200 or method == "HEAD":
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
class Listener:
    server: Server
    port: int
    clients: list[Client] = field(default_factory=list)

    async def connect(self) -> Client:
        with anyio.fail_after(BOUND):
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        client = Client(reader, writer)
        self.clients.append(client)
        return client

    async def exchange(self, request: bytes, method: str = "POST") -> Response:
        """One request on a connection of its own."""
        client = await self.connect()
        await client.send(request)
        resp = await client.response(method)
        await client.close()
        return resp


@asynccontextmanager
async def serving(
    routes: Mapping[str, Handler], *, max_body: int = LIMIT, idle_timeout: float = 60.0
) -> AsyncIterator[Listener]:
    server = Server(routes, max_body=max_body, idle_timeout=idle_timeout)
    listener = Listener(server, await server.start("127.0.0.1", 0))
    try:
        yield listener
    finally:
        for client in listener.clients:
            client.abort()
        await server.close(0)
        # An aborted transport closes its socket in a callback; let it run before the loop ends.
        for _ in range(3):
            await anyio.lowlevel.checkpoint()


def request(
    body: bytes | None = b"",
    *headers: str,
    method: str = "POST",
    target: str = "/mcp",
    version: str = "1.1",
) -> bytes:
    """A request with a Content-Length body; with body=None, only the head (for framing by
    hand: chunked, or a body sent later)."""
    lines = [f"{method} {target} HTTP/{version}", "Host: 127.0.0.1", *headers]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    return "".join(f"{line}\r\n" for line in (*lines, "")).encode() + (body or b"")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def pattern(size: int) -> bytes:
    """Bytes that are not all alike, so a dropped or reordered piece changes the digest."""
    return (bytes(range(251)) * (size // 251 + 1))[:size]


class Recorder:
    """A handler that keeps every request it gets and echoes the body."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Reply:
        self.requests.append(request)
        return Reply(self.status, request.body, "application/octet-stream")


async def wait(event: asyncio.Event) -> None:
    with anyio.fail_after(BOUND):
        await event.wait()


async def until(predicate: Callable[[], bool]) -> None:
    """Polls a state that has no event of its own, yielding to the loop between looks."""
    with anyio.fail_after(BOUND):
        while not predicate():
            await anyio.lowlevel.checkpoint()


# --- plain requests -----------------------------------------------------------------------------


async def test_a_post_is_answered_with_its_length_and_a_date() -> None:
    """RFC 9112 6.3: a response with a body carries Content-Length; RFC 9110 6.6.1: an origin
    server with a clock sends Date. The handler sees method, path, headers, body and peer."""
    seen: list[Request] = []

    async def handler(req: Request) -> Reply:
        seen.append(req)
        return Reply(201, b'{"ok":true}', "application/json", [("X-Extra", "1")])

    async with serving({"/mcp": handler}) as srv:
        resp = await srv.exchange(request(b"hello", "Content-Type: text/plain"))
    assert resp.status == 201
    assert resp.body == b'{"ok":true}'
    assert resp.getall("Content-Length") == ["11"]
    assert resp.get("Content-Type") == "application/json"
    assert resp.get("X-Extra") == "1"
    assert resp.get("Transfer-Encoding") is None
    date = resp.get("Date")
    assert date is not None
    assert date.endswith(" GMT")  # IMF-fixdate (RFC 9110 5.6.7)
    assert parsedate_to_datetime(date).utcoffset() == timedelta(0)
    (req,) = seen
    assert (req.method, req.path, req.body) == ("POST", "/mcp", b"hello")
    assert req.headers.get("content-type") == "text/plain"
    assert req.host == "127.0.0.1"
    assert req.remote == "127.0.0.1"
    assert req.keep_alive and not req.too_big


async def test_keep_alive_serves_sequential_requests_on_one_connection() -> None:
    """RFC 9112 9.3: HTTP/1.1 connections persist unless "close" is signalled."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        for body in (b"first", b"second", b""):
            await client.send(request(body))
            resp = await client.response()
            assert resp.status == 200
            assert resp.body == body
            assert resp.get("Connection") is None
        assert len(srv.server.connections) == 1
    assert [r.body for r in recorder.requests] == [b"first", b"second", b""]


async def test_pipelined_requests_are_answered_in_order() -> None:
    """RFC 9112 9.3.2: responses to pipelined requests go in the order the requests came, even
    when a later one would be ready first; requests on one connection are served one at a time."""
    started: list[bytes] = []
    first_started = asyncio.Event()
    release = {b"1": asyncio.Event(), b"3": asyncio.Event()}

    async def handler(req: Request) -> Reply:
        started.append(req.body)
        if req.body == b"1":
            first_started.set()
        if req.body in release:
            await release[req.body].wait()
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"1") + request(b"2") + request(b"3"))
        await wait(first_started)
        assert started == [b"1"]
        release[b"3"].set()  # the last one may finish at once; it still waits its turn
        release[b"1"].set()
        bodies = [(await client.response()).body for _ in range(3)]
    assert bodies == [b"1", b"2", b"3"]
    assert started == [b"1", b"2", b"3"]


async def test_more_pipelined_requests_than_the_depth_are_all_answered() -> None:
    """Past PIPELINE_DEPTH queued requests the server stops reading the socket, and resumes as
    the queue drains: every request is still answered, in order."""
    count = PIPELINE_DEPTH * 3
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: Request) -> Reply:
        if req.body == b"0":
            first_started.set()
            await release.wait()
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        batch = [request(b"%d" % i) for i in range(count)]
        # The first part fills the queue past the depth while the first request is held; the
        # rest arrives while the server has stopped reading.
        await client.send(b"".join(batch[: PIPELINE_DEPTH + 4]))
        await wait(first_started)
        await client.send(b"".join(batch[PIPELINE_DEPTH + 4 :]))
        release.set()
        bodies = [(await client.response()).body for _ in range(count)]
        assert bodies == [b"%d" % i for i in range(count)]
        await client.send(request(b"after"))
        assert (await client.response()).body == b"after"


async def test_a_chunked_body_is_reassembled() -> None:
    """RFC 9112 7.1: a chunked request body (with extensions, split across writes) reaches the
    handler decoded and whole; the connection stays usable."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(
            request(None, "Transfer-Encoding: chunked"),
            chunk(b"hello "),
            b"5;ext=1\r\nwor",
            b"ld\r\n",
            chunk(b"!" * 300),
            b"0\r\n\r\n",
        )
        resp = await client.response()
        assert resp.body == b"hello world" + b"!" * 300
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"
    assert recorder.requests[0].body == b"hello world" + b"!" * 300


async def test_a_body_split_across_many_writes() -> None:
    """RFC 9112 6.2: the body is Content-Length octets however the transport splits them; here
    one byte per write, head included."""
    body = pattern(200)
    data = request(body)
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        for i in range(len(data)):
            await client.send(data[i : i + 1])
            await anyio.lowlevel.checkpoint()  # lets the server read each byte on its own
        resp = await client.response()
    assert resp.body == body


# --- Expect: 100-continue -----------------------------------------------------------------------


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    """RFC 9110 10.1.1: a server that will read the body sends 100 (Continue) to a client that
    waits for it, then the final response."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 4"))
        interim = await client.response()
        assert interim.status == 100
        assert recorder.requests == []
        await client.send(b"body")
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"body")
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


async def test_expect_100_continue_with_a_body_over_the_limit_gets_the_final_answer() -> None:
    """RFC 9110 10.1.1: a server may answer the final status instead of 100 (Continue); over
    max_body the handler sees too_big at once, with no 100, and the connection closes since
    the body was never read (RFC 9110 15.5.14)."""
    recorder = Recorder(413)
    async with serving({"/mcp": recorder}, max_body=100) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 101"))
        resp = await client.response()
        assert resp.status == 413
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    (req,) = recorder.requests
    assert req.too_big
    assert req.body == b""
    assert not req.keep_alive


async def test_expect_100_continue_is_ignored_in_http_1_0() -> None:
    """RFC 9110 10.1.1: a server that receives a 100-continue expectation in an HTTP/1.0
    request MUST ignore it (an HTTP/1.0 client cannot parse interim responses)."""
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 4", version="1.0"))
        await client.send(b"body")
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"body")


async def test_100_continue_for_a_pipelined_request_waits_for_the_earlier_response() -> None:
    """RFC 9112 9.3.2: responses go in request order, and a 100 (Continue) belongs to its
    request's response: it may not be written ahead of an earlier request's answer."""
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: Request) -> Reply:
        if req.body == b"1":
            first_started.set()
            await release.wait()
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(
            request(b"1") + request(None, "Expect: 100-continue", "Content-Length: 1")
        )
        await wait(first_started)
        release.set()
        first = await client.response()
        assert (first.status, first.body) == (200, b"1")
        interim = await client.response()
        assert interim.status == 100
        await client.send(b"2")
        second = await client.response()
        assert (second.status, second.body) == (200, b"2")


# --- limits -------------------------------------------------------------------------------------


async def test_a_content_length_over_the_limit() -> None:
    """Over max_body the handler is called at once with too_big and an empty body; the rest is
    not read, so the connection closes after the reply (RFC 9110 15.5.14)."""
    recorder = Recorder(413)
    async with serving({"/mcp": recorder}, max_body=16) as srv:
        client = await srv.connect()
        await client.send(request(b"x" * 17))
        resp = await client.response()
        assert resp.status == 413
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    (req,) = recorder.requests
    assert (req.too_big, req.body, req.keep_alive) == (True, b"", False)


async def test_a_chunked_body_over_the_limit() -> None:
    """A chunked body has no length up front: it is refused once what arrived passes max_body,
    without reading the rest, and the connection closes after the reply."""
    recorder = Recorder(413)
    async with serving({"/mcp": recorder}, max_body=16) as srv:
        client = await srv.connect()
        await client.send(
            request(None, "Transfer-Encoding: chunked"),
            chunk(b"x" * 10) + chunk(b"y" * 7) + chunk(b"z" * 50) + b"0\r\n\r\n",
        )
        resp = await client.response()
        assert resp.status == 413
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    (req,) = recorder.requests
    assert (req.too_big, req.body, req.keep_alive) == (True, b"", False)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_exactly_at_the_limit_is_accepted(framing: str) -> None:
    """max_body is the largest body taken, not the first refused."""
    body = pattern(16)
    recorder = Recorder()
    async with serving({"/mcp": recorder}, max_body=16) as srv:
        client = await srv.connect()
        if framing == "chunked":
            await client.send(
                request(None, "Transfer-Encoding: chunked")
                + chunk(body[:9])
                + chunk(body[9:])
                + b"0\r\n\r\n"
            )
        else:
            await client.send(request(body))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, body)
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"
    assert not recorder.requests[0].too_big


# --- content codings ----------------------------------------------------------------------------


def deflate_raw(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


ENCODERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "x-gzip": ("x-gzip", gzip.compress),
    "deflate-zlib": ("deflate", zlib.compress),
    "deflate-raw": ("deflate", deflate_raw),
    "gzip-upper-case": (" GZIP ", gzip.compress),
}


@pytest.mark.parametrize("encoding", list(ENCODERS))
async def test_an_encoded_body_is_inflated(encoding: str) -> None:
    """RFC 9110 8.4: a body with a content coding reaches the handler decoded; "deflate" is
    zlib-wrapped by RFC 9110 8.4.1.2 and raw in the wild, so both are read."""
    coding, encode = ENCODERS[encoding]
    body = b'{"jsonrpc":"2.0","method":"ping","id":1}' * 50
    recorder = Recorder()
    async with serving({"/mcp": recorder}, max_body=len(body)) as srv:
        client = await srv.connect()
        await client.send(request(encode(body), f"Content-Encoding: {coding}"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, body)
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"
    assert (recorder.requests[0].too_big, recorder.requests[0].keep_alive) == (False, True)


async def test_an_encoded_body_inflating_past_the_limit_is_too_big() -> None:
    """max_body bounds the decoded body, not the bytes sent (a compression bomb): one byte over
    is too_big with an empty body. The whole message was read, so the connection stays."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}, max_body=1000) as srv:
        client = await srv.connect()
        await client.send(request(gzip.compress(b"\0" * 1001), "Content-Encoding: gzip"))
        assert (await client.response()).body == b""
        await client.send(request(gzip.compress(b"\0" * 1000), "Content-Encoding: gzip"))
        assert (await client.response()).body == b"\0" * 1000
    over, at = recorder.requests
    assert (over.too_big, over.body) == (True, b"")
    assert (at.too_big, at.body) == (False, b"\0" * 1000)


CORRUPT = {
    "gzip-garbage": ("gzip", b"this is not gzip"),
    "gzip-truncated": ("gzip", gzip.compress(pattern(2000))[:-100]),
    "gzip-no-trailer": ("gzip", gzip.compress(b"hello")[:-8]),
    "deflate-garbage": ("deflate", b"\xff\xff\xff this is not deflate"),
    "deflate-truncated": ("deflate", zlib.compress(pattern(2000))[:-100]),
}


@pytest.mark.parametrize("case", list(CORRUPT))
async def test_a_corrupt_encoded_body(case: str) -> None:
    """A body that does not decode (garbage, or cut short) never reaches the handler as if it
    were the client's body: the handler sees an empty one, and the connection is closed after
    the reply (the client and the server disagree about what was sent)."""
    coding, data = CORRUPT[case]
    recorder = Recorder(400)
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(request(data, f"Content-Encoding: {coding}"))
        resp = await client.response()
        assert resp.status == 400
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
        assert (await srv.exchange(request(b"fine"))).body == b"fine"
    req = recorder.requests[0]
    assert (req.body, req.too_big, req.keep_alive) == (b"", False, False)


# --- methods and targets ------------------------------------------------------------------------


async def test_head_gets_the_length_but_no_body() -> None:
    """RFC 9110 9.3.2: a response to HEAD has the headers GET would have (Content-Length of the
    body) and no body; the next response on the connection parses cleanly after it."""

    async def handler(req: Request) -> Reply:
        return Reply(200, b"a body of 19 octets", "text/plain")

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(None, method="HEAD"))
        resp = await client.response("HEAD")
        assert resp.status == 200
        assert resp.get("Content-Length") == "19"
        await client.send(request(b""))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"a body of 19 octets")


async def test_an_unknown_path_is_404_with_a_json_body() -> None:
    """A path with no route is 404, in the JSON-RPC error shape the MCP endpoint uses, and the
    connection stays usable."""
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        await client.send(request(b"{}", target="/other"))
        resp = await client.response()
        assert resp.status == 404
        assert resp.get("Content-Type") == "application/json"
        error = resp.json()
        assert error["id"] is None
        assert error["error"]["code"] == -32600
        await client.send(request(b"ok"))
        assert (await client.response()).status == 200


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/mcp?session=1", "/mcp"),
        ("/m%63p", "/mcp"),
        ("/mcp?next=%2Fother", "/mcp"),
        ("/a%20b", "/a b"),
        ("/mcp%3Fx", "/mcp?x"),  # an encoded "?" is part of the path, not a query
    ],
)
async def test_the_path_routed_is_decoded_and_without_the_query(target: str, path: str) -> None:
    """RFC 9112 3.2.1 / RFC 3986 3.3-3.4: the route is the path before "?", percent-decoded
    after the query is split off."""
    recorder = Recorder()
    routes: dict[str, Handler] = {"/mcp": recorder, "/a b": recorder, "/mcp?x": recorder}
    async with serving(routes) as srv:
        resp = await srv.exchange(request(b"", target=target))
    assert resp.status == 200
    assert recorder.requests[0].path == path


@pytest.mark.parametrize(("suffix", "path"), [("/mcp?q=1", "/mcp"), ("", "/")])
async def test_an_absolute_form_target_routes_by_its_path(suffix: str, path: str) -> None:
    """RFC 9112 3.2.2: a server accepts the absolute-form target and routes by its path (an
    empty path is "/")."""
    recorder = Recorder()
    async with serving({"/mcp": recorder, "/": recorder}) as srv:
        resp = await srv.exchange(request(b"x", target=f"http://127.0.0.1:{srv.port}{suffix}"))
    assert resp.status == 200
    assert recorder.requests[0].path == path


MALFORMED = {
    "garbage": b"garbage\r\n\r\n",
    "header-line": b"POST /mcp HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    "content-length": b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
    "two-lengths": (
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"
    ),
    "length-and-chunked": (
        b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "chunk-size": b"POST /mcp HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_request_is_refused_and_the_connection_closed(case: str) -> None:
    """RFC 9112 2.2 / 6.3: a message that cannot be parsed (or framed unambiguously, which is
    how requests are smuggled) is answered 400, in the JSON-RPC shape (code -32600, id null),
    and the connection closed; the server goes on serving new connections."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(MALFORMED[case])
        resp = await client.response()
        assert resp.status == 400
        assert resp.get("Connection") == "close"
        error = resp.json()
        assert error["jsonrpc"] == "2.0"
        assert error["id"] is None
        assert error["error"]["code"] == -32600
        assert await client.closed_by_server()
        assert recorder.requests == []
        assert (await srv.exchange(request(b"fine"))).body == b"fine"


async def test_a_malformed_request_after_a_pipelined_one_ends_the_connection_after_it() -> None:
    """The request before the garbage is answered first (RFC 9112 9.3.2), saying the connection
    closes (RFC 9112 9.6), and then it does."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        # One write: the server parses both before it answers the first.
        await client.send(request(b"1") + b"garbage\r\n\r\n")
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"1")
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    assert [r.body for r in recorder.requests] == [b"1"]


async def test_trailer_fields_are_not_merged_into_the_headers() -> None:
    """RFC 9110 6.5.1: trailer fields are not header fields; a recipient must not merge them
    into the header section (a trailer must not be able to add, say, a Content-Encoding or a
    credential the head did not carry)."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        await srv.exchange(
            request(None, "Transfer-Encoding: chunked", "Trailer: X-Injected")
            + chunk(b"hi")
            + b"0\r\nX-Injected: yes\r\n\r\n"
        )
    (req,) = recorder.requests
    assert req.body == b"hi"
    assert "X-Injected" not in req.headers
    assert [name for name, _ in req.headers.items()] == ["Host", "Transfer-Encoding", "Trailer"]


UPGRADE = (
    "Connection: Upgrade, HTTP2-Settings",
    "Upgrade: h2c",
    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
)


@pytest.mark.parametrize(
    "parts",
    [
        [request(b"", *UPGRADE, method="GET") + request(b"pipelined")],
        [request(b"body", *UPGRADE) + request(b"pipelined")],
        [request(None, *UPGRADE, "Content-Length: 4"), b"body", request(b"pipelined")],
        [
            request(None, *UPGRADE, "Transfer-Encoding: chunked")
            + chunk(b"bo")
            + chunk(b"dy")
            + b"0\r\n\r\n"
            + request(b"pipelined")
        ],
    ],
    ids=["no-body", "content-length", "body-sent-later", "chunked"],
)
async def test_an_upgrade_not_taken_is_served_as_http_1_1(parts: list[bytes]) -> None:
    """RFC 9110 7.8: a server may ignore Upgrade; the request is then served as a plain one,
    its body included (Java's HttpClient offers h2c on a POST with a body), and the connection
    goes on in HTTP/1.1 (curl --http2 reuses it after an ignored offer)."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(*parts)
        first = await client.response()
        assert first.status == 200
        assert (await client.response()).body == b"pipelined"
        await client.send(request(b"later"))
        assert (await client.response()).body == b"later"
    bodies = [r.body for r in recorder.requests]
    assert bodies == [recorder.requests[0].body, b"pipelined", b"later"]
    assert bodies[0] == (b"" if recorder.requests[0].method == "GET" else b"body")
    assert recorder.requests[0].headers.get("HTTP2-Settings") == "AAMAAABkAAQCAAAAAAIAAAAA"


async def test_connect_is_not_supported() -> None:
    """RFC 9110 9.3.6: CONNECT asks for a tunnel, which this server does not make: 501 and the
    connection closed (what follows the head would be tunnel bytes)."""
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        await client.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        resp = await client.response()
        assert resp.status == 501
        assert resp.json()["error"]["code"] == -32600
        assert await client.closed_by_server()


# --- connection management ----------------------------------------------------------------------


async def test_connection_close_from_the_client() -> None:
    """RFC 9112 9.6: a request with "close" gets a response with "close", and the server then
    closes the connection."""
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        await client.send(request(b"bye", "Connection: close"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"bye")
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()


async def test_http_1_0_closes_after_the_response() -> None:
    """RFC 9112 9.3: an HTTP/1.0 connection without keep-alive does not persist."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(request(b"old", version="1.0"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"old")
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    assert not recorder.requests[0].keep_alive


async def test_http_1_0_keep_alive_persists() -> None:
    """RFC 9112 C.2.2: an HTTP/1.0 client asking keep-alive gets "Connection: keep-alive" back
    (its default is to close) and the connection persists."""
    async with serving({"/mcp": Recorder()}) as srv:
        client = await srv.connect()
        for body in (b"one", b"two"):
            await client.send(request(body, "Connection: keep-alive", version="1.0"))
            resp = await client.response()
            assert (resp.status, resp.body) == (200, body)
            assert resp.get("Connection") == "keep-alive"


# --- streamed responses -------------------------------------------------------------------------


async def test_a_streamed_response_is_chunked_piece_by_piece() -> None:
    """RFC 9112 7.1: a response written as it goes is chunked, one chunk per write, each sent
    before the next is written; an empty write sends nothing (an empty chunk would end the
    body), and the connection stays usable after the last chunk."""
    go = asyncio.Event()

    async def handler(req: Request) -> None:
        if req.body == b"plain":
            return None  # handled below: a reply that is neither returned nor streamed
        stream = req.stream(200, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: 1\n\n")
        await go.wait()
        await stream.write(b"")
        await stream.write(b"data: 2\n\n")
        await stream.write(b"data: 3\n\n")
        await stream.end()
        await stream.end()  # ending twice writes the last chunk once
        return None

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"stream"))
        head = await client.read_head()
        assert head.status == 200
        assert head.get("Transfer-Encoding") == "chunked"
        assert head.get("Content-Length") is None
        assert head.get("Content-Type") == "text/event-stream"
        assert await client.read_chunk() == b"data: 1\n\n"
        go.set()
        assert await client.read_chunk() == b"data: 2\n\n"
        assert await client.read_chunk() == b"data: 3\n\n"
        assert await client.read_chunk() == b""
        await client.send(request(b"plain"))
        # A handler returning None without streaming has not answered: that is a server error.
        assert (await client.response()).status == 500


async def test_a_streamed_response_to_http_1_0_is_close_delimited() -> None:
    """RFC 9112 6.3 (item 8): HTTP/1.0 has no chunked coding, so a streamed body without a
    length ends when the server closes the connection, even if keep-alive was asked."""

    async def handler(req: Request) -> None:
        stream = req.stream(200, [])
        for piece in (b"one ", b"two ", b"three"):
            await stream.write(piece)
        await stream.end()

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"", "Connection: keep-alive", version="1.0"))
        resp = await client.response()
        assert resp.get("Transfer-Encoding") is None
        assert resp.get("Content-Length") is None
        assert resp.get("Connection") == "close"
        assert resp.body == b"one two three"


async def test_a_handler_failing_mid_stream_ends_the_response_by_closing() -> None:
    """A streamed response cannot become a 500 once its head is sent: the connection is closed
    without the last chunk, so the client sees the body as incomplete (RFC 9112 8)."""

    async def handler(req: Request) -> None:
        stream = req.stream(200, [])
        await stream.write(b"partial")
        raise RuntimeError("the handler broke")

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        assert (await client.read_head()).status == 200
        assert await client.read_chunk() == b"partial"
        assert await client.closed_by_server()  # no "0\r\n\r\n"


# --- handlers that fail, clients that go --------------------------------------------------------


async def test_a_handler_raising_is_a_500_and_the_server_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler's exception is logged and answered 500; the connection and the server stay."""

    async def handler(req: Request) -> Reply:
        if req.body == b"fail":
            raise ValueError("the handler broke")
        return Reply(200, req.body)

    with caplog.at_level(logging.ERROR, logger="gateway.http"):
        async with serving({"/mcp": handler}) as srv:
            client = await srv.connect()
            await client.send(request(b"fail"))
            resp = await client.response()
            assert resp.status == 500
            assert resp.get("Connection") is None
            await client.send(request(b"next"))
            assert (await client.response()).body == b"next"
    (record,) = [r for r in caplog.records if r.name == "gateway.http"]
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError


async def test_a_handler_raising_a_connection_error_of_its_own_is_a_500() -> None:
    """A ConnectionError from the handler's own work (a backend refusing a connection) is not
    the client going away: the client, still connected, gets a 500 and keeps its connection."""

    async def handler(req: Request) -> Reply:
        if req.body == b"fail":
            raise ConnectionRefusedError("a backend is down")
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"fail"))
        assert (await client.response()).status == 500
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_a_client_disconnect_cancels_its_handler(how: str) -> None:
    """Work for a caller that has gone stops: the handler's task is cancelled when the client
    closes (FIN) or resets (RST) the connection, and the server goes on serving."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(req: Request) -> Reply:
        if req.body == b"hold":
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"hold"))
        await wait(started)
        if how == "close":
            await client.close()
        else:
            client.abort()
        await wait(cancelled)
        assert (await srv.exchange(request(b"next"))).body == b"next"


async def test_a_stream_write_after_the_client_left_raises_connection_reset() -> None:
    """Stream.write raises ConnectionResetError once the client has gone (here the handler
    writes while handling its own cancellation)."""
    started = asyncio.Event()
    raised: list[type[BaseException]] = []
    done = asyncio.Event()

    async def handler(req: Request) -> None:
        stream = req.stream(200, [])
        await stream.write(b"first")
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            try:
                await stream.write(b"second")
            except BaseException as exc:
                raised.append(type(exc))
            done.set()
            raise

    async with serving({"/mcp": handler, "/other": Recorder()}) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(started)
        client.abort()
        await wait(done)
        assert (await srv.exchange(request(b"", target="/other"))).status == 200
    assert raised == [ConnectionResetError]


async def test_a_writer_waiting_on_a_slow_client_is_woken_by_its_disconnect() -> None:
    """A write held back by flow control (from a task other than the handler's, as a keep-alive
    ticker would write) raises ConnectionResetError when the client goes, rather than waiting
    forever."""
    streams: list[Stream] = []
    handler_started = asyncio.Event()

    async def handler(req: Request) -> None:
        streams.append(req.stream(200, []))
        handler_started.set()
        await asyncio.Event().wait()

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(handler_started)
        (stream,) = streams
        piece = pattern(64 * 1024)

        async def writer() -> None:
            while True:
                await stream.write(piece)

        task = asyncio.create_task(writer())
        # The client reads nothing, so the writer comes to wait for the client to read.
        await until(lambda: stream._conn.paused or task.done())
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert not task.done()
        client.abort()
        with anyio.fail_after(BOUND), pytest.raises(ConnectionResetError):
            await task


async def test_backpressure_holds_a_streaming_handler_until_the_client_reads() -> None:
    """A handler streaming more than the client reads is held in Stream.write (it does not
    buffer the whole body in the server); once the client reads, every byte arrives, in order,
    and the connection stays usable."""
    size = 32 * 1024 * 1024
    piece_size = 64 * 1024
    body = pattern(size)
    finished = asyncio.Event()
    written = 0

    requests: list[Request] = []

    async def handler(req: Request) -> None:
        nonlocal written
        if req.body == b"next":
            return None
        requests.append(req)
        stream = req.stream(200, [])
        for offset in range(0, size, piece_size):
            await stream.write(body[offset : offset + piece_size])
            written += piece_size
        await stream.end()
        finished.set()
        return None

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        # The client reads nothing: the server's transport fills and pauses writing (its
        # connection's flag, read here since flow control has no event to wait on).
        await until(lambda: bool(requests) and requests[0]._conn.paused)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        # Held: far from done while the client has read nothing.
        assert not finished.is_set()
        assert written < size // 2
        head = await client.read_head()
        assert head.get("Transfer-Encoding") == "chunked"
        digest = hashlib.sha256()
        received = 0
        while data := await client.read_chunk():
            digest.update(data)
            received += len(data)
        await wait(finished)
        assert received == written == size
        assert digest.digest() == hashlib.sha256(body).digest()
        await client.send(request(b"next"))
        assert (await client.response()).status == 500


# --- idle connections ---------------------------------------------------------------------------


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    """RFC 9112 9.8: a server may close an idle connection; after idle_timeout it does, both
    after an answered request and when nothing was ever sent."""
    async with serving({"/mcp": Recorder()}, idle_timeout=IDLE) as srv:
        used = await srv.connect()
        await used.send(request(b"one"))
        assert (await used.response()).body == b"one"
        silent = await srv.connect()
        assert await used.closed_by_server()
        assert await silent.closed_by_server()
        assert len(srv.server.connections) == 0


@pytest.mark.parametrize(
    "partial",
    [
        b"POST /mcp HTTP/1.1\r\nHost: 127.",
        request(None, "Content-Length: 10") + b"abc",
        request(None, "Transfer-Encoding: chunked") + chunk(b"abc"),
    ],
    ids=["head", "length-body", "chunked-body"],
)
async def test_a_request_that_stalls_is_closed(partial: bytes) -> None:
    """A request that has not fully arrived within idle_timeout (a stuck or slow-loris sender)
    is dropped with its connection, unanswered."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}, idle_timeout=IDLE) as srv:
        client = await srv.connect()
        await client.send(partial)
        assert await client.closed_by_server()
    assert recorder.requests == []


async def test_a_busy_connection_is_not_closed_by_the_idle_sweep() -> None:
    """A connection whose request is still being answered is not idle, however long the
    handler takes: it outlives an idle connection opened after it, then gets its answer."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: Request) -> Reply:
        if req.body == b"slow":
            started.set()
            await release.wait()
        return Reply(200, req.body)

    async with serving({"/mcp": handler}, idle_timeout=IDLE) as srv:
        busy = await srv.connect()
        await busy.send(request(b"slow"))
        await wait(started)
        idle = await srv.connect()
        # Closing this one means a sweep ran after `busy` too had been quiet for idle_timeout.
        assert await idle.closed_by_server()
        release.set()
        resp = await busy.response()
        assert (resp.status, resp.body) == (200, b"slow")
        assert resp.get("Connection") is None
        # and once answered, it is idle like any other
        assert await busy.closed_by_server()


# --- closing the server -------------------------------------------------------------------------


async def test_close_lets_an_in_flight_request_finish() -> None:
    """Server.close(grace): idle connections close at once, a request being answered finishes
    and is answered (with "close", RFC 9112 9.6, since the connection is about to end), and
    new connections are refused."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: Request) -> Reply:
        if req.body == b"slow":
            started.set()
            await release.wait()
        return Reply(200, req.body)

    async with serving({"/mcp": handler}) as srv:
        idle = await srv.connect()
        await idle.send(request(b"quick"))
        assert (await idle.response()).body == b"quick"
        busy = await srv.connect()
        await busy.send(request(b"slow"))
        await wait(started)
        closing = asyncio.create_task(srv.server.close(BOUND))
        assert await idle.closed_by_server()
        assert not closing.done()
        release.set()
        resp = await busy.response()
        assert (resp.status, resp.body) == (200, b"slow")
        assert resp.get("Connection") == "close"
        assert await busy.closed_by_server()
        with anyio.fail_after(BOUND):
            await closing
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", srv.port)


async def test_close_cancels_what_outlives_the_grace() -> None:
    """A request still running when the grace ends is cancelled and its connection closed
    unanswered; close() then returns."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(req: Request) -> Reply:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return Reply(200)

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"forever"))
        await wait(started)
        with anyio.fail_after(BOUND):
            await srv.server.close(0.1)
        assert cancelled.is_set()
        assert await client.closed_by_server()
        assert srv.server.connections == set()


# --- Headers ------------------------------------------------------------------------------------


def test_headers_lookups_ignore_case_and_keep_repeats() -> None:
    """RFC 9110 5.1: field names are case-insensitive; RFC 9110 5.3: repeated fields keep their
    order. items() gives the fields as received, original case included."""
    raw = [("Accept", "application/json"), ("X-Dup", "a"), ("x-dup", "b"), ("X-DUP", "c")]
    headers = Headers(raw)
    assert headers.get("accept") == "application/json"
    assert headers.get("ACCEPT") == "application/json"
    assert headers.get("x-dup") == "a"  # the first of repeats
    assert headers.get("missing") is None
    assert headers.get("missing", "default") == "default"
    assert headers.getall("X-Dup") == ["a", "b", "c"]
    assert headers.getall("missing") == []
    assert "x-DUP" in headers
    assert "missing" not in headers
    assert headers.items() == raw


# --- limits and refusals the server answers itself -----------------------------------------------


async def test_a_head_over_the_limit_is_refused_with_431_before_it_ends() -> None:
    """RFC 6585 5: header fields too large get 431. llhttp alone would buffer a header of any
    size, so the server counts head bytes itself and refuses once MAX_HEAD is passed, without
    waiting for the head to end; the handler is never called and the connection closes."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        await client.send(b"a" * (MAX_HEAD + 1024))  # no end of line: the head never ends
        resp = await client.response()
        assert resp.status == 431
        assert resp.json()["error"]["code"] == -32600
        assert await client.closed_by_server()
        assert recorder.requests == []
        assert (await srv.exchange(request(b"next"))).body == b"next"


async def test_a_head_just_under_the_limit_is_served() -> None:
    """MAX_HEAD bounds the head; a large head that fits is an ordinary request."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        resp = await srv.exchange(request(b"x", "X-Big: " + "a" * (MAX_HEAD - 1024)))
    assert (resp.status, resp.body) == (200, b"x")


@pytest.mark.parametrize("hosts", [[], ["a", "b"]], ids=["none", "two"])
async def test_an_http11_request_without_exactly_one_host_is_400(hosts: list[str]) -> None:
    """RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request that lacks Host or has
    more than one; the handler is not called and the connection closes."""
    recorder = Recorder()
    head = "".join(f"Host: {h}\r\n" for h in hosts)
    raw = f"POST /mcp HTTP/1.1\r\n{head}Content-Length: 2\r\n\r\nhi".encode()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(raw)
        resp = await client.response()
        assert resp.status == 400
        assert resp.json()["error"]["code"] == -32600
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()
    assert recorder.requests == []


async def test_an_http10_request_without_host_is_served() -> None:
    """RFC 9112 3.2 requires Host of HTTP/1.1 requests only."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        await client.send(b"POST /mcp HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
        resp = await client.response()
    assert (resp.status, resp.body) == (200, b"hi")


@pytest.mark.parametrize("coding", ["br", "gzip, deflate", "compress"])
async def test_an_unsupported_content_coding_is_415(coding: str) -> None:
    """RFC 9110 15.5.16: a body in a content coding the server does not support gets 415
    (stacked codings included); the handler never sees the undecoded bytes."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        resp = await srv.exchange(request(b"\x1f\x8b....", f"Content-Encoding: {coding}"))
    assert resp.status == 415
    assert resp.json()["error"]["code"] == -32600
    assert recorder.requests == []


async def test_identity_coding_is_the_body_as_sent() -> None:
    """RFC 9110 8.4.1: `identity` means no coding."""
    recorder = Recorder()
    async with serving({"/mcp": recorder}) as srv:
        resp = await srv.exchange(request(b"plain", "Content-Encoding: identity"))
    assert (resp.status, resp.body) == (200, b"plain")


async def test_a_413_reaches_a_client_still_sending_a_large_body() -> None:
    """RFC 9112 9.6: after answering early, the server closes its side but keeps reading (and
    dropping) for a while, so the client's unread data cannot reset the answer away before the
    client has read it."""
    recorder = Recorder(413)
    body = pattern(8 * 1024 * 1024)
    async with serving({"/mcp": recorder}) as srv:
        client = await srv.connect()
        client.writer.write(request(body))  # buffered; sent while we read the answer

        async def send_rest() -> None:
            with suppress(ConnectionError):
                await client.writer.drain()

        sender = asyncio.ensure_future(send_rest())
        resp = await client.response()
        await sender
    assert resp.status == 413
    assert recorder.requests[0].too_big
    assert resp.get("Connection") == "close"


async def test_a_streamed_answer_to_head_has_no_body() -> None:
    """RFC 9110 9.3.2: a response to HEAD has no content, also when the handler streams; the
    connection stays usable."""

    async def handler(req: Request) -> None:
        stream = req.stream(200, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: x\n\n")
        await stream.end()

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b"", method="HEAD"))
        head = await client.response("HEAD")
        assert head.status == 200
        await client.send(request(b""))
        resp = await client.response()
        assert resp.chunks == [b"data: x\n\n"]


async def test_a_stream_started_while_closing_says_connection_close() -> None:
    """RFC 9112 9.6: a response on a connection that will close says so, streamed or whole."""
    started = asyncio.Event()
    go = asyncio.Event()

    async def handler(req: Request) -> None:
        started.set()
        await go.wait()
        stream = req.stream(200, [])
        await stream.write(b"late")
        await stream.end()

    async with serving({"/mcp": handler}) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(started)
        closing = asyncio.ensure_future(srv.server.close(BOUND))
        await until(lambda: all(c.closing for c in srv.server.connections))
        go.set()
        resp = await client.response()
        await closing
    assert resp.get("Connection") == "close"
    assert resp.body == b"late"


async def test_a_client_that_never_reads_a_whole_reply_is_dropped_after_the_idle_timeout() -> None:
    """A reply too large for the socket buffers waits for the client to read; a client that
    reads nothing for the idle timeout loses the connection instead of holding the server's
    task (and the reply) forever."""
    big = pattern(16 * 1024 * 1024)

    async def handler(req: Request) -> Reply:
        return Reply(200, big)

    async with serving({"/mcp": handler}, idle_timeout=IDLE) as srv:
        client = await srv.connect()
        await client.send(request(b""), request(b""))  # a second request keeps the task waiting
        conns = list(srv.server.connections)
        assert len(conns) == 1
        await until(lambda: conns[0].task is None and not srv.server.connections)
        head = await client.read_head()  # what was sent before the drop is still readable
        assert head.status == 200
