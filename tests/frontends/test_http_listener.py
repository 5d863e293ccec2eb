"""The gateway's HTTP listener (gateway/frontends/listener.py) against raw sockets on 127.0.0.1.

aiohttp parses and frames; these tests pin what the gateway makes of it: bodies read within
their limits and codings (`read_body`), streams, cancellation on disconnect, the timeouts, the
graceful close, and that bad input gets a prompt answer while the listener goes on serving. The
handlers are small ones of the test's own, so each case shows the listener alone; the gateway's
endpoint on top of it is in test_http_transport_rules.py and test_http_limits.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib
import logging
import zlib
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import anyio
import pytest
from aiohttp import web

from gateway.config import ListenerLimits
from gateway.frontends.bodies import BodyError
from gateway.frontends.listener import read_body, start_stream
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    until,
)
from tests.support.listener import (
    LIMITS,
    Serving,
    chunk,
    listening,
    pattern,
    request,
    wait,
)

pytestmark = pytest.mark.anyio

# Short enough that a test waits for a timeout without slowing the suite.
SHORT = 0.2


def limits(**changes: Any) -> ListenerLimits:
    return dataclasses.replace(LIMITS, **changes)


class Recorder:
    """A handler that reads each body as the gateway does and echoes it (or the refusal)."""

    def __init__(self, limit: int = LIMITS.max_body_bytes, timeout: float = BOUND) -> None:
        self.limit = limit
        self.timeout = timeout
        self.bodies: list[bytes] = []
        self.refusals: list[int] = []

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            body = await read_body(request, self.limit, self.timeout)
        except BodyError as exc:
            self.refusals.append(exc.status)
            response = web.Response(status=exc.status, text=exc.reason)
            response.force_close()
            return response
        self.bodies.append(body)
        return web.Response(body=body)


# --- plain requests -----------------------------------------------------------------------------


async def test_keep_alive_serves_sequential_requests_on_one_connection() -> None:
    """RFC 9112 9.3: HTTP/1.1 connections persist unless "close" is signalled."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        for body in (b"first", b"second", b""):
            await client.send(request(body))
            resp = await client.response()
            assert (resp.status, resp.body) == (200, body)
            assert not resp.closes
        assert srv.listener is not None and srv.listener.open == 1
    assert recorder.bodies == [b"first", b"second", b""]


async def test_pipelined_requests_are_answered_in_order() -> None:
    """RFC 9112 9.3.2: responses to pipelined requests go in the order the requests came; the
    requests of one connection are served one at a time."""
    started: list[bytes] = []
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(req, 100, BOUND)
        started.append(body)
        if body == b"1":
            first_started.set()
            await release.wait()
        return web.Response(body=body)

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b"1") + request(b"2") + request(b"3"))
        await wait(first_started)
        assert started == [b"1"]
        release.set()
        bodies = [(await client.response()).body for _ in range(3)]
    assert bodies == [b"1", b"2", b"3"]


async def test_a_chunked_body_is_reassembled() -> None:
    """RFC 9112 7.1: a chunked request body (with extensions, split across writes) is read
    decoded and whole; the connection stays usable."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(
            request(None, "Transfer-Encoding: chunked"),
            chunk(b"hello "),
            b"5;ext=1\r\nwor",
            b"ld\r\n",
            chunk(b"!" * 300),
            b"0\r\n\r\n",
        )
        assert (await client.response()).body == b"hello world" + b"!" * 300
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


async def test_a_body_split_across_many_writes() -> None:
    """RFC 9112 6.2: the body is Content-Length octets however the transport splits them; here
    one byte per write, head included (the body is not there yet when the handler starts)."""
    body = pattern(200)
    data = request(body)
    async with listening(Recorder()) as srv:
        client = await srv.connect()
        for i in range(len(data)):
            await client.send(data[i : i + 1])
            await anyio.lowlevel.checkpoint()
        resp = await client.response()
    assert resp.body == body


# --- Expect: 100-continue -----------------------------------------------------------------------


async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    """RFC 9110 10.1.1: a server that will read the body sends 100 (Continue) to a client that
    waits for it, then the final response. (aiohttp's low-level server leaves this to us.)"""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 4"))
        interim = await client.response()
        assert interim.status == 100
        assert recorder.bodies == []
        await client.send(b"body")
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"body")
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


