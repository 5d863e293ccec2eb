"""Overload protection (`overload:`, `backends.NAME.max_in_flight`): bounds on requests in flight,
overall and per backend, a short FIFO queue, then -31004 (HTTP 503 with Retry-After); `/readyz`
unready while the gateway drains at shutdown.

The bound itself is driven with tasks of the test (no clock: waits are on the tasks); the
end-to-end tests run the gateway's HTTP listener in front of an MCP server of the test whose
`hold` answers only when the test releases it, so requests stay in flight exactly as long as a
test needs, and what reached the server is recorded.
"""

from __future__ import annotations

import asyncio
import math
import re
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from mcp import Client

from gateway import errors
from gateway.app import Gateway
from gateway.config import ConfigInvalid, Overload, parse
from gateway.config.operations import JSON_WINDOW
from gateway.core.overload import BACKEND, OVERALL, Bound
from gateway.frontends import replies as front_replies
from gateway.protocol import codes
from tests.support import (
    BOUND,
    START_BOUND,
    VERSION,
    Proc,
    call,
    gateway_command,
    mirrored_headers,
    request,
    sdk_stdio_command,
    stdio_backend,
)
from tests.support.auth import serving

pytestmark = pytest.mark.anyio

TOOLS = [{"name": name, "inputSchema": {"type": "object"}} for name in ("hold", "echo")]


# --- the config -------------------------------------------------------------------------------


def test_every_bound_has_a_default_and_a_key() -> None:
    backends = {"b": stdio_backend(["x"])}
    default = parse(yaml.safe_dump({"listen": {"stdio": True}, "backends": backends}))
    assert default.overload == Overload(
        max_in_flight=512, max_queued=128, queue_timeout=1.0, retry_after=1.0
    )
    assert default.backends[0].max_in_flight == 128
    set_ = {"max_in_flight": 8, "max_queued": 0, "queue_timeout": 0.5, "retry_after": 3}
    backends = {"b": stdio_backend(["x"], max_in_flight=2)}
    config = parse(
        yaml.safe_dump({"listen": {"stdio": True}, "backends": backends, "overload": set_})
    )
    assert config.overload == Overload(8, 0, 0.5, 3.0)
    assert config.backends[0].max_in_flight == 2


@pytest.mark.parametrize(
    ("where", "bad"),
    [
        ("overload", {"max_in_flight": 0}),
        ("overload", {"max_queued": -1}),
        ("overload", {"queue_timeout": 0}),
        ("overload", {"retry_after": "soon"}),
        ("backend", {"max_in_flight": 0}),
    ],
)
def test_a_bad_bound_is_refused(where: str, bad: dict[str, Any]) -> None:
    backend = stdio_backend(["x"], **(bad if where == "backend" else {}))
    doc: dict[str, Any] = {"listen": {"stdio": True}, "backends": {"b": backend}}
    if where == "overload":
        doc["overload"] = bad
    with pytest.raises(ConfigInvalid):
        parse(yaml.safe_dump(doc))


def test_a_queue_timeout_past_the_json_window_is_refused_naming_its_key() -> None:
    """Past the HTTP front end's JSON window a reply has turned into a stream with status 200,
    so a queued request could no longer get its 503 and Retry-After."""
    assert front_replies.JSON_WINDOW == JSON_WINDOW  # the loader checks against the real one

    def doc(timeout: float) -> str:
        backends = {"b": stdio_backend(["x"])}
        overload = {"queue_timeout": timeout}
        return yaml.safe_dump(
            {"listen": {"stdio": True}, "backends": backends, "overload": overload}
        )

    assert parse(doc(JSON_WINDOW - 0.5)).overload.queue_timeout == JSON_WINDOW - 0.5
    for bad in (JSON_WINDOW, JSON_WINDOW + 20):
        with pytest.raises(ConfigInvalid) as caught:
            parse(doc(bad))
        [problem] = caught.value.problems
        assert "overload.queue_timeout" in problem


def test_the_refusal_is_503_and_carries_its_delay() -> None:
    for exc in (
        errors.Overloaded(2.0, "overloaded"),
        errors.BackendOverloaded("b", "overloaded", 2.0),
    ):
        wire = errors.to_wire(exc, 7)
        assert wire["error"]["code"] == codes.GATEWAY_OVERLOADED
        assert wire["error"]["data"] == {"retryAfter": 2.0}
        assert errors.http_status(wire) == 503


# --- the bound --------------------------------------------------------------------------------


