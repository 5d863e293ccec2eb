"""Resilience per backend, end to end over real sockets: a gateway in-process in front of a small
modern MCP server on 127.0.0.1 (aiohttp) that fails on demand and counts what reaches it.

- Safe retries: a list that meets an HTTP 503 is sent again and answered; a tool whose
  annotations say readOnlyHint and idempotentHint (2026-07-28 schema, ToolAnnotations) is too;
  any other tools/call is sent once, whatever happens (server/tools, Calling Tools).
- A tool's own timeout is an idle timer: a slow tool is cancelled (streamable-http,
  Cancellation: the stream is closed) and answered -31002 while another tool of the backend
  runs longer under the backend's request_timeout; progress notifications
  (basic/utilities/progress) keep a long call alive; and a tool's own timeout may be longer
  than request_timeout.
- The circuit breaker opens after its failures (calls then fail at once, reaching nothing),
  lets a probe through after its cooldown and closes on its success; /metrics and
  /status.json show its state.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import codes
from tests.support import (
    BOUND,
    PYTHON,
    START_BOUND,
    Message,
    call,
    messages,
    mirrored_headers,
    request,
    serve_http,
)

pytestmark = pytest.mark.anyio

DISCOVERED: dict[str, Any] = {
    "resultType": "complete",
    "supportedVersions": ["2026-07-28"],
    "capabilities": {"tools": {}},
    "serverInfo": {"name": "flaky", "version": "1"},
}
SCHEMA = {"type": "object"}
TOOLS = [
    {
        "name": "peek",
        "inputSchema": SCHEMA,
        "annotations": {"readOnlyHint": True, "idempotentHint": True},
    },
    {"name": "write", "inputSchema": SCHEMA, "annotations": {"readOnlyHint": True}},
    {"name": "slow", "inputSchema": SCHEMA},
    {"name": "steady", "inputSchema": SCHEMA},
    {"name": "long", "inputSchema": SCHEMA},
]
# How long `steady` takes, and `long` between its progress notifications (of which it sends 8).
STEADY = 1.0
TICK = 0.15


class Server:
    """Counts each request by method (tools/call: by tool); answers `fail[key]` of them with a
    bare HTTP 503 first."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.fail: Counter[str] = Counter()
        self.slow_cancelled = asyncio.Event()

    async def handle(self, req: web.Request) -> web.StreamResponse:
        body = orjson.loads(await req.read())
        if "id" not in body:
            return web.Response(status=202)
        method, params = body["method"], body.get("params") or {}
        key = params["name"] if method == "tools/call" else method
        self.seen[key] += 1
        if self.fail[key] > 0:
            self.fail[key] -= 1
            return web.Response(status=503)
        result: dict[str, Any] = {"resultType": "complete"}
        if method == "server/discover":
            result = DISCOVERED
        elif method == "tools/list":
            result = {"resultType": "complete", "tools": TOOLS}
        elif key == "slow":
            try:
                await asyncio.sleep(BOUND * 2)
            except asyncio.CancelledError:
                self.slow_cancelled.set()  # (the gateway closed the stream)
                raise
        elif key == "steady":
            await asyncio.sleep(STEADY)
        elif key == "long":
            return await self.progress(req, body)
        if method == "tools/call":
            result = {"resultType": "complete", "content": [{"type": "text", "text": key}]}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def progress(self, req: web.Request, body: Message) -> web.StreamResponse:
        token = body["params"]["_meta"]["progressToken"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for n in range(1, 9):
            await asyncio.sleep(TICK)
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": token, "progress": n, "total": 8},
            }
            await resp.write(b"data: " + orjson.dumps(note) + b"\n\n")
        result = {"resultType": "complete", "content": [{"type": "text", "text": "long"}]}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        await resp.write(b"data: " + orjson.dumps(reply) + b"\n\n")
        await resp.write_eof()
        return resp


@asynccontextmanager
async def gateway(**backend: Any) -> AsyncIterator[tuple[Gateway, Server, str]]:
    server = Server()
    async with serve_http(server.handle) as base:
        listen = {
            "http": {"host": "127.0.0.1", "port": 0},
            "admin": {"host": "127.0.0.1", "port": 0},
        }
        backends = {"flaky": {"http": {"url": base + "/mcp"}, **backend}}
        text = yaml.safe_dump({"listen": listen, "backends": backends})
        with anyio.fail_after(START_BOUND):
            async with Gateway(parse(text)) as gw:
                assert gw.http_url is not None
                await gw.catalogs_loaded.wait()
                server.seen.clear()
                yield gw, server, gw.http_url


async def exchange(url: str, msg: Message) -> list[Message]:
    """Every message the gateway sent back for `msg`, its reply last."""
    out: list[Message] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
    ):
        async for item in messages(resp):
            out.append(item)
    assert out and "method" not in out[-1], out
    return out


async def reply_to(url: str, msg: Message) -> Message:
    with anyio.fail_after(BOUND):
        return (await exchange(url, msg))[-1]


def error_code(reply: Message) -> int | None:
    return reply["error"]["code"] if "error" in reply else None


# --- safe retries --------------------------------------------------------------------------------


async def test_a_list_and_a_safe_tool_are_retried_and_any_other_call_is_not() -> None:
    async with gateway(retries={"backoff": 0.01, "max_backoff": 0.05}) as (_, server, url):
        server.fail["tools/list"] = 1
        listed = await reply_to(url, request(1, "tools/list"))
        assert [t["name"] for t in listed["result"]["tools"]] == [t["name"] for t in TOOLS]
        assert server.seen["tools/list"] == 2

        server.fail["peek"] = 1
        peeked = await reply_to(url, call(2, "peek"))
        assert "result" in peeked and server.seen["peek"] == 2

        # readOnlyHint alone is not enough: `write` reaches the server once, and fails.
        server.fail["write"] = 1
        written = await reply_to(url, call(3, "write"))
        assert error_code(written) == codes.BACKEND_UNAVAILABLE
        assert server.seen["write"] == 1