async def test_expect_100_continue_with_a_body_over_the_limit_gets_the_final_answer() -> None:
    """RFC 9110 10.1.1: a server may answer the final status instead of 100 (Continue); over the
    limit the answer is 413 at once, and the connection closes since the body was never read."""
    recorder = Recorder(limit=100)
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 101"))
        resp = await client.response()
        assert resp.status == 413
        assert resp.closes
    assert recorder.refusals == [413]


async def test_expect_100_continue_is_ignored_in_http_1_0() -> None:
    """RFC 9110 10.1.1: a 100-continue expectation in an HTTP/1.0 request MUST be ignored (an
    HTTP/1.0 client cannot parse interim responses)."""
    async with listening(Recorder()) as srv:
        client = await srv.connect()
        await client.send(request(None, "Expect: 100-continue", "Content-Length: 4", version="1.0"))
        await client.send(b"body")
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"body")


async def test_100_continue_for_a_pipelined_request_waits_for_the_earlier_response() -> None:
    """RFC 9112 9.3.2: responses go in request order, and a 100 (Continue) belongs to its
    request's response: it is not written ahead of an earlier request's answer."""
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        if req.headers.get("Expect") is None:
            first_started.set()
            await release.wait()
        return web.Response(body=await read_body(req, 100, BOUND))

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(
            request(b"1") + request(None, "Expect: 100-continue", "Content-Length: 1")
        )
        await wait(first_started)
        release.set()
        first = await client.response()
        assert (first.status, first.body) == (200, b"1")
        assert (await client.response()).status == 100
        await client.send(b"2")
        second = await client.response()
        assert (second.status, second.body) == (200, b"2")


# --- bodies: size, coding, arrival ----------------------------------------------------------------


async def test_a_content_length_over_the_limit_is_refused_before_the_body_arrives() -> None:
    """Over the limit the answer is 413 without waiting for (or reading) the body; the
    connection closes after it (RFC 9110 15.5.14)."""
    recorder = Recorder(limit=16)
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(None, "Content-Length: 17"))  # the body never comes
        resp = await client.response()
        assert resp.status == 413
        assert resp.closes
    assert recorder.refusals == [413]


async def test_a_chunked_body_over_the_limit() -> None:
    """A chunked body has no length up front: it is refused once what arrived passes the limit,
    and the connection closes after the reply."""
    recorder = Recorder(limit=16)
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(None, "Transfer-Encoding: chunked"), chunk(b"x" * 10))
        await client.send(chunk(b"y" * 7))
        resp = await client.response()
        assert resp.status == 413
        assert resp.closes
        assert await client.closed_by_server()
    assert recorder.refusals == [413]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_exactly_at_the_limit_is_accepted(framing: str) -> None:
    """The limit is the largest body taken, not the first refused."""
    body = pattern(16)
    recorder = Recorder(limit=16)
    async with listening(recorder) as srv:
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
        assert (await client.response()).body == body
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


async def test_a_413_reaches_a_client_still_sending_a_large_body() -> None:
    """RFC 9112 9.6: after answering early, the rest of the input is read and dropped for a
    while before the close, so the client's unread data cannot reset the answer away."""
    recorder = Recorder()
    body = pattern(8 * 1024 * 1024)
    async with listening(recorder) as srv:
        client = await srv.connect()
        client.writer.write(request(body))  # buffered; sent while we read the answer

        async def send_rest() -> None:
            with anyio.move_on_after(BOUND), suppress(ConnectionError):
                await client.writer.drain()

        sender = asyncio.ensure_future(send_rest())
        resp = await client.response()
        await sender
    assert resp.status == 413
    assert resp.closes


def deflate_raw(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


ENCODERS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "x-gzip": ("x-gzip", gzip.compress),
    "gzip-two-members": ("gzip", lambda data: gzip.compress(data[:7]) + gzip.compress(data[7:])),
    "deflate-zlib": ("deflate", zlib.compress),
    "deflate-raw": ("deflate", deflate_raw),
    "gzip-upper-case": ("GZIP ", gzip.compress),
}


