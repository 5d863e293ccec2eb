"""The gateway the status page tests look at: the bundled demo server and a backend that cannot
start (its command's name is markup, so its error text is too), with the MCP listener and the
admin listener on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import anyio
import orjson
import yaml

from gateway.app import Gateway
from gateway.config import parse
from tests.support import BOUND, DEMO_STDIO, START_BOUND, call, mirrored_headers

# What a hostile or broken config could put in front of the page: shown as text, never run.
MARKUP = "<img src=x onerror=window.__pwned=1><script>window.__pwned=2</script>"
BROKEN_COMMAND = f"/nonexistent/{MARKUP}"
BACKENDS = ("demo", "broken")


def config_text() -> str:
    return yaml.safe_dump(
        {
            "listen": {
                "http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"},
                "admin": {"host": "127.0.0.1", "port": 0},
            },
            "backends": {"demo": DEMO_STDIO, "broken": {"stdio": {"command": BROKEN_COMMAND}}},
        },
        sort_keys=False,
    )


@asynccontextmanager
async def status_gateway() -> AsyncIterator[Gateway]:
    """Started, its catalogs loaded, and the broken backend known to be down."""
    async with Gateway(parse(config_text())) as gw:
        with anyio.fail_after(START_BOUND):
            await gw.catalogs_loaded.wait()
            await gw.health[1].wait(down=True)
        yield gw


async def call_echo(url: str, text: str = "hello") -> None:
    """One tools/call through the gateway's MCP listener to the demo backend (two backends: its
    tools are prefixed)."""
    msg = call(1, "demo_echo", text=text)
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
        ):
            assert resp.status == 200, await resp.text()
            reply = orjson.loads(await resp.read())
            assert reply["result"]["content"][0]["text"] == text, reply
