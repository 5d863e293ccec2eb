"""Misbehaving HTTP backends beside a healthy one, seen through a whole gateway on 127.0.0.1:
one answering HTTP 500 to everything, one redirecting everything, one refusing connections, a
black hole (the connection never completes), one that accepts and never answers, one that
drips an endless stream a byte at a time, and one that floods an event that never ends.

Once start-up is over (every backend's first catalog load has ended; a backend still starting
is waited for), for each: a call to one of its tools gets a prompt JSON-RPC error of our own (a
backend error code, basic/index "Error Codes") naming it, never `-32602` for an unknown tool;
the lists,
discovery and a listen answer with the healthy backend's part within a second
(server/tools "Listing Tools", basic/patterns/subscriptions); the healthy backend's tools are
still served; `/readyz` names it as not ready; nothing is logged with a traceback; and the
flood is cut at `limits.max_event_bytes` rather than buffered.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway import config as gateway_config
from gateway.app import Gateway
from gateway.core import catalog
from gateway.protocol import codes, meta
from tests.support import BOUND, call, dead_url, messages, mirrored_headers, request, serve_http
from tests.support.backend import Peer, Server, head, hold, stalled_listener

pytestmark = [pytest.mark.anyio]

Message = dict[str, Any]
Fault = Callable[[], AbstractAsyncContextManager[dict[str, Any]]]

# "Promptly": what a list, discovery, listen or call may take, far below the broken
# backends' own timeouts (30 s here), which nothing may wait out.
PROMPT = 1.0
# How long the broken backend's first catalog load may take here (LOAD_TIMEOUT, 15 s by
# default): the start-up, during which a list still waits for a backend that is starting.
START_UP = 0.5
# The backend errors of protocol/codes: each names the backend.
BACKEND_CODES = frozenset(
    {
        codes.BACKEND_UNAVAILABLE,
        codes.BACKEND_TIMEOUT,
        codes.BACKEND_PROTOCOL_ERROR,
        codes.BACKEND_CONNECTION_LOST,
    }
)
DISCOVERED = {
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {"listChanged": True}},
    "serverInfo": {"name": "good", "version": "1"},
}
TOOLS = [{"name": "echo", "inputSchema": {"type": "object"}}]


# --- the healthy backend ------------------------------------------------------------------


async def healthy(request: web.Request) -> web.StreamResponse:
    """Discovery, one tool `echo`, and listens acknowledged and then held open."""
    msg: Message = orjson.loads(await request.read())
    if "id" not in msg:
        return web.Response(status=202)
    method = msg["method"]
    if method == "subscriptions/listen":
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        honoured = msg["params"].get("notifications", {})
        params = {"notifications": honoured, "_meta": {meta.SUBSCRIPTION_ID: msg["id"]}}
        ack = {"jsonrpc": "2.0", "method": meta.ACKNOWLEDGED, "params": params}
        await resp.write(b"data: " + orjson.dumps(ack) + b"\n\n")
        await anyio.sleep_forever()  # until the gateway closes the stream
    results: dict[str, dict[str, Any]] = {
        "server/discover": DISCOVERED,
        "tools/list": {"tools": TOOLS},
        "tools/call": {"content": [{"type": "text", "text": "ok"}]},
    }
    value = results.get(method, {})
    body = {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **value}}
    return web.json_response(body)


# --- the faults -----------------------------------------------------------------------------


def broken(url: str, **extra: Any) -> dict[str, Any]:
    """A backend at `url` pinned modern (no era probe), with timeouts nothing may wait out."""
    http: dict[str, Any] = {"url": url, **extra}
    return {"http": http, "era": "modern", "connect_timeout": 30, "request_timeout": 30}


@asynccontextmanager
async def server_error() -> AsyncIterator[dict[str, Any]]:
    async def handler(_: web.Request) -> web.StreamResponse:
        html = "<html><body><h1>500 Internal Server Error</h1></body></html>"
        return web.Response(status=500, text=html, content_type="text/html")

    async with serve_http(handler) as base:
        yield broken(f"{base}/mcp")


@asynccontextmanager
async def redirect() -> AsyncIterator[dict[str, Any]]:
    async def handler(_: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async with serve_http(handler) as base:
        yield broken(f"{base}/mcp")


@asynccontextmanager
async def refused() -> AsyncIterator[dict[str, Any]]:
    yield broken(dead_url())


@asynccontextmanager
async def black_hole() -> AsyncIterator[dict[str, Any]]:
    with stalled_listener() as listener:
        host, port = listener.getsockname()
        yield broken(f"http://{host}:{port}/mcp")


@asynccontextmanager
async def silent() -> AsyncIterator[dict[str, Any]]:
    async with Server(hold) as server:
        yield broken(server.url())


async def drip(peer: Peer) -> None:
    """An event stream that never ends: a comment byte after byte, forever."""
    if await peer.read_request() is None:
        return
    await peer.send(head("Content-Type: text/event-stream", "Connection: close"))
    while True:
        await peer.send(b":")
        await anyio.sleep(0.02)  # the fault itself (a slow server), not a wait of the test


@asynccontextmanager
async def slow_drip() -> AsyncIterator[dict[str, Any]]:
    async with Server(drip) as server:
        yield broken(server.url())


# Bytes each flooded connection took before the gateway let it go.
FLOODED: list[int] = []
FLOOD_CHUNK = 65536


async def flood(peer: Peer) -> None:
    """One event whose data line never ends, written as fast as the client reads."""
    if await peer.read_request() is None:
        return
    await peer.send(head("Content-Type: text/event-stream", "Connection: close"), b"data: ")
    FLOODED.append(0)
    index = len(FLOODED) - 1
    while True:
        await peer.send(b"x" * FLOOD_CHUNK)
        FLOODED[index] += FLOOD_CHUNK


@asynccontextmanager
async def endless_event() -> AsyncIterator[dict[str, Any]]:
    async with Server(flood) as server:
        yield broken(server.url(), limits={"max_event_bytes": 256 * 1024})


FAULTS = [
    pytest.param(server_error, id="http-500"),
    pytest.param(redirect, id="redirect"),
    pytest.param(refused, id="refused"),
    pytest.param(black_hole, id="black-hole"),
    pytest.param(silent, id="silent"),
    pytest.param(slow_drip, id="slow-drip"),
    pytest.param(endless_event, id="endless-event"),
]


# --- the gateway and its client -------------------------------------------------------------


@pytest.fixture(autouse=True)
def quick_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog, "LOAD_TIMEOUT", START_UP)


@asynccontextmanager
async def gateway(
    bad: dict[str, Any], good: str
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, str]]:
    """Backends `good` and `bad` (names prefixed `good_`, `bad_`): a client session, the MCP
    URL and the /readyz URL."""
    backends = {"good": {"http": {"url": good}, "era": "modern"}, "bad": bad}
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": backends}
    )
    async with Gateway(gateway_config.parse(text)) as gw, aiohttp.ClientSession() as session:
        assert gw.http_url is not None
        with anyio.fail_after(BOUND):
            await gw.catalogs_loaded.wait()  # past start-up: every first catalog load ended
        base = gw.http_url.removesuffix("/mcp")
        yield session, gw.http_url, f"{base}/readyz"


async def post(session: aiohttp.ClientSession, url: str, msg: Message) -> Message:
    """The reply to `msg` (notifications on the way are skipped)."""
    async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        async for item in messages(resp):
            if "method" not in item:
                return item
    raise AssertionError(f"no reply to {msg['id']!r}")


async def acknowledgement(session: aiohttp.ClientSession, url: str) -> Message:
    """A listen's acknowledgement (the stream is closed once it has come)."""
    msg = request("listen", "subscriptions/listen", {"notifications": {"toolsListChanged": True}})
    async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        async for item in messages(resp):
            assert "error" not in item, item
            if item.get("method") == meta.ACKNOWLEDGED:
                return item
    raise AssertionError("the listen ended unacknowledged")