@pytest.mark.parametrize("encoding", list(ENCODERS))
async def test_an_encoded_body_is_inflated(encoding: str) -> None:
    """RFC 9110 8.4: a body with a content coding is read decoded; "deflate" is zlib-wrapped by
    RFC 9110 8.4.1.2 and raw in the wild, so both are read; "x-gzip" is gzip (8.4.1.3)."""
    coding, encode = ENCODERS[encoding]
    body = b'{"jsonrpc":"2.0","method":"ping","id":1}' * 50
    recorder = Recorder(limit=len(body))
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(encode(body), f"Content-Encoding: {coding}"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, body)
        await client.send(request(b"next"))
        assert (await client.response()).body == b"next"


async def test_an_encoded_body_inflating_past_the_limit_is_too_big() -> None:
    """The limit bounds the decoded body, not the bytes sent (a compression bomb): one byte
    over is 413; exactly at the limit is served."""
    recorder = Recorder(limit=1000)
    async with listening(recorder) as srv:
        over = await srv.exchange(request(gzip.compress(b"\0" * 1001), "Content-Encoding: gzip"))
        at = await srv.exchange(request(gzip.compress(b"\0" * 1000), "Content-Encoding: gzip"))
    assert over.status == 413
    assert (at.status, at.body) == (200, b"\0" * 1000)


CORRUPT = {
    "gzip-garbage": ("gzip", b"this is not gzip"),
    "gzip-truncated": ("gzip", gzip.compress(pattern(2000))[:-100]),
    "gzip-no-trailer": ("gzip", gzip.compress(b"hello")[:-8]),
    "gzip-trailing-garbage": ("gzip", gzip.compress(b"hello") + b"junk"),
    "deflate-garbage": ("deflate", b"\xff\xff\xff this is not deflate"),
    "deflate-truncated": ("deflate", zlib.compress(pattern(2000))[:-100]),
}


@pytest.mark.parametrize("case", list(CORRUPT))
async def test_a_corrupt_encoded_body_is_400(case: str) -> None:
    """A body that does not decode whole (garbage, cut short, junk after its end) is refused
    with 400, never read as if it were what the client sent (aiohttp's own decoder takes a gzip
    body without its trailer as whole); the listener goes on serving."""
    coding, data = CORRUPT[case]
    recorder = Recorder()
    async with listening(recorder) as srv:
        resp = await srv.exchange(request(data, f"Content-Encoding: {coding}"))
        assert resp.status == 400
        assert resp.closes
        assert (await srv.exchange(request(b"fine"))).body == b"fine"
    assert recorder.bodies == [b"fine"]


@pytest.mark.parametrize("coding", ["br", "gzip, deflate", "compress", "zstd"])
async def test_an_unsupported_content_coding_is_415(coding: str) -> None:
    """RFC 9110 15.5.16: a body in a content coding the gateway does not decode gets 415
    (stacked codings included); its bytes are never taken for the body."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        resp = await srv.exchange(request(b"\x1f\x8b....", f"Content-Encoding: {coding}"))
    assert resp.status == 415
    assert recorder.bodies == []


async def test_identity_coding_is_the_body_as_sent() -> None:
    """RFC 9110 8.4.1: `identity` means no coding."""
    async with listening(Recorder()) as srv:
        resp = await srv.exchange(request(b"plain", "Content-Encoding: identity"))
    assert (resp.status, resp.body) == (200, b"plain")


@pytest.mark.parametrize(
    "partial",
    [request(None, "Content-Length: 10") + b"abc", request(None, "Transfer-Encoding: chunked")],
    ids=["length-body", "chunked-body"],
)
async def test_a_body_that_stalls_is_408(partial: bytes) -> None:
    """A body must arrive within the body timeout of its head: a stuck or slow sender gets 408
    and its connection closes."""
    recorder = Recorder(timeout=SHORT)
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(partial)
        resp = await client.response()
        assert resp.status == 408
        assert resp.closes
    assert recorder.refusals == [408]


# --- methods, targets, malformed input ------------------------------------------------------------


async def test_head_gets_the_length_but_no_body() -> None:
    """RFC 9110 9.3.2: a response to HEAD has the headers GET would have and no body; the next
    response on the connection parses cleanly after it."""

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        return web.Response(body=b"a body of 19 octets")

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(None, method="HEAD"))
        resp = await client.response("HEAD")
        assert (resp.status, resp.get("Content-Length")) == (200, "19")
        await client.send(request(b""))
        assert (await client.response()).body == b"a body of 19 octets"


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
    "no-host": b"POST /mcp HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
    "two-hosts": b"POST /mcp HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: 2\r\n\r\nhi",
    "nul-in-value": b"POST /mcp HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_request_is_refused_quietly_and_the_connection_closed(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 9112 2.2 / 3.2 / 6.3: a message that cannot be parsed or framed unambiguously (how
    requests are smuggled), or an HTTP/1.1 request without exactly one Host, is answered 400 and
    the connection closed; the listener goes on serving. The client's fault is at most one
    debug line, never a traceback, and does not quote what the client sent."""
    recorder = Recorder()
    caplog.set_level(logging.DEBUG)
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(MALFORMED[case])
        resp = await client.response()
        assert resp.status == 400
        assert await client.closed_by_server()
        assert recorder.bodies == []
        assert (await srv.exchange(request(b"fine"))).body == b"fine"
    assert not [r for r in caplog.records if r.exc_info or r.levelno > logging.DEBUG]
    assert len([r for r in caplog.records if r.name.startswith("gateway.http")]) <= 1