def bound(limit: int, max_queued: int, queue_timeout: float = 30.0) -> Bound:
    settings = Overload(limit, max_queued, queue_timeout, 1.0)
    return Bound(OVERALL, "", limit, settings, Counter())


async def take(b: Bound, order: list[str], name: str) -> None:
    """What a caller does: the fast path, else the queue; notes when it holds a slot."""
    if b.busy < b.limit:
        b.busy += 1
    else:
        await b.queue()
    order.append(name)


async def test_slots_go_to_the_queue_first_come_first_served() -> None:
    b = bound(1, 3)
    order: list[str] = []
    async with anyio.create_task_group() as tg:
        await take(b, order, "first")
        for name in ("second", "third"):
            tg.start_soon(take, b, order, name)
            await anyio.wait_all_tasks_blocked()
        assert b.queued == 2 and b.busy == 1
        b.release()  # first ends: the slot goes to the oldest waiter, not to a newcomer
        await anyio.wait_all_tasks_blocked()
        assert order == ["first", "second"] and b.busy == 1
        b.release()
    assert order == ["first", "second", "third"]
    b.release()
    assert b.busy == 0 and b.queued == 0


async def test_past_the_queue_a_request_is_refused_at_once_and_counted() -> None:
    counts: Counter[tuple[str, str]] = Counter()
    b = Bound(BACKEND, "slow", 1, Overload(1, 1, 30.0, 2.0), counts)
    order: list[str] = []
    async with anyio.create_task_group() as tg:
        await take(b, order, "first")
        tg.start_soon(take, b, order, "queued")
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(errors.BackendOverloaded) as refused:
            await take(b, order, "refused")
        assert refused.value.backend == "slow" and refused.value.retry_after == 2.0
        b.release()
    assert order == ["first", "queued"] and counts == {(BACKEND, "slow"): 1}


async def test_a_queued_request_is_refused_when_its_wait_is_over() -> None:
    b = bound(1, 5, queue_timeout=0.05)
    order: list[str] = []
    await take(b, order, "first")
    with anyio.fail_after(BOUND), pytest.raises(errors.Overloaded):
        await take(b, order, "late")
    assert b.queued == 0 and b.busy == 1


async def test_a_waiter_that_goes_away_leaves_the_queue_and_never_holds_a_slot() -> None:
    b = bound(1, 1)
    order: list[str] = []
    await take(b, order, "first")
    async with anyio.create_task_group() as tg:
        tg.start_soon(take, b, order, "gone")
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert b.queued == 0
    b.release()
    assert b.busy == 0 and order == ["first"]


async def test_a_slot_handed_to_a_waiter_cancelled_meanwhile_is_passed_on() -> None:
    b = bound(1, 2)
    order: list[str] = []
    await take(b, order, "first")
    gone = asyncio.ensure_future(take(b, order, "gone"))
    nxt = asyncio.ensure_future(take(b, order, "next"))
    await anyio.wait_all_tasks_blocked()
    b.release()  # the slot is handed to "gone"...
    gone.cancel()  # ...which is cancelled before it runs: "next" gets the slot instead
    with anyio.fail_after(BOUND):
        await nxt
    assert order == ["first", "next"] and gone.cancelled() and b.busy == 1


# --- over HTTP, in front of a server of the test ----------------------------------------------