def error_of(reply: Message) -> tuple[int, str]:
    assert "error" in reply, reply
    error: dict[str, Any] = reply["error"]
    return error["code"], error["message"]


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_broken_http_backend_fails_its_own_calls_and_delays_nobody(
    fault: Fault, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "gateway")
    FLOODED.clear()
    async with (
        serve_http(healthy) as good,
        fault() as bad,
        gateway(bad, f"{good}/mcp") as (session, url, readyz),
    ):
        # The lists, discovery and a listen: the healthy backend's part, promptly.
        with anyio.fail_after(PROMPT):
            listed = await post(session, url, request(1, "tools/list"))
        assert [t["name"] for t in listed["result"]["tools"]] == ["good_echo"]
        with anyio.fail_after(PROMPT):
            discovered = await post(session, url, request(2, "server/discover"))
        assert "tools" in discovered["result"]["capabilities"]
        with anyio.fail_after(PROMPT):
            ack = await acknowledgement(session, url)
        assert ack["params"]["notifications"] == {"toolsListChanged": True}

        # A call to the broken backend's tool: an error of ours naming it, not an unknown tool.
        with anyio.fail_after(PROMPT):
            reply = await post(session, url, call(3, "bad_echo"))
        code, message = error_of(reply)
        assert code in BACKEND_CODES, reply
        assert "'bad'" in message

        # The healthy backend is still served, and its unknown names are told promptly.
        with anyio.fail_after(PROMPT):
            assert "result" in await post(session, url, call(4, "good_echo"))
            unknown = await post(session, url, call(5, "good_nope"))
        assert error_of(unknown)[0] == codes.INVALID_PARAMS
        with anyio.fail_after(PROMPT):
            listed = await post(session, url, request(6, "tools/list"))
        assert [t["name"] for t in listed["result"]["tools"]] == ["good_echo"]

        # /readyz names it.
        with anyio.fail_after(BOUND):
            async with session.get(readyz) as resp:
                status, body = resp.status, await resp.json()
        assert status == 503
        assert body["backends"] == {"good": True, "bad": False}
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    if fault is endless_event:
        # Memory: each flooded reply was let go near max_event_bytes (256 KiB here; the
        # default is 16 MiB), what is in flight in the sockets aside.
        assert FLOODED and max(FLOODED) < 8 * 1024 * 1024, FLOODED