async def test_garbage_after_a_pipelined_request_ends_the_connection() -> None:
    """Nothing after unparseable bytes is taken for a request, and the connection closes after
    a 400. (aiohttp refuses the whole read: a good request that came in the same segment as the
    garbage is refused with it, never served twice or in part.)"""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(b"1") + b"garbage\r\n\r\n" + request(b"2"))
        statuses = [(await client.response()).status]
        if statuses[0] == 200:
            statuses.append((await client.response()).status)
        assert statuses[-1] == 400
        assert await client.closed_by_server()
    assert recorder.bodies in ([], [b"1"])
    assert len(statuses) == 1 + len(recorder.bodies)


async def test_trailer_fields_are_not_merged_into_the_headers() -> None:
    """RFC 9110 6.5.1: trailer fields are not header fields (a trailer must not be able to add,
    say, a Content-Encoding or a credential the head did not carry)."""
    seen: list[list[str]] = []

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(req, 100, BOUND)
        seen.append(list(req.headers))
        return web.Response(body=body)

    async with listening(handler) as srv:
        resp = await srv.exchange(
            request(None, "Transfer-Encoding: chunked", "Trailer: X-Injected")
            + chunk(b"hi")
            + b"0\r\nX-Injected: yes\r\nContent-Encoding: gzip\r\n\r\n"
        )
    assert resp.body == b"hi"
    assert seen == [["Host", "Transfer-Encoding", "Trailer"]]


UPGRADE = (
    "Connection: Upgrade, HTTP2-Settings",
    "Upgrade: h2c",
    "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
)


@pytest.mark.parametrize(
    "parts",
    [
        [request(b"", *UPGRADE, method="GET")],
        [request(b"body", *UPGRADE)],
        [request(None, *UPGRADE, "Content-Length: 4"), b"body"],
        [request(None, *UPGRADE, "Transfer-Encoding: chunked"), chunk(b"bo") + chunk(b"dy")],
    ],
    ids=["no-body", "content-length", "body-sent-later", "chunked"],
)
async def test_an_upgrade_not_taken_is_served_as_http_1_1(parts: list[bytes]) -> None:
    """RFC 9110 7.8: a server may ignore Upgrade; the request is then served as a plain one, its
    body included (Java's HttpClient offers h2c on a POST with a body), and the connection goes
    on in HTTP/1.1 (curl --http2 reuses it after an ignored offer)."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(*parts)
        if parts[-1].endswith(chunk(b"dy")):
            await client.send(b"0\r\n\r\n")
        first = await client.response()
        assert first.status == 200
        await client.send(request(b"later"))
        assert (await client.response()).body == b"later"
    assert recorder.bodies[-1] == b"later"
    assert recorder.bodies[0] in (b"", b"body")


async def test_connect_gets_no_tunnel() -> None:
    """RFC 9110 9.3.6: CONNECT asks for a tunnel, which the listener never makes: 501 before any
    handler sees it, and the connection closes (what follows the head would be tunnel bytes)."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        resp = await client.response()
        assert resp.status == 501
        assert resp.json()["error"]["code"] == -32600
        assert await client.closed_by_server()
        assert (await srv.exchange(request(b"fine"))).body == b"fine"
    assert recorder.bodies == [b"fine"]


