"""Tool search end to end (README "Tool search"): a gateway process with `tool_search: {mode:
"on"}` in front of the SDK test server and the reference server-everything, both over stdio,
and the official SDK client in both eras (basic/versioning) over Streamable HTTP. Each lists
the three meta-tools (server/tools, Listing Tools), finds tools of both backends by words,
reads one's definition, calls one through `_call_tool` with its progress (basic/utilities/
progress) and its elicitation (basic/patterns/mrtr; a legacy session's answered for it,
client/elicitation), and still calls a tool by its name; a name no tool has is -32602."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import yaml
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp_types import ElicitRequestFormParams, ElicitRequestParams, ElicitResult, TextContent

from tests.support import BOUND, VERSION, sdk_stdio_command, start_gateway_http, stdio_backend
from tests.support.conformance import npm_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

META = ["_search_tools", "_describe_tool", "_call_tool"]
INVALID_PARAMS = -32602


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    backends = {
        "sdk": stdio_backend(sdk_stdio_command()),
        "everything": stdio_backend([*npm_server("server-everything"), "stdio"]),
    }
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": backends,
        "tool_search": {"mode": "on"},
    }
    path = Path(tmp_path_factory.mktemp("search")) / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc, found = start_gateway_http(path)
    yield found
    proc.stop()


async def accept(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    assert isinstance(params, ElicitRequestFormParams)
    return ElicitResult(action="accept", content={"answer": "42"})


@asynccontextmanager
async def client(url: str, mode: str) -> AsyncIterator[Client]:
    with anyio.fail_after(6 * BOUND):
        async with Client(url, mode=mode, elicitation_callback=accept) as found:
            yield found


def text(result: Any) -> str:
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.mark.parametrize("mode", [VERSION, "legacy"])
async def test_a_client_finds_describes_and_calls_through_the_meta_tools(
    url: str, mode: str
) -> None:
    async with client(url, mode) as session:
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == META
        with anyio.fail_after(BOUND):
            found = await session.call_tool("_search_tools", {"query": "add two numbers"})
        names = [t["name"] for t in orjson.loads(text(found))["tools"]]
        assert {"sdk_add", "everything_get-sum"} <= set(names)
        described = await session.call_tool("_describe_tool", {"name": "sdk_slow"})
        definition = orjson.loads(text(described))
        assert definition["name"] == "sdk_slow"
        assert "seconds" in definition["inputSchema"]["properties"]

        seen: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)

        with anyio.fail_after(BOUND):
            slow = await session.call_tool(
                "_call_tool",
                {"name": "sdk_slow", "arguments": {"seconds": 0.1, "steps": 3}},
                progress_callback=on_progress,
            )
        assert text(slow) == "done" and seen == [1.0, 2.0, 3.0]
        with anyio.fail_after(BOUND):
            asked = await session.call_tool(
                "_call_tool", {"name": "sdk_ask", "arguments": {"question": "yes?"}}
            )
        assert text(asked) == "answer: 42"
        direct = await session.call_tool("sdk_echo", {"text": "by name"})
        assert text(direct) == "by name"
        # A tool with an x-mcp-header parameter (streamable-http, Routing Headers): the client
        # mirrors nothing for `_call_tool`'s arguments, and none is asked of it (an HTTP
        # backend gets them derived from the body it is sent).
        regional = {"name": "sdk_regional", "arguments": {"region": "eu-west", "query": "q"}}
        assert text(await session.call_tool("_call_tool", regional)) == "eu-west:q"
        with pytest.raises(MCPError) as caught:
            await session.call_tool("_call_tool", {"name": "sdk_nope"})
        assert caught.value.code == INVALID_PARAMS
