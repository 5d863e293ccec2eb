"""A start that must reach its backends (`app.run(must_reach=True)`, what `connect` and
`expose` ask for; app/reach.py `MustReach`): the gateway serves once each backend's first catalog
load has ended, and a backend that is down by then, or refused that load, stops the start with
`Unreachable` and its reason. Without it, nothing changes: a config's backend that is down is
served around and retried. Real children and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import pytest
import yaml
from aiohttp import web

from gateway.app import Gateway, Unreachable
from gateway.app.reach import MustReach
from gateway.config import Config, parse
from tests.support import DEMO_STDIO, PYTHON, START_BOUND, dead_url, serve_http, stdio_backend

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

EXITS = stdio_backend([PYTHON, "-c", "import sys; sys.stderr.write('no key\\n'); sys.exit(3)"])


def config(backend: Mapping[str, object]) -> Config:
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    return parse(yaml.safe_dump({"listen": listen, "backends": {"only": dict(backend)}}))


async def start(
    backend: Mapping[str, object], *, must_reach: bool, until_down: bool = False
) -> Gateway:
    """The gateway started (and, `until_down`, its backend found down) and stopped again."""
    with anyio.fail_after(START_BOUND):
        async with (MustReach if must_reach else Gateway)(config(backend)) as gw:
            if until_down:
                await gw.health[0].wait(down=True)
            return gw


async def test_a_child_that_exits_at_once_stops_the_start_with_its_stderr() -> None:
    with pytest.raises(Unreachable) as stopped:
        await start(EXITS, must_reach=True)
    assert stopped.value.backend == "only" and not stopped.value.answered
    assert "exited with code 3" in stopped.value.reason and "no key" in stopped.value.reason


async def test_a_url_nobody_listens_at_stops_the_start() -> None:
    with pytest.raises(Unreachable) as stopped:
        await start({"http": {"url": dead_url()}}, must_reach=True)
    assert "cannot connect" in stopped.value.reason


async def test_a_server_error_is_an_answer_that_stops_the_start() -> None:
    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    async with serve_http(broken) as origin:
        with pytest.raises(Unreachable) as stopped:
            await start({"http": {"url": f"{origin}/mcp"}}, must_reach=True)
    assert stopped.value.answered and "HTTP 500" in stopped.value.reason


async def test_a_refused_first_load_stops_the_start_as_an_answer() -> None:
    """A server that answers every request with a JSON-RPC error is reached: what stops the
    start is its answer (basic/lifecycle: the first lists fail)."""

    async def refusing(request: web.Request) -> web.Response:
        msg = await request.json()
        error = {"code": -32603, "message": "not today"}
        return web.json_response({"jsonrpc": "2.0", "id": msg.get("id"), "error": error})

    async with serve_http(refusing) as origin:
        with pytest.raises(Unreachable) as stopped:
            await start({"http": {"url": f"{origin}/mcp"}}, must_reach=True)
    assert stopped.value.answered and "not today" in stopped.value.reason


async def test_a_backend_that_serves_is_served_with_its_catalog_loaded() -> None:
    gw = await start(DEMO_STDIO, must_reach=True)
    assert gw.catalogs_loaded.is_set()


async def test_without_it_a_down_backend_does_not_stop_the_start() -> None:
    gw = await start(EXITS, must_reach=False, until_down=True)
    assert gw.http_url is not None and gw.health[0].down
