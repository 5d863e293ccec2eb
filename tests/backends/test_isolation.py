"""`isolation: per_session`: a stdio child per client, for servers that keep state per client
(backends/isolated.py). The backend is a real stateful server on the official SDK
(tests/servers/counter_server.py: `count` answers how often this process was asked, and its
pid); clients speak raw HTTP, legacy ones in sessions (2025-11-25 basic/transports, Session
Management), modern ones statelessly (2026-07-28 basic/versioning)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from mcp import Client

from gateway.app import Gateway
from gateway.backends.base import Call, NotificationSink
from gateway.backends.isolated import CATALOG, IsolatedBackend, _key
from gateway.config import ConfigInvalid, describe, parse
from gateway.config.model import DEFAULT_CHILD_IDLE_TIMEOUT, DEFAULT_MAX_CHILDREN
from gateway.core.catalog import Catalogs
from gateway.frontends.legacy.front import Session
from gateway.origin import GATEWAY_ORIGIN, STDIO_ORIGIN, Origin
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.telemetry import procfs
from tests.frontends.test_http_transport_rules import call, post, send
from tests.frontends.test_legacy_sessions import (
    SESSION,
    in_session,
    legacy,
    open_session,
    result_of,
)
from tests.support import PYTHON, ROOT, START_BOUND, gone, sdk_stdio_command
from tests.support.conformance import npm_server
from tests.system.test_legacy_clients import model, user
from tests.system.test_parity import text_of

# A child started per client and waited on to go idle: several seconds a test.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

COUNTER = str(ROOT / "tests" / "servers" / "counter_server.py")
GATEWAY_OVERLOADED = -31004
# Short enough for a test to see a child reaped, long enough that a test's own requests in a
# row never leave it idle that long.
SHORT_IDLE = 1.0


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def config(**backend: object) -> str:
    # The era is pinned: the probe's 3 s is too short for several SDK children starting at once
    # on a loaded machine (issue 16, "slow starters"), and the probe is not what is tested here.
    counter = {"stdio": {"command": PYTHON, "args": [COUNTER]}, "era": "modern", **backend}
    return yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"counter": counter}}
    )


@asynccontextmanager
async def gateway(**backend: object) -> AsyncIterator[tuple[Gateway, str]]:
    async with Gateway(parse(config(**backend))) as gw:
        assert gw.http_url is not None
        yield gw, gw.http_url


def isolated(gw: Gateway) -> IsolatedBackend:
    backend = gw.transports[0]
    assert isinstance(backend, IsolatedBackend)
    return backend


def counted(result: dict[str, Any]) -> tuple[int, int]:
    structured = result["structuredContent"]
    return structured["pid"], structured["count"]


# A call may start a child (an SDK process): bounded as a process start is.
async def count_in(url: str, session_id: str, id_: int = 1) -> tuple[int, int]:
    msg = legacy("tools/call", {"name": "count"}, id_)
    reply = await post(url, msg, mirror=False, extra=[(SESSION, session_id)], bound=START_BOUND)
    return counted(result_of(reply, id_))


async def count_as(url: str, authorization: str | None = None) -> tuple[int, int]:
    extra = [("Authorization", authorization)] if authorization is not None else []
    reply = await post(url, call("count", {}), extra=extra, bound=START_BOUND)
    msg = reply.json()
    assert "error" not in msg, msg
    return counted(msg["result"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- config -----------------------------------------------------------------------------------


def test_defaults_and_keys() -> None:
    shared = parse(config()).backends[0]
    assert shared.isolation == "shared"
    assert shared.child_idle_timeout == DEFAULT_CHILD_IDLE_TIMEOUT
    assert shared.max_children == DEFAULT_MAX_CHILDREN == 64
    own = parse(config(isolation="per_session", child_idle_timeout=5, max_children=2)).backends[0]
    assert (own.isolation, own.child_idle_timeout, own.max_children) == ("per_session", 5.0, 2)
    assert "a child per session, at most 2, idle 5s" in describe(
        parse(config(isolation="per_session", child_idle_timeout=5, max_children=2))
    )


def test_per_session_is_for_stdio_backends_only() -> None:
    text = yaml.safe_dump(
        {
            "listen": {"http": {"port": 0}},
            "backends": {
                "web": {"http": {"url": "http://127.0.0.1:1/mcp"}, "isolation": "per_session"}
            },
        },
        sort_keys=False,
    )
    with pytest.raises(ConfigInvalid) as caught:
        parse(text, "gw.yaml")
    (problem,) = caught.value.problems
    line = 1 + next(i for i, t in enumerate(text.splitlines()) if "isolation" in t)
    assert problem.startswith(f"gw.yaml:{line}: backends.web.isolation:"), problem
    assert "stdio" in problem


@pytest.mark.parametrize(
    ("backend", "key"),
    [
        ({"isolation": "per_client"}, "isolation"),
        ({"isolation": "per_session", "max_children": 0}, "max_children"),
        ({"isolation": "per_session", "child_idle_timeout": -1}, "child_idle_timeout"),
        ({"max_children": 3}, "max_children"),  # only meaningful under per_session
        ({"child_idle_timeout": 3}, "child_idle_timeout"),
    ],
)
def test_bad_isolation_settings_are_named(backend: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(config(**backend), "gw.yaml")
    (problem,) = caught.value.problems
    assert f"backends.counter.{key}:" in problem, problem


# --- whose child (in memory) ------------------------------------------------------------------

TOOLS_CALL: Message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}}


def key_as(origin: Origin | None, msg: Message = TOOLS_CALL) -> str:
    return _key(msg, origin)[0]


async def test_the_key_of_a_request() -> None:
    alice = Origin("http", "127.0.0.1", {"Authorization": "Bearer alice"})
    bob = Origin("http", "127.0.0.1", {"Authorization": "Bearer bob"})
    anonymous = [Origin("http", "127.0.0.1", {}), Origin("http", "10.0.0.9", {})]
    assert key_as(alice) != key_as(bob)
    assert key_as(anonymous[0]) == key_as(anonymous[1])  # nothing tells them apart
    assert key_as(alice) not in (key_as(anonymous[0]), CATALOG)
    one, two = Session(), Session()
    # A session's requests are the session's, whatever credentials they carry.
    assert key_as(alice.within(one)) == key_as(bob.within(one)) != key_as(alice.within(two))
    assert key_as(alice.within(one)) != key_as(alice)
    # stdio: the one legacy session, or the one modern caller; never the catalog child.
    stdio = {key_as(STDIO_ORIGIN.within(one)), key_as(STDIO_ORIGIN), CATALOG}
    assert len(stdio) == 3
    # The gateway's own requests, requests outside any client and discovery: the catalog child.
    assert key_as(GATEWAY_ORIGIN) == key_as(None) == CATALOG
    discover = {**TOOLS_CALL, "method": "server/discover"}
    assert key_as(alice, discover) == key_as(alice.within(one), discover) == CATALOG


class Recorder:
    """A backend that records the origin each request was made under."""

    name = "fake"
    transport = "stdio"
    up = True

    def __init__(self) -> None:
        self.origins: list[Origin] = []

    async def run(self) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.origins.append(call.origin)
        if msg["method"] == "server/discover":
            result: dict[str, Any] = {"supportedVersions": ["2026-07-28"], "capabilities": {}}
        else:
            result = {}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}

    async def notify(self, msg: Message) -> None:
        return None


async def test_a_catalog_refresh_a_client_started_is_the_gateways_own() -> None:
    """A refresh made on a client's miss must not reach (or start) that client's child."""
    backend = Recorder()
    catalogs = Catalogs([backend], [Exposure("fake", "fake")], Naming(), {"name": "gw"})
    client = Call(Origin("http", None, {"Authorization": "Bearer c"}))
    await catalogs.refresh("fake", client)
    catalogs.invalidate("fake")
    await catalogs.refresh_stale(None, None, client)  # (a miss's refresh, as the dispatcher's)
    assert backend.origins and all(o is GATEWAY_ORIGIN for o in backend.origins)


# --- children per client ----------------------------------------------------------------------


async def test_legacy_sessions_get_children_of_their_own() -> None:
    """Two sessions: two processes with independent state; a session keeps its child; the
    gateway's own requests (catalog) have a third."""
    async with gateway(isolation="per_session") as (gw, url):
        first, second = await open_session(url), await open_session(url)
        pid_a, n = await count_in(url, first)
        assert n == 1
        assert await count_in(url, first, 2) == (pid_a, 2)
        pid_b, n = await count_in(url, second)
        assert n == 1 and pid_b != pid_a
        assert await count_in(url, first, 3) == (pid_a, 3)
        backend = isolated(gw)
        assert backend.children == 3 and {pid_a, pid_b} < set(backend.pids())
        assert all(pid != os.getpid() for pid in backend.pids())
        metrics, _ = gw._render_metrics("text/plain")
        assert b'mcp_gateway_backend_children{backend="counter"} 3.0' in metrics
        # Their CPU and memory, summed over the three running children (/proc, Linux).
        assert set(backend.running_pids()) == set(backend.pids())
        if procfs.AVAILABLE:
            rss = re.search(
                rb'^mcp_gateway_backend_child_resident_memory_bytes\{backend="counter"\} (\S+)$',
                metrics,
                re.MULTILINE,
            )
            assert rss is not None and float(rss[1]) > 3 * 5_000_000  # three interpreters


