"""Streaming replies of the HTTP front end: quiet long calls turn into SSE with keep-alive comments
(streamable-http, Receiving Messages). Cancellation by a closed stream is in test_faults."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import orjson
import pytest

from gateway.app import Gateway
from gateway.config import parse
from gateway.frontends import replies
from tests.support import START_BOUND, sdk_stdio_command

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    command = sdk_stdio_command()
    text = orjson.dumps(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"sdk": {"stdio": {"command": command[0], "args": command[1:]}}},
        }
    ).decode()
    async with Gateway(parse(text)) as gw:
        yield gw


def slow_call(seconds: float, steps: int, token: str | None = None) -> dict[str, Any]:
    meta = {**META, "progressToken": token} if token else META
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "slow",
            "arguments": {"seconds": seconds, "steps": steps},
            "_meta": meta,
        },
    }


HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "slow",
}


async def test_quiet_long_call_becomes_sse_with_keepalive_comments(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replies, "JSON_WINDOW", 0.05)
    monkeypatch.setattr(replies, "KEEPALIVE_INTERVAL", 0.05)
    assert gateway.http_url is not None
    with anyio.fail_after(START_BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gateway.http_url, data=orjson.dumps(slow_call(0.6, 1)), headers=HEADERS
            ) as resp,
        ):
            body = await resp.read()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert resp.headers["X-Accel-Buffering"] == "no"
    assert b":\r\n\r\n" in body
    last = body.rstrip().rsplit(b"data: ", 1)[1]
    assert orjson.loads(last)["result"]["content"][0]["text"] == "done"