class Logged(logging.Handler):
    """Sets `seen` once a record of the gateway's log says `text`: a wait on the log."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_a_failing_backend_that_recovers_is_ready_again_without_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its catalog is loaded again in the background (no client need ask): /readyz is 200 and
    its tools are served once it answers properly."""
    monkeypatch.setattr(catalog, "FIRST_RELOAD", 0.05)
    fixed = anyio.Event()

    async def flaky(request: web.Request) -> web.StreamResponse:
        if not fixed.is_set():
            return web.Response(status=500, text="down for maintenance")
        return await healthy(request)

    logged = Logged("catalog of bad loaded again")
    logger = logging.getLogger("gateway.catalog")
    level = logger.level
    logger.addHandler(logged)
    logger.setLevel(logging.INFO)
    try:
        async with (
            serve_http(healthy) as good,
            serve_http(flaky) as bad,
            gateway(broken(f"{bad}/mcp"), f"{good}/mcp") as (session, url, readyz),
        ):
            async with session.get(readyz) as resp:
                assert resp.status == 503
            fixed.set()
            with anyio.fail_after(BOUND):
                await logged.seen.wait()
                async with session.get(readyz) as resp:
                    assert resp.status == 200, await resp.text()
                assert "result" in await post(session, url, call(1, "bad_echo"))
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)