async def test_modern_callers_are_told_apart_by_their_credentials() -> None:
    """A modern request has no session: its child is its caller's (front end + credentials).
    Anonymous callers share one."""
    async with gateway(isolation="per_session") as (_, url):
        alice, n = await count_as(url, "Bearer alice")
        assert n == 1
        assert await count_as(url, "Bearer alice") == (alice, 2)
        bob, n = await count_as(url, "Bearer bob")
        assert n == 1 and bob != alice
        anonymous, n = await count_as(url)
        assert n == 1 and anonymous not in (alice, bob)
        assert await count_as(url) == (anonymous, 2)


async def test_shared_is_the_default_one_child_for_everyone() -> None:
    async with gateway() as (gw, url):
        first, second = await open_session(url), await open_session(url)
        pid, n = await count_in(url, first)
        assert await count_in(url, second) == (pid, n + 1)  # legacy sessions share one child
        # Modern callers share one too; the server speaks both eras, so the legacy sessions'
        # child is its second, legacy-era one (docs/decisions/0042).
        modern, m = await count_as(url, "Bearer someone")
        assert await count_as(url, "Bearer other") == (modern, m + 1)
        assert not isinstance(gw.transports[0], IsolatedBackend)


# --- ends of children -------------------------------------------------------------------------


async def test_an_idle_child_is_stopped_and_a_new_one_starts_on_demand() -> None:
    async with gateway(isolation="per_session", child_idle_timeout=SHORT_IDLE) as (gw, url):
        pid, _ = await count_as(url, "Bearer idle")
        await gone(pid)
        assert pid not in isolated(gw).pids()
        again, n = await count_as(url, "Bearer idle")
        assert again != pid and n == 1  # a fresh process: the old state went with the old one


