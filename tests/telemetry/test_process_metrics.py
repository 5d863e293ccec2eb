"""Process and per-backend metrics, the event loop's lag and exemplars, on a real gateway's
/metrics (issue 21): every value here is measured (a blocked loop, a killed child, a call held
open), none assumed. The dashboard's queries of them are checked against a live scrape in
tests/system/test_observability_assets.py, a real Prometheus storing the exemplars in
tests/telemetry/test_prometheus_scrape.py."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gateway.app import Gateway
from gateway.backends.stdio import StdioBackend
from gateway.config import parse
from gateway.telemetry import procfs
from gateway.telemetry.loop import measure_lag
from tests.support import (
    BOUND,
    DEMO_STDIO,
    START_BOUND,
    call,
    gone,
    http_backend,
    messages,
    mirrored_headers,
    sdk_stdio_command,
    start_sdk_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SAMPLED = "4bf92f3577b34da6a3ce929d0e0e4736"
UNSAMPLED = "0af7651916cd43dd8448eb211c80319c"
OPENMETRICS = {"Accept": "application/openmetrics-text; version=1.0.0"}
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def sdk_http_url() -> Iterator[str]:
    proc, url = start_sdk_http()
    yield url
    proc.stop()


@asynccontextmanager
async def running(
    backends: dict[str, Any], tracing: TracerProvider | None = None
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession, str]]:
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": backends}
    )
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text), tracing=tracing) as gw, aiohttp.ClientSession() as s:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            yield gw, s, gw.http_url


async def post(session: aiohttp.ClientSession, url: str, msg: dict[str, Any]) -> dict[str, Any]:
    with anyio.fail_after(START_BOUND):
        async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
            body = await resp.read()
    if resp.content_type == "text/event-stream":
        body = body.strip().rsplit(b"data: ", 1)[1]
    reply: dict[str, Any] = orjson.loads(body)
    return reply


async def scrape(session: aiohttp.ClientSession, url: str, accept: str = "") -> str:
    headers = {"Accept": accept} if accept else {}
    with anyio.fail_after(BOUND):
        async with session.get(url.removesuffix("/mcp") + "/metrics", headers=headers) as resp:
            assert resp.status == 200
            return await resp.text()


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def one(got: Samples, name: str, **labels: str) -> float:
    return got[(name, frozenset(labels.items()))]


def traced(msg: dict[str, Any], trace_id: str, sampled: bool) -> dict[str, Any]:
    parent = f"00-{trace_id}-b7ad6b7169203331-{'01' if sampled else '00'}"
    msg["params"]["_meta"] = {**msg["params"]["_meta"], "traceparent": parent}
    return msg


# --- the event loop's lag -----------------------------------------------------------------------


async def test_lag_measures_a_blocked_loop() -> None:
    """A callback holding the loop 0.3 s makes the next wake-up that late: measured, the
    observation arriving as an event."""
    seen: list[float] = []
    measuring = anyio.Event()
    late = anyio.Event()

    def observe(seconds: float) -> None:
        seen.append(seconds)
        measuring.set()
        if seconds >= 0.2:
            late.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(measure_lag, observe, 0.05)
        with anyio.fail_after(BOUND):
            await measuring.wait()  # it runs, and has asked to wake again within 0.05 s
        time.sleep(0.3)  # noqa: ASYNC251 -- blocking the loop is what is measured
        with anyio.fail_after(BOUND):
            await late.wait()
        tg.cancel_scope.cancel()
    assert 0.2 <= max(seen) < 0.3 + BOUND
    assert min(seen) >= 0.0


async def test_gateway_exports_the_lag_of_its_loop() -> None:
    async with running({"demo": DEMO_STDIO}) as (_, session, url):
        # The gateway's task wakes every 0.5 s: a stall of 0.8 s covers a wake-up and holds it
        # at least 0.3 s. That late wake-up runs before the scrape's connection is accepted
        # (due timers run in the loop's first iteration after the stall).
        time.sleep(0.8)  # noqa: ASYNC251 -- a stalled loop, on purpose
        got = samples(await scrape(session, url))
    lag = "mcp_gateway_event_loop_lag_seconds"
    count = one(got, f"{lag}_count")
    assert count >= 1
    assert one(got, f"{lag}_bucket", le="0.25") < count  # one wake-up was over 0.25 s late
    assert one(got, f"{lag}_sum") >= 0.3


# --- the process ----------------------------------------------------------------------------------


async def test_process_gc_and_platform_metrics() -> None:
    async with running({"demo": DEMO_STDIO}) as (_, session, url):
        text = await scrape(session, url)
    got = samples(text)
    if procfs.AVAILABLE:
        assert one(got, "process_cpu_seconds_total") > 0
        assert one(got, "process_resident_memory_bytes") > 10_000_000  # an interpreter at least
        assert one(got, "process_open_fds") >= 3
        assert one(got, "process_start_time_seconds") <= time.time()
    generations = {
        dict(labels)["generation"] for name, labels in got if name == "python_gc_collections_total"
    }
    assert generations >= {"0", "1", "2"}
    assert any(name == "python_info" for name, _ in got)


# --- per backend: children, in flight, pool -------------------------------------------------


class _Started(logging.Handler):
    def __init__(self, event: anyio.Event) -> None:
        super().__init__(logging.INFO)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "backend %s: started pid %s":
            self.event.set()  # (logged on the loop's thread, by the supervisor's task)


@contextmanager
def started_children(event: anyio.Event) -> Iterator[None]:
    """`event` is set when a stdio backend logs the start of a child."""
    logger = logging.getLogger("gateway.backend")
    handler, level = _Started(event), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.mark.skipif(not procfs.AVAILABLE, reason="/proc: Linux only")
async def test_stdio_child_cpu_memory_and_restarts() -> None:
    async with running({"alpha": stdio_backend(sdk_stdio_command())}) as (gw, session, url):
        stdio = gw.transports[0]
        assert isinstance(stdio, StdioBackend) and stdio.pid is not None
        first = stdio.pid
        got = samples(await scrape(session, url))
        assert one(got, "mcp_gateway_backend_child_cpu_seconds_total", backend="alpha") > 0
        rss = one(got, "mcp_gateway_backend_child_resident_memory_bytes", backend="alpha")
        assert rss > 5_000_000  # a Python interpreter with the SDK loaded
        assert one(got, "mcp_gateway_backend_restarts_total", backend="alpha") == 0

        restarted = anyio.Event()
        with started_children(restarted):
            os.kill(first, signal.SIGKILL)
            await gone(first)
            with anyio.fail_after(START_BOUND):
                await restarted.wait()  # its supervisor logged the new child's start
        # A request waits for the started child to be ready; its answer names the new pid.
        reply = await post(session, url, call(1, "whoami"))
        second = int(reply["result"]["content"][0]["text"])
        assert second != first and second == stdio.pid
        got = samples(await scrape(session, url))
        assert one(got, "mcp_gateway_backend_restarts_total", backend="alpha") == 1
        assert one(got, "mcp_gateway_backend_child_cpu_seconds_total", backend="alpha") > 0
        assert one(got, "mcp_gateway_backend_child_resident_memory_bytes", backend="alpha") > 0


def test_procfs_usage_of_this_process_and_of_a_gone_one() -> None:
    if not procfs.AVAILABLE:
        assert procfs.usage([os.getpid()]) is None
        return
    mine = procfs.usage([os.getpid()])
    assert mine is not None and mine.cpu_seconds > 0 and mine.resident_bytes > 0
    # A pid that is not running counts nothing (exited between the pid's read and the scrape).
    assert procfs.usage([2**22 + 1]) == procfs.Usage(0.0, 0)


async def test_http_backend_in_flight_and_pool_connections(sdk_http_url: str) -> None:
    async with running({"beta": http_backend(sdk_http_url)}) as (_, session, url):
        await post(session, url, call(1, "echo", text="warm"))
        got = samples(await scrape(session, url))
        assert one(got, "mcp_gateway_backend_requests_in_flight", backend="beta") == 0
        assert one(got, "mcp_gateway_backend_pool_connections", backend="beta", state="in_use") == 0
        assert one(got, "mcp_gateway_backend_pool_connections", backend="beta", state="idle") >= 1
        # No child process: no child metrics for an HTTP backend.
        assert not any(n.startswith("mcp_gateway_backend_child_") for n, _ in got)

        msg = call(2, "slow", token="slow-2", seconds=30, steps=300)
        with anyio.fail_after(BOUND):
            async with session.post(
                url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
            ) as resp:
                async for item in messages(resp):
                    # The first progress: the call is running in the backend now.
                    assert item.get("method") == "notifications/progress", item
                    break
                during = samples(await scrape(session, url))
    assert one(during, "mcp_gateway_backend_requests_in_flight", backend="beta") == 1
    in_use = one(during, "mcp_gateway_backend_pool_connections", backend="beta", state="in_use")
    assert in_use >= 1


# --- exemplars ------------------------------------------------------------------------------------


def exemplars(text: str) -> dict[str, list[Sample]]:
    """Trace id -> the bucket samples carrying it, out of an OpenMetrics exposition."""
    out: dict[str, list[Sample]] = {}
    for family in openmetrics_families(text):  # type: ignore[no-untyped-call]
        for s in family.samples:
            if s.exemplar is not None:
                out.setdefault(s.exemplar.labels["trace_id"], []).append(s)
    return out


async def test_exemplars_name_sampled_traces_only() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with running({"demo": DEMO_STDIO}, provider) as (_, session, url):
        await post(session, url, traced(call(1, "echo", text="x"), UNSAMPLED, sampled=False))
        await post(session, url, traced(call(2, "echo", text="y"), SAMPLED, sampled=True))
        text = await scrape(session, url, OPENMETRICS["Accept"])
        classic = await scrape(session, url)
    found = exemplars(text)
    assert UNSAMPLED not in found  # its trace was not recorded: a link would lead nowhere
    names = {s.name for s in found[SAMPLED]}
    assert names == {
        "mcp_server_operation_duration_seconds_bucket",
        "mcp_client_operation_duration_seconds_bucket",
    }
    for s in found[SAMPLED]:
        assert s.labels["mcp_method_name"] == "tools/call" and s.labels["target"] == "echo"
        assert s.exemplar is not None and 0 < s.exemplar.value <= float(s.labels["le"])
    recorded = {format(span.context.trace_id, "032x") for span in exporter.get_finished_spans()}
    assert SAMPLED in recorded and UNSAMPLED not in recorded
    assert SAMPLED not in classic  # the classic text format has no exemplars


async def test_no_exemplars_without_tracing() -> None:
    async with running({"demo": DEMO_STDIO}) as (_, session, url):
        await post(session, url, traced(call(1, "echo", text="x"), SAMPLED, sampled=True))
        text = await scrape(session, url, OPENMETRICS["Accept"])
    assert exemplars(text) == {}


async def test_lag_task_ends_with_the_gateway() -> None:
    """The lag task is the gateway's: none is left on the loop once it has stopped."""
    async with running({"demo": DEMO_STDIO}):
        named = {t.get_name() for t in asyncio.all_tasks()}
        assert any("event-loop lag" in name for name in named)
    assert not any("event-loop lag" in t.get_name() for t in asyncio.all_tasks())
