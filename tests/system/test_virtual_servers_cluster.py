"""Virtual servers in a cluster (issue 33, README "Running several replicas"): two replicas
sharing Redis and `cluster.secrets`. A virtual server's listen on one replica hears a list
change made through the other (its listens follow the merged server's on the bus), and what a
server signs (cursors) is good on the other replica's same server, and only there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, MCPError
from mcp.client.subscriptions import ToolsListChanged

from gateway.app import Gateway
from gateway.protocol import codes
from tests.cluster.test_cluster_changes import SECRET, Heard, redis, replicas_of, until_heard
from tests.support import Proc, sdk_stdio_command, stdio_backend
from tests.support.redis_server import redis_url

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

__all__ = ["redis"]  # (the fixture, imported)


def config_text(redis_port: int) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {
                "sdk": stdio_backend(sdk_stdio_command("--page-size", "3")),
                "other": stdio_backend(sdk_stdio_command("--label", "o")),
            },
            "cluster": {
                "secrets": [SECRET],
                "redis": redis_url(redis_port),
                "redis_retry_interval": 0.1,
            },
            "servers": {
                "docs": {"backends": {"sdk": {}}},
                "ops": {"backends": {"sdk": {}, "other": {"tools": ["echo"]}}},
            },
        }
    )


@asynccontextmanager
async def replicas(port: int) -> AsyncIterator[tuple[Gateway, Gateway]]:
    async with replicas_of(config_text(port)) as both:
        yield both


def at(gw: Gateway, path: str) -> str:
    assert gw.http_url is not None
    return gw.http_url.removesuffix("/mcp") + path


async def test_a_virtual_servers_listen_hears_a_change_made_on_the_other_replica(
    redis: tuple[int, list[Proc]],
) -> None:
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        Client(at(a, "/mcp/docs")) as on_a,
        Client(at(b, "/mcp/docs")) as on_b,
        on_a.listen(tools_list_changed=True) as sub,
        anyio.create_task_group() as tg,
    ):
        heard = Heard()
        tg.start_soon(heard.read, sub)
        await until_heard(
            lambda: on_b.call_tool("change_tools", {}),
            heard.arrival,
            lambda: any(isinstance(e, ToolsListChanged) for e in heard.seen),
        )
        tg.cancel_scope.cancel()


async def test_a_cursor_is_good_on_the_same_server_of_another_replica_only(
    redis: tuple[int, list[Proc]],
) -> None:
    """Keys derived per server from cluster.secrets: a page of docs continues on the other
    replica's docs; the other replica's ops refuses it (-32602)."""
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        Client(at(a, "/mcp/docs")) as docs_a,
        Client(at(b, "/mcp/docs")) as docs_b,
        Client(at(b, "/mcp/ops")) as ops_b,
    ):
        first = await docs_a.list_tools()
        assert first.next_cursor is not None
        rest: Any = await docs_b.list_tools(cursor=first.next_cursor)
        assert rest.tools and {t.name for t in rest.tools}.isdisjoint(t.name for t in first.tools)
        with pytest.raises(MCPError) as refused:
            await ops_b.list_tools(cursor=first.next_cursor)
        assert refused.value.error.code == codes.INVALID_PARAMS