async def test_a_legacy_sessions_child_lasts_while_its_watch_is_open() -> None:
    """The session's watch for list changes is a listen on its child: the child is in use
    however long the session is quiet, and keeps its state."""
    async with gateway(isolation="per_session", child_idle_timeout=SHORT_IDLE) as (_, url):
        session = await open_session(url)
        pid, _ = await count_in(url, session)
        with anyio.move_on_after(SHORT_IDLE * 2):
            await gone(pid)
        assert alive(pid) and await count_in(url, session, 2) == (pid, 2)


async def test_a_busy_child_is_not_idle() -> None:
    """A request in flight longer than the idle timeout keeps its child."""
    async with gateway(isolation="per_session", child_idle_timeout=SHORT_IDLE) as (gw, url):
        pid, _ = await count_as(url, "Bearer busy")
        backend = isolated(gw)
        child = next(c for c in backend._children.values() if c.stdio.pid == pid)
        child.busy += 1  # as a request in flight does
        try:
            with anyio.move_on_after(SHORT_IDLE * 2):
                await gone(pid)
            assert alive(pid)
        finally:
            child.busy -= 1
        await gone(pid)


async def test_the_end_of_a_legacy_session_ends_its_child() -> None:
    """DELETE (Session Management 5) ends the session and, with it, its process, long before
    the idle timeout; other clients' children stay."""
    async with gateway(isolation="per_session") as (gw, url):
        ending, staying = await open_session(url), await open_session(url)
        pid, _ = await count_in(url, ending)
        other, _ = await count_in(url, staying)
        reply = await send("DELETE", url, None, [(SESSION, ending)])
        assert reply.status in (200, 204)
        await gone(pid)
        assert alive(other) and await count_in(url, staying, 2) == (other, 2)
        assert isolated(gw).children == 2  # the other session's and the catalog child