@pytest.mark.parametrize(("version", "status"), [("2.0", 505), ("0.9", 505), ("1.2", 400)])
async def test_a_request_line_of_another_http_version_is_refused_and_closed(
    version: str, status: int
) -> None:
    """RFC 9110 6.2 / 15.6.6: the listener serves HTTP/1.1 and 1.0 only; a request line of
    another version (whose framing may differ) is refused before any handler sees it, and the
    connection closes: 505, or 400 from the parser for what it cannot read (aiohttp's parser
    takes 2.0 and 0.9, and the listener used to serve them as 1.1)."""
    recorder = Recorder()
    async with listening(recorder) as srv:
        client = await srv.connect()
        await client.send(request(b"new", version=version))
        resp = await client.response()
        assert resp.status == status
        if status == 505:
            assert resp.json()["error"]["code"] == -32600
        assert await client.closed_by_server()
        assert (await srv.exchange(request(b"fine"))).body == b"fine"
    assert recorder.bodies == [b"fine"]


async def test_a_request_followed_by_a_half_close_is_answered() -> None:
    """RFC 9112 9.6: a client may shut down its sending side after its request (`curl -T`,
    `nc -N`) and still read the reply; the reply says `Connection: close`, then the connection
    ends. (aiohttp let the transport close on the client's FIN, which cancelled the request.)
    The FIN is first answered with an interim 100, which tells a half-close (the client reads
    past it) from a close (the client's reset cancels: the test above)."""
    started = asyncio.Event()
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        body = await read_body(req, 100, BOUND)
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response(body=body)

    async with listening(handler) as srv:
        assert srv.listener is not None
        gates = srv.listener.gates
        client = await srv.connect()
        await client.send(request(b"half"))
        await wait(started)
        client.writer.write_eof()
        # The FIN has no event of its own on the server's side: its flag (or, without it, the
        # cancelled handler) is polled.
        await until(
            lambda: cancelled.is_set() or any(getattr(g, "eof", False) for g in gates.values())
        )
        assert not cancelled.is_set()
        release.set()
        probe = await client.response()  # (an interim response: a closed client resets it)
        assert probe.status == 100
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"half")
        assert resp.closes
        assert await client.closed_by_server()


# --- connection management ----------------------------------------------------------------------


async def test_connection_close_from_the_client() -> None:
    """RFC 9112 9.6: a request with "close" gets a response with "close", then the close."""
    async with listening(Recorder()) as srv:
        client = await srv.connect()
        await client.send(request(b"bye", "Connection: close"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"bye")
        assert resp.get("Connection") == "close"
        assert await client.closed_by_server()


async def test_http_1_0_closes_after_the_response() -> None:
    """RFC 9112 9.3: an HTTP/1.0 connection without keep-alive does not persist."""
    async with listening(Recorder()) as srv:
        client = await srv.connect()
        await client.send(request(b"old", version="1.0"))
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"old")
        assert resp.closes
        assert await client.closed_by_server()


async def test_http_1_0_keep_alive_persists() -> None:
    """RFC 9112 C.2.2: an HTTP/1.0 client asking keep-alive gets "Connection: keep-alive" back
    (its default is to close) and the connection persists."""
    async with listening(Recorder()) as srv:
        client = await srv.connect()
        for body in (b"one", b"two"):
            await client.send(request(body, "Connection: keep-alive", version="1.0"))
            resp = await client.response()
            assert (resp.status, resp.body) == (200, body)
            assert resp.get("Connection") == "keep-alive"


