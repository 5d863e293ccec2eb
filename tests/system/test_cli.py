"""The one-backend commands and the bundled demo, each as a real process with the SDK client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp_types import TextContent

from tests.support import BOUND, PYTHON, ROOT, Proc, sdk_stdio_command

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def echo_through(server: StdioServerParameters | str, tool: str = "echo") -> str:
    with anyio.fail_after(3 * BOUND):
        async with Client(server) as client:
            result = await client.call_tool(tool, {"text": "through"})
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.fixture
def exposed() -> Iterator[str]:
    proc = Proc([PYTHON, "-m", "gateway", "expose", "--port", "0", "--", *sdk_stdio_command()])
    url = proc.wait_for(r"listening on (http://\S+)").group(1)
    yield url
    assert proc.stop() == 0, proc.output()


async def test_expose_serves_a_stdio_server_over_http(exposed: str) -> None:
    assert await echo_through(exposed) == "through"


async def test_connect_serves_a_remote_http_server_on_stdio(sdk_http: str) -> None:
    server = StdioServerParameters(
        command=PYTHON, args=["-m", "gateway", "connect", sdk_http, "-H", "X-Team: blue"]
    )
    assert await echo_through(server) == "through"


async def test_run_serves_the_bundled_demo(tmp_path: Path) -> None:
    demo = (ROOT / "gateway" / "demo" / "config.yaml").read_text()
    config = tmp_path / "demo.yaml"
    config.write_text(demo.replace("port: 8080", "port: 0"))
    proc = Proc([PYTHON, "-m", "gateway", "run", "--config", str(config)])
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        assert await echo_through(url) == "through"
    finally:
        assert proc.stop() == 0, proc.output()


def test_expose_names_its_backend_after_the_command() -> None:
    """`expose -- python …/sdk_server.py stdio`: the backend (in logs, metrics and errors) is
    `sdk_server`, the server's own name, not the launcher's."""
    proc = Proc([PYTHON, "-m", "gateway", "expose", "--port", "0", "--", *sdk_stdio_command()])
    try:
        proc.wait_for(r"listening on http://")
        proc.wait_for(r"backend sdk_server\b")
    finally:
        assert proc.stop() == 0, proc.output()