async def test_children_past_max_children_are_refused_with_overloaded() -> None:
    """max_children: 1 -> the first client's child runs, a second client gets -31004 (our
    GATEWAY_OVERLOADED) naming the limit, until the first child ends."""
    settings = {"isolation": "per_session", "max_children": 1, "child_idle_timeout": SHORT_IDLE}
    async with gateway(**settings) as (_, url):
        pid, _ = await count_as(url, "Bearer first")
        other = [("Authorization", "Bearer 2")]
        refused = (await post(url, call("count", {}), extra=other, bound=START_BOUND)).json()
        assert refused["error"]["code"] == GATEWAY_OVERLOADED, refused
        assert "max_children" in refused["error"]["message"]
        assert await count_as(url, "Bearer first") == (pid, 2)  # the running client still served
        await gone(pid)  # idle: its slot is free again
        second, n = await count_as(url, "Bearer 2")
        assert n == 1 and second != pid


async def test_catalog_loads_use_the_catalog_child_not_a_clients(tmp_path: Path) -> None:
    """The catalog is loaded before any client exists, from a child of its own; a client's
    state is not touched by it."""
    async with gateway(isolation="per_session") as (gw, url):
        backend = isolated(gw)
        with anyio.fail_after(START_BOUND):  # (the listener serves before catalogs load)
            await gw.catalogs_loaded.wait()
        (catalog_pid,) = backend.pids()  # started for the start-up catalog load
        pid, n = await count_as(url, "Bearer c")
        assert n == 1 and pid != catalog_pid
        gw.dispatcher.catalogs.invalidate("counter")
        await gw.dispatcher.catalogs.refresh("counter")
        assert set(backend.pids()) == {catalog_pid, pid}
        assert await count_as(url, "Bearer c") == (pid, 2)


# A list change must reach the client within this long of what made it (the child's start, a
# call), however the session's watch and the child's start interleave.
CHANGE_BOUND = 5.0


def per_session(name: str, command: list[str], **backend: object) -> str:
    stdio = {"command": command[0], "args": command[1:]}
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {name: {"stdio": stdio, "isolation": "per_session", **backend}},
        }
    )


async def notification(stream: aiohttp.ClientResponse, method: str) -> Message:
    """The next message of `method` on a session's GET stream (the caller bounds the wait)."""
    async for line in stream.content:
        if line.startswith(b"data:"):
            event: Message = orjson.loads(line[5:])
            if event.get("method") == method:
                return event
    raise AssertionError(f"the GET stream ended without {method}")


async def session_tools(url: str, session_id: str) -> set[str]:
    """The names of the session's tools (one page: the servers here do not paginate)."""
    reply = await in_session(url, session_id, legacy("tools/list", {}, 2))
    result = result_of(reply, 2)
    assert "nextCursor" not in result
    return {tool["name"] for tool in result["tools"]}


