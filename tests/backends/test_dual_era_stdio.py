"""A stdio server of both eras (the official SDK's MCPServer) behind the gateway: what one
process can serve, and what the gateway does about it (docs/guides/dual-era.md).

Measured on the SDK (2.3.0) over one stdio stream: a connection keeps the era of its first
request. After a legacy `initialize`, every request carrying modern `_meta` is refused
(-32600); after a modern request, `initialize` is refused (-32022) and plain legacy requests
too (-32602). So a legacy client of such a server gets a second process by default (its
in-memory state is its own), `legacy_lane: false` keeps every client on the modern one, and
`era: legacy` on the legacy one (basic/versioning, Backward Compatibility with
Initialization-Based Versions; transports/stdio). The counter server's `count` says which
process answered and how often it was asked."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from tests.frontends.test_http_transport_rules import call, post
from tests.frontends.test_legacy_sessions import SESSION, legacy, open_session, result_of
from tests.support import BOUND, PYTHON, ROOT, START_BOUND, Proc

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

COUNTER = str(ROOT / "tests" / "servers" / "counter_server.py")
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


@asynccontextmanager
async def gateway(command: list[str], **backend: object) -> AsyncIterator[str]:
    entry = {"stdio": {"command": command[0], "args": command[1:]}, **backend}
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"counter": entry}}
    )
    async with Gateway(parse(text)) as gw:
        assert gw.http_url is not None
        yield gw.http_url


async def modern_count(url: str) -> tuple[int, int]:
    reply = await post(url, call("count", {}), bound=START_BOUND)
    msg = reply.json()
    assert "error" not in msg, msg
    return msg["result"]["structuredContent"]["pid"], msg["result"]["structuredContent"]["count"]


async def legacy_count(url: str, session_id: str) -> tuple[int, int]:
    msg = legacy("tools/call", {"name": "count"}, 2)
    reply = await post(url, msg, mirror=False, extra=[(SESSION, session_id)], bound=START_BOUND)
    result = result_of(reply, 2)
    return result["structuredContent"]["pid"], result["structuredContent"]["count"]


def exchange(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages written one at a time on one stdio stream to the server, each request's reply
    awaited before the next is written: the replies, in order."""
    proc = Proc([PYTHON, COUNTER], stdin=True)
    replies: list[dict[str, Any]] = []
    try:
        stdin = proc.popen.stdin
        assert stdin is not None
        for msg in lines:
            stdin.write(orjson.dumps(msg) + b"\n")
            stdin.flush()
            if "id" not in msg:
                continue
            ident = msg["id"]

            def answered(out: list[str], ident: object = ident) -> bool:
                return any(orjson.loads(x).get("id") == ident for x in out)

            got = proc.wait_lines(answered, stream="stdout", timeout=START_BOUND)
            replies += [r for x in got if (r := orjson.loads(x)).get("id") == ident]
    finally:
        proc.stop()
    return replies


def test_one_stdio_stream_keeps_the_era_of_its_first_request() -> None:
    """The measurement the design rests on: no interleaving of the eras on one stream."""
    init = legacy(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "l", "version": "1"},
        },
        1,
    )
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    modern = {**legacy("tools/list", {"_meta": MODERN_META}, 3)}
    legacy_first = exchange([init, initialized, legacy("tools/list", {}, 2), modern])
    assert "result" in legacy_first[0] and "result" in legacy_first[1]
    assert legacy_first[2]["error"]["code"] == -32600
    modern_first = exchange([{**modern, "id": 1}, {**init, "id": 2}, legacy("tools/list", {}, 3)])
    assert "result" in modern_first[0]
    assert modern_first[1]["error"]["code"] == -32022
    assert modern_first[2]["error"]["code"] == -32602


async def test_by_default_a_legacy_client_gets_a_second_process_with_its_own_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.backend")
    async with gateway([PYTHON, COUNTER]) as url:
        modern_pid, _ = await modern_count(url)
        legacy_pid, count = await legacy_count(url, await open_session(url))
        assert legacy_pid != modern_pid and count == 1  # the first count on that process
        assert (await modern_count(url))[0] == modern_pid
    said = [r.getMessage() for r in caplog.records]
    assert any("trying the legacy era on a second process" in line for line in said), said
    assert any("speaks both eras" in line and "second process" in line for line in said), said


@pytest.mark.parametrize("backend", [{"legacy_lane": False}, {"era": "legacy"}])
async def test_one_process_serves_both_eras_when_pinned(backend: dict[str, object]) -> None:
    """`legacy_lane: false`: legacy clients on the modern process; `era: legacy`: modern
    clients on the legacy session. Either way one process, one state."""
    async with gateway([PYTHON, COUNTER], **backend) as url:
        modern_pid, first = await modern_count(url)
        legacy_pid, second = await legacy_count(url, await open_session(url))
        assert legacy_pid == modern_pid and second == first + 1
        assert await modern_count(url) == (modern_pid, second + 1)


async def test_a_modern_only_server_is_said_so_in_plain_words(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The bundled demo server refuses `initialize` with -32022 (its supported versions in the
    error's data): one INFO line says what that means, with no error dict in it."""
    caplog.set_level(logging.INFO, logger="gateway.backend")
    async with gateway([PYTHON, "-m", "gateway.demo.server"]) as url:
        session_id = await open_session(url)
        echo = legacy("tools/call", {"name": "echo", "arguments": {"text": "x"}}, 2)
        reply = await post(url, echo, mirror=False, extra=[(SESSION, session_id)], bound=BOUND * 3)
        assert result_of(reply, 2)["content"][0]["text"] == "x"
    (line,) = [
        r.getMessage() for r in caplog.records if "speaks only the modern era" in r.getMessage()
    ]
    assert "-32022, unsupported protocol version (it supports 2026-07-28)" in line
    assert "nothing to fix" in line and "{" not in line and "\n" not in line
