"""A replica's start with `cluster.redis`: its own listens on the backends (core/changes.py's
watch) begin with the gateway, before the backends' transports have started; they wait for the
start instead of finding the backend "not started" and marking it down, so the replica's first
requests are served (not -31001 for about a second: the official SDK client then falls back to
`initialize`, and a rolling restart sheds requests). A real `redis-server` on a free loopback
port; an HTTP backend on 127.0.0.1 (basic/patterns/subscriptions, basic/index "Error Codes").
"""

from __future__ import annotations

import logging

import aiohttp
import anyio
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from tests.backends.faults.test_http_faults import healthy, post
from tests.support import START_BOUND, call, request, serve_http
from tests.support.redis_server import redis_url

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "cluster-start-secret-Hq3Zr8Lw2Nx6Tp4V"


async def serve_and_check(text: str, tool: str, caplog: pytest.LogCaptureFixture) -> None:
    """A replica's first call and list are served, and its backend is never marked down."""
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw, aiohttp.ClientSession() as session:
            assert gw.http_url is not None
            reply = await post(session, gw.http_url, call(1, tool, text="hi"))
            assert "result" in reply, reply
            listed = await post(session, gw.http_url, request(2, "tools/list"))
            assert tool in [t["name"] for t in listed["result"]["tools"]]
            assert gw.bus is not None
            await gw.bus.ready.wait()
            assert not gw.health[0].down
    downs = [r.getMessage() for r in caplog.records if "down (" in r.getMessage()]
    assert not downs


def replica(redis_port: int, backend: dict[str, object]) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"b": backend},
            "cluster": {"secrets": [SECRET], "redis": redis_url(redis_port)},
        }
    )


async def test_a_replica_serves_its_first_requests_over_streamable_http(
    redis_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "gateway")
    async with serve_http(healthy) as base:
        backend: dict[str, object] = {"http": {"url": f"{base}/mcp"}, "era": "modern"}
        await serve_and_check(replica(redis_port, backend), "echo", caplog)
