"""A list's first page takes a backend's part from its catalog, without asking it, while the
backend's own hints allow (server/utilities/caching: "Cacheable Model", "Cache Scope Field",
"Interaction with Notifications", "Interaction with Pagination"; issue 34): every page of the
load public with a positive `ttlMs`, younger than the smallest, no list change, restart or failed
load since, the backend up and its `lists_from_catalog` on. Anything else is asked as before: a
private list, `ttlMs` 0 or absent (a legacy-era server's), an expired one, a later page (its
cursor), a retry with `requestState`/`inputResponses` (basic/patterns/mrtr: not cacheable). The
page is the one the backend's answer would have made, but for `ttlMs`: what is left of the
backend's. Engine tests over in-memory backends (tests/support/memory_backend.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway import errors
from gateway.app.servers import make
from gateway.config import parse
from gateway.core import catalog
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.policy import Policy
from gateway.frontends.legacy.front import LegacyFront, Session
from gateway.origin import Origin
from gateway.protocol.jsonrpc import Message
from gateway.routing import cursor as cursors
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.telemetry.api import NoTelemetry, Stats
from gateway.telemetry.metrics import GatewayCollector
from gateway.telemetry.recorder import BackendState
from tests.support.memory_backend import TOOLS, MemoryBackend, ignore, modern

pytestmark = pytest.mark.anyio

HOUR = 3_600_000
PUBLIC = {"ttlMs": HOUR, "cacheScope": "public"}
LIST_METHODS = ("tools/list", "resources/list", "resources/templates/list")
# Far below any timeout, far above what an in-memory answer takes.
BOUND = 5.0


class Hinted(MemoryBackend):
    """MemoryBackend whose lists carry cache hints (`hints`; per page: `page_hints`), its tools
    on `pages` pages (cursors `p2`, `p3`, ...), and its discovery `ttlMs` 0; `up` as set; the
    methods in `failing` fail as a server answering HTTP 500 does; a `gate` held closed holds
    every tools/list until it is set."""

    def __init__(
        self,
        name: str = "mem",
        hints: dict[str, Any] | None = None,
        pages: int = 1,
        page_hints: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(name)
        self.hints = PUBLIC if hints is None else hints
        self.pages = pages
        self.page_hints = page_hints
        self.is_up = True
        self.failing: set[str] = set()
        self.gate: anyio.Event | None = None
        self.listing = anyio.Event()  # set when a tools/list arrives

    @property
    def up(self) -> bool:
        return self.is_up

    async def answer(self, msg: Message) -> Message:
        method = msg["method"]
        if method in self.failing:
            raise errors.BackendUnavailable(self.name, "HTTP 500 without a JSON-RPC reply")
        if method == "tools/list":
            self.listing.set()
            if self.gate is not None:
                await self.gate.wait()
        reply = await super().answer(msg)
        if method == "server/discover":
            return {**reply, "result": {**reply["result"], "ttlMs": 0}}
        if method not in LIST_METHODS:
            return reply
        result = {"resultType": "complete", **reply["result"], **self.hints}
        if method == "tools/list" and self.pages > 1:
            cursor = msg["params"].get("cursor")
            page = int(cursor[1:]) if isinstance(cursor, str) else 1
            result["tools"] = [t for i, t in enumerate(TOOLS) if i % self.pages == page - 1]
            if page < self.pages:
                result["nextCursor"] = f"p{page + 1}"
            if self.page_hints is not None:
                result.update(self.page_hints[page - 1])
        return {**reply, "result": result}

    def lists(self, method: str = "tools/list") -> list[Message]:
        """The requests for a list it was sent (the gateway's catalog loads among them)."""
        return [m for m in self.asked if m["method"] == method]


def dispatcher(*backends: MemoryBackend, on: bool = True, **extra: Any) -> Dispatcher:
    return Dispatcher(
        backends,
        [Exposure(b.name, b.name, lists_from_catalog=on) for b in backends],
        Naming(PrefixMode.AUTO, backends=len(backends)),
        GatewayInfo("mcp-gateway", "test"),
        **extra,
    )


async def loaded(*backends: MemoryBackend, on: bool = True, **extra: Any) -> Dispatcher:
    d = dispatcher(*backends, on=on, **extra)
    with anyio.fail_after(BOUND):
        await d.catalogs.load_all()
    return d


async def answer(d: Dispatcher, msg: Message) -> dict[str, Any]:
    with anyio.fail_after(BOUND):
        reply = await d.handle(msg, ignore)
    assert "result" in reply, reply
    result: dict[str, Any] = reply["result"]
    return result


def names(result: dict[str, Any]) -> list[str]:
    return [t["name"] for t in result["tools"]]


async def asks(d: Dispatcher, backend: Hinted, msg: Message) -> int:
    """How many requests of `msg`'s reached the backend while it was served (the gateway's own
    catalog loads, under ids of their own, aside)."""
    before = len(backend.lists(msg["method"]))
    await answer(d, msg)
    return sum(m["id"] == msg["id"] for m in backend.lists(msg["method"])[before:])


async def until_shared(d: Dispatcher, backend: str) -> None:
    """Until the backend's tool list may be served from its catalog (a background load ended)."""
    catalogs = d.catalogs
    with anyio.fail_after(BOUND):
        while catalogs.shared_list(backend, "tools", anyio.current_time()) is None:
            await catalogs.changed.wait()


# --- answered from the catalog ----------------------------------------------------------------


async def test_a_fresh_public_list_is_answered_from_the_catalog_as_the_backend_would() -> None:
    """Each of the backend's lists is served without a request of its own; the page is the one
    asking would have made, its ttlMs what is left of the backend's, `public` kept."""
    mem = Hinted()
    d = await loaded(mem)
    asked = await answer(await loaded(Hinted(), on=False), modern(1, "tools/list"))
    for method in LIST_METHODS:
        assert await asks(d, mem, modern(2, method)) == 0, method
    served = await answer(d, modern(3, "tools/list"))
    assert asked["ttlMs"] == HOUR
    assert HOUR - BOUND * 1000 < served["ttlMs"] <= HOUR
    assert {**served, "ttlMs": HOUR} == asked
    assert d.catalogs.from_catalog == {"mem": 4}


async def test_every_page_of_the_load_counts_and_the_whole_list_is_the_first_page() -> None:
    """Interaction with Pagination: each page has its own ttlMs; the catalog holds every page,
    so its part is the whole list, with no cursor of its own, fresh for the shortest of them."""
    mem = Hinted(pages=2, page_hints=[PUBLIC, {"ttlMs": 60_000, "cacheScope": "public"}])
    d = await loaded(mem)
    assert await asks(d, mem, modern(1, "tools/list")) == 0
    served = await answer(d, modern(2, "tools/list"))
    assert sorted(names(served)) == sorted(str(t["name"]) for t in TOOLS)
    assert "nextCursor" not in served
    assert 60_000 - BOUND * 1000 < served["ttlMs"] <= 60_000


async def test_merged_hints_take_the_strictest_part_whichever_way_it_came() -> None:
    """A part from the catalog and one asked: the smallest ttlMs, private if any part is."""
    fresh = Hinted("fresh")
    private = Hinted("private", hints={"ttlMs": 60_000, "cacheScope": "private"})
    d = await loaded(fresh, private)
    before = len(fresh.lists()), len(private.lists())
    served = await answer(d, modern(1, "tools/list"))
    assert (len(fresh.lists()), len(private.lists())) == (before[0], before[1] + 1)
    assert (served["ttlMs"], served["cacheScope"]) == (60_000, "private")
    assert len(served["tools"]) == 2 * len(TOOLS)
    assert names(served)[: len(TOOLS)] == [f"fresh_{t['name']}" for t in TOOLS]  # config order


async def test_the_callers_view_still_decides_what_a_list_from_the_catalog_shows() -> None:
    """A policy's hidden tool stays hidden (the policy judges every part alike)."""
    config = parse(
        "listen: {stdio: true}\nbackends:\n  mem: {stdio: {command: x}}\npolicy:\n"
        "  default: allow\n  rules:\n    - deny: {backends: [mem], tools: [add]}\n"
    )
    assert config.policy is not None
    mem = Hinted()
    d = await loaded(mem, policy=Policy(config.policy))
    before = len(mem.lists())
    with anyio.fail_after(BOUND):
        reply = await d.serve(modern(1, "tools/list"), ignore, Origin("http"))
    assert names(reply["result"]) == ["echo", "fail", "hold"]
    assert len(mem.lists()) == before


async def test_a_virtual_servers_list_from_the_catalog_shows_its_own_selection() -> None:
    """A virtual server shares the merged server's catalogs (0061): its list is served from them
    too, through its own selection and names, and counted with the merged server's."""
    config = parse(
        "listen: {http: {port: 0}}\nbackends:\n  mem: {stdio: {command: x}}\n"
        "servers:\n  few:\n    backends:\n      mem: {tools: [echo, add]}\n"
    )
    mem = Hinted()
    main = dispatcher(mem)
    few = make(config, config.servers[0], main, {"mem": mem}, NoTelemetry())
    with anyio.fail_after(BOUND):
        await main.catalogs.load_all()
    before = len(mem.lists())
    assert names(await answer(few, modern(1, "tools/list"))) == ["echo", "add"]
    assert names(await answer(main, modern(2, "tools/list"))) == [str(t["name"]) for t in TOOLS]
    assert len(mem.lists()) == before
    assert main.catalogs.from_catalog == {"mem": 2}


async def test_a_legacy_clients_list_is_answered_from_the_catalog_too() -> None:
    """A legacy session's tools/list goes through the same list path (frontends/legacy/front.py);
    its answer has no 2026-07-28 cache hints."""
    mem = Hinted()
    d = await loaded(mem)
    session, front = Session(), LegacyFront(d)
    before = len(mem.lists())
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize"}
    params = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "c"}}
    listed = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with anyio.fail_after(BOUND):
        await front.handle(session, {**init, "params": params}, ignore)
        reply = await front.handle(session, listed, ignore)
    assert names(reply["result"]) == [t["name"] for t in TOOLS]
    assert "ttlMs" not in reply["result"] and "cacheScope" not in reply["result"]
    assert len(mem.lists()) == before
    assert d.catalogs.from_catalog == {"mem": 1}