class SlowServer:
    """A modern MCP server on HTTP: `hold` answers once the test sets `release`, `echo` at
    once; every call that reaches it is recorded as (path, tool, tag)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.release = anyio.Event()
        self._arrived = anyio.Event()

    async def held(self, count: int) -> None:
        """Until `count` calls of `hold` have arrived."""
        with anyio.fail_after(BOUND):
            while sum(1 for _, tool, _ in self.calls if tool == "hold") < count:
                await self._arrived.wait()

    async def handle(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        if "id" not in body:
            return web.Response(status=202)
        params = body.get("params") or {}
        result: dict[str, Any] = {"resultType": "complete"}
        if body["method"] == "server/discover":
            result |= {
                "supportedVersions": [VERSION],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "slow", "version": "1"},
            }
        elif body["method"] == "tools/list":
            result |= {"tools": TOOLS, "ttlMs": 0}
        elif body["method"] == "tools/call":
            tag = str((params.get("arguments") or {}).get("tag"))
            self.calls.append((request.path, params["name"], tag))
            self._arrived.set()
            self._arrived = anyio.Event()
            if params["name"] == "hold":
                await self.release.wait()
            result |= {"content": [{"type": "text", "text": tag}]}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")


@asynccontextmanager
async def gateway_before(
    paths: tuple[str, ...], overload: dict[str, Any], **backend: Any
) -> AsyncIterator[tuple[Gateway, SlowServer]]:
    """The gateway (HTTP listener) before a SlowServer, one backend per path (named by it,
    names always prefixed); `backend` settings go on the first."""
    server = SlowServer()
    async with serving(server.handle) as origin:
        backends = {
            p: {"http": {"url": f"{origin}/{p}"}, **(backend if i == 0 else {})}
            for i, p in enumerate(paths)
        }
        doc = {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": backends,
            "namespacing": {"prefix": "always"},
            "overload": overload,
        }
        with anyio.fail_after(START_BOUND):
            async with Gateway(parse(yaml.safe_dump(doc))) as gw:
                await gw.catalogs_loaded.wait()
                try:
                    yield gw, server
                finally:
                    server.release.set()  # what still holds ends, so everything closes at once


async def post(
    session: aiohttp.ClientSession, url: str, msg: dict[str, Any]
) -> tuple[int, str | None, dict[str, Any]]:
    async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        reply: dict[str, Any] = orjson.loads(await resp.read())
        return resp.status, resp.headers.get("Retry-After"), reply


def assert_overloaded(status: int, retry_after: str | None, reply: dict[str, Any]) -> None:
    assert status == 503, reply
    assert reply["error"]["code"] == codes.GATEWAY_OVERLOADED, reply
    assert retry_after == str(max(1, math.ceil(reply["error"]["data"]["retryAfter"])))


@pytest.mark.slow
async def test_past_the_bound_and_its_queue_http_gets_503_at_once_and_the_rest_is_served() -> None:
    overload = {"max_in_flight": 2, "max_queued": 1, "queue_timeout": 9.5, "retry_after": 3}
    async with (
        gateway_before(("slow",), overload) as (gw, server),
        aiohttp.ClientSession() as session,
    ):
        url = gw.http_url
        assert url is not None
        replies: dict[str, tuple[int, str | None, dict[str, Any]]] = {}
        ended = anyio.Event()

        async def send(tag: str, tool: str) -> None:
            replies[tag] = await post(session, url, call(tag, f"slow_{tool}", tag=tag))
            ended.set()

        async with anyio.create_task_group() as tg:
            for tag in ("h1", "h2"):
                tg.start_soon(send, tag, "hold")
            await server.held(2)  # the bound is full
            tg.start_soon(send, "e1", "echo")
            tg.start_soon(send, "e2", "echo")
            with anyio.fail_after(BOUND):  # one waits in the queue, the other is refused now
                await ended.wait()
            [(refused, (status, retry_after, reply))] = replies.items()
            assert_overloaded(status, retry_after, reply)
            assert retry_after == "3" and reply["id"] == refused
            assert [tag for _, _, tag in server.calls] == ["h1", "h2"]  # nothing reached it
            server.release.set()
        queued = "e2" if refused == "e1" else "e1"
        for tag in ("h1", "h2", queued):
            status, _, reply = replies[tag]
            assert status == 200 and reply["result"]["content"][0]["text"] == tag
        assert refused not in [tag for _, _, tag in server.calls]
        stats = gw.telemetry.stats
        assert stats.overloaded == {(OVERALL, ""): 1} and stats.rejections["overloaded"] == 1
        assert gw.dispatcher.bound is not None and gw.dispatcher.bound.busy == 0


@pytest.mark.slow
async def test_a_queued_request_gets_503_once_its_wait_is_over() -> None:
    overload = {"max_in_flight": 1, "max_queued": 4, "queue_timeout": 0.2}
    async with (
        gateway_before(("slow",), overload) as (gw, server),
        aiohttp.ClientSession() as session,
        anyio.create_task_group() as tg,
    ):
        url = gw.http_url
        assert url is not None
        tg.start_soon(post, session, url, call("h", "slow_hold", tag="h"))
        await server.held(1)
        with anyio.fail_after(BOUND):
            assert_overloaded(*await post(session, url, call("late", "slow_echo", tag="late")))
        server.release.set()
        with anyio.fail_after(BOUND):
            status, _, reply = await post(session, url, call("after", "slow_echo", tag="after"))
        assert status == 200 and "result" in reply
        assert [tag for _, _, tag in server.calls] == ["h", "after"]


@pytest.mark.slow
async def test_a_backend_past_its_bound_is_refused_alone_while_the_others_are_served() -> None:
    async with (
        gateway_before(("slow", "fast"), {"max_queued": 0}, max_in_flight=1) as (gw, server),
        aiohttp.ClientSession() as session,
        anyio.create_task_group() as tg,
    ):
        url = gw.http_url
        assert url is not None
        tg.start_soon(post, session, url, call("h", "slow_hold", tag="h"))
        await server.held(1)
        with anyio.fail_after(BOUND):
            status, retry_after, reply = await post(session, url, call("s", "slow_echo", tag="s"))
            assert_overloaded(status, retry_after, reply)
            assert "'slow'" in reply["error"]["message"]
            status, _, reply = await post(session, url, call("f", "fast_echo", tag="f"))
            assert status == 200 and reply["result"]["content"][0]["text"] == "f"
            # A list asks every backend: the overloaded one is left out (fail_open), as if down.
            status, _, reply = await post(session, url, request("l", "tools/list"))
            assert status == 200
            assert {t["name"] for t in reply["result"]["tools"]} == {"fast_hold", "fast_echo"}
        assert [(path, tag) for path, _, tag in server.calls] == [("/slow", "h"), ("/fast", "f")]
        assert gw.telemetry.stats.overloaded == {(BACKEND, "slow"): 2}
        assert gw.telemetry.stats.rejections["overloaded"] == 0  # not the gateway's own bound
        server.release.set()


def queued_gauge(text: str) -> dict[tuple[str, str], float]:
    """mcp_gateway_overload_queued by (scope, backend), from an exposition."""
    out: dict[tuple[str, str], float] = {}
    pattern = r'^mcp_gateway_overload_queued\{backend="([^"]*)",scope="([^"]*)"\} (\S+)$'
    for backend, scope, value in re.findall(pattern, text, re.MULTILINE):
        out[(scope, backend)] = float(value)
    return out


@pytest.mark.slow
async def test_the_queues_depth_is_on_metrics_by_scope_and_backend() -> None:
    """Room for two requests overall and one at backend `slow`: a held call takes one of each,
    a second call to `slow` waits in its backend's queue, a call to `fast` in the overall one."""
    overload = {"max_in_flight": 2, "max_queued": 4, "queue_timeout": 9.5}
    async with (
        gateway_before(("slow", "fast"), overload, max_in_flight=1) as (gw, server),
        aiohttp.ClientSession() as session,
        anyio.create_task_group() as tg,
    ):
        url = gw.http_url
        assert url is not None
        metrics = url.removesuffix("/mcp") + "/metrics"

        async def scrape() -> dict[tuple[str, str], float]:
            async with session.get(metrics) as resp:
                assert resp.status == 200
                return queued_gauge(await resp.text())

        # Every bound is there before any overload, at 0.
        idle = {(OVERALL, ""): 0.0, (BACKEND, "slow"): 0.0, (BACKEND, "fast"): 0.0}
        assert await scrape() == idle
        tg.start_soon(post, session, url, call("h", "slow_hold", tag="h"))
        await server.held(1)
        overall = gw.dispatcher.bound
        assert overall is not None
        slow = next(w.bound for w in gw.wired if w.config.name == "slow")

        async def queued(tag: str, tool: str, bound: Bound) -> None:
            tg.start_soon(post, session, url, call(tag, tool, tag=tag))
            with anyio.fail_after(BOUND):
                # (joining a queue is no event a test can wait on: each turn of the loop looks)
                while not bound.queued:
                    await anyio.lowlevel.checkpoint()

        # In turn: `s` takes the second overall slot before `f` comes, which finds none.
        await queued("s", "slow_echo", slow)
        await queued("f", "fast_echo", overall)
        assert await scrape() == {**idle, (OVERALL, ""): 1.0, (BACKEND, "slow"): 1.0}
        server.release.set()
        with anyio.fail_after(BOUND):
            while overall.busy:
                await anyio.lowlevel.checkpoint()
        assert await scrape() == idle
        assert sorted(tag for _, _, tag in server.calls) == ["f", "h", "s"]


