"""The benchmark's moving parts as real processes on 127.0.0.1: the echo backend (both eras, HTTP
and stdio), the load generator (both transports and eras, its error counting and CPU accounting)
and the pass-through baselines. Counts are tiny: these check behaviour, not speed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from aiohttp import web

from bench.load import META as LOAD_META
from bench.load import cpu_ticks, find_reply
from bench.run import descendants
from tests.support import (
    BOUND,
    META,
    PYTHON,
    START_BOUND,
    Proc,
    call,
    dead_url,
    mirrored_headers,
    request,
    serve_http,
)

Message = dict[str, Any]
LEGACY = "2025-11-25"
ECHO_STDIO = [PYTHON, "-m", "bench.echo", "--stdio"]
BRIDGE = [PYTHON, "-m", "bench.passthrough", "--client", "stdio", "--port", "0", "--"]
N = 40


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- helpers ----------------------------------------------------------------------------------


def start_ready(args: list[str]) -> tuple[Proc, str]:
    proc = Proc(args)
    url = proc.wait_for(r"^READY (http://127\.0\.0\.1:\d+/mcp)$", stream="stdout").group(1)
    return proc, url


@pytest.fixture(scope="module")
def echo_http() -> Iterator[tuple[Proc, str]]:
    proc, url = start_ready([PYTHON, "-m", "bench.echo", "--http", "--port", "0"])
    yield proc, url
    assert proc.stop() == 0, proc.output()


def run_load(*args: str) -> Message:
    """Run load.py to the end and return the one JSON object it prints."""
    proc = Proc([PYTHON, "-m", "bench.load", *args])
    try:
        line = proc.wait_for(r"^\{.*\}$", stream="stdout").group(0)
        assert proc.popen.wait(BOUND) == 0, proc.output()
    finally:
        proc.stop()
    assert len(proc.lines["stdout"]) == 1, proc.output()
    result: Message = orjson.loads(line)
    return result


def assert_clean(result: Message, requests: int = N) -> None:
    assert result["requests"] == requests, result
    assert result["errors"] == 0, result
    assert result["rps"] > 0
    assert 0 < result["p50_ms"] <= result["p90_ms"] <= result["p99_ms"]


def legacy_request(rid: int | str, method: str, params: Message | None = None) -> Message:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}}


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Message:
        msg: Message = orjson.loads(self.body)
        return msg


async def post(url: str, msg: Message, headers: dict[str, str] | None = None) -> Reply:
    if headers is None:
        headers = mirrored_headers(msg) if "_meta" in msg.get("params", {}) else {}
    sent = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        **headers,
    }
    return await send("POST", url, orjson.dumps(msg), sent)


async def send(method: str, url: str, data: bytes | None, headers: dict[str, str]) -> Reply:
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=data, headers=headers) as resp,
        ):
            return Reply(resp.status, dict(resp.headers), await resp.read())


class StdioPeer:
    """Raw JSON lines to and from a stdio server process."""

    def __init__(self, args: list[str]) -> None:
        self.proc = Proc(args, stdin=True)

    def send(self, msg: Message) -> None:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(msg) + b"\n")
        stdin.flush()

    def reply(self, rid: int | str) -> Message:
        # orjson writes compact JSON, so the id appears exactly like this in its reply line.
        pattern = rf'"id":{re.escape(orjson.dumps(rid).decode())}[,}}]'
        line = self.proc.wait_for(pattern, stream="stdout", timeout=START_BOUND).string
        msg: Message = orjson.loads(line)
        return msg


# --- echo over HTTP ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.anyio
async def test_echo_http_modern(echo_http: tuple[Proc, str]) -> None:
    _, url = echo_http
    reply = await post(url, request(1, "server/discover"))
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    result = reply.json()["result"]
    assert result["resultType"] == "complete"
    assert "2026-07-28" in result["supportedVersions"]
    assert "tools" in result["capabilities"]

    listed = (await post(url, request(2, "tools/list"))).json()
    assert listed["id"] == 2
    tools = listed["result"]["tools"]
    assert [t["name"] for t in tools] == ["echo", "add", "noop"]
    assert all(t["inputSchema"]["type"] == "object" for t in tools)

    echoed = (await post(url, call(3, "echo", text="hello"))).json()
    assert echoed == {
        "jsonrpc": "2.0",
        "id": 3,
        "result": {"content": [{"type": "text", "text": "hello"}], "resultType": "complete"},
    }
    added = (await post(url, call(4, "add", a=2, b=3))).json()
    assert added["result"]["content"] == [{"type": "text", "text": "5"}]
    assert (await post(url, call(5, "noop"))).json()["result"]["content"] == []
    assert (await post(url, request(6, "ping"))).json()["result"] == {"resultType": "complete"}

    unknown = await post(url, request(7, "no/such"))
    assert unknown.status == 404
    assert unknown.json()["error"]["code"] == -32601


@pytest.mark.slow
@pytest.mark.anyio
async def test_echo_http_legacy_session(echo_http: tuple[Proc, str]) -> None:
    _, url = echo_http
    init = await post(url, legacy_request(1, "initialize", {"protocolVersion": "2025-06-18"}))
    assert init.status == 200
    assert init.json()["result"]["protocolVersion"] == "2025-06-18"
    session = init.headers["Mcp-Session-Id"]
    headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-06-18"}

    done = await post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers)
    assert (done.status, done.body) == (202, b"")
    reply = await post(
        url, legacy_request(2, "tools/call", {"name": "echo", "arguments": {"text": "x"}}), headers
    )
    # A legacy answer carries no resultType.
    assert reply.json()["result"] == {"content": [{"type": "text", "text": "x"}]}
    unknown = await post(url, legacy_request(3, "no/such"), headers)
    assert (unknown.status, unknown.json()["error"]["code"]) == (200, -32601)

    future = await post(url, legacy_request(4, "initialize", {"protocolVersion": "2099-01-01"}))
    assert future.json()["result"]["protocolVersion"] == LEGACY
    assert future.headers["Mcp-Session-Id"] != session


@pytest.mark.slow
@pytest.mark.anyio
async def test_echo_http_other_methods(echo_http: tuple[Proc, str]) -> None:
    _, url = echo_http
    assert (await send("GET", url, None, {})).status == 405
    assert (await send("DELETE", url, None, {"Mcp-Session-Id": "any"})).status == 200
    bad = await send("POST", url, b"{not json", {"Content-Type": "application/json"})
    assert bad.status == 400
    assert bad.json()["error"]["code"] == -32700


# --- echo over stdio --------------------------------------------------------------------------


@pytest.mark.slow
def test_echo_stdio_both_eras() -> None:
    peer = StdioPeer(ECHO_STDIO)
    try:
        peer.send(request(1, "server/discover"))
        assert peer.reply(1)["result"]["resultType"] == "complete"
        peer.send(request(2, "tools/list"))
        assert len(peer.reply(2)["result"]["tools"]) == 3
        peer.send(call(3, "echo", text="over stdio"))
        assert peer.reply(3)["result"]["content"][0]["text"] == "over stdio"

        peer.send(legacy_request("i", "initialize", {"protocolVersion": "2025-03-26"}))
        assert peer.reply("i")["result"]["protocolVersion"] == "2025-03-26"
        peer.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        peer.send(legacy_request("p", "ping"))
        assert peer.reply("p") == {"jsonrpc": "2.0", "id": "p", "result": {}}
        peer.send(legacy_request(4, "nope"))
        assert peer.reply(4)["error"]["code"] == -32601
        # Lines come in order, so a line for the notification would sit among these six.
        assert len(peer.proc.lines["stdout"]) == 6, peer.proc.output()

        stdin = peer.proc.popen.stdin
        assert stdin is not None
        stdin.close()
        assert peer.proc.popen.wait(BOUND) == 0
    finally:
        peer.proc.stop()


# --- load.py ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("era", ["modern", "legacy"])
@pytest.mark.parametrize("method", ["tools/call", "tools/list"])
def test_load_http(echo_http: tuple[Proc, str], era: str, method: str) -> None:
    proc, url = echo_http
    pid = proc.popen.pid
    result = run_load(
        "--url", url, "--concurrency", "4", "--requests", str(N), "--warmup", "8",
        "--era", era, "--method", method, "--pid", str(pid),
    )  # fmt: skip
    assert_clean(result)
    # The echo backend is excluded from the CPU count, so measuring it alone costs nothing.
    assert result["cpu_ms"] == 0.0
    assert result["target_pid"] == pid
    assert isinstance(result["peak_rss_mb"], float)


@pytest.mark.slow
@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_load_stdio(era: str) -> None:
    result = run_load(
        "--concurrency", "8", "--requests", str(N), "--warmup", "4", "--era", era,
        "--stdio", "--", *ECHO_STDIO,
    )  # fmt: skip
    assert_clean(result)
    assert isinstance(result["cpu_ms"], float)
    assert isinstance(result["target_pid"], int)
    assert isinstance(result["peak_rss_mb"], float)


@pytest.mark.slow
def test_load_duration_and_rss_samples(echo_http: tuple[Proc, str]) -> None:
    proc, url = echo_http
    result = run_load(
        "--url", url, "--concurrency", "2", "--duration", "0.3", "--sample-rss", "0.1",
        "--pid", str(proc.popen.pid),
    )  # fmt: skip
    assert result["errors"] == 0
    assert result["requests"] > 0
    assert 0.3 <= result["seconds"] < 0.3 + BOUND
    assert len(result["rss_samples_mb"]) >= 2


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_load_counts_http_500_as_errors(era: str) -> None:
    async def fail(_: web.Request) -> web.StreamResponse:
        return web.json_response({"oops": True}, status=500)

    async with serve_http(fail) as base:
        args = ["--url", f"{base}/mcp", "--concurrency", "3", "--requests", str(N), "--era", era]
        # load.py is a blocking wait; the server answering it runs on this thread's loop.
        result = await anyio.to_thread.run_sync(lambda: run_load(*args))
    assert (result["requests"], result["errors"]) == (N, N)
    assert result["cpu_ms"] is None


@pytest.mark.slow
def test_load_counts_refused_connections_and_a_dead_child() -> None:
    refused = run_load("--url", dead_url(), "--concurrency", "2", "--requests", "5")
    assert (refused["requests"], refused["errors"]) == (5, 5)
    dead = run_load("--concurrency", "2", "--requests", "5", "--stdio", PYTHON, "-c", "pass")
    assert (dead["requests"], dead["errors"]) == (5, 5)


@pytest.mark.slow
@pytest.mark.anyio
async def test_load_reads_chunked_event_streams() -> None:
    """The reply is the SSE event whose data has the request's id, after other events."""

    async def sse(req: web.Request) -> web.StreamResponse:
        msg = orjson.loads(await req.read())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)  # no Content-Length: chunked
        note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
        await resp.write(b": comment\r\n\r\nevent: message\r\ndata: " + orjson.dumps(note))
        await resp.write(b"\r\n\r\nid: 1\r\ndata: ")
        await resp.write(orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {}}))
        await resp.write(b"\r\n\r\n")
        await resp.write_eof()
        return resp

    async with serve_http(sse) as base:
        args = ["--url", f"{base}/mcp", "--concurrency", "2", "--requests", str(N)]
        result = await anyio.to_thread.run_sync(lambda: run_load(*args))
    assert_clean(result)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("era", ["modern", "legacy"])
