"""Namespacing policies of the merged server: filters and renames, prefix modes, fan-out failure
policies, shortened names, cursors, host config import. In-process gateway, SDK client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import yaml
from mcp import Client, MCPError

from gateway.app import Gateway, StartupError
from gateway.config import parse
from gateway.core import catalog as catalog_module
from tests.support import (
    PYTHON,
    START_BOUND,
    Proc,
    dead_url,
    http_backend,
    sdk_stdio_command,
    stdio_backend,
    tool_names,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DEMO = [PYTHON, "-m", "gateway.demo.server"]


def config_text(backends: dict[str, Any], **top: Any) -> str:
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    return yaml.safe_dump({"listen": listen, "backends": backends, **top})


@asynccontextmanager
async def merged(backends: dict[str, Any], **top: Any) -> AsyncIterator[Client]:
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(config_text(backends, **top))) as gw:
            assert gw.http_url is not None
            async with Client(gw.http_url) as client:
                yield client


def text(result: Any) -> str:
    return str(result.content[0].text)


async def test_filters_and_renames_shape_the_merged_catalog() -> None:
    """A filtered tool is absent from lists and refused as unknown; a renamed one answers."""
    sdk = stdio_backend(
        sdk_stdio_command(),
        tools={"allow": ["echo", "label", "t0*"], "deny": ["t05"]},
        rename={"echo": "say"},
    )
    async with merged({"alpha": sdk, "demo": stdio_backend(DEMO)}) as client:
        names = await tool_names(client)
        alpha = [n for n in names if n.startswith("alpha_")]
        assert alpha == ["alpha_say", "alpha_label"] + [f"alpha_t0{i}" for i in range(10) if i != 5]
        assert text(await client.call_tool("alpha_say", {"text": "renamed"})) == "renamed"
        for hidden in ("alpha_echo", "alpha_t05", "alpha_add"):
            with pytest.raises(MCPError) as caught:
                await client.call_tool(hidden, {"text": "x", "a": 1, "b": 2})
            assert caught.value.code == -32602


async def test_prefix_always_namespaces_even_a_single_backend() -> None:
    namespacing = {"prefix": "always", "separator": "."}
    async with merged({"demo": stdio_backend(DEMO)}, namespacing=namespacing) as client:
        assert await tool_names(client) == ["demo.echo", "demo.add", "demo.sleep", "demo.utc_now"]
        assert text(await client.call_tool("demo.echo", {"text": "dot"})) == "dot"
        read = await client.read_resource("mcp-gateway://demo/demo://readme")
        assert str(read.contents[0].uri) == "mcp-gateway://demo/demo://readme"


async def test_prefix_never_keeps_names_when_they_are_unique() -> None:
    sdk = stdio_backend(sdk_stdio_command(), tools={"allow": ["label"]})
    backends = {"alpha": sdk, "demo": stdio_backend(DEMO)}
    async with merged(backends, namespacing={"prefix": "never"}) as client:
        assert await tool_names(client) == ["label", "echo", "add", "sleep", "utc_now"]
        assert text(await client.call_tool("label")) == "sdk"
        assert text(await client.call_tool("echo", {"text": "demo's"})) == "demo's"


async def test_prefix_never_with_a_collision_refuses_to_start() -> None:
    backends = {"alpha": stdio_backend(sdk_stdio_command()), "demo": stdio_backend(DEMO)}
    text_ = config_text(backends, namespacing={"prefix": "never"})
    with pytest.raises(StartupError) as caught, anyio.fail_after(START_BOUND):
        async with Gateway(parse(text_)):
            pass
    assert "'alpha'" in str(caught.value) and "'demo'" in str(caught.value)


async def test_long_names_are_shortened_and_still_route() -> None:
    namespace = "a-namespace-that-is-far-too-long-for-comfort"
    backend = stdio_backend(DEMO, namespace=namespace)
    top = {"namespacing": {"prefix": "always", "max_name_length": 32}}
    async with merged({"demo": backend}, **top) as client:
        tools = (await client.list_tools()).tools
        names = [t.name for t in tools]
        assert len(set(names)) == 4 and all(len(n) <= 32 for n in names)
        assert all(n.startswith(namespace[:16]) for n in names)
        echo = next(t.name for t in tools if t.title == "Echo")
        assert text(await client.call_tool(echo, {"text": "short"})) == "short"


@pytest.mark.parametrize("policy", ["fail_open", "fail_closed"])
async def test_a_backend_that_is_down_under_each_failure_policy(policy: str) -> None:
    backends = {"demo": stdio_backend(DEMO), "down": http_backend(dead_url(), connect_timeout=0.5)}
    text_ = config_text(backends, fan_out={"on_failure": policy})
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text_)) as gw:
            listed = await gw.dispatcher.handle(_request("tools/list"), _ignore)
            discovered = await gw.dispatcher.handle(_request("server/discover"), _ignore)
            echo = {"name": "demo_echo", "arguments": {"text": "up"}}
            called = await gw.dispatcher.handle(_request("tools/call", echo), _ignore)
    if policy == "fail_open":
        names = [t["name"] for t in listed["result"]["tools"]]
        assert names == ["demo_echo", "demo_add", "demo_sleep", "demo_utc_now"]
        assert gw.dispatcher.fan_out_failures["down"] >= 1
    else:
        assert listed["error"]["code"] == -31001
    # Discovery answers under both policies, and the healthy backend's calls are unaffected.
    assert "tools" in discovered["result"]["capabilities"]
    assert called["result"]["content"][0]["text"] == "up"


async def test_a_cursor_is_only_good_for_its_own_list() -> None:
    backends = {
        "alpha": stdio_backend(sdk_stdio_command("--page-size", "3")),
        "demo": stdio_backend(DEMO),
    }
    async with merged(backends) as client:
        first = await client.list_tools()
        assert first.next_cursor is not None
        for misuse in (
            client.list_prompts(cursor=first.next_cursor),
            client.list_tools(cursor=first.next_cursor[:-1] + "x"),
            client.list_tools(cursor="forged"),
        ):
            with pytest.raises(MCPError) as caught:
                await misuse
            assert caught.value.code == -32602


async def test_merged_cache_hints_take_the_strictest_part() -> None:
    """caching: the smallest ttlMs; public only if every part is public. A part taken from a
    loaded catalog says what is left of the backend's hour (core/fanout.py)."""
    with anyio.fail_after(START_BOUND):
        async with Gateway(
            parse(config_text({"d1": stdio_backend(DEMO), "d2": stdio_backend(DEMO)}))
        ) as gw:
            public = await gw.dispatcher.handle(_request("tools/list"), _ignore)
        backends = {"demo": stdio_backend(DEMO), "sdk": stdio_backend(sdk_stdio_command())}
        async with Gateway(parse(config_text(backends))) as gw:
            mixed = await gw.dispatcher.handle(_request("tools/list"), _ignore)
    assert 3_540_000 < public["result"]["ttlMs"] <= 3_600_000
    assert public["result"]["cacheScope"] == "public"
    assert (mixed["result"]["ttlMs"], mixed["result"]["cacheScope"]) == (0, "private")


