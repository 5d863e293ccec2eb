"""A cluster as it is deployed (README "Running several replicas"): three gateway processes
sharing `cluster.secrets` and one `cluster.redis`, behind a real nginx running the shipped
deploy/nginx/mcp-gateway.conf (round robin, no affinity), with a real `redis-server`; all on
loopback, started here and stopped at the end.

nginx's access log (a line format of the test's around the shipped site) names the replica each
request went to, so "every request on another replica than the one before" is read, not
assumed. Proved: the official SDK client's modern era (paged lists, calls, resources, prompts)
and an MRTR retry served by replicas in turn; one caller's burst spent over all three; Redis
stopped and started under load, and a reload of every replica under load, without one failed
request; the SDK client's legacy era (a session in Redis) with every POST on another replica
than the one before, a backend's question answered through another replica, and a session
going on after the replica that opened it is killed; a listen stream on one replica
hearing a list change another replica saw.
"""

from __future__ import annotations

import math
import os
import re
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.subscriptions import ToolsListChanged
from mcp_types import ElicitRequestParams, ElicitResult, TextContent

from gateway.protocol import codes
from tests.support import (
    BOUND,
    START_BOUND,
    Message,
    Proc,
    call,
    mirrored_headers,
    sdk_stdio_command,
    stdio_backend,
    tool_names,
)
from tests.support.nginx import Replica, behind_nginx, replicas, upstreams_logged
from tests.support.redis_server import free_port, launch, need_redis, redis_url

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "cluster-test-secret-6Hq2Vd8Lp4Xw0Nz"
PAGE_SIZE = 2
# Each replica runs its own copy of the backend (stdio); the copies share the key that seals their
# `requestState`, as copies behind a load balancer must, so an MRTR retry verifies on any.
STATE_KEY = "backend-request-state-key-3Fv9Kq1Zr7Tm5Wd"
SDK = stdio_backend(
    sdk_stdio_command("--page-size", str(PAGE_SIZE), "--request-state-key", STATE_KEY)
)
EXTRA = stdio_backend(sdk_stdio_command("--label", "extra", "--page-size", "0"))
# One caller (behind nginx every request comes from 127.0.0.1): generous per caller, so load
# is never refused (nor, while Redis is away, by one replica alone); `sdk_label` has a burst of
# three and no refill to speak of, for the shared-limit test alone.
LABEL_BURST = 3
RATE_LIMITS = {
    "per_identity": {"rate": 10000, "burst": 10000},
    "tools": {"sdk_label": {"rate": 0.001, "burst": LABEL_BURST}},
}
LOAD_WORKERS = 8


def settings(redis_port: int, **backends: dict[str, object]) -> dict[str, Any]:
    return {
        "backends": {"sdk": SDK, **backends},
        # Every tool is `sdk_...` whatever else is configured, so a reload that adds a backend
        # renames nothing the load is calling.
        "namespacing": {"prefix": "always"},
        "rate_limits": RATE_LIMITS,
        "cluster": {
            "secrets": [SECRET],
            "redis": redis_url(redis_port),
            # Tried again soon after a failure: the test waits for it to be back.
            "redis_retry_interval": 0.1,
        },
    }


@dataclass
class Cluster:
    url: str  # nginx's
    gateways: list[Replica]
    access_log: Path
    redis_port: int
    redis: Proc
    directory: Path
    marks: int = 0

    def settings(self, **backends: dict[str, object]) -> dict[str, Any]:
        return settings(self.redis_port, **backends)

    def log_mark(self) -> int:
        return len(upstreams_logged(self.access_log))

    async def requests_since(self, mark: int) -> list[list[str]]:
        """nginx's log lines from `mark` up to now: a request of the test's own is sent last
        and waited for, since nginx writes a line once the reply is out."""
        self.marks += 1
        marker = f"/healthz?mark={self.marks}"
        with anyio.fail_after(BOUND):
            async with aiohttp.ClientSession() as http, http.get(self.url.replace("/mcp", marker)):
                pass
            while True:
                lines = upstreams_logged(self.access_log, mark)
                ends = [i for i, line in enumerate(lines) if line[3] == marker]
                if ends:
                    return lines[: ends[0]]
                await anyio.sleep(0.01)  # (a file growing is not an event here)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    need_redis()
    directory = tmp_path_factory.mktemp("cluster")
    access_log = directory / "access.log"
    port = free_port()
    redis = launch(port)
    cluster: Cluster | None = None
    try:
        with (
            replicas(directory, settings(port)) as gateways,
            behind_nginx(directory, gateways, access_log) as url,
        ):
            cluster = Cluster(url, gateways, access_log, port, redis, directory)
            yield cluster
    finally:
        # The Redis running now (a test restarts it).
        (redis if cluster is None else cluster.redis).stop()