async def test_load_speaks_each_era_on_the_wire(era: str) -> None:
    seen: list[tuple[dict[str, str], Message]] = []
    ended: list[str] = []
    session_ids = iter(["s1", "s2"])

    async def record(req: web.Request) -> web.StreamResponse:
        if req.method == "DELETE":
            ended.append(req.headers["Mcp-Session-Id"])
            return web.Response(status=200)
        msg = orjson.loads(await req.read())
        seen.append((dict(req.headers), msg))
        if "id" not in msg:
            return web.Response(status=202)
        if msg["method"] == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {}, "serverInfo": {}}
            reply = {"jsonrpc": "2.0", "id": msg["id"], "result": result}
            return web.json_response(reply, headers={"Mcp-Session-Id": next(session_ids)})
        return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "result": {}})

    async with serve_http(record) as base:
        args = ["--url", f"{base}/mcp", "--concurrency", "2", "--requests", "4", "--era", era]
        result = await anyio.to_thread.run_sync(lambda: run_load(*args))
    assert_clean(result, 4)
    calls = [(h, m) for h, m in seen if m.get("method") == "tools/call"]
    assert len(calls) == 4
    for headers, msg in calls:
        assert msg["params"]["name"] == "echo"
        assert msg["params"]["arguments"] == {"text": "hello"}
        assert headers["Accept"] == "application/json, text/event-stream"
        assert headers["Content-Type"] == "application/json"
    if era == "modern":
        assert len(seen) == 4
        assert ended == []
        for headers, msg in calls:
            assert msg["params"]["_meta"] == META
            assert headers["MCP-Protocol-Version"] == "2026-07-28"
            assert (headers["Mcp-Method"], headers["Mcp-Name"]) == ("tools/call", "echo")
        return
    inits = [h for h, m in seen if m.get("method") == "initialize"]
    assert len(inits) == 2  # one per client
    assert all("Mcp-Session-Id" not in h for h in inits)
    sessions = set()
    for headers, msg in seen:
        if msg.get("method") == "initialize":
            continue
        assert "_meta" not in msg.get("params", {})
        assert headers["MCP-Protocol-Version"] == "2025-06-18"
        assert "Mcp-Method" not in headers
        sessions.add(headers["Mcp-Session-Id"])
    assert sessions == {"s1", "s2"}
    notes = [m for _, m in seen if m.get("method") == "notifications/initialized"]
    assert len(notes) == 2
    # Session Management (2025-11-25): a client done with its session ends it with DELETE.
    assert sorted(ended) == ["s1", "s2"]


