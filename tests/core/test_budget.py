"""The context budget kept by the engine (gateway/core/budget.py) over in-memory backends: what
each server's lists (server/tools, server/prompts, server/resources: the list results) cost a
model, as the `mcp_gateway_catalog_tokens` gauge and the status page show it, after a catalog
load, a list change (notifications/tools/list_changed) and a reload."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import pytest
from prometheus_client import CollectorRegistry

from gateway.app.views import catalog_rows, server_facts
from gateway.backends.base import NotificationSink
from gateway.core import budget
from gateway.core.budget import DEFAULT_SERVER, Budget
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.protocol.jsonrpc import Message
from gateway.routing.budget import KINDS, Cost, backend_costs
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.telemetry.api import Stats
from gateway.telemetry.metrics import GatewayCollector
from gateway.telemetry.status import StatusBoard, snapshot
from tests.support import BOUND
from tests.support.memory_backend import FakeBackend, MemoryBackend

pytestmark = pytest.mark.anyio

CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def tool(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"type": "object"}}


class Lists:
    """A backend whose tools a test changes, and which may fail its discovery."""

    def __init__(self, name: str, tools: list[dict[str, Any]]) -> None:
        self.tools = tools
        self.broken = False
        self.backend = FakeBackend(self.handle, name)

    async def handle(self, msg: Message, sink: NotificationSink) -> Message | None:
        if msg["method"] == "server/discover" and self.broken:
            return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32603, "message": "x"}}
        if msg["method"] == "tools/list":
            return {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": list(self.tools)}}
        return None  # (the memory server's answer)


class Engine:
    """A dispatcher over the backends, its budget followed by a task, and the metrics."""

    def __init__(self, tg: anyio.abc.TaskGroup, *backends: MemoryBackend) -> None:
        self.naming = Naming(backends=len(backends))
        self.dispatcher = Dispatcher(
            list(backends),
            [Exposure(b.name, b.name) for b in backends],
            self.naming,
            GatewayInfo("mcp-gateway", "test"),
        )
        self.dispatcher.catalogs.spawn = tg.start_soon
        self.budget = Budget()
        self.registry = CollectorRegistry()
        self.registry.register(
            GatewayCollector(Stats(), list, lambda: 0, list, lambda: catalog_rows(self.budget))
        )
        self.tg = tg

    async def start(self) -> None:
        await self.dispatcher.catalogs.load_all()
        self.tg.start_soon(self.budget.follow, DEFAULT_SERVER, self.dispatcher.catalogs)

    def gauge(self, name: str, kind: str) -> float:
        labels = {"server": DEFAULT_SERVER, "kind": kind}
        value = self.registry.get_sample_value(f"mcp_gateway_catalog_{name}", labels)
        assert value is not None, (name, kind)
        return value

    def expected(self) -> dict[str, Cost]:
        """What each kind costs, from the catalogs as loaded now (routing/budget.py's sums)."""
        out = dict.fromkeys(KINDS, Cost())
        for exposure, data in self.dispatcher.catalogs.sources():
            if data is not None:
                for kind, cost in backend_costs(self.naming, exposure, data).items():
                    out[kind] += cost
        return out

    async def settled(self, check: Callable[[], bool]) -> None:
        with anyio.fail_after(BOUND):
            while not check():
                await self.budget.changed.wait()


@pytest.fixture
async def tg() -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as group:
        yield group
        group.cancel_scope.cancel()


async def test_the_gauge_after_a_catalog_load(tg: anyio.abc.TaskGroup) -> None:
    alpha = Lists("alpha", [tool("search", "Find documents by words."), tool("fetch", "Get one.")])
    engine = Engine(tg, alpha.backend, MemoryBackend("beta"))
    await engine.start()
    await engine.settled(lambda: set(engine.budget.backends(DEFAULT_SERVER)) == {"alpha", "beta"})
    expected = engine.expected()
    assert expected["tools"].items == 2 + 4 and expected["resources"].items == 1 + 1
    for kind in KINDS:
        assert engine.gauge("tokens", kind) == expected[kind].tokens
        assert engine.gauge("items", kind) == expected[kind].items
    assert engine.gauge("tokens", "tools") > 0
    assert engine.gauge("tokens", "prompts") == 0  # (a kind nobody offers is there, at 0)


async def test_a_list_change_reloads_the_catalog_and_moves_the_gauge(
    tg: anyio.abc.TaskGroup,
) -> None:
    """A backend's notifications/tools/list_changed loads its catalog again in the background,
    with no request asking; only that backend is estimated again."""
    alpha = Lists("alpha", [tool("search", "Find documents by words.")])
    engine = Engine(tg, alpha.backend, MemoryBackend("beta"))
    await engine.start()
    await engine.settled(lambda: len(engine.budget.backends(DEFAULT_SERVER)) == 2)
    before = engine.gauge("tokens", "tools")
    beta = engine.budget.backends(DEFAULT_SERVER)["beta"]
    alpha.tools.append(tool("translate", "Translate a text into another language. " * 20))
    engine.dispatcher.backend_notification("alpha", CHANGED)
    await engine.settled(lambda: engine.budget.costs(DEFAULT_SERVER)["tools"].items == 1 + 4 + 1)
    assert engine.gauge("tokens", "tools") == engine.expected()["tools"].tokens
    assert engine.gauge("tokens", "tools") > before + 100
    assert engine.budget.backends(DEFAULT_SERVER)["beta"] is beta  # (not estimated again)


async def test_changes_during_a_load_make_one_more_load_not_one_each(
    tg: anyio.abc.TaskGroup,
) -> None:
    alpha = Lists("alpha", [tool("search", "Find.")])
    engine = Engine(tg, alpha.backend)
    await engine.start()
    loads = engine.dispatcher.catalogs.refreshes["alpha"]
    alpha.tools.append(tool("fetch", "Get one."))
    for _ in range(5):
        engine.dispatcher.backend_notification("alpha", CHANGED)
    await engine.settled(lambda: engine.budget.costs(DEFAULT_SERVER)["tools"].items == 2)
    with anyio.fail_after(BOUND):
        while engine.dispatcher.catalogs.refreshes["alpha"] < loads + 2:
            await engine.dispatcher.catalogs.changed.wait()
    await anyio.wait_all_tasks_blocked()
    assert engine.dispatcher.catalogs.refreshes["alpha"] == loads + 2


async def test_a_backend_whose_catalog_did_not_load_counts_nothing(
    tg: anyio.abc.TaskGroup,
) -> None:
    broken = Lists("broken", [tool("never", "Never listed.")])
    broken.broken = True
    engine = Engine(tg, broken.backend, MemoryBackend("beta"))
    await engine.start()
    await engine.settled(lambda: "beta" in engine.budget.backends(DEFAULT_SERVER))
    assert set(engine.budget.backends(DEFAULT_SERVER)) == {"beta"}
    assert engine.gauge("items", "tools") == 4
    (facts,) = server_facts(engine.budget)
    assert facts.backend_tokens == {"beta": engine.budget.tokens(DEFAULT_SERVER)}


async def test_a_reload_that_removes_a_backend_takes_its_part_away(
    tg: anyio.abc.TaskGroup,
) -> None:
    alpha = Lists("alpha", [tool("search", "Find documents by words.")])
    engine = Engine(tg, alpha.backend, MemoryBackend("beta"))
    await engine.start()
    await engine.settled(lambda: len(engine.budget.backends(DEFAULT_SERVER)) == 2)
    engine.naming = Naming()
    engine.dispatcher.reconfigure(
        [alpha.backend], [Exposure("alpha", "alpha")], engine.naming, "fail_open", None, None
    )
    await engine.settled(lambda: set(engine.budget.backends(DEFAULT_SERVER)) == {"alpha"})
    assert engine.gauge("items", "tools") == 1
    # One backend left: its names are no longer prefixed, and cost less.
    assert engine.gauge("tokens", "tools") == engine.expected()["tools"].tokens


async def test_the_status_page_lists_each_server(tg: anyio.abc.TaskGroup) -> None:
    engine = Engine(tg, MemoryBackend("beta"))
    await engine.start()
    await engine.settled(lambda: bool(engine.budget.backends(DEFAULT_SERVER)))
    page = snapshot(
        StatusBoard(),
        version="test",
        listeners={},
        backends=[],
        servers=server_facts(engine.budget),
        serving=True,
        draining=False,
    )
    expected = engine.expected()
    assert page["servers"] == [
        {
            "name": "default",
            "items": {kind: cost.items for kind, cost in expected.items()},
            "tokens": {kind: cost.tokens for kind, cost in expected.items()},
            "total_tokens": sum(cost.tokens for cost in expected.values()),
            "backend_tokens": {"beta": sum(cost.tokens for cost in expected.values())},
        }
    ]
    engine.budget.forget(DEFAULT_SERVER)
    assert server_facts(engine.budget) == []


async def test_an_estimate_that_fails_is_one_log_line_and_the_next_change_is_estimated(
    tg: anyio.abc.TaskGroup, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The budget is a figure for operators: its failure never ends the gateway's tasks."""
    failed = anyio.Event()
    real = budget._estimate

    def once_broken(naming: Naming, stale: Any) -> Generator[None, None, Any]:
        # (a generator: its first pass runs in the worker thread, where it fails)
        if not failed.is_set():
            anyio.from_thread.run_sync(failed.set)
            raise ValueError("not today")
        return (yield from real(naming, stale))

    monkeypatch.setattr(budget, "_estimate", once_broken)
    alpha = Lists("alpha", [tool("search", "Find.")])
    engine = Engine(tg, alpha.backend)
    await engine.start()
    with anyio.fail_after(BOUND):
        await failed.wait()
    alpha.tools.append(tool("fetch", "Get one."))
    engine.dispatcher.backend_notification("alpha", CHANGED)
    await engine.settled(lambda: engine.budget.costs(DEFAULT_SERVER)["tools"].items == 2)
    lines = [r for r in caplog.records if r.name == "gateway.budget"]
    assert len(lines) == 1 and "not today" in lines[0].getMessage()
    assert lines[0].exc_info is None  # (no traceback)