async def test_retries_can_be_turned_off() -> None:
    async with gateway(retries={"attempts": 1}) as (_, server, url):
        server.fail["tools/list"] = 1
        listed = await reply_to(url, request(1, "tools/list"))
        assert error_code(listed) == codes.BACKEND_UNAVAILABLE
        assert server.seen["tools/list"] == 1


# --- a tool's own timeout ------------------------------------------------------------------------


async def test_a_tools_own_timeout_cancels_it_while_the_others_run_on() -> None:
    own = {"slow": {"timeout": 0.3}, "long": {"timeout": 0.6}, "steady": {}}
    async with gateway(tools=own) as (_, server, url):
        with anyio.fail_after(BOUND):
            timed_out = await reply_to(url, call(1, "slow"))
            assert error_code(timed_out) == codes.BACKEND_TIMEOUT
            await server.slow_cancelled.wait()  # the call was given up on the server too

        # Another tool of the backend, under the backend's request_timeout, takes longer.
        steady = await reply_to(url, call(2, "steady"))
        assert steady["result"]["content"][0]["text"] == "steady"

        # Progress restarts the idle timer: 8 notifications 0.15 s apart outlast 0.6 s.
        with anyio.fail_after(BOUND):
            got = await exchange(url, call(3, "long", token="p"))
        progress = [m["params"]["progress"] for m in got if m.get("method")]
        assert progress == list(range(1, 9))
        assert got[-1]["result"]["content"][0]["text"] == "long"


async def test_a_tools_own_timeout_may_be_longer_than_the_backends() -> None:
    async with gateway(request_timeout=0.5, tools={"steady": {"timeout": 3}}) as (_, _, url):
        steady = await reply_to(url, call(1, "steady"))
        assert steady["result"]["content"][0]["text"] == "steady"
    async with gateway(request_timeout=0.5) as (_, _, url):
        assert error_code(await reply_to(url, call(2, "steady"))) == codes.BACKEND_TIMEOUT


@pytest.mark.slow
async def test_over_stdio_progress_keeps_a_call_past_request_timeout_and_silence_ends_it() -> None:
    """The demo server's `sleep` reports progress each second when asked (a progressToken)."""
    demo = {
        "stdio": {"command": PYTHON, "args": ["-m", "gateway.demo.server"]},
        "request_timeout": 0.5,
        "tools": {"sleep": {"timeout": 1.8}},
    }
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"demo": demo}}
    )
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            got = await exchange(gw.http_url, call(1, "sleep", token="t", seconds=2.5))
            assert [m["params"]["progress"] for m in got if m.get("method")] == [1, 2, 2.5]
            assert "result" in got[-1]
            silent = await reply_to(gw.http_url, call(2, "sleep", seconds=2.5))
            assert error_code(silent) == codes.BACKEND_TIMEOUT
            assert "sleep" in silent["error"]["message"]


# --- the circuit breaker -------------------------------------------------------------------------


def breaker_metrics(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "mcp_gateway_backend_breaker_state":
                out[s.labels["state"]] = s.value
            elif s.name == "mcp_gateway_backend_breaker_opens_total":
                out["opens"] = s.value
    return out


def state(now: str, opens: int) -> dict[str, float]:
    """The breaker's series when it is in state `now` and has opened `opens` times."""
    states = ("closed", "open", "half_open")
    return {**{s: 1.0 if s == now else 0.0 for s in states}, "opens": opens}


async def observed(gw: Gateway) -> tuple[dict[str, float], str | None]:
    """The breaker's series on /metrics, and its state on /status.json."""
    assert gw.http_url is not None and gw.admin_url is not None
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.http_url.removesuffix("/mcp") + "/metrics") as resp:
            metrics = breaker_metrics(await resp.text())
        async with session.get(gw.admin_url + "/status.json") as resp:
            status = await resp.json()
    (backend,) = status["backends"]
    shown: str | None = backend["breaker"]
    return metrics, shown


async def test_the_breaker_opens_fails_at_once_and_closes_after_a_good_probe() -> None:
    settings = {"failures": 2, "window": 30, "cooldown": 0.5}
    async with gateway(breaker=settings, retries={"attempts": 1}) as (gw, server, url):
        assert await observed(gw) == (state("closed", 0), "closed")
        server.fail["write"] = 2
        for rid in (1, 2):
            assert error_code(await reply_to(url, call(rid, "write"))) == codes.BACKEND_UNAVAILABLE
        assert server.seen["write"] == 2

        refused = await reply_to(url, call(3, "write"))
        assert error_code(refused) == codes.BACKEND_UNAVAILABLE
        assert "flaky" in refused["error"]["message"]
        assert server.seen["write"] == 2  # failed at once: nothing reached the server
        assert await observed(gw) == (state("open", 1), "open")

        await anyio.sleep(settings["cooldown"])  # (the cooldown is what is under test)
        probe = await reply_to(url, call(4, "write"))
        assert "result" in probe and server.seen["write"] == 3
        assert await observed(gw) == (state("closed", 1), "closed")


async def test_without_a_breaker_there_is_no_state_to_show() -> None:
    async with gateway() as (gw, _, _):
        assert await observed(gw) == ({}, None)