async def test_a_list_from_the_catalog_does_not_wait_past_the_grace_for_a_slow_one() -> None:
    """fan_out.grace counts from the parts in hand: a slow backend asked beside a part from the
    catalog is shown as its catalog last listed it (on a page not to be cached), and one that
    fails is left out without failing the list (0010)."""
    fresh, slow = Hinted("fresh"), Hinted("slow", hints={})
    d = await loaded(fresh, slow, grace=0.01)
    slow.gate = anyio.Event()  # (never set: it does not answer)
    served = await answer(d, modern(1, "tools/list"))
    assert len(served["tools"]) == 2 * len(TOOLS) and served["ttlMs"] == 0
    failing = Hinted("failing", hints={})
    d = await loaded(Hinted("fresh"), failing)
    failing.failing.add("tools/list")
    served = await answer(d, modern(2, "tools/list"))
    assert names(served) == [f"fresh_{t['name']}" for t in TOOLS]


# --- asked of the backend ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "hints",
    [
        {"ttlMs": HOUR, "cacheScope": "private"},  # never shared across callers
        {"ttlMs": HOUR},  # no scope: not said to be public
        {"ttlMs": 0, "cacheScope": "public"},  # immediately stale
        {"ttlMs": -5, "cacheScope": "public"},  # treated as 0
        {"ttlMs": "3600000", "cacheScope": "public"},  # not an integer
        {"cacheScope": "public"},  # absent: 0 (a legacy-era server sends none)
        {},
    ],
    ids=["private", "no-scope", "ttl-0", "ttl-negative", "ttl-string", "no-ttl", "no-hints"],
)
async def test_a_list_not_fresh_and_public_by_the_backends_hints_is_asked(
    hints: dict[str, Any],
) -> None:
    mem = Hinted(hints=hints)
    d = await loaded(mem)
    assert await asks(d, mem, modern(1, "tools/list")) == 1
    assert d.catalogs.from_catalog == {"mem": 0}