def test_find_reply_picks_the_event_with_the_id() -> None:
    body = (
        b'data: {"jsonrpc":"2.0","id":1,"result":{"wrong":true}}\n\n'
        b'event: message\ndata: {"jsonrpc":"2.0",\ndata: "id":2,"result":{}}\n\n'
    )
    assert find_reply(body, True, 2) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    assert find_reply(body, True, 3) is None
    assert find_reply(b'{"jsonrpc":"2.0","id":7,"result":{}}', False, 7) is not None
    assert find_reply(b"not json", False, 7) is None


@pytest.mark.slow
def test_cpu_accounting_takes_descendants_but_not_the_echo_backend() -> None:
    echo = Proc(ECHO_STDIO, stdin=True)
    other = Proc([PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=True)
    # The stdio bridge names bench.echo in its own command line (its child's command): it is
    # measured, its child is not.
    bridge, _ = start_ready([*BRIDGE, *ECHO_STDIO])
    try:
        ticks = cpu_ticks([os.getpid()])
        assert os.getpid() in ticks
        assert other.popen.pid in ticks
        assert echo.popen.pid not in ticks
        assert bridge.popen.pid in ticks
        children = [pid for pid in descendants(bridge.popen.pid) if pid != bridge.popen.pid]
        assert children and not any(pid in ticks for pid in children)
    finally:
        echo.stop()
        other.stop()
        bridge.stop()


# --- passthrough ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["raw", "aiohttp"])
def passthrough(request: pytest.FixtureRequest, echo_http: tuple[Proc, str]) -> Iterator[Proc]:
    _, upstream = echo_http
    proc = Proc(
        [PYTHON, "-m", "bench.passthrough", "--upstream", upstream, "--client", request.param]
    )
    proc.wait_for(r"^READY http://127\.0\.0\.1:\d+/mcp$", stream="stdout", timeout=START_BOUND)
    yield proc
    assert proc.stop() == 0, proc.output()


def url_of(proc: Proc) -> str:
    return proc.wait_for(r"^READY (\S+)$", stream="stdout").group(1)


@pytest.mark.slow
@pytest.mark.anyio
async def test_passthrough_forwards_unchanged(
    passthrough: Proc, echo_http: tuple[Proc, str]
) -> None:
    _, upstream = echo_http
    front = url_of(passthrough)
    msg = call(1, "echo", text="through")
    direct, forwarded = await post(upstream, msg), await post(front, msg)
    assert forwarded.status == direct.status == 200
    assert forwarded.body == direct.body
    assert forwarded.headers["Content-Type"] == "application/json"

    unknown = await post(front, request(2, "no/such"))
    assert (unknown.status, unknown.json()["error"]["code"]) == (404, -32601)
    init = await post(front, legacy_request(3, "initialize", {"protocolVersion": LEGACY}))
    assert init.headers["Mcp-Session-Id"].startswith("echo-")
    done = await post(front, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert (done.status, done.body) == (202, b"")


@pytest.mark.slow
@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_load_through_passthrough(passthrough: Proc, era: str) -> None:
    result = run_load(
        "--url", url_of(passthrough), "--concurrency", "4", "--requests", str(N),
        "--era", era, "--pid", str(passthrough.popen.pid),
    )  # fmt: skip
    assert_clean(result)
    assert isinstance(result["cpu_ms"], float)
    assert result["target_pid"] == passthrough.popen.pid


def test_load_sends_the_canonical_meta() -> None:
    assert LOAD_META == META


# --- the HTTP->stdio bridge (the floor of the gateway's HTTP->stdio rows) ----------------------


@pytest.fixture(scope="module")
def bridge() -> Iterator[tuple[Proc, str]]:
    proc, url = start_ready([*BRIDGE, *ECHO_STDIO])
    yield proc, url
    assert proc.stop() == 0, proc.output()


@pytest.mark.slow
@pytest.mark.anyio
async def test_bridge_keeps_colliding_client_ids_apart(bridge: tuple[Proc, str]) -> None:
    """Every client counts its ids from 1: requests in flight at once under the same id each get
    their own reply, with the client's id (basic, JSON-RPC: a response carries its request's id)."""
    _, url = bridge
    texts = [f"t{i}" for i in range(24)]
    replies: list[Reply] = [Reply(0, {}, b"")] * len(texts)

    async def one(i: int) -> None:
        replies[i] = await post(url, call(1, "echo", text=texts[i]))

    async with anyio.create_task_group() as tg:
        for i in range(len(texts)):
            tg.start_soon(one, i)
    for text, reply in zip(texts, replies, strict=True):
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "application/json"
        msg = reply.json()
        assert msg["id"] == 1
        assert msg["result"]["content"] == [{"type": "text", "text": text}]


@pytest.mark.slow
@pytest.mark.anyio
async def test_bridge_gives_a_legacy_client_a_session(bridge: tuple[Proc, str]) -> None:
    """Lifecycle, Initialization (2025-11-25): the child answers initialize, the bridge names the
    session; the initialized notification is accepted with 202 and nothing comes back."""
    _, url = bridge
    init = await post(url, legacy_request("init", "initialize", {"protocolVersion": LEGACY}))
    assert init.status == 200
    assert init.json()["result"]["protocolVersion"] == LEGACY
    session = init.headers["Mcp-Session-Id"]
    assert session
    done = await post(
        url,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
    )
    assert (done.status, done.body) == (202, b"")
    listed = await post(url, legacy_request(7, "tools/list"), {"Mcp-Session-Id": session})
    assert listed.json()["id"] == 7
    assert "echo" in {t["name"] for t in listed.json()["result"]["tools"]}
    assert "Mcp-Session-Id" not in listed.headers


@pytest.mark.slow
@pytest.mark.parametrize("era", ["modern", "legacy"])
def test_load_through_bridge(bridge: tuple[Proc, str], era: str) -> None:
    proc, url = bridge
    result = run_load(
        "--url", url, "--concurrency", "8", "--requests", str(N), "--era", era,
        "--pid", str(proc.popen.pid),
    )  # fmt: skip
    assert_clean(result)
    assert isinstance(result["cpu_ms"], float)
    assert result["target_pid"] == proc.popen.pid


@pytest.mark.slow
@pytest.mark.anyio
async def test_bridge_answers_502_once_its_child_is_gone() -> None:
    """Whether the request reaches the pipe before the child exits or after, it fails at once."""
    proc, url = start_ready([*BRIDGE, PYTHON, "-c", "pass"])
    try:
        for rid in (1, 2):
            assert (await post(url, call(rid, "echo", text="x"))).status == 502
    finally:
        proc.stop()
