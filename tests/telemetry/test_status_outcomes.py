"""How requests that end because their client went away are counted (issue 30): not as errors of
the backends they reached, on the status page (`/status.json`) or in the duration histograms,
and long-lived streams (a listen, which also feeds a legacy session's GET stream) never feed a
latency. Against a real gateway in this process with the SDK test server over stdio, read over
the real admin listener.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from tests.frontends.test_http_transport_rules import send
from tests.frontends.test_legacy_sessions import SESSION, open_session
from tests.support import (
    BOUND,
    START_BOUND,
    call,
    messages,
    mirrored_headers,
    request,
    sdk_stdio_command,
    stdio_backend,
    until,
)

pytestmark = pytest.mark.anyio

Message = dict[str, Any]
ACKNOWLEDGED = "notifications/subscriptions/acknowledged"
PROGRESS = "notifications/progress"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def gw() -> AsyncIterator[Gateway]:
    text = yaml.safe_dump(
        {
            "listen": {
                "http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"},
                "admin": {"host": "127.0.0.1", "port": 0},
            },
            "backends": {"sdk": stdio_backend(sdk_stdio_command())},
        }
    )
    async with Gateway(parse(text)) as running:
        with anyio.fail_after(START_BOUND):
            await running.catalogs_loaded.wait()
        yield running


def url(gw: Gateway) -> str:
    assert gw.http_url is not None
    return gw.http_url


async def fetch(gw: Gateway, path: str) -> bytes:
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{gw.admin_url}{path}") as resp,
        ):
            assert resp.status == 200
            return await resp.read()


async def sdk_status(gw: Gateway) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The sdk backend's numbers on /status.json, and the recent errors of it."""
    page = orjson.loads(await fetch(gw, "/status.json"))
    (backend,) = [b for b in page["backends"] if b["name"] == "sdk"]
    errors = [e for e in page["recent_errors"] if e["backend"] == "sdk"]
    return backend, errors


def numbers(backend: dict[str, Any]) -> tuple[int, int, Any]:
    """(requests, errors, last error) of a backend over the page's window."""
    return int(backend["requests"]), int(backend["errors"]), backend["last_error"]


async def first_message(url: str, msg: Message, method: str) -> None:
    """POST `msg`, read its SSE stream up to the first notification `method`, then close the
    stream: the client goes away in the middle of its request."""
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp,
        ):
            async for item in messages(resp):
                assert item.get("method") == method, item
                return
    raise AssertionError(f"no {method} on the stream")


async def settled(gw: Gateway) -> None:
    """Until no client request is in flight: the one whose client left has ended (its backend
    requests ended before it, within its task group)."""
    stats = gw.telemetry.stats
    await until(lambda: stats.in_flight["http"] == 0)


async def test_a_listen_closed_by_its_client_is_no_backend_error_and_no_latency(
    gw: Gateway,
) -> None:
    """basic/patterns/subscriptions, streamable-http Cancellation: a client that closes its
    listen stream ends its subscription; the backend's listen the gateway held for it is
    cancelled, which is not the backend's error, and a stream's lifetime is no latency (it
    entered neither the status page's series nor the duration histograms)."""
    before, _ = await sdk_status(gw)
    await first_message(
        url(gw),
        request(1, "subscriptions/listen", {"notifications": {"toolsListChanged": True}}),
        ACKNOWLEDGED,
    )
    await settled(gw)
    after, errors = await sdk_status(gw)
    assert errors == []
    assert numbers(after) == numbers(before)
    metrics = (await fetch(gw, "/metrics")).decode()
    assert 'mcp_method_name="subscriptions/listen"' not in metrics


async def test_a_call_whose_client_left_is_cancelled_not_a_backend_error(gw: Gateway) -> None:
    """streamable-http, Cancellation: closing the SSE response stream cancels the request; the
    backend's part is counted as `cancelled` (its own outcome in the histograms), not as an
    error of the backend on the status page."""
    await first_message(url(gw), call(2, "hold", token="t", key="left"), PROGRESS)
    await settled(gw)
    async with aiohttp.ClientSession() as session:
        msg = call(3, "was_cancelled", key="left")
        async with session.post(
            url(gw), data=orjson.dumps(msg), headers=mirrored_headers(msg)
        ) as resp:
            replies = [item async for item in messages(resp) if "id" in item]
    assert replies[-1]["result"]["content"][0]["text"] == "cancelled"
    backend, errors = await sdk_status(gw)
    assert errors == []
    assert numbers(backend)[1:] == (0, None)
    metrics = (await fetch(gw, "/metrics")).decode()
    held = [
        line
        for line in metrics.splitlines()
        if line.startswith("mcp_client_operation_duration_seconds_count")
        and 'target="hold"' in line
    ]
    assert held and all('error_type="cancelled"' in line for line in held), held


async def test_a_legacy_session_ending_its_stream_is_no_backend_error(gw: Gateway) -> None:
    """2025-11-25 Session Management, Listening for Messages from the Server: a legacy session's
    GET stream is fed by a listen the gateway holds on its behalf; the session's end (DELETE)
    cancels it, which is not the backend's error, and its lifetime is no latency."""
    before, _ = await sdk_status(gw)
    session_id = await open_session(url(gw))
    headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
    stats = gw.telemetry.stats
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as http,
            http.get(url(gw), headers=headers) as stream,
        ):
            assert stream.status == 200
            # The session's listen is a request in flight while the stream is open.
            await until(lambda: stats.in_flight["http"] >= 1)
            assert (await send("DELETE", url(gw), None, [(SESSION, session_id)])).status == 204
            await stream.content.read()
    await settled(gw)
    after, errors = await sdk_status(gw)
    assert errors == []
    assert numbers(after)[1:] == numbers(before)[1:] == (0, None)
    metrics = (await fetch(gw, "/metrics")).decode()
    assert 'mcp_method_name="subscriptions/listen"' not in metrics
