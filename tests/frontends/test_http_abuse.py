"""The gateway's HTTP front end against clients that misbehave on the wire (issue 30): malformed
requests must not flood the log, a client that stops reading must lose its connection within
the idle timeout, a half-closed request still gets its reply, and several Origin or Host fields
are refused rather than judged by the first.

The gateway runs in-process with the SDK test server over stdio as its backend, but for the log,
which is read from a gateway process at the default log level.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import orjson
import pytest

from gateway.app import Gateway
from tests.support import (
    BOUND,
    META,
    START_BOUND,
    Proc,
    gateway_command,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)
from tests.support.listener import (
    Serving,
    echo_call,
    gateway,
    mcp_request,
    port_of,
    request,
    served,
)

pytestmark = pytest.mark.anyio

IDLE = 0.5
# An echo's reply carries the text twice (content and structuredContent): past the 4 MiB the
# kernel's send buffer takes at most (tcp_wmem) and the transport's high-water mark.
BIG_TEXT = 3 * 1024 * 1024
LIMITS = {"idle_timeout": IDLE, "max_body_bytes": BIG_TEXT + 4096}


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


# --- the log --------------------------------------------------------------------------------------

HEAD = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
MALFORMED = {
    "request-line": b"garbage\r\n\r\n",
    "method": b"G@T /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "header-line": HEAD + b"no colon here\r\n\r\n",
    "header-name": HEAD + b"X-A : a\r\nContent-Length: 0\r\n\r\n",
    "obs-fold": HEAD + b"X-A: a\r\n b\r\nContent-Length: 0\r\n\r\n",
    "nul": HEAD + b"X-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
    "content-length": HEAD + b"Content-Length: 1x\r\n\r\n",
    "negative-length": HEAD + b"Content-Length: -1\r\n\r\n",
    "huge-length": HEAD + b"Content-Length: 99999999999999999999999\r\n\r\n",
    "two-lengths": HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
    "length-and-chunked": HEAD
    + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunk-size": HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
    "huge-chunk": HEAD + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n",
    "chunk-extension": HEAD + b"Transfer-Encoding: chunked\r\n\r\n2;\x01\r\nab\r\n0\r\n\r\n",
    "long-header": HEAD + b"X-A: " + b"a" * 70000 + b"\r\n\r\n",
    "long-target": b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "bad-target": b"GET http://[::1/mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "two-hosts": b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n\r\n",
    "http-version": b"GET /mcp HTTP/3.0\r\nHost: 127.0.0.1\r\n\r\n",
    "lf-only": b"POST /mcp HTTP/1.1\nHost: 127.0.0.1\nContent-Length: 0\n\n",
    "tls-hello": bytes.fromhex("16030100a5010000a10303") + bytes(40),
}


async def test_malformed_requests_write_no_traceback_at_the_default_log_level(
    tmp_path: Path,
) -> None:
    """Bad input is at most one log line, never a traceback: a gateway at `--log-level info`
    answers each malformed request 400 and writes nothing for it (aiohttp's "Error handling
    request" records, lowered to debug, used to be written whatever the level)."""
    config = write_config(tmp_path, {"sdk": stdio_backend(sdk_stdio_command())}, http=True)
    proc = Proc(gateway_command(config, "--log-level", "info"))
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        srv = Serving(port_of(url))
        quiet = len(proc.lines["stderr"])
        for case, data in MALFORMED.items():
            resp = await srv.exchange(data)
            assert resp.status == 400, case
        with anyio.fail_after(START_BOUND):
            await served(url)
        srv.abort_all()
    finally:
        proc.stop()
    lines = proc.lines["stderr"][quiet:]
    assert not [line for line in lines if "Traceback" in line or " DEBUG " in line], lines
    assert not [line for line in lines if "gateway.http" in line or "aiohttp" in line], lines
    assert len(lines) <= len(MALFORMED), lines


# --- a client that stops reading ------------------------------------------------------------------

TCP_CLOSE = 7  # (linux/tcp_states.h)


def tcp_state(sock: socket.socket) -> int:
    """The kernel's state of a TCP connection (the first byte of struct tcp_info)."""
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0])


