"""subscriptions/listen on the merged server: two backends of different transports, namespaced
resource URIs, re-subscription after a backend restart, catalog invalidation by list changes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, MCPError
from mcp.client.subscriptions import ResourceUpdated, ToolsListChanged

from gateway.app import Gateway
from gateway.config import parse
from gateway.core import catalog as catalog_module
from tests.support import (
    BOUND,
    START_BOUND,
    http_backend,
    sdk_stdio_command,
    start_sdk_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ALPHA_MOTD = "mcp-gateway://alpha/mem://motd"
BETA_MOTD = "mcp-gateway://beta/mem://motd"


@pytest.fixture(scope="module")
def beta_url() -> Iterator[str]:
    proc, url = start_sdk_http("--label", "b")
    yield url
    proc.stop()


@asynccontextmanager
async def merged_client(beta_url: str) -> AsyncIterator[tuple[Gateway, Client]]:
    backends = {
        "alpha": stdio_backend(sdk_stdio_command("--label", "a")),
        "beta": http_backend(beta_url),
    }
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": backends}
    )
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            async with Client(gw.http_url) as client:
                yield gw, client


async def next_event(sub: Any) -> Any:
    with anyio.fail_after(BOUND):
        return await sub.__anext__()


async def test_updates_from_both_backends_arrive_namespaced(beta_url: str) -> None:
    async with (
        merged_client(beta_url) as (_, client),
        client.listen(
            tools_list_changed=True, resource_subscriptions=[ALPHA_MOTD, BETA_MOTD]
        ) as sub,
    ):
        assert sub.honored.tools_list_changed
        assert set(sub.honored.resource_subscriptions or ()) == {ALPHA_MOTD, BETA_MOTD}
        events = sub.__aiter__()
        await client.call_tool("alpha_touch", {"uri": "mem://motd"})
        assert await next_event(events) == ResourceUpdated(uri=ALPHA_MOTD)
        await client.call_tool("beta_touch", {"uri": "mem://motd"})
        assert await next_event(events) == ResourceUpdated(uri=BETA_MOTD)
        await client.call_tool("beta_change_tools", {})
        assert isinstance(await next_event(events), ToolsListChanged)


async def test_a_restarted_backend_is_listened_to_again(beta_url: str) -> None:
    async with (
        merged_client(beta_url) as (_, client),
        client.listen(resource_subscriptions=[ALPHA_MOTD, BETA_MOTD]) as sub,
    ):
        events = sub.__aiter__()
        pid = int((await client.call_tool("alpha_whoami")).content[0].text)  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)
        # A backend that ends its stream on purpose is listened to again as well.
        await client.call_tool("beta_close_listens", {})
        # Touch until both updates come through: until the child is back and both backends
        # are listened to again, a touch can fail or go unheard.
        seen: set[Any] = set()
        with anyio.fail_after(START_BOUND):
            while seen != {ResourceUpdated(uri=ALPHA_MOTD), ResourceUpdated(uri=BETA_MOTD)}:
                for tool in ("alpha_touch", "beta_touch"):
                    with contextlib.suppress(MCPError):
                        await client.call_tool(tool, {"uri": "mem://motd"})
                with anyio.move_on_after(0.5):
                    while len(seen) < 2:
                        seen.add(await events.__anext__())
        new_pid = int((await client.call_tool("alpha_whoami")).content[0].text)  # type: ignore[union-attr]
        assert new_pid != pid


async def test_a_list_change_makes_the_catalog_stale(
    beta_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the refresh interval long, only the list-change notification lets a new tool route."""
    monkeypatch.setattr(catalog_module, "MIN_REFRESH_INTERVAL", 3600.0)
    async with (
        merged_client(beta_url) as (gw, client),
        client.listen(tools_list_changed=True) as sub,
    ):
        events = sub.__aiter__()
        before = gw.dispatcher.catalogs.refreshes["alpha"]
        await client.call_tool("alpha_change_tools", {"toggle": True})  # adds tool `dummy`
        assert isinstance(await next_event(events), ToolsListChanged)
        assert gw.dispatcher.catalogs.table.tool("alpha_dummy") is None
        route = await gw.dispatcher.param_headers("alpha_dummy")
        assert route is not None
        assert gw.dispatcher.catalogs.refreshes["alpha"] == before + 1
