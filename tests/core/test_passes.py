"""Long work in passes (gateway/core/passes.py): tool search's index and the context budget
built a pass at a time in a worker thread, the event loop's turn between passes, and the
result the same whatever the pass size (README "Tool search": a reindex never holds requests)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Generator

import anyio
import anyio.lowlevel
import pytest

from bench.search import generated, index_of
from gateway.core import passes, toolsearch
from gateway.core.catalog import Catalogs
from gateway.protocol import headers
from gateway.routing import budget, search
from gateway.routing.names import Naming
from gateway.routing.search import Index
from gateway.routing.table import CatalogData, Exposure, build
from tests.support.memory_backend import MemoryBackend

TOOLS = generated(1000)


def indexes_equal(a: Index, b: Index) -> bool:
    return (
        a.entries == b.entries
        and a.tokens == b.tokens
        and {w: (list(i), list(f)) for w, (i, f) in a.postings.items()}
        == {w: (list(i), list(f)) for w, (i, f) in b.postings.items()}
    )


class Ticks:
    """The loop's turns while some work runs: a task that counts one at each checkpoint."""

    def __init__(self) -> None:
        self.count = 0

    async def run(self) -> None:
        while True:
            self.count += 1
            await anyio.lowlevel.checkpoint()


@pytest.mark.anyio
async def test_each_pass_runs_in_a_worker_thread_and_the_loop_runs_between_them() -> None:
    """A pass holds the GIL at most as long as it runs; between two the loop has its turn (a
    task of its own moves on), so a request waits at most a pass, never the whole build."""
    loop_thread = threading.get_ident()
    ticks = Ticks()
    seen: list[tuple[int, int]] = []  # (thread, ticks) at each pass

    def work() -> Generator[None, None, str]:
        for _ in range(5):
            seen.append((threading.get_ident(), ticks.count))
            yield
        return "done"

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticks.run)
        assert await passes.run(work()) == "done"
        tg.cancel_scope.cancel()
    assert len(seen) == 5
    assert all(thread != loop_thread for thread, _ in seen)
    marks = [t for _, t in seen]
    assert all(later > earlier for earlier, later in itertools.pairwise(marks))


@pytest.mark.parametrize("per_pass", [1, 16, 64, 100, 5000])
def test_an_index_built_in_passes_is_the_index_built_at_once(per_pass: int) -> None:
    """Whatever the pass size, the same postings, weights, entries and token estimate."""
    whole = index_of(TOOLS)
    steps = Index.passes(whole.entries, per_pass)
    count = 0
    while True:
        try:
            next(steps)
        except StopIteration as end:
            built: Index = end.value
            break
        count += 1
    assert indexes_equal(built, whole)
    if per_pass <= 64:  # each pass handles a pass's worth: 1,000 tools take many
        assert count >= len(whole.entries) // 64


def test_a_search_index_build_is_dropped_once_a_newer_table_is_being_built() -> None:
    """A list change during a build: the build stops at the next pass instead of finishing an
    index that would be thrown away."""
    items = tuple({**t, "name": f"{s}_{t['name']}"} for s, own in TOOLS.items() for t in own)
    data = CatalogData(tools=items)
    naming, exposure = Naming(), Exposure("cat", "cat")
    table = build(naming, [exposure], {"cat": data})
    newer = [False]
    steps = toolsearch._passes(table, {"cat": data}, lambda: newer[0])
    next(steps)
    newer[0] = True
    with pytest.raises(StopIteration) as end:
        next(steps)
    assert end.value.value is None
    # Not outdated, it ends with the index `search.entries` and `Index.build` give.
    whole = toolsearch._passes(table, {"cat": data}, lambda: False)
    while True:
        try:
            next(whole)
        except StopIteration as done:
            index, shadowed = done.value
            break
    found, _ = search.entries(table, {"cat": data}, toolsearch.NAMES)
    assert indexes_equal(index, Index.build(found)) and shadowed == []


@pytest.mark.parametrize("per_pass", [1, 16, 64, 100])
def test_a_budget_estimated_in_passes_is_the_estimate_at_once(per_pass: int) -> None:
    """The context budget's figures (items, tokens) do not depend on the pass size, filters
    leaving out items across pass boundaries included (the estimate's chunks stay the whole
    list's)."""
    items = tuple({**t, "name": f"{s}_{t['name']}"} for s, own in TOOLS.items() for t in own)
    data = CatalogData(tools=items)
    naming = Naming()
    for exposure in (Exposure("cat", "cat"), Exposure("cat", "cat", deny=("*_delete_*",))):
        whole = budget.backend_costs(naming, exposure, data)
        steps = budget.cost_passes(naming, exposure, data, per_pass)
        count = 0
        while True:
            try:
                next(steps)
            except StopIteration as end:
                assert end.value == whole
                break
            count += 1
        assert count >= len(items) // max(64, per_pass)
    assert whole["tools"].items < len(items)  # (the filter left some out)


@pytest.mark.anyio
async def test_a_load_rebuilds_each_servers_table_with_the_loops_turn_between() -> None:
    """A backend two servers offer (the merged one and a virtual one): one load, both route
    tables rebuilt, each a stretch of its own: the loop runs other work between them."""
    backend = MemoryBackend("one")
    exposures = [Exposure("one", "one")]
    merged = Catalogs([backend], exposures, Naming(), {"name": "test"})
    virtual = Catalogs([backend], exposures, Naming(), {"name": "test"}, shared=merged)
    ticks = Ticks()
    marks: list[tuple[str, int]] = []
    merged.on_rebuilt.append(lambda: marks.append(("merged", ticks.count)))
    virtual.on_rebuilt.append(lambda: marks.append(("virtual", ticks.count)))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticks.run)
        await merged.refresh("one")
        tg.cancel_scope.cancel()
    assert [name for name, _ in marks] == ["merged", "virtual"]
    assert marks[1][1] > marks[0][1]
    assert merged.table.tool("echo") is not None and virtual.table.tool("echo") is not None


def test_a_catalogs_header_annotations_are_walked_once_for_every_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each server's table of one catalog load reads the same x-mcp-header walk (the routes'
    headers as before: tests/routing), not one walk per table."""
    walked: list[object] = []
    real = headers.param_headers

    def counted(schema: object) -> tuple[headers.ParamHeader, ...] | str:
        walked.append(schema)
        return real(schema)

    monkeypatch.setattr(headers, "param_headers", counted)
    items = tuple({**t, "name": f"{s}_{t['name']}"} for s, own in TOOLS.items() for t in own)
    data = CatalogData(tools=items)
    build(Naming(), [Exposure("cat", "cat")], {"cat": data})
    build(Naming(), [Exposure("cat", "v", tools=("*_get_*",))], {"cat": data})
    assert len(walked) == len(items)