async def test_a_client_that_stops_reading_is_reset_after_the_idle_timeout(
    gw: Gateway, srv: Serving
) -> None:
    """A reply larger than the socket buffers, to a client that reads none of it: after the
    idle timeout the connection is reset, so the client (and the kernel, which would go on
    offering the unsent reply to a zero window) does not keep it; another client is served
    meanwhile."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    assert gw.http_url is not None
    try:
        with anyio.fail_after(BOUND):
            await loop.sock_connect(sock, ("127.0.0.1", srv.port))
            await loop.sock_sendall(sock, mcp_request(echo_call("x" * BIG_TEXT)))
        await served(gw.http_url, "meanwhile")
        # The connection's state has no event of its own: it is polled. (The bound covers the
        # backend's echo of megabytes on a busy machine too, not only the idle timeout.)
        with anyio.fail_after(START_BOUND):
            while tcp_state(sock) != TCP_CLOSE:
                await anyio.lowlevel.checkpoint()
        with anyio.fail_after(BOUND), pytest.raises(ConnectionResetError):
            while await loop.sock_recv(sock, 65536):
                pass
    finally:
        sock.close()


# --- a half-closed request -----------------------------------------------------------------------


async def test_a_request_then_a_half_close_gets_its_reply(srv: Serving) -> None:
    """streamable-http, Sending Messages: the reply to a POST comes on its response; a client
    that shuts down its sending side after the request (`curl -T`, `nc -N`) still reads it,
    then the connection ends."""
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"seconds": 0.2, "steps": 1}, "_meta": META},
    }
    client = await srv.connect()
    await client.send(mcp_request(call, "Accept: application/json"))
    client.writer.write_eof()
    resp = await client.response()
    while resp.status < 200:  # (the interim response that tells a half-close from a close)
        resp = await client.response()
    assert resp.status == 200
    assert resp.closes
    assert orjson.loads(_last_message(resp.body))["result"]["content"][0]["text"] == "done"


def _last_message(body: bytes) -> bytes:
    """The JSON reply, or the last event's data of an SSE reply."""
    if body.startswith(b"{"):
        return body
    data = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")]
    return data[-1]


# --- several Origin or Host fields ----------------------------------------------------------------

LOOPBACK_ORIGIN = "Origin: http://127.0.0.1:6274"
EVIL_ORIGIN = "Origin: http://evil.example"


@pytest.mark.parametrize(
    "origins",
    [
        (LOOPBACK_ORIGIN, EVIL_ORIGIN),
        (EVIL_ORIGIN, LOOPBACK_ORIGIN),
        (LOOPBACK_ORIGIN, LOOPBACK_ORIGIN),
        ("Origin: http://127.0.0.1:6274 http://evil.example",),
    ],
    ids=["good-then-bad", "bad-then-good", "twice", "a-list"],
)
async def test_several_origins_are_refused(srv: Serving, origins: tuple[str, ...]) -> None:
    """streamable-http, Security & Endpoint: the server validates the Origin; a request that
    carries several (as separate fields, or a list in one) names no one origin, and is refused
    as a bad Origin is (403), whichever comes first; one loopback Origin is served."""
    resp = await srv.exchange(mcp_request(echo_call(), *origins))
    assert resp.status == 403
    assert resp.json()["error"]["code"] == -32600
    served_one = await srv.exchange(mcp_request(echo_call("one"), LOOPBACK_ORIGIN))
    assert served_one.status == 200


async def test_several_host_fields_are_refused(srv: Serving) -> None:
    """RFC 9112 3.2: a request with more than one Host field is answered 400 (it is not judged
    by its first Host), and the connection closes."""
    data = mcp_request(echo_call(), "Host: evil.example")
    assert re.search(rb"Host: 127\.0\.0\.1\r\n.*Host: evil\.example", data, re.S)
    client = await srv.connect()
    await client.send(data)
    assert (await client.response()).status == 400
    assert await client.closed_by_server()
    assert (await srv.exchange(request(b"", method="GET", target="/nowhere"))).status == 404