async def test_requests_per_connection_end_with_connection_close() -> None:
    """max_requests_per_connection: the response to the last request a connection may carry
    says `Connection: close` (streamed or whole), then the connection closes; the client
    reconnects and is served."""
    async with listening(Recorder(), limits(max_requests_per_connection=3)) as srv:
        client = await srv.connect()
        for i in range(3):
            await client.send(request(b"%d" % i))
            resp = await client.response()
            assert resp.body == b"%d" % i
            assert resp.closes == (i == 2)
        assert await client.closed_by_server()
        assert (await srv.exchange(request(b"again"))).body == b"again"

    async def streamer(req: web.BaseRequest) -> web.StreamResponse:
        stream = await start_stream(req, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: x\n\n")
        await stream.write_eof()
        return stream

    async with listening(streamer, limits(max_requests_per_connection=1)) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        resp = await client.response()
        assert resp.chunks == [b"data: x\n\n"]
        assert resp.closes
        assert await client.closed_by_server()


# --- streamed responses -------------------------------------------------------------------------


async def test_a_streamed_response_is_chunked_piece_by_piece() -> None:
    """RFC 9112 7.1: a response written as it goes is chunked, each piece sent before the next
    is written; the connection stays usable after the last chunk."""
    go = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        await read_body(req, 100, BOUND)
        stream = await start_stream(req, [("Content-Type", "text/event-stream")])
        await stream.write(b"data: 1\n\n")
        await go.wait()
        await stream.write(b"data: 2\n\n")
        await stream.write_eof()
        return stream

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b"stream"))
        head = await client.read_head()
        assert head.status == 200
        assert head.get("Transfer-Encoding") == "chunked"
        assert head.get("Content-Type") == "text/event-stream"
        assert await client.read_chunk() == b"data: 1\n\n"
        go.set()
        assert await client.read_chunk() == b"data: 2\n\n"
        assert await client.read_chunk() == b""
        await client.send(request(b"again"))
        assert (await client.response()).chunks == [b"data: 1\n\n", b"data: 2\n\n"]


async def test_a_streamed_response_to_http_1_0_is_close_delimited() -> None:
    """RFC 9112 6.3 (item 8): HTTP/1.0 has no chunked coding, so a streamed body ends when the
    connection closes, even if keep-alive was asked."""

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        stream = await start_stream(req, [])
        for piece in (b"one ", b"two ", b"three"):
            await stream.write(piece)
        await stream.write_eof()
        return stream

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b"", "Connection: keep-alive", version="1.0"))
        resp = await client.response()
        assert resp.get("Transfer-Encoding") is None
        assert resp.get("Content-Length") is None
        assert resp.closes
        assert resp.body == b"one two three"


async def test_a_handler_failing_mid_stream_ends_the_response_by_closing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A streamed response cannot become a 500 once its head is sent: the connection is closed
    without the last chunk, so the client sees the body as incomplete (RFC 9112 8). An error
    of the gateway's own keeps its traceback in the log."""

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        stream = await start_stream(req, [])
        await stream.write(b"partial")
        raise RuntimeError("the handler broke")

    with caplog.at_level(logging.ERROR):
        async with listening(handler) as srv:
            client = await srv.connect()
            await client.send(request(b""))
            assert (await client.read_head()).status == 200
            assert await client.read_chunk() == b"partial"
            assert await client.closed_by_server()  # no "0\r\n\r\n"
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


async def test_a_handler_raising_is_a_500_and_the_listener_goes_on() -> None:
    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        if await read_body(req, 100, BOUND) == b"fail":
            raise ValueError("the handler broke")
        return web.Response(body=b"ok")

    async with listening(handler) as srv:
        assert (await srv.exchange(request(b"fail"))).status == 500
        assert (await srv.exchange(request(b"next"))).body == b"ok"


