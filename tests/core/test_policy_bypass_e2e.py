"""Policy bypass through another spelling (THREAT_MODEL.md, Policy bypass), end to end: a gateway
process in front of the lenient test server (tests/servers/lenient_server.py, which runs what a
lenient match finds and records it), spoken to over its stdio front end in both eras (a
2025-11-25 `initialize` session, basic/lifecycle) and over Streamable HTTP.

Every bypass case is refused with the unknown-name error (server/tools, Error Handling: -32602)
and the server records nothing of it; what is allowed still runs. A `tools/call` sent as a
notification (no id) never reaches the server; over HTTP it gets 400 and an error without an id
(streamable-http, Sending Messages)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from gateway.protocol import codes, headers
from tests.core.test_policy_bypass import DENIED_URIS, SPELLINGS
from tests.support import (
    BOUND,
    META,
    ROOT,
    START_BOUND,
    VERSION,
    Proc,
    gateway_command,
    start_gateway_http,
)

pytestmark = [pytest.mark.slow]

Message = dict[str, Any]
LENIENT = str(ROOT / "tests" / "servers" / "lenient_server.py")
LEGACY = "2025-11-25"
# (what the case is, method, params): each refused as unknown, none reaching the server.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    *((f"denied tool, {k}", "tools/call", {"name": v}) for k, v in SPELLINGS.items()),
    ("filtered-out tool", "tools/call", {"name": "Hidden_Tool"}),
    ("renamed-away tool", "tools/call", {"name": "OLD_NAME"}),
    ("required tool without its scope", "tools/call", {"name": "ADMIN_TOOL"}),
    ("denied prompt", "prompts/get", {"name": "SECRET_PROMPT"}),
    *((f"denied resource {u}", "resources/read", {"uri": u}) for u in DENIED_URIS),
    ("rate-limited tool, exhausted", "tools/call", {"name": "ECHO"}),
]
REQUEST_AS_NOTIFICATION: Message = {
    "jsonrpc": "2.0",
    "method": "tools/call",
    "params": {"name": "secret_read", "arguments": {}},
}


def config(directory: Path, *, http: bool) -> Path:
    record = directory / "record.jsonl"
    record.touch()
    listen: dict[str, Any] = (
        {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}} if http else {"stdio": True}
    )
    doc = {
        "listen": listen,
        "backends": {
            "lenient": {
                "stdio": {"command": sys.executable, "args": [LENIENT, str(record)]},
                "tools": {"deny": ["hidden_*"]},
                "rename": {"old_name": "new_name"},
            }
        },
        "policy": {
            "rules": [
                {"deny": {"tools": ["secret_*"], "prompts": ["secret_*"]}},
                {"deny": {"resources": ["file:///secret/*"]}},
                {"require": {"tools": ["admin_*"]}, "scopes": ["admin"]},
            ]
        },
        "rate_limits": {"tools": {"echo": {"rate": 0.001, "burst": 1}}},
    }
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def recorded(directory: Path) -> list[Message]:
    lines = (directory / "record.jsonl").read_bytes().splitlines()
    return [orjson.loads(line) for line in lines]


def expect_only_the_allowed(directory: Path) -> None:
    """The server ran the one allowed call and the one allowed read, nothing else."""
    ran = [(r["method"], r["ran"]) for r in recorded(directory)]
    assert ran == [("tools/call", "echo"), ("resources/read", "file:///public/readme")]


def code(reply: Message) -> int:
    assert "error" in reply, reply
    value: int = reply["error"]["code"]
    return value


def text_of(reply: Message) -> str:
    assert "result" in reply, reply
    if "contents" in reply["result"]:
        value: str = reply["result"]["contents"][0]["text"]
    else:
        value = reply["result"]["content"][0]["text"]
    return value


# --- stdio ---------------------------------------------------------------------------------


class Stdio:
    """A gateway process spoken to in raw lines; string ids find each reply line."""

    def __init__(self, path: Path, legacy: bool) -> None:
        self.proc = Proc(gateway_command(path), stdin=True)
        self.legacy = legacy
        self.ids = 0
        self.bound = START_BOUND  # the first reply waits for both processes to start

    def send(self, msg: Message) -> None:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(msg) + b"\n")
        stdin.flush()

    def ask(self, method: str, params: dict[str, Any]) -> Message:
        self.ids += 1
        rid = f"r{self.ids}"
        body = params if self.legacy else {**params, "_meta": META}
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": body})
        line = self.proc.wait_for(f'"id":"{rid}"', stream="stdout", timeout=self.bound).string
        self.bound = BOUND
        reply: Message = orjson.loads(line)
        return reply


@pytest.fixture(params=["modern", "legacy"])
def stdio(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stdio]:
    gateway = Stdio(config(tmp_path, http=False), legacy=request.param == "legacy")
    try:
        if gateway.legacy:
            info = {"name": "t", "version": "1"}
            opened = gateway.ask(
                "initialize", {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": info}
            )
            assert opened["result"]["protocolVersion"] == LEGACY
            gateway.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield gateway
    finally:
        gateway.proc.stop()


def test_every_bypass_is_refused_over_stdio(stdio: Stdio, tmp_path: Path) -> None:
    assert text_of(stdio.ask("tools/call", {"name": "echo", "arguments": {"text": "x"}})) == (
        "ran echo: x"
    )
    limited = stdio.ask("tools/call", {"name": "echo", "arguments": {}})
    assert code(limited) == codes.RATE_LIMITED
    for case, method, params in CASES:
        assert code(stdio.ask(method, params)) == codes.INVALID_PARAMS, case
    stdio.send(REQUEST_AS_NOTIFICATION)
    stdio.proc.wait_for(r"notification with the request method 'tools/call': dropped")
    read = stdio.ask("resources/read", {"uri": "file:///public/readme"})
    assert text_of(read) == "public text"
    expect_only_the_allowed(tmp_path)


# --- Streamable HTTP -------------------------------------------------------------------------


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[str]:
    proc, url = start_gateway_http(config(tmp_path, http=True))
    try:
        yield url
    finally:
        proc.stop()


def mirrored(method: str, params: dict[str, Any]) -> dict[str, str]:
    out = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": method,
    }
    field = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(method)
    if field is not None:
        out["Mcp-Name"] = headers.encode_value(params[field])
    return out


async def post(session: aiohttp.ClientSession, url: str, msg: Message) -> tuple[int, Message]:
    params = msg.get("params", {})
    async with session.post(
        url, data=orjson.dumps(msg), headers=mirrored(msg["method"], params)
    ) as resp:
        body = await resp.read()
        return resp.status, orjson.loads(body) if body else {}


@pytest.mark.anyio
async def test_every_bypass_is_refused_over_http(http_url: str, tmp_path: Path) -> None:
    timeout = aiohttp.ClientTimeout(total=BOUND)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def ask(method: str, params: dict[str, Any]) -> Message:
            msg = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
            _, reply = await post(session, http_url, msg)
            return reply

        assert text_of(await ask("tools/call", {"name": "echo", "arguments": {"text": "y"}})) == (
            "ran echo: y"
        )
        assert code(await ask("tools/call", {"name": "echo", "arguments": {}})) == (
            codes.RATE_LIMITED
        )
        for case, method, params in CASES:
            assert code(await ask(method, params)) == codes.INVALID_PARAMS, case
        note = {**REQUEST_AS_NOTIFICATION, "params": {**REQUEST_AS_NOTIFICATION["params"]}}
        note["params"]["_meta"] = META
        status, reply = await post(session, http_url, note)
        assert status == 400
        assert code(reply) == codes.INVALID_REQUEST
        assert reply.get("id") is None
        await legacy_session_refuses(session, http_url)
        read = await ask("resources/read", {"uri": "file:///public/readme"})
        assert text_of(read) == "public text"
    expect_only_the_allowed(tmp_path)


async def legacy_session_refuses(session: aiohttp.ClientSession, url: str) -> None:
    """A 2025-11-25 session (streamable-http of that revision, Session Management) meets the
    same refusals, and its notification with a request method gets 400."""
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    info = {"name": "t", "version": "1"}
    opening = {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": info}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": opening}
    async with session.post(url, data=orjson.dumps(init), headers=base) as resp:
        assert resp.status == 200
        fields = {**base, "Mcp-Session-Id": resp.headers["Mcp-Session-Id"]}
    fields["MCP-Protocol-Version"] = LEGACY

    async def send(msg: Message) -> tuple[int, Message]:
        async with session.post(url, data=orjson.dumps(msg), headers=fields) as resp:
            body = await resp.read()
            return resp.status, orjson.loads(body) if body else {}

    await send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    for case, method, params in CASES:
        _, reply = await send({"jsonrpc": "2.0", "id": 2, "method": method, "params": params})
        assert code(reply) == codes.INVALID_PARAMS, case
    status, reply = await send(REQUEST_AS_NOTIFICATION)
    assert status == 400 and code(reply) == codes.INVALID_REQUEST