async def test_one_page_not_public_makes_the_whole_list_asked() -> None:
    """Every page of the listing must allow it: the second one private, the list is asked."""
    private = {"ttlMs": HOUR, "cacheScope": "private"}
    mem = Hinted(pages=2, page_hints=[PUBLIC, private])
    d = await loaded(mem)
    assert await asks(d, mem, modern(1, "tools/list")) == 1


async def test_an_expired_list_is_asked_and_loaded_again_in_the_background() -> None:
    """Freshness Calculation: past ttlMs the backend is asked, and its catalog is loaded again
    (once), after which lists are served from it again."""
    mem = Hinted(hints={"ttlMs": 100, "cacheScope": "public"})
    async with anyio.create_task_group() as tg:
        d = dispatcher(mem)
        d.catalogs.spawn = tg.start_soon
        with anyio.fail_after(BOUND):
            await d.catalogs.load_all()
        assert await asks(d, mem, modern(1, "tools/list")) == 0
        await anyio.sleep(0.15)  # (time passing, past the backend's 100 ms: what is tested)
        assert await asks(d, mem, modern(2, "tools/list")) == 1
        await until_shared(d, "mem")
        assert await asks(d, mem, modern(3, "tools/list")) == 0
        tg.cancel_scope.cancel()
    assert d.catalogs.refreshes == {"mem": 2}


