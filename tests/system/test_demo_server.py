"""End-to-end tests for the bundled demo server, spoken to over real stdio pipes."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": VERSION,
    "io.modelcontextprotocol/clientCapabilities": {},
}
# Generous for a loaded CI box; only reached when the server misbehaves.
TIMEOUT = 5.0


class Server:
    """The demo server as a child process, with replies read on a thread so a hang times out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.demo.server"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def send_raw(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(orjson.dumps(message))

    def recv(self) -> dict[str, Any]:
        message: dict[str, Any] = orjson.loads(self.lines.get(timeout=TIMEOUT))
        return message

    def request(self, rid: int | str, method: str, **params: Any) -> dict[str, Any]:
        self.send(
            {"jsonrpc": "2.0", "id": rid, "method": method, "params": {"_meta": META, **params}}
        )
        reply = self.recv()
        assert reply["id"] == rid
        return reply

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=TIMEOUT)
        self.pump.join(timeout=TIMEOUT)  # so every line the server wrote is now in the queue
        return code

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.pump.join(timeout=TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    try:
        yield srv
        assert srv.close() == 0
    finally:
        srv.cleanup()


def error_code(reply: dict[str, Any]) -> int:
    code: int = reply["error"]["code"]
    return code


def test_discover(server: Server) -> None:
    result = server.request("d", "server/discover")["result"]
    assert result["resultType"] == "complete"
    assert result["supportedVersions"] == [VERSION]
    assert set(result["capabilities"]) == {"tools", "resources", "prompts"}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "mcp-gateway-demo"
    assert result["instructions"] and result["ttlMs"] >= 0 and result["cacheScope"] == "public"


def test_tools_list(server: Server) -> None:
    result = server.request(1, "tools/list")["result"]
    tools = {tool["name"]: tool for tool in result["tools"]}
    assert set(tools) == {"echo", "add", "sleep", "utc_now"}
    assert all(t["inputSchema"]["type"] == "object" and t["title"] for t in tools.values())
    assert "outputSchema" in tools["add"]
    assert "nextCursor" not in result and result["ttlMs"] >= 0 and "cacheScope" in result


def test_tool_calls(server: Server) -> None:
    echo = server.request(1, "tools/call", name="echo", arguments={"text": "hi"})["result"]
    assert echo["content"] == [{"type": "text", "text": "hi"}] and echo["isError"] is False
    add = server.request(2, "tools/call", name="add", arguments={"a": 2, "b": 40})["result"]
    assert add["structuredContent"] == {"sum": 42}
    bad = server.request(3, "tools/call", name="add", arguments={"a": "2", "b": 1})["result"]
    assert bad["isError"] is True and bad["resultType"] == "complete"
    now = server.request(4, "tools/call", name="utc_now", arguments={})["result"]
    assert now["content"][0]["text"].startswith("20")


def test_unknown_tool_is_protocol_error(server: Server) -> None:
    assert error_code(server.request(1, "tools/call", name="nope", arguments={})) == -32602


def test_version_and_meta_errors(server: Server) -> None:
    server.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/list",
            "params": {
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "1999-01-01",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }
            },
        }
    )
    reply = server.recv()
    assert error_code(reply) == -32022
    assert reply["error"]["data"] == {"supported": [VERSION], "requested": "1999-01-01"}
    server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}})
    assert error_code(server.recv()) == -32602
    server.send(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25"},
        }
    )
    assert error_code(server.recv()) == -32022
    assert error_code(server.request(4, "no/such/method")) == -32601


def test_malformed_json(server: Server) -> None:
    server.send_raw(b'{"jsonrpc": "2.0", "id": 1,')
    reply = server.recv()
    assert error_code(reply) == -32700 and "id" not in reply


def test_resources(server: Server) -> None:
    readme = server.request(1, "resources/read", uri="demo://readme")["result"]
    assert readme["contents"][0]["mimeType"] == "text/markdown" and "ttlMs" in readme
    echo = server.request(2, "resources/read", uri="demo://echo/hello%20world")["result"]
    assert echo["contents"][0]["text"] == "hello world"
    templates = server.request(3, "resources/templates/list")["result"]
    assert templates["resourceTemplates"][0]["uriTemplate"] == "demo://echo/{text}"
    missing = server.request(4, "resources/read", uri="demo://missing")
    assert error_code(missing) == -32602
    assert error_code(server.request(5, "resources/list", cursor="not-a-cursor")) == -32602


def test_prompts(server: Server) -> None:
    prompts = server.request(1, "prompts/list")["result"]["prompts"]
    assert prompts[0]["name"] == "summarize" and prompts[0]["arguments"][0]["required"]
    result = server.request(2, "prompts/get", name="summarize", arguments={"text": "abc"})
    messages = result["result"]["messages"]
    assert len(messages) == 1 and messages[0]["role"] == "user"
    assert messages[0]["content"]["text"].endswith("abc")
    assert error_code(server.request(3, "prompts/get", name="summarize")) == -32602


def test_sleep_reports_progress(server: Server) -> None:
    server.send(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "sleep",
                "arguments": {"seconds": 0.1},
                "_meta": {**META, "progressToken": "p"},
            },
        }
    )
    note = server.recv()
    assert note["method"] == "notifications/progress" and note["params"]["progressToken"] == "p"
    assert note["params"]["progress"] == note["params"]["total"] == 0.1
    assert server.recv()["result"]["content"][0]["text"].startswith("Slept")


def test_slow_call_does_not_block_and_can_be_cancelled() -> None:
    srv = Server()
    srv.send(
        {
            "jsonrpc": "2.0",
            "id": "slow",
            "method": "tools/call",
            "params": {"name": "sleep", "arguments": {"seconds": 30}, "_meta": META},
        }
    )
    # Answered while the sleep is still running.
    assert srv.request("fast", "tools/call", name="echo", arguments={"text": "x"})["result"]
    srv.send(
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}}
    )
    # Exits within the timeout only if the 30 s sleep was really stopped.
    try:
        assert srv.close() == 0
        assert srv.lines.empty()  # and nothing at all was sent for the cancelled request
    finally:
        srv.cleanup()