@pytest.mark.parametrize("how", ["close", "abort"])
async def test_a_client_disconnect_cancels_its_handler(how: str) -> None:
    """Work for a caller that has gone stops (streamable-http, Cancellation): the handler is
    cancelled when the client closes (FIN) or resets (RST), and the listener goes on."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        if await read_body(req, 100, BOUND) == b"hold":
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return web.Response(body=b"ok")

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b"hold"))
        await wait(started)
        if how == "close":
            await client.close()
        else:
            client.abort()
        await wait(cancelled)
        assert (await srv.exchange(request(b"next"))).body == b"ok"


async def test_a_stream_write_after_the_client_left_raises_connection_reset() -> None:
    """A write to a stream whose client has gone raises ConnectionResetError (what the front
    end's relay takes for a client gone), here while the handler is being cancelled."""
    started = asyncio.Event()
    raised: list[type[BaseException]] = []
    done = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        stream = await start_stream(req, [])
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
        return stream

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(started)
        client.abort()
        await wait(done)
    assert len(raised) == 1 and issubclass(raised[0], ConnectionResetError)


async def test_a_writer_waiting_on_a_slow_client_is_woken_by_its_disconnect() -> None:
    """A write held back by flow control, from a task other than the handler's (as the SSE
    keep-alive ticker writes), fails when the client goes instead of waiting forever."""
    streams: list[web.StreamResponse] = []
    requests: list[web.BaseRequest] = []
    handler_started = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        streams.append(await start_stream(req, []))
        requests.append(req)
        handler_started.set()
        await asyncio.Event().wait()
        return streams[0]

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(handler_started)
        (stream,) = streams
        piece = pattern(1024 * 1024)

        async def writer() -> None:
            while True:
                await stream.write(piece)

        task = asyncio.create_task(writer())
        # The client reads nothing, so the transport pauses the writer (flow control has no
        # event of its own: its flag is polled).
        await until(lambda: requests[0].protocol.writing_paused or task.done())
        assert not task.done()
        client.abort()
        with anyio.fail_after(BOUND), pytest.raises(ConnectionError):
            await task


async def test_backpressure_holds_a_streaming_handler_until_the_client_reads() -> None:
    """A handler streaming more than the client reads is held in write (the reply is not
    buffered whole); once the client reads, every byte arrives in order."""
    size = 32 * 1024 * 1024
    piece_size = 64 * 1024
    body = pattern(size)
    written = 0
    finished = asyncio.Event()
    requests: list[web.BaseRequest] = []

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        nonlocal written
        requests.append(req)
        stream = await start_stream(req, [])
        for offset in range(0, size, piece_size):
            await stream.write(body[offset : offset + piece_size])
            written += piece_size
        await stream.write_eof()
        finished.set()
        return stream

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        # The client reads nothing: the transport pauses the writer (its flag, polled: flow
        # control has no event), which is held long before the end.
        await until(lambda: bool(requests) and requests[0].protocol.writing_paused)
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
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
    assert received == size
    assert digest.digest() == hashlib.sha256(body).digest()


async def test_a_client_that_stops_reading_a_reply_is_dropped_after_the_idle_timeout() -> None:
    """A reply too large for the socket buffers waits for the client to read; one that reads
    nothing for the idle timeout loses its connection, instead of holding the reply (and a
    connection of max_connections) forever."""
    big = pattern(16 * 1024 * 1024)
    gone = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        stream = await start_stream(req, [])
        try:
            while True:
                await stream.write(big)
        except (ConnectionError, asyncio.CancelledError):
            gone.set()
            raise

    async with listening(handler, limits(idle_timeout=SHORT)) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(gone)
        assert srv.listener is not None
        await until(lambda: srv.listener is not None and srv.listener.open == 0)


# --- timeouts -----------------------------------------------------------------------------------


async def test_an_idle_keep_alive_connection_is_closed() -> None:
    """RFC 9112 9.8: a server may close an idle connection; after idle_timeout it does."""
    async with listening(Recorder(), limits(idle_timeout=SHORT)) as srv:
        used = await srv.connect()
        await used.send(request(b"one"))
        assert (await used.response()).body == b"one"
        assert await used.closed_by_server()


@pytest.mark.parametrize(
    "partial", [b"", b"POST /mcp HTTP/1.1\r\nHost: 127."], ids=["nothing", "half-a-head"]
)
async def test_a_first_head_that_is_late_closes_the_connection(partial: bytes) -> None:
    """header_timeout: a new connection must deliver its first request head in time (slowloris);
    it is closed unanswered, while a prompt client is served."""
    recorder = Recorder()
    async with listening(recorder, limits(header_timeout=SHORT)) as srv:
        slow = await srv.connect()
        await slow.send(partial)
        assert (await srv.exchange(request(b"prompt"))).body == b"prompt"
        assert await slow.closed_by_server()
    assert recorder.bodies == [b"prompt"]


async def test_a_busy_connection_is_not_closed_by_the_idle_timeout() -> None:
    """A connection whose request is still being answered is not idle, however long the
    handler takes: it outlives an idle connection opened after it, then gets its answer."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        if await read_body(req, 100, BOUND) == b"slow":
            started.set()
            await release.wait()
        return web.Response(body=b"done")

    async with listening(handler, limits(idle_timeout=SHORT, header_timeout=SHORT)) as srv:
        busy = await srv.connect()
        await busy.send(request(b"slow"))
        await wait(started)
        idle = await srv.connect()
        assert await idle.closed_by_server()
        release.set()
        resp = await busy.response()
        assert (resp.status, resp.body) == (200, b"done")
        assert not resp.closes


# --- closing the listener -----------------------------------------------------------------------


async def _close_while_busy(srv: Serving, grace: float) -> None:
    assert srv.listener is not None
    await srv.listener.close(grace)


async def test_close_lets_an_in_flight_request_finish() -> None:
    """close(grace): idle connections close at once, a request being answered finishes and is
    answered with "close" (RFC 9112 9.6), and new connections are refused."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        if await read_body(req, 100, BOUND) == b"slow":
            started.set()
            await release.wait()
        return web.Response(body=b"done")

    async with listening(handler) as srv:
        idle = await srv.connect()
        await idle.send(request(b"quick"))
        assert (await idle.response()).body == b"done"
        busy = await srv.connect()
        await busy.send(request(b"slow"))
        await wait(started)
        closing = asyncio.create_task(_close_while_busy(srv, BOUND))
        assert await idle.closed_by_server()
        assert not closing.done()
        release.set()
        resp = await busy.response()
        assert (resp.status, resp.body) == (200, b"done")
        assert resp.get("Connection") == "close"
        assert await busy.closed_by_server()
        with anyio.fail_after(BOUND):
            await closing
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", srv.port)


async def test_a_stream_started_while_closing_says_connection_close() -> None:
    """RFC 9112 9.6: a response on a connection that will close says so, streamed too."""
    started = asyncio.Event()
    go = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        started.set()
        await go.wait()
        stream = await start_stream(req, [])
        await stream.write(b"late")
        await stream.write_eof()
        return stream

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b""))
        await wait(started)
        assert srv.listener is not None
        closing = asyncio.ensure_future(srv.listener.close(BOUND))
        await until(lambda: srv.listener is not None and srv.listener.closing)
        go.set()
        resp = await client.response()
        await closing
    assert resp.get("Connection") == "close"
    assert resp.body == b"late"


