"""The policy on the HTTP front end (without authentication every caller is anonymous): a hidden
tool's `x-mcp-header` annotations are not checked against a call's Mcp-Param-* headers
(streamable-http, Request Metadata), so calling it is refused as an unknown tool is (server/tools,
Error Handling), never as a header mismatch that would tell the tool exists."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.support import (
    BOUND,
    call,
    mirrored_headers,
    request,
    sdk_stdio_command,
    start_gateway_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": {"sdk": stdio_backend(sdk_stdio_command())},
        "policy": {"rules": [{"deny": {"tools": ["regional"]}}]},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc, found = start_gateway_http(path)
    yield found
    proc.stop()


async def test_a_hidden_tools_mirrored_headers_are_not_checked(url: str) -> None:
    timeout = aiohttp.ClientTimeout(total=4 * BOUND)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        listed = request("l", "tools/list")
        async with http.post(url, json=listed, headers=mirrored_headers(listed)) as resp:
            names = [t["name"] for t in (await resp.json())["result"]["tools"]]
        assert "echo" in names and "regional" not in names
        hidden = call("r", "regional", region="eu", query="q")
        # No Mcp-Param-Region: for a tool the caller may see, a header mismatch (-32020).
        async with http.post(url, json=hidden, headers=mirrored_headers(hidden)) as resp:
            reply = await resp.json()
        assert reply["error"]["code"] == -32602
        assert reply["error"]["message"] == "Unknown tool: regional"