def _request(method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }


async def _ignore(_: dict[str, Any]) -> None:
    return None


async def test_run_serves_the_servers_of_a_host_mcp_json(tmp_path: Path) -> None:
    """`mcp-transparent-gateway run --mcp-json FILE`: the mcpServers a desktop host already has."""
    mcp_json = tmp_path / "mcp.json"
    command = sdk_stdio_command("--label", "from-json")
    servers = {
        "fromjson": {"command": command[0], "args": command[1:]},
        "demo": {"command": DEMO[0], "args": DEMO[1:], "env": {"X": "1"}},
    }
    mcp_json.write_bytes(orjson.dumps({"mcpServers": servers}))
    config = tmp_path / "listen.yaml"
    config.write_text(yaml.safe_dump({"listen": {"http": {"host": "127.0.0.1", "port": 0}}}))
    proc = Proc(
        [PYTHON, "-m", "gateway", "run", "--config", str(config), "--mcp-json", str(mcp_json)]
    )
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        with anyio.fail_after(START_BOUND):
            async with Client(url) as client:
                assert text(await client.call_tool("fromjson_label")) == "from-json"
                assert text(await client.call_tool("demo_echo", {"text": "j"})) == "j"
    finally:
        assert proc.stop() == 0, proc.output()


def test_duplicate_namespaces_are_a_config_error_naming_both(tmp_path: Path) -> None:
    backends = {
        "one": stdio_backend(DEMO, namespace="shared"),
        "two": stdio_backend(DEMO, namespace="shared"),
    }
    path = tmp_path / "dup.yaml"
    path.write_text(config_text(backends))
    proc = Proc([PYTHON, "-m", "gateway", "check-config", str(path)])
    assert proc.popen.wait(START_BOUND) == 2
    proc.wait_for(r"backends\.two: namespace 'shared' is already used by backend 'one'")
    proc.stop()


async def test_catalog_is_reused_while_fresh_and_refetched_when_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's lists say ttlMs one hour, the SDK server's say 0: a miss refetches only the
    stale one; a list change from a backend makes its catalog stale at once. A miss refetches
    only the catalogs the name can be in (by its namespace): none for a name of no namespace."""
    monkeypatch.setattr(catalog_module, "MIN_REFRESH_INTERVAL", 0.0)
    backends = {"demo": stdio_backend(DEMO), "sdk": stdio_backend(sdk_stdio_command())}

    def unknown(name: str) -> dict[str, Any]:
        return _request("tools/call", {"name": name, "arguments": {}})

    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(config_text(backends))) as gw:
            catalogs = gw.dispatcher.catalogs
            await gw.catalogs_loaded.wait()  # (served while they load: prefix mode auto)
            assert catalogs.refreshes == {"demo": 1, "sdk": 1}
            for name in ("demo_x", "sdk_x", "nobody_x"):
                reply = await gw.dispatcher.handle(unknown(name), _ignore)
                assert reply["error"]["code"] == -32602
            assert catalogs.refreshes == {"demo": 1, "sdk": 2}
            change = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
            gw.dispatcher.backend_notification("demo", change)
            await gw.dispatcher.handle(unknown("demo_x"), _ignore)
            assert catalogs.refreshes == {"demo": 2, "sdk": 2}