async def test_close_cancels_what_outlives_the_grace() -> None:
    """A request still running when the grace ends is cancelled and its connection closed
    unanswered; close() then returns."""
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return web.Response()

    async with listening(handler) as srv:
        client = await srv.connect()
        await client.send(request(b"forever"))
        await wait(started)
        assert srv.listener is not None
        with anyio.fail_after(BOUND):
            await srv.listener.close(0.1)
        assert cancelled.is_set()
        assert await client.closed_by_server()
        assert srv.listener.open == 0


def _held_request(srv: Serving) -> bool:
    assert srv.listener is not None
    return any(gate.current is not None for gate in srv.listener.gates.values())


async def test_a_held_listener_answers_a_request_once_released() -> None:
    """The gateway takes its address before its backends start (gateway/app/) and holds what arrives
    meanwhile: a request waits, then is answered, not refused."""
    answered = asyncio.Event()

    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        answered.set()
        return web.Response(text="served")

    async with listening(handler) as srv:
        assert srv.listener is not None
        srv.listener.hold()
        client = await srv.connect()
        await client.send(request(b"{}"))
        await until(lambda: _held_request(srv))
        assert not answered.is_set()
        srv.listener.release()
        resp = await client.response()
        assert (resp.status, resp.body) == (200, b"served")


async def test_a_held_request_is_refused_at_once_when_the_start_fails() -> None:
    async def handler(req: web.BaseRequest) -> web.StreamResponse:
        raise AssertionError("a held request reached the handler of a failed start")

    async with listening(handler) as srv:
        assert srv.listener is not None
        srv.listener.hold()
        client = await srv.connect()
        await client.send(request(b"{}"))
        await until(lambda: _held_request(srv))
        with anyio.fail_after(BOUND):  # not after the shutdown grace
            closing = asyncio.ensure_future(srv.listener.close(30))
            resp = await client.response()
            await closing
        assert resp.status == 503
        assert resp.json()["error"]["code"] == -31006  # GATEWAY_SHUTTING_DOWN