@pytest.mark.slow
async def test_a_listen_stream_does_not_use_up_the_bounds() -> None:
    """With room for one request overall and one per backend, an open listen stream (and the
    backend listen it holds) leaves that room to calls."""
    backends = {"sdk": stdio_backend(sdk_stdio_command(), max_in_flight=1)}
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0}},
        "backends": backends,
        "overload": {"max_in_flight": 1, "max_queued": 0},
    }
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(yaml.safe_dump(doc))) as gw:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            async with (
                Client(gw.http_url) as client,
                client.listen(resource_subscriptions=["mem://motd"]) as sub,
            ):
                assert sub.honored.resource_subscriptions == ["mem://motd"]  # the backend's
                assert gw.dispatcher.subscriptions.active == 1
                assert gw.dispatcher.bound is not None and gw.dispatcher.bound.busy == 0
                assert gw.bounds[0].busy == 0
                result = await client.call_tool("echo", {"text": "served"})
                assert result.content[0].text == "served"  # type: ignore[union-attr]
            assert gw.telemetry.stats.overloaded == {}


@pytest.mark.slow
def test_stdio_past_the_bound_gets_the_json_rpc_error(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    doc = {
        "listen": {"stdio": True},
        "backends": {"sdk": stdio_backend(sdk_stdio_command())},
        "overload": {"max_in_flight": 1, "max_queued": 0, "retry_after": 2},
    }
    config.write_text(yaml.safe_dump(doc))
    proc = Proc(gateway_command(config), stdin=True)
    try:
        stdin = proc.popen.stdin
        assert stdin is not None
        for msg in (call("h", "hold", token="t", key="k"), call("e", "echo", text="e")):
            stdin.write(orjson.dumps(msg) + b"\n")
            stdin.flush()
            if msg["id"] == "h":  # in flight once its progress comes
                proc.wait_for(r'"progressToken":"t"', "stdout", START_BOUND)
        refused = orjson.loads(proc.wait_for(r'"id":"e"', "stdout", BOUND).string)
        # The held call is cancelled, then stdin ends: the drain has nothing left to wait for.
        cancel = {"method": "notifications/cancelled", "params": {"requestId": "h"}}
        stdin.write(orjson.dumps({"jsonrpc": "2.0", **cancel}) + b"\n")
        stdin.close()
        assert proc.popen.wait(BOUND) == 0, proc.output()
    finally:
        proc.stop()
    assert refused["error"]["code"] == codes.GATEWAY_OVERLOADED
    assert refused["error"]["data"] == {"retryAfter": 2.0}


# --- /readyz while draining ---------------------------------------------------------------


@pytest.mark.slow
async def test_readyz_answers_503_while_the_gateway_drains_after_sigterm(tmp_path: Path) -> None:
    """A load balancer polling /readyz stops sending as soon as shutdown begins; the request
    in flight still finishes within the grace, and the gateway exits 0."""
    server = SlowServer()
    async with serving(server.handle) as origin, aiohttp.ClientSession() as session:
        doc = {
            "listen": {
                "http": {"host": "127.0.0.1", "port": 0},
                "admin": {"host": "127.0.0.1", "port": 0},
            },
            "backends": {"slow": {"http": {"url": f"{origin}/slow"}}},
        }
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump(doc))
        proc = Proc(gateway_command(config))
        try:
            url = (await anyio.to_thread.run_sync(proc.wait_for, r"listening on (\S+)")).group(1)
            found = proc.wait_for(r"admin listener \(metrics, health\) on (\S+)", timeout=BOUND)
            readyz = found.group(1) + "/readyz"
            with anyio.fail_after(BOUND):
                # Ready once the backend has answered.
                assert (await post(session, url, call("e", "echo", tag="e")))[0] == 200
                async with session.get(readyz) as resp:
                    assert resp.status == 200, await resp.text()
            async with anyio.create_task_group() as tg:
                replies: list[tuple[int, str | None, dict[str, Any]]] = []

                async def hold() -> None:
                    replies.append(await post(session, url, call("h", "hold", tag="h")))

                tg.start_soon(hold)
                await server.held(1)
                proc.popen.send_signal(signal.SIGTERM)
                await anyio.to_thread.run_sync(proc.wait_for, r"received SIGTERM")
                with anyio.fail_after(BOUND):
                    async with session.get(readyz) as resp:
                        body = orjson.loads(await resp.read())
                        assert resp.status == 503, body
                assert body["draining"] is True and body["status"] == "not ready"
                server.release.set()
            [(status, _, reply)] = replies  # finished within the grace
            assert status == 200 and reply["result"]["content"][0]["text"] == "h"
            code = await anyio.to_thread.run_sync(proc.popen.wait, BOUND)
            assert code == 0, proc.output()
        finally:
            server.release.set()
            proc.stop()
    assert re.search(r"shutting down", proc.output())
