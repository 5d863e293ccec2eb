"""The entries `client-config` writes work: a host reading the file reaches the gateway, over
HTTP at the URL, on stdio through `connect URL`, and on stdio through `run --config FILE`
(the SDK client standing in for the host, started from the file as a host starts it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from click.testing import CliRunner
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from gateway.cli import main
from tests.support import (
    BOUND,
    DEMO_STDIO,
    PYTHON,
    ROOT,
    start_gateway_http,
    write_config,
)

pytestmark = pytest.mark.anyio
# How the host starts this checkout's gateway (an installed one would be its absolute path).
GATEWAY = f"{PYTHON} -m gateway"


@pytest.fixture
def gateway_url(tmp_path: Path) -> Iterator[str]:
    proc, url = start_gateway_http(write_config(tmp_path, {"demo": DEMO_STDIO}, http=True))
    yield url
    assert proc.stop() == 0, proc.output()


def written(host: str, file: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        main, ["client-config", host, "--file", str(file), "--command", GATEWAY, *args]
    )
    assert result.exit_code == 0, result.output
    servers = orjson.loads(file.read_bytes())["servers" if host == "vscode" else "mcpServers"]
    entry: dict[str, Any] = servers["gateway"]
    return entry


async def echo(server: StdioServerParameters | str) -> str:
    with anyio.fail_after(3 * BOUND):
        async with Client(server) as client:
            result = await client.call_tool("echo", {"text": "from the host"})
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def as_host_starts_it(entry: dict[str, Any]) -> StdioServerParameters:
    # (cwd: this checkout, whose gateway `-m gateway` must find)
    return StdioServerParameters(command=entry["command"], args=entry["args"], cwd=str(ROOT))


async def test_an_http_entry_reaches_the_gateway_at_its_url(
    gateway_url: str, tmp_path: Path
) -> None:
    entry = written("vscode", tmp_path / "mcp.json", "--url", gateway_url)
    assert entry["type"] == "http"
    assert "from the host" in await echo(entry["url"])


async def test_a_stdio_entry_reaches_the_gateway_through_connect(
    gateway_url: str, tmp_path: Path
) -> None:
    entry = written("claude-desktop", tmp_path / "claude.json", "--url", gateway_url)
    assert entry["args"][-2:] == ["connect", gateway_url]
    assert "from the host" in await echo(as_host_starts_it(entry))


async def test_a_config_entry_starts_a_whole_gateway_on_stdio(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"demo": DEMO_STDIO}, http=False, stdio=True)
    entry = written("cursor", tmp_path / "mcp.json", "--config", str(config))
    assert entry["args"][-3:] == ["run", "--config", str(config)]
    assert "from the host" in await echo(as_host_starts_it(entry))
