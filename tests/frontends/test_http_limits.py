"""The HTTP listener's limits (`listen.http.limits`), each sent past by an abusive client over a
raw socket while a well-behaved client is served at the same time: the abuser gets a prompt
refusal (or loses its connection), the gateway keeps serving everyone else.

The gateway runs in-process with the SDK test server over stdio as its backend; one gateway
with small limits serves the module, another the connection cap (whose count other tests'
connections would disturb), and the pipelining test runs a gateway process to read its memory.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from gateway.app import Gateway
from tests.support import (
    BOUND,
    START_BOUND,
    Proc,
    gateway_command,
    stdio_backend,
    until,
    write_config,
)
from tests.support import sdk_stdio_command as sdk_command
from tests.support.listener import (
    Serving,
    chunk,
    echo_call,
    gateway,
    mcp_request,
    port_of,
    request,
    served,
)

pytestmark = pytest.mark.anyio

INVALID_REQUEST = -32600
LIMITS: dict[str, Any] = {
    "max_body_bytes": 4096,
    "max_header_bytes": 1024,
    "max_headers": 20,
    "max_requests_per_connection": 3,
    "idle_timeout": 0.5,
    "header_timeout": 0.3,
    "body_timeout": 0.3,
}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def gw() -> AsyncIterator[Gateway]:
    async with gateway({"limits": LIMITS}) as running:
        assert running.http_url is not None
        with anyio.fail_after(START_BOUND):
            await served(running.http_url, "warm")
        yield running


@pytest.fixture
async def srv(gw: Gateway) -> AsyncIterator[Serving]:
    assert gw.http_url is not None
    serving = Serving(port_of(gw.http_url))
    yield serving
    serving.abort_all()


def url(gw: Gateway) -> str:
    assert gw.http_url is not None
    return gw.http_url


# --- header line size, header count, trailers -----------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["one-read", "trickled"])
async def test_a_header_line_over_max_header_bytes_is_refused(
    gw: Gateway, srv: Serving, split: bool
) -> None:
    """max_header_bytes (aiohttp's max_field_size and max_line_size): a longer header line is
    400 and the connection closes, whether it comes in one read or never ends."""
    abuser = await srv.connect()
    head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    if split:
        await abuser.send(head)
        await served(url(gw))  # the abuser's head is open meanwhile
        for _ in range(4):
            await abuser.send(b"a" * 512)
    else:
        await abuser.send(head + b"a" * 2048 + b"\r\nContent-Length: 0\r\n\r\n")
    resp = await abuser.response()
    assert resp.status in (400, 431)
    assert await abuser.closed_by_server()
    await served(url(gw))


async def test_a_request_line_over_max_header_bytes_is_refused(gw: Gateway, srv: Serving) -> None:
    resp = await srv.exchange(request(b"", target="/mcp?" + "q" * 2048))
    assert resp.status in (400, 414, 431)
    await served(url(gw))


async def test_a_header_just_under_max_header_bytes_is_served(gw: Gateway, srv: Serving) -> None:
    msg = echo_call("under")
    resp = await srv.exchange(mcp_request(msg, "X-Big: " + "a" * 900))
    assert resp.json()["result"]["content"][0]["text"] == "under"


@pytest.mark.parametrize("count", [21, 10_000])
async def test_more_header_lines_than_max_headers_are_refused(
    gw: Gateway, srv: Serving, count: int
) -> None:
    """max_headers (aiohttp's max_headers): past the count the request is 400 (the issue's
    10,000 lines in one read were answered 200 by the old server, which only bounded the bytes
    of a head that arrived in several reads)."""
    extra = [f"X-{i}: a" for i in range(count - 5)]
    data = mcp_request(echo_call(), *extra, mirror=False)
    abuser = await srv.connect()
    await abuser.send(data)
    resp = await abuser.response()
    assert resp.status in (400, 431)
    assert await abuser.closed_by_server()
    await served(url(gw))


async def test_chunked_trailers_are_bounded(gw: Gateway, srv: Serving) -> None:
    """Trailer fields count with the header fields (aiohttp 3.14): a client that sends trailer
    lines without end (the issue: 200 MB sent, 206 MiB kept by the old server) is refused after
    max_headers of them, so the gateway never holds more than max_headers lines of
    max_header_bytes; the well-behaved client is served meanwhile. What the client hands the
    sockets before it sees the refusal is their buffers, far below what it tries to send."""
    abuser = await srv.connect()
    await abuser.send(
        request(None, "Transfer-Encoding: chunked", *_media()) + chunk(b"{}") + b"0\r\n"
    )
    await served(url(gw))
    batch = (b"X-Trailer: " + b"t" * 900 + b"\r\n") * 64
    sent = 0
    refused = False
    with anyio.fail_after(BOUND):
        while sent < 200 * 1024 * 1024:
            try:
                await abuser.send(batch)
            except ConnectionError:
                refused = True
                break
            sent += len(batch)
    assert refused
    assert sent < 64 * 1024 * 1024
    await served(url(gw))


def _media() -> tuple[str, ...]:
    return ("Content-Type: application/json", "Accept: application/json, text/event-stream")


# --- body size ------------------------------------------------------------------------------------


async def test_a_body_over_max_body_bytes_is_413_while_others_are_served(
    gw: Gateway, srv: Serving
) -> None:
    """max_body_bytes: a declared length over it is refused before the body is sent; a chunked
    one once what arrived passes it; and a small gzip body that inflates past it."""
    abuser = await srv.connect()
    await abuser.send(request(None, *_media(), "Content-Length: 5000"))
    declared = await abuser.response()
    assert declared.status == 413
    assert declared.json()["error"]["code"] == INVALID_REQUEST
    await served(url(gw))
    chunked = await srv.connect()
    await chunked.send(request(None, *_media(), "Transfer-Encoding: chunked"))
    for _ in range(5):
        await chunked.send(chunk(b" " * 1000))
    assert (await chunked.response()).status == 413

    bomb = gzip.compress(orjson.dumps(echo_call("x" * 100_000)))
    assert len(bomb) < 4096
    resp = await srv.exchange(request(bomb, *_media(), "Content-Encoding: gzip"))
    assert resp.status == 413
    await served(url(gw))


# --- requests per connection, timeouts ------------------------------------------------------------


async def test_the_last_request_of_a_connection_says_close(gw: Gateway, srv: Serving) -> None:
    """max_requests_per_connection: the response to the third request says `Connection:
    close` and the connection ends; the client reconnects and is served."""
    client = await srv.connect()
    for i in range(3):
        await client.send(mcp_request(echo_call(f"n{i}")))
        resp = await client.response()
        assert resp.json()["result"]["content"][0]["text"] == f"n{i}"
        assert resp.closes == (i == 2)
        if i == 0:
            await served(url(gw))
    assert await client.closed_by_server()
    again = await srv.exchange(mcp_request(echo_call("again")))
    assert again.json()["result"]["content"][0]["text"] == "again"


async def test_an_idle_connection_is_closed_after_idle_timeout(gw: Gateway, srv: Serving) -> None:
    """idle_timeout (aiohttp's keepalive_timeout): a kept-alive connection with nothing to do
    is closed after it."""
    idle = await srv.connect()
    await idle.send(mcp_request(echo_call("once")))
    assert (await idle.response()).status == 200
    await served(url(gw))
    assert await idle.closed_by_server()


@pytest.mark.parametrize(
    "partial", [b"", b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-"], ids=["none", "half"]
)
async def test_a_late_first_head_loses_its_connection(
    gw: Gateway, srv: Serving, partial: bytes
) -> None:
    """header_timeout: a new connection must deliver its first request head within it (the
    slow-header attack that holds connections open); it is closed unanswered."""
    slow = await srv.connect()
    await slow.send(partial)
    await served(url(gw))
    assert await slow.closed_by_server()


async def test_a_late_body_is_408_with_a_json_rpc_error(gw: Gateway, srv: Serving) -> None:
    """body_timeout: the body must arrive within it of its head; a stalled one gets 408 with a
    JSON-RPC error, and the connection closes."""
    body = orjson.dumps(echo_call("late"))
    slow = await srv.connect()
    await slow.send(mcp_request(echo_call("late"))[: -len(body) // 2])
    await served(url(gw))
    resp = await slow.response()
    assert resp.status == 408
    assert resp.json()["error"]["code"] == INVALID_REQUEST
    assert resp.closes


# --- concurrent connections -----------------------------------------------------------------------


async def test_connections_over_max_connections_are_closed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """max_connections: past it a new connection is closed at once, counted in the rejection
    metric and logged once (not once per connection); the connections already open are served,
    and once one ends a new one is taken."""
    async with gateway({"limits": {"max_connections": 3}}) as running:
        assert running.http_url is not None
        srv = Serving(port_of(running.http_url))
        try:
            keep = [await srv.connect() for _ in range(3)]
            await until(lambda: running.telemetry.stats.rejections["connections"] == 0)
            for _ in range(3):
                over = await srv.connect()
                assert await over.closed_by_server()
            assert running.telemetry.stats.rejections["connections"] == 3
            warnings = [r for r in caplog.records if "max_connections" in r.getMessage()]
            assert len(warnings) == 1
            await keep[0].send(mcp_request(echo_call("kept")))
            assert (await keep[0].response()).json()["result"]["content"][0]["text"] == "kept"
            keep[1].abort()
            listener = running._http
            assert listener is not None
            await until(lambda: listener.open == 2)
            await served(running.http_url, "after")
            metrics = await srv.exchange(request(None, method="GET", target="/metrics"))
            assert b'mcp_gateway_rejections_total{reason="connections"} 3.0' in metrics.body
        finally:
            srv.abort_all()


# --- pipelining without reading -------------------------------------------------------------------


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[tuple[Proc, int]]:
    config = write_config(
        tmp_path,
        {"sdk": stdio_backend(sdk_command())},
        http=True,
        http_extra={"limits": {"max_body_bytes": 5 * 1024 * 1024}},
    )
    proc = Proc(gateway_command(config))
    try:
        found = proc.wait_for(r"listening on http://127\.0\.0\.1:(\d+)/mcp")
        yield proc, int(found.group(1))
    finally:
        proc.stop()


@pytest.mark.slow
async def test_pipelining_big_requests_without_reading_keeps_memory_bounded(
    gateway_process: tuple[Proc, int],
) -> None:
    """A client pipelining 4 MiB requests and never reading the replies (the issue: the old
    server went from 41 to 373 MB) cannot grow the gateway's memory: aiohttp queues a bounded
    number of requests and stops reading the socket while a body waits, and replies the client
    does not take stop the handler. The gateway process's RSS stays within a few bodies of
    where it started while a well-behaved client is served."""
    proc, port = gateway_process
    base_url = f"http://127.0.0.1:{port}/mcp"
    await served(base_url, "before")
    baseline = _rss(proc.popen.pid)
    one = mcp_request(echo_call("x" * (4 * 1024 * 1024 - 300)))
    peak = [baseline]
    done = threading.Event()

    def flood() -> None:
        """Send 80 requests and read nothing; stop once the gateway has taken nothing for a
        few socket timeouts in a row (it stopped reading)."""
        quiet = 0
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(0.5)
            for _ in range(80):
                view = memoryview(one)
                while view and quiet < 4:
                    try:
                        view = view[sock.send(view) :]
                        quiet = 0
                    except TimeoutError:
                        quiet += 1
                    peak[0] = max(peak[0], _rss(proc.popen.pid))
                if quiet >= 4:
                    break
        done.set()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    served_during = 0
    with anyio.fail_after(40):
        while not done.is_set():
            await served(base_url, f"during-{served_during}")
            served_during += 1
    await anyio.to_thread.run_sync(thread.join, BOUND)
    await served(base_url, "after")
    assert served_during > 0
    assert peak[0] - baseline < 96 * 1024 * 1024, (baseline, peak[0])
