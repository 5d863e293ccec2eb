"""Lists from the catalog with the gateway as shipped (issue 34; server/utilities/caching,
"Cache Scope Field", "Interaction with Notifications"): two real Streamable HTTP servers on
127.0.0.1 count the tools/list requests that reach them; one says its lists are public for an
hour, the other private. After the gateway's catalog load, modern and legacy clients' lists
reach only the private one, the page says what is left of the public one's hour, and /metrics
counts the lists served from the catalog. Over a real pipe, a stdio server's list change makes
the next lists show its new list (its catalog loaded again), still from the catalog."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from mcp import Client

from tests.servers.listing_server import Listing
from tests.support import (
    BOUND,
    PYTHON,
    START_BOUND,
    http_backend,
    mirrored_headers,
    request,
    serve_http,
    start_gateway_http,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.anyio]

HOUR = 3_600_000


async def post(http: aiohttp.ClientSession, url: str, msg: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        assert resp.status == 200, await resp.text()
        reply: dict[str, Any] = orjson.loads(await resp.read())
    return reply


async def test_lists_reach_only_the_backend_whose_hints_do_not_allow_the_catalog(
    tmp_path: Path,
) -> None:
    public = Listing({"ttlMs": HOUR, "cacheScope": "public"})
    private = Listing({"ttlMs": HOUR, "cacheScope": "private"})
    async with serve_http(public.handle) as pub, serve_http(private.handle) as priv:
        backends = {"pub": http_backend(f"{pub}/mcp"), "priv": http_backend(f"{priv}/mcp")}
        config = write_config(tmp_path, backends, http=True)
        proc, url = await anyio.to_thread.run_sync(start_gateway_http, config)
        try:
            for name in ("pub", "priv"):  # (logged once its catalog is in place)
                await anyio.to_thread.run_sync(proc.wait_for, rf"catalog of {name}: 1 tools")
            assert (public.lists, private.lists) == (1, 1)
            with anyio.fail_after(START_BOUND):
                async with aiohttp.ClientSession() as http:
                    pages = [await post(http, url, request(i, "tools/list")) for i in (1, 2)]
                    base = re.match(r"https?://[^/]+", url)
                    assert base is not None
                    async with http.get(base.group(0) + "/metrics") as resp:
                        metrics = await resp.text()
                async with Client(url, mode="legacy") as legacy:
                    listed = await legacy.list_tools()
        finally:
            proc.stop()
    for page in pages:
        result = page["result"]
        assert sorted(t["name"] for t in result["tools"]) == ["priv_echo", "pub_echo"]
        assert result["cacheScope"] == "private"  # (the private part's)
        assert result["ttlMs"] <= HOUR
    assert sorted(t.name for t in listed.tools) == ["priv_echo", "pub_echo"]
    # The catalog load's request alone reached the public one; each list reached the other.
    assert (public.lists, private.lists) == (1, 1 + 3)
    assert 'mcp_gateway_lists_from_catalog_total{backend="pub"} 2.0' in metrics
    assert 'mcp_gateway_lists_from_catalog_total{backend="priv"} 0.0' in metrics


async def test_a_lone_public_backend_is_listed_with_what_is_left_of_its_ttl(
    tmp_path: Path,
) -> None:
    """One backend, unprefixed, shown as itself (0015): its page from the catalog is public,
    fresh for no longer than the backend said, and the backend is not asked."""
    public = Listing({"ttlMs": HOUR, "cacheScope": "public"})
    async with serve_http(public.handle) as pub:
        config = write_config(tmp_path, {"pub": http_backend(f"{pub}/mcp")}, http=True)
        proc, url = await anyio.to_thread.run_sync(start_gateway_http, config)
        try:
            await anyio.to_thread.run_sync(proc.wait_for, r"catalog of pub: 1 tools")
            with anyio.fail_after(BOUND):
                async with aiohttp.ClientSession() as http:
                    page = await post(http, url, request(1, "tools/list"))
        finally:
            proc.stop()
    result = page["result"]
    assert [t["name"] for t in result["tools"]] == ["echo"]
    assert result["cacheScope"] == "public" and HOUR - 60_000 < result["ttlMs"] <= HOUR
    assert public.lists == 1


async def test_a_stdio_servers_list_change_is_seen_by_the_next_list_from_the_catalog(
    tmp_path: Path,
) -> None:
    """bench/echo.py lists public for an hour; its `relist` tool changes one tool's description
    and sends notifications/tools/list_changed on the pipe: the gateway loads its catalog again,
    and lists show the new description, served from the catalog before and after."""
    echo = stdio_backend([PYTHON, "-m", "bench.echo", "--stdio", "--tools", "1"])
    config = write_config(tmp_path, {"echo": echo}, http=True)
    proc, url = await anyio.to_thread.run_sync(start_gateway_http, config)

    def loads(count: int) -> None:
        """Until the echo's catalog has been loaded `count` times (each load logs its line)."""
        proc.wait_lines(lambda lines: sum("catalog of echo: " in x for x in lines) >= count)

    try:
        await anyio.to_thread.run_sync(loads, 1)
        with anyio.fail_after(START_BOUND):
            async with aiohttp.ClientSession() as http:
                before = await post(http, url, request(1, "tools/list"))
                changed = await post(http, url, request(2, "tools/call", {"name": "relist"}))
                await anyio.to_thread.run_sync(loads, 2)
                after = await post(http, url, request(3, "tools/list"))
                base = re.match(r"https?://[^/]+", url)
                assert base is not None
                async with http.get(base.group(0) + "/metrics") as resp:
                    metrics = await resp.text()
    finally:
        proc.stop()
    assert "error" not in changed, changed

    def described(page: dict[str, Any]) -> list[str]:
        return [str(t.get("description")) for t in page["result"]["tools"]]

    assert not any(d.startswith("generation") for d in described(before))
    assert "generation 1" in described(after)
    assert 'mcp_gateway_lists_from_catalog_total{backend="echo"} 2.0' in metrics