async def test_after_a_list_change_the_backend_is_asked_until_its_catalog_is_loaded_again() -> None:
    """Interaction with Notifications: a list change makes the catalog stale at once."""
    mem = Hinted()
    async with anyio.create_task_group() as tg:
        d = dispatcher(mem)
        with anyio.fail_after(BOUND):
            await d.catalogs.load_all()
        change = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        d.backend_notification("mem", change)  # (no background reload yet: no spawn)
        assert await asks(d, mem, modern(1, "tools/list")) == 1
        d.catalogs.spawn = tg.start_soon
        d.backend_notification("mem", change)
        await until_shared(d, "mem")
        assert await asks(d, mem, modern(2, "tools/list")) == 0
        tg.cancel_scope.cancel()


async def test_a_load_that_a_list_change_overtook_is_not_served() -> None:
    """A change told while a load was reading the lists: what it read may be from before."""
    mem = Hinted()
    d = await loaded(mem)
    mem.gate, mem.listing = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        d.catalogs.invalidate("mem")
        tg.start_soon(d.catalogs.refresh, "mem")
        with anyio.fail_after(BOUND):
            await mem.listing.wait()
        d.backend_notification(
            "mem", {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        )
        mem.gate.set()
    assert d.catalogs.problem("mem") is None
    assert await asks(d, mem, modern(1, "tools/list")) == 1


async def test_after_a_failed_load_the_backend_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its discovery stale at once (ttlMs 0) while its lists are not: a miss's refresh that
    fails keeps the catalog for routing, not for lists."""
    monkeypatch.setattr(catalog, "MIN_REFRESH_INTERVAL", 0.0)
    mem = Hinted()
    d = await loaded(mem)
    assert await asks(d, mem, modern(1, "tools/list")) == 0
    mem.failing.add("server/discover")
    with anyio.fail_after(BOUND):
        await d.catalogs.refresh("mem")
    assert d.catalogs.problem("mem") is not None
    assert await asks(d, mem, modern(2, "tools/list")) == 1


async def test_a_backend_down_is_asked_and_skipped_as_before() -> None:
    mem = Hinted()
    d = await loaded(mem)
    mem.is_up = False
    assert await asks(d, mem, modern(1, "tools/list")) == 1


async def test_a_later_page_is_asked_with_its_own_cursor() -> None:
    """A cursor names the backend's own position: only the backend can answer it."""
    mem = Hinted(pages=2)
    d = await loaded(mem)
    cursor = cursors.encode([("mem", "p2")], d.cursor_keys[0], "tools/list")
    assert await asks(d, mem, modern(1, "tools/list", cursor=cursor)) == 1
    assert mem.lists()[-1]["params"]["cursor"] == "p2"


@pytest.mark.parametrize("param", ["requestState", "inputResponses"])
async def test_a_multi_round_trip_retry_is_asked(param: str) -> None:
    """Cache Key: a request carrying `requestState` or `inputResponses` must not be served from
    a cache; its part is asked of the backend."""
    mem = Hinted()
    d = await loaded(mem)
    value: object = "state" if param == "requestState" else {"k": {"action": "accept"}}
    assert await asks(d, mem, modern(1, "tools/list", **{param: value})) == 1


async def test_lists_from_catalog_off_asks_the_backend_every_time() -> None:
    """`backends.NAME.lists_from_catalog: false`: for a backend whose hints are not trusted."""
    mem = Hinted()
    d = await loaded(mem, on=False)
    assert await asks(d, mem, modern(1, "tools/list")) == 1
    assert await asks(d, mem, modern(2, "tools/list")) == 1


# --- observable --------------------------------------------------------------------------------


def test_lists_from_the_catalog_are_counted_per_backend_on_metrics() -> None:
    state = BackendState("mem", True, 0, 1, 0, lists_from_catalog=3)
    registry = CollectorRegistry()
    registry.register(GatewayCollector(Stats(), lambda: [state], lambda: 0))
    text = generate_latest(registry).decode()
    assert 'mcp_gateway_lists_from_catalog_total{backend="mem"} 3.0' in text