# --- helpers ----------------------------------------------------------------------------------


async def post(url: str, msg: Message) -> tuple[int, dict[str, str], Message]:
    async with aiohttp.ClientSession() as http:
        with anyio.fail_after(BOUND):
            async with http.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as r:
                return r.status, dict(r.headers), orjson.loads(await r.read())


async def post_all(url: str, msgs: list[Message]) -> list[tuple[int, dict[str, str], Message]]:
    """`msgs` posted at once; their replies in order."""
    replies: dict[int, tuple[int, dict[str, str], Message]] = {}

    async def one(i: int) -> None:
        replies[i] = await post(url, msgs[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(msgs)):
            tg.start_soon(one, i)
    return [replies[i] for i in range(len(msgs))]


def text_of(result: Any) -> str:
    assert not result.is_error, result
    content = result.content[0]
    assert isinstance(content, TextContent), content
    return content.text


async def answer(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    """The user of the SDK client answers any form with `answer: yes`."""
    return ElicitResult(action="accept", content={"answer": "yes"})


async def metric(replica: Replica, name: str) -> float | None:
    async with aiohttp.ClientSession() as http:
        with anyio.fail_after(BOUND):
            async with http.get(replica.metrics_url) as resp:
                text = await resp.text()
    found = re.search(rf"^{name} (\S+)$", text, flags=re.M)
    return float(found.group(1)) if found else None


async def logged(replica: Replica, pattern: str, count: int, bound: float = BOUND) -> None:
    """Until `replica` has logged `count` lines matching `pattern` (within `bound`)."""

    def enough(lines: list[str]) -> bool:
        return sum(1 for line in lines if re.search(pattern, line)) >= count

    await anyio.to_thread.run_sync(lambda: replica.running.wait_lines(enough, timeout=bound))


def count_logged(replica: Replica, pattern: str) -> int:
    return sum(1 for line in replica.running.lines["stderr"] if re.search(pattern, line))


def tries(access_log: Path, mark: int) -> list[tuple[list[str], str, str]]:
    """The access log's requests from line `mark` on: (the replicas nginx tried, in order: the
    last one answered), status, method."""
    out = []
    for line in upstreams_logged(access_log, mark):
        tried = []
        while line[0].endswith(","):  # `$upstream_addr` joins each replica tried with ", "
            tried.append(line.pop(0).removesuffix(","))
        out.append(([*tried, line[0]], line[1], line[2]))
    return out


def assert_round_robin(lines: list[list[str]], gateways: list[Replica]) -> list[str]:
    """Each request went to one replica (none was tried twice) and to another than the one
    before; all of them served. The replicas in order."""
    served = [line[0] for line in lines]
    assert set(served) == {g.address for g in gateways}, served
    assert all(a != b for a, b in pairwise(served)), served
    return served


@dataclass
class Load:
    """Modern SDK clients calling through nginx, each one request after another, until the end
    of the `load` block; every failure kept."""

    served: int = 0
    failures: list[str] = field(default_factory=list)
    _tick: anyio.Event = field(default_factory=anyio.Event)

    def count(self) -> None:
        self.served += 1
        self._tick.set()
        self._tick = anyio.Event()

    async def beyond(self, count: int) -> None:
        """Until more than `count` requests have been served (bounded)."""
        with anyio.fail_after(BOUND):
            while self.served <= count:
                await self._tick.wait()


@asynccontextmanager
async def load(url: str, workers: int = LOAD_WORKERS) -> AsyncIterator[Load]:
    stats = Load()
    stop = anyio.Event()

    async def work(n: int) -> None:
        async with Client(url) as client:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    with anyio.fail_after(BOUND):
                        result = await client.call_tool("sdk_echo", {"text": f"w{n}-{i}"})
                    assert text_of(result).endswith(f"w{n}-{i}")
                except Exception as exc:  # every failure is counted, none ends the load
                    stats.failures.append(repr(exc))
                else:
                    stats.count()

    async with anyio.create_task_group() as tg:
        for n in range(workers):
            tg.start_soon(work, n)
        try:
            await stats.beyond(workers)  # flowing before the test disturbs anything
            yield stats
        finally:
            stop.set()
    assert stats.served > 0 and not stats.failures, stats.failures[:5]


# --- modern clients ---------------------------------------------------------------------------


async def test_the_sdk_clients_requests_go_to_each_replica_in_turn(cluster: Cluster) -> None:
    alone = await sdk_names(cluster.gateways[0].url)
    mark = cluster.log_mark()
    with anyio.fail_after(BOUND * 2):
        async with Client(cluster.url) as client:
            names = await tool_names(client)
            for i in range(3):
                assert text_of(await client.call_tool("sdk_echo", {"text": f"r{i}"})) == f"r{i}"
            resources = await client.list_resources()
            prompts = await client.list_prompts()
            templates = await client.list_resource_templates()
    assert names == alone and len(names) > 3 * PAGE_SIZE  # pages from every replica join up
    assert {p.name for p in prompts.prompts} == {"sdk_greet", "sdk_farewell"}
    assert resources.resources and templates.resource_templates
    lines = await cluster.requests_since(mark)
    assert_round_robin(lines, cluster.gateways)
    methods = [line[4] for line in lines]
    assert methods.count("tools/list") == len(names) // PAGE_SIZE + 1
    assert methods.count("tools/call") == 3


async def sdk_names(url: str) -> list[str]:
    async with Client(url) as client:
        return await tool_names(client)


async def test_an_input_required_retry_is_completed_by_another_replica(cluster: Cluster) -> None:
    asked: list[str] = []

    async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return await answer(context, params)

    mark = cluster.log_mark()
    with anyio.fail_after(BOUND * 2):
        async with Client(cluster.url, elicitation_callback=on_elicit) as client:
            result = await client.call_tool("sdk_ask", {"question": "ready?"})
    assert text_of(result) == "answer: yes" and asked == ["ready?"]
    lines = await cluster.requests_since(mark)
    calls = [line for line in lines if line[4] == "tools/call"]
    # The first call answered input_required; its retry, with the requestState, went to
    # another replica, which completed it.
    assert len(calls) == 2 and calls[0][0] != calls[1][0], calls
    assert all(line[1] == "200" for line in calls)


async def test_one_callers_burst_is_spent_over_the_three_replicas(cluster: Cluster) -> None:
    mark = cluster.log_mark()
    replies = [await post(cluster.url, call(i, "sdk_label")) for i in range(2 * LABEL_BURST)]
    lines = await cluster.requests_since(mark)
    assert_round_robin(lines, cluster.gateways)
    # `burst` calls in all, on three replicas, then refused by each of them: not 3 x burst.
    served, refused = replies[:LABEL_BURST], replies[LABEL_BURST:]
    assert all(status == 200 and "result" in reply for status, _, reply in served), served
    assert len({line[0] for line in lines[LABEL_BURST:]}) == 3
    for status, headers, reply in refused:
        assert status == 429, reply
        assert reply["error"]["code"] == codes.RATE_LIMITED
        delay = reply["error"]["data"]["retryAfter"]
        assert headers["Retry-After"] == str(max(1, math.ceil(delay)))


async def test_redis_stopped_and_started_under_load_fails_no_request(cluster: Cluster) -> None:
    failed = r"redis: rate-limit check failed"
    back = r"redis: reachable again"
    before = {g.port: (count_logged(g, failed), count_logged(g, back)) for g in cluster.gateways}
    with anyio.fail_after(START_BOUND + 4 * BOUND):
        async with load(cluster.url) as work:
            await anyio.to_thread.run_sync(cluster.redis.stop)
            for g in cluster.gateways:
                await logged(g, failed, before[g.port][0] + 1)
                assert await metric(g, "mcp_gateway_redis_up") == 0
            served = work.served
            await work.beyond(served)  # still served while Redis is away
            cluster.redis = await anyio.to_thread.run_sync(launch, cluster.redis_port)
            for g in cluster.gateways:
                await logged(g, back, before[g.port][1] + 1)
                assert await metric(g, "mcp_gateway_redis_up") == 1
                fallbacks = await metric(g, "mcp_gateway_rate_limit_fallbacks_total")
                assert fallbacks is not None and fallbacks > 0
            await work.beyond(work.served)


async def test_a_reload_of_every_replica_under_load_fails_no_request(cluster: Cluster) -> None:
    reloaded = r"config reloaded from \S+: added {}; removed {};"
    with anyio.fail_after(START_BOUND + 4 * BOUND):
        async with load(cluster.url) as work:
            for g in cluster.gateways:
                g.write(cluster.settings(extra=EXTRA))
                os.kill(g.running.popen.pid, signal.SIGHUP)
            for g in cluster.gateways:
                # (A reload that adds a stdio backend starts a process: bounded as starts are.)
                await logged(g, reloaded.format("extra", "none"), 1, START_BOUND)
            # The new backend answers through nginx, from every replica: the load's requests
            # take their turns too, so calls go in batches until each replica served some.
            seen: set[str] = set()
            with anyio.fail_after(START_BOUND):
                while seen != {g.address for g in cluster.gateways}:
                    mark = cluster.log_mark()
                    batch = [call(i, "extra_label") for i in range(3 * len(cluster.gateways))]
                    for status, _, reply in await post_all(cluster.url, batch):
                        assert status == 200, reply
                        assert reply["result"]["content"][0]["text"] == "extra"
                    lines = await cluster.requests_since(mark)
                    seen |= {line[0] for line in lines if line[5] == "extra_label"}
            for g in cluster.gateways:
                g.write(cluster.settings())
                os.kill(g.running.popen.pid, signal.SIGHUP)
            for g in cluster.gateways:
                await logged(g, reloaded.format("none", "extra"), 1)
                _, _, gone = await post(g.url, call("y", "extra_label"))
                assert gone["error"]["code"] == codes.INVALID_PARAMS, gone
            await work.beyond(work.served)


# --- not yet shared across replicas -----------------------------------------------------------


async def test_a_legacy_session_is_served_by_every_replica(cluster: Cluster) -> None:
    alone = await sdk_names(cluster.gateways[0].url)
    mark = cluster.log_mark()
    with anyio.fail_after(BOUND * 2):
        async with Client(cluster.url, mode="legacy", elicitation_callback=answer) as client:
            names = await tool_names(client)
            assert text_of(await client.call_tool("sdk_echo", {"text": "hi"})) == "hi"
            # The backend's input_required reaches the client as a request on its session,
            # and the client's answer is a POST nginx sends to another replica.
            assert text_of(await client.call_tool("sdk_ask", {"question": "ok?"})) == "answer: yes"
    assert names == alone
    # (The session's GET stream is logged when it ends, out of turn: its POSTs and DELETE are
    # what must take turns.)
    lines = await cluster.requests_since(mark)
    assert_round_robin([line for line in lines if line[2] != "GET"], cluster.gateways)


async def test_a_legacy_session_outlives_the_replica_that_opened_it(cluster: Cluster) -> None:
    # A fourth replica, first in a second nginx's upstream (round robin starts there): the
    # session is opened on it, then it is killed; the fixture's replicas and nginx are untouched.
    directory = cluster.directory / "doomed"
    directory.mkdir()
    access_log = directory / "access.log"
    with replicas(directory, cluster.settings(), count=1) as (doomed,):
        upstreams = [doomed, *cluster.gateways]
        with behind_nginx(directory, upstreams, access_log) as url:
            with anyio.fail_after(BOUND * 2):
                async with Client(url, mode="legacy") as client:
                    assert text_of(await client.call_tool("sdk_echo", {"text": "a"})) == "a"
                    opened = upstreams_logged(access_log)[0]
                    assert opened[0] == doomed.address and opened[2] == "POST", opened
                    mark = len(upstreams_logged(access_log))
                    doomed.stop(signal.SIGKILL)
                    # nginx finds it gone and sends each request to a live replica, which
                    # reads the session from Redis. One request can fail, and only this way:
                    # sent on a connection nginx still held to the dead replica before it saw
                    # that close, it went out, so nginx answers 502 rather than send it again
                    # (README "What a crash costs"); the session goes on all the same.
                    try:
                        after = await client.call_tool("sdk_echo", {"text": "b"})
                    except MCPError as exc:
                        assert exc.code == codes.INTERNAL_ERROR  # (the SDK's word for a 502)
                        posts = [t for t in tries(access_log, mark) if t[2] == "POST"]
                        assert posts == [([doomed.address], "502", "POST")], posts
                        after = await client.call_tool("sdk_echo", {"text": "b"})
                    assert text_of(after) == "b"
                    assert "sdk_echo" in await tool_names(client)
            # Every request after the kill was served by a live replica (nginx may have tried
            # the dead one first, and found it refusing connections).
            served = [t for t in tries(access_log, mark) if t[2] == "POST" and t[1] != "502"]
            assert served and all(t[0][-1] != doomed.address for t in served), served
            assert all(t[1] in ("200", "202") for t in served), served


async def test_a_listen_stream_hears_a_list_change_another_replica_saw(cluster: Cluster) -> None:
    a, b = cluster.gateways[:2]
    with anyio.fail_after(BOUND * 3):
        async with (
            Client(a.url) as listener,
            Client(b.url) as changer,
            listener.listen(tools_list_changed=True) as sub,
        ):
            events = sub.__aiter__()
            # B's backend says its tools changed; only B hears it from its backend.
            await changer.call_tool("sdk_change_tools", {})
            with anyio.fail_after(BOUND):
                assert isinstance(await events.__anext__(), ToolsListChanged)