@pytest.mark.parametrize(
    ("era", "args"),
    [("modern", ()), ("auto", ()), ("auto", ("--legacy-only",))],
    ids=["modern-child", "legacy-child-of-a-dual-server", "legacy-only-server"],
)
async def test_a_list_change_in_a_sessions_child_reaches_the_session(
    era: str, args: tuple[str, ...]
) -> None:
    """server/tools, List Changed (legacy): the session's watch is a listen on its own child, so
    a change made there by a call of the session (the SDK server's `change_tools` adds the tool
    `dummy`) reaches the session's GET stream, and the catalog is marked stale; whether the
    child speaks the modern era (a listen of its own) or, opened with `initialize`, the legacy
    one (the listen served from the child's session notifications, backends/era/listen.py)."""
    text = per_session("sdk", sdk_stdio_command("--page-size", "0", *args), era=era)
    async with Gateway(parse(text)) as gw:
        url = gw.http_url
        assert url is not None
        session_id = await open_session(url)
        headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
        change = legacy("tools/call", {"name": "change_tools", "arguments": {"toggle": True}}, 3)
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as stream:
            assert stream.status == 200
            reply = await post(url, change, mirror=False, extra=headers[:1], bound=START_BOUND)
            assert result_of(reply, 3)["structuredContent"] == {"result": "dummy present"}
            with anyio.fail_after(CHANGE_BOUND):
                await notification(stream, "notifications/tools/list_changed")
        assert gw.dispatcher.catalogs._entries["sdk"].fetched_at == -math.inf
        # The change is the session's child's: its list has `dummy`, another session's not.
        assert "dummy" in await session_tools(url, session_id)
        assert "dummy" not in await session_tools(url, await open_session(url))


async def test_list_changes_a_legacy_child_sends_as_it_starts_reach_the_session() -> None:
    """server-everything registers the tools it offers by the client's capabilities once it has
    `notifications/initialized`, and announces each with `notifications/tools/list_changed` at
    once: on a session's own child, while the request that started it (the session's watch,
    from `initialize` on) still waits for the handshake to end. Those announcements reach the
    session too: the watch's listen is registered on the child as soon as the handshake is
    done, ahead of what the child sends on `notifications/initialized` (by the time the child
    takes to handle it: a watch attached any later would lose them)."""
    command = [*npm_server("server-everything"), "stdio"]
    async with Gateway(parse(per_session("everything", command))) as gw:
        url = gw.http_url
        assert url is not None
        # The catalog child announces its own tools as it starts too: over before its catalog
        # is loaded, so that what follows can only be the session's child's.
        with anyio.fail_after(START_BOUND):
            await gw.catalogs_loaded.wait()
        session_id = await open_session(url)
        headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as stream:
            assert stream.status == 200
            # The session's child is up (and has announced its tools) once it answers a list.
            names = await session_tools(url, session_id)
            assert "simulate-research-query" in names  # registered after `initialized`
            with anyio.fail_after(CHANGE_BOUND):
                await notification(stream, "notifications/tools/list_changed")


async def test_a_legacy_sessions_child_carries_the_servers_own_requests() -> None:
    """client/sampling and client/elicitation, 2025-11-25: a legacy session's child of a
    dual-era server is opened in the legacy era (`initialize` first: the SDK settles a stdio
    connection's era on its first request), so the tool's own requests mid-call reach that
    client, as directly; a modern caller's child stays modern."""
    command = sdk_stdio_command()
    sdk = {"stdio": {"command": command[0], "args": command[1:]}, "isolation": "per_session"}
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"sdk": sdk}}
    )
    async with Gateway(parse(text)) as gw:
        assert gw.http_url is not None
        with anyio.fail_after(3 * START_BOUND):
            async with Client(
                gw.http_url, mode="legacy", sampling_callback=model, elicitation_callback=user
            ) as client:
                sampled = await client.call_tool("sample", {"prompt": "hi"})
                assert text_of(sampled) == "sampled: model says hi"
                confirmed = await client.call_tool("confirm", {"question": "ok?"})
                assert text_of(confirmed) == "confirmed: yes"
            async with Client(gw.http_url) as modern:
                assert text_of(await modern.call_tool("echo", {"text": "modern"})) == "modern"
        eras = {child.era.era for child in isolated(gw)._children.values()}
        assert "modern" in eras  # the catalog's and the modern caller's children
