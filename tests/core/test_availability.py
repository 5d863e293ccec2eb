"""One backend that never answers, answers late, is down or fails every request must not hold
up what the others serve (server/tools "Listing Tools", server/utilities/pagination,
basic/patterns/subscriptions, basic/index "Error Codes"): merged lists and discovery answer
with what is in `fan_out.grace` after the last answer, a listen is acknowledged without it, an
unknown name is told at once, and a name of a backend whose catalog cannot be loaded is that
backend's unavailability, not an unknown name. Under fail_closed a list still waits for every
backend. Engine tests over in-memory backends (tests/support/memory_backend.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest

from gateway import errors
from gateway.backends.base import Call, NotificationSink
from gateway.core import catalog
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from tests.support.memory_backend import FakeBackend, MemoryBackend, ignore, modern, tool_call

pytestmark = pytest.mark.anyio

# "Promptly": far below the timeouts a silent backend would otherwise be waited for (the
# listen acknowledgement's 10 s, a catalog load's 15 s, a request's 300 s).
PROMPT = 1.0


class Listening(MemoryBackend):
    """Announces its tool list's changes; acknowledges a listen at once and keeps it open."""

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        if msg["method"] == "server/discover":
            caps = {"tools": {"listChanged": True}}
            return {"jsonrpc": "2.0", "id": msg["id"], "result": {"capabilities": caps}}
        if msg["method"] != "subscriptions/listen":
            return await super().request(msg, sink, call, long_lived=long_lived)
        honoured = msg["params"]["notifications"]
        params = {"notifications": honoured, "_meta": {meta.SUBSCRIPTION_ID: msg["id"]}}
        await sink({"jsonrpc": "2.0", "method": meta.ACKNOWLEDGED, "params": params})
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class Silent(MemoryBackend):
    """Takes every request and never answers (a child that never replies to its opening, a
    server that accepts and says nothing); counts the requests given up on."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.abandoned = 0

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.asked.append(msg)
        try:
            await anyio.sleep_forever()
        finally:
            self.abandoned += 1
        raise AssertionError("unreachable")


class Late(MemoryBackend):
    """Answers like MemoryBackend, `delay` seconds after each request (a slow server)."""

    def __init__(self, name: str, delay: float) -> None:
        super().__init__(name)
        self.delay = delay

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        await anyio.sleep(self.delay)  # the server's own slowness, not a wait of the test
        return await super().request(msg, sink, call, long_lived=long_lived)


def erring(name: str) -> MemoryBackend:
    """Every request fails as a backend answering HTTP 500 to everything does."""

    async def fail(msg: Message, sink: NotificationSink) -> Message:
        raise errors.BackendUnavailable(name, "HTTP 500 without a JSON-RPC reply")

    return FakeBackend(fail, name)


class Down(MemoryBackend):
    """Known to be down: every request fails at once (backends/health.py's refusal)."""

    @property
    def up(self) -> bool:
        return False

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.asked.append(msg)
        raise errors.BackendDown(self.name, "down (cannot connect); retrying in the background")


class Paged(MemoryBackend):
    """Lists its tools one a page (`<name>-1`, `<name>-2`); from the second page on it is
    `Late` when `slow_later` is set."""

    def __init__(self, name: str, slow_later: float = 0.0) -> None:
        super().__init__(name)
        self.slow_later = slow_later

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        if msg["method"] != "tools/list":
            return await super().request(msg, sink, call, long_lived=long_lived)
        cursor = msg["params"].get("cursor")
        if cursor is not None and self.slow_later:
            await anyio.sleep(self.slow_later)  # the server's own slowness
        page = 2 if cursor == "p2" else 1
        result: dict[str, Any] = {"tools": [{"name": f"t{page}", "inputSchema": {}}]}
        if page == 1:
            result["nextCursor"] = "p2"
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


@pytest.fixture(autouse=True)
def quick_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A catalog load that gets no answer ends after 0.05 s, not 15 s: the silent backends
    here are past their start-up at once."""
    monkeypatch.setattr(catalog, "LOAD_TIMEOUT", 0.05)


def dispatcher(*backends: MemoryBackend, on_failure: str = "fail_open", **extra: Any) -> Dispatcher:
    return Dispatcher(
        backends,
        [Exposure(backend=b.name, namespace=b.name) for b in backends],
        Naming(PrefixMode.ALWAYS, backends=len(backends)),
        GatewayInfo("mcp-gateway", "test"),
        on_failure,
        **extra,
    )


async def started(*backends: MemoryBackend, **extra: Any) -> Dispatcher:
    """A dispatcher past start-up: every backend's first catalog load has ended."""
    d = dispatcher(*backends, **extra)
    with anyio.fail_after(PROMPT):
        await d.catalogs.load_all()
    return d


async def answer(d: Dispatcher, msg: Message) -> Message:
    with anyio.fail_after(PROMPT):
        return await d.handle(msg, ignore)


def tools_of(reply: Message) -> list[str]:
    assert "result" in reply, reply
    return [t["name"] for t in reply["result"]["tools"]]


def code_of(reply: Message) -> int:
    assert "error" in reply, reply
    code: int = reply["error"]["code"]
    return code


# --- merged lists and discovery -------------------------------------------------------------


async def test_a_list_answers_with_the_others_when_a_backend_never_answers() -> None:
    silent = Silent("silent")
    d = await started(MemoryBackend("mem"), silent)
    abandoned = silent.abandoned
    reply = await answer(d, modern(1, "tools/list"))
    assert tools_of(reply) == ["mem_echo", "mem_add", "mem_fail", "mem_hold"]
    assert "nextCursor" not in reply["result"]
    assert silent.abandoned == abandoned + 1  # its request was cancelled, not left running
    assert d.fan_out_failures == {"silent": 1}


async def test_discovery_answers_with_the_others_when_a_backend_never_answers() -> None:
    d = await started(MemoryBackend("mem"), Silent("silent"))
    reply = await answer(d, modern(1, "server/discover"))
    assert set(reply["result"]["capabilities"]) >= {"tools", "resources"}


async def test_a_list_with_every_other_backend_down_answers_with_the_one_up() -> None:
    d = await started(Down("a"), MemoryBackend("mem"), Down("b"), Silent("c"))
    assert tools_of(await answer(d, modern(1, "tools/list")))[0] == "mem_echo"


async def test_a_late_backend_is_shown_from_its_catalog_past_the_grace() -> None:
    """Late by 0.2 s with a grace of 0.01 s (fan_out.grace): the list does not wait for it,
    and its tools are still listed, as its catalog last had them, on a page not to be cached;
    with a grace of 5 s its own answer is waited for (and the page may be cached)."""
    late = Late("late", 0.0)
    short = await started(MemoryBackend("mem"), late, grace=0.01)  # (its catalog loaded)
    late.delay = 0.2
    with anyio.fail_after(0.15):  # (its own answer would take 0.2 s)
        reply = await answer(short, modern(1, "tools/list"))
    assert len(tools_of(reply)) == 8 and "late_echo" in tools_of(reply)
    assert reply["result"]["ttlMs"] == 0
    late = Late("late", 0.0)
    long = await started(MemoryBackend("mem"), late, grace=5.0)
    late.delay = 0.2
    assert len(tools_of(await answer(long, modern(3, "tools/list")))) == 8


async def test_a_late_backend_whose_catalog_never_loaded_is_left_out() -> None:
    """Nothing known of it: the list answers with the others' items past the grace."""
    d = await started(MemoryBackend("mem"), Late("late", 0.3), grace=0.01)  # (load: 0.05 s)
    assert d.catalogs.data("late") is None
    with anyio.fail_after(0.25):
        assert tools_of(await answer(d, modern(1, "tools/list"))) == [
            "mem_echo",
            "mem_add",
            "mem_fail",
            "mem_hold",
        ]


async def test_under_fail_closed_a_list_waits_for_every_backend() -> None:
    d = await started(MemoryBackend("mem"), Late("late", 0.2), on_failure="fail_closed", grace=0.01)
    assert len(tools_of(await answer(d, modern(1, "tools/list")))) == 8
    failing = await started(MemoryBackend("mem"), erring("bad"), on_failure="fail_closed")
    assert code_of(await answer(failing, modern(2, "tools/list"))) == codes.BACKEND_UNAVAILABLE


async def test_a_list_at_start_up_waits_for_a_backend_still_starting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its first catalog load under way, a backend is starting: a list made meanwhile shows
    its tools too, however much later than the others it answers."""
    monkeypatch.setattr(catalog, "LOAD_TIMEOUT", 15.0)
    late = Late("late", 0.2)
    d = dispatcher(MemoryBackend("mem"), late, grace=0.01)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.catalogs.load_all)
        assert len(tools_of(await answer(d, modern(1, "tools/list")))) == 8
    assert d.catalogs.starting("late") is False


async def test_a_list_at_start_up_waits_for_a_starting_backend_only_until_start_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A backend silent at its start (a child that never answers its opening) holds a list
    made at start-up for `start_wait` from its start, not for its load's 15 s; past that, a
    list does not wait for it at all, though its load is still under way."""
    monkeypatch.setattr(catalog, "LOAD_TIMEOUT", 15.0)
    d = dispatcher(MemoryBackend("mem"), Silent("silent"), grace=0.01, start_wait=0.2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.catalogs.load_all)
        for rid in (1, 2):
            assert tools_of(await answer(d, modern(rid, "tools/list")))[0] == "mem_echo"
            assert d.catalogs.starting("silent")  # (its load goes on)
        assert d.catalogs.start_left("silent") == 0
        tg.cancel_scope.cancel()


class Gated(Listening):
    """A Listening backend that answers nothing but listens until `gate` is set: a backend
    that is still starting (its catalog loads once it has)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.gate = anyio.Event()

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        if msg["method"] != "subscriptions/listen":
            await self.gate.wait()
        return await super().request(msg, sink, call, long_lived=long_lived)


async def test_a_listen_is_told_of_the_lists_a_backend_brings_once_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past start_wait a client's lists left the starting backend out: when its first catalog
    comes in, the client's open listen is told its tool list changed (basic/patterns/
    subscriptions), under the client's subscription id, so it lists again and sees it."""
    monkeypatch.setattr(catalog, "LOAD_TIMEOUT", 15.0)
    late = Gated("late")
    d = dispatcher(Listening("mem"), late, grace=0.01, start_wait=0.1)
    seen: list[Message] = []
    news = anyio.Event()

    async def sink(note: Message) -> None:
        seen.append(note)
        if note["method"] == "notifications/tools/list_changed":
            news.set()

    msg = modern(7, "subscriptions/listen", notifications={"toolsListChanged": True})
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.catalogs.load_all)
        tg.start_soon(d.handle, msg, sink)
        with anyio.fail_after(PROMPT):
            assert "late_echo" not in tools_of(await answer(d, modern(1, "tools/list")))
        assert not news.is_set()
        late.gate.set()
        with anyio.fail_after(PROMPT):
            await news.wait()
        assert "late_echo" in tools_of(await answer(d, modern(2, "tools/list")))
        tg.cancel_scope.cancel()
    assert seen[0]["method"] == meta.ACKNOWLEDGED
    told = [n for n in seen if n["method"] == "notifications/tools/list_changed"]
    assert len(told) == 1
    assert told[0]["params"]["_meta"][meta.SUBSCRIPTION_ID] == 7


async def test_a_list_waits_for_the_first_answer_however_late() -> None:
    """With nothing in yet there is nothing to show: the grace counts from the first answer,
    so a list whose only live backend is slow still gets its tools."""
    d = await started(Late("late", 0.2), Silent("silent"), grace=0.01)
    assert tools_of(await answer(d, modern(1, "tools/list")))[0] == "late_echo"


async def test_a_backend_late_for_a_later_page_keeps_its_place_in_the_cursor() -> None:
    """Page 2: the late backend's part is left out but its position kept, so its items come
    on page 3, where it is alone and waited for: lateness loses no item of a listing it is
    part of (server/utilities/pagination)."""
    d = await started(Paged("a"), Paged("b", slow_later=0.2), grace=0.01)
    first = await answer(d, modern(1, "tools/list"))
    assert tools_of(first) == ["a_t1", "b_t1"]
    second = await answer(d, modern(2, "tools/list", cursor=first["result"]["nextCursor"]))
    assert tools_of(second) == ["a_t2"]
    third = await answer(d, modern(3, "tools/list", cursor=second["result"]["nextCursor"]))
    assert tools_of(third) == ["b_t2"]
    assert "nextCursor" not in third["result"]


async def test_a_backend_late_for_the_first_page_is_left_out_of_the_listing() -> None:
    """Nothing of it listed yet (its catalog never loaded), it has no place to keep: the
    listing goes on without it (a backend that never answers must not make the last page wait
    for it)."""
    d = await started(Paged("a"), Silent("silent"), grace=0.01)
    first = await answer(d, modern(1, "tools/list"))
    assert tools_of(first) == ["a_t1"]
    second = await answer(d, modern(2, "tools/list", cursor=first["result"]["nextCursor"]))
    assert tools_of(second) == ["a_t2"]
    assert "nextCursor" not in second["result"]


# --- names ------------------------------------------------------------------------------------


async def test_an_unknown_name_is_told_at_once_while_another_backend_is_silent() -> None:
    """Its catalog not loaded yet (stale), the silent backend would be refreshed and waited
    for by any miss; a name that can only be the other's is not its business."""
    silent = Silent("silent")
    d = dispatcher(MemoryBackend("mem"), silent)
    async with anyio.create_task_group() as tg:
        d.catalogs.spawn = tg.start_soon
        await d.catalogs.refresh("mem")
        assert code_of(await answer(d, tool_call(1, "mem_nope"))) == codes.INVALID_PARAMS
        assert code_of(await answer(d, tool_call(2, "nope"))) == codes.INVALID_PARAMS
        assert "result" in await answer(d, tool_call(3, "mem_echo"))
        tg.cancel_scope.cancel()
    assert not silent.asked  # no lookup had any business with its catalog


@pytest.mark.parametrize("broken", [erring, Down], ids=["failing", "down"])
async def test_a_name_of_a_backend_whose_catalog_cannot_be_loaded_is_unavailable(
    broken: Callable[[str], MemoryBackend],
) -> None:
    """Its catalog unknown, the name may well be one of its tools: -31001 naming it, which a
    client may retry, not -32602 (an unknown tool, which it may not)."""
    d = await started(MemoryBackend("mem"), broken("bad"))
    reply = await answer(d, tool_call(1, "bad_echo"))
    assert code_of(reply) == codes.BACKEND_UNAVAILABLE
    assert "'bad'" in reply["error"]["message"]
    assert code_of(await answer(d, tool_call(2, "mem_nope"))) == codes.INVALID_PARAMS
    assert d.catalogs.problem("bad") is not None and d.catalogs.problem("mem") is None


# --- listens ----------------------------------------------------------------------------------


@pytest.mark.parametrize("other", [Silent, Down, erring], ids=["silent", "down", "failing"])
async def test_a_listen_is_acknowledged_without_a_backend_that_cannot_acknowledge(
    other: Callable[[str], MemoryBackend],
) -> None:
    """The other's capabilities unknown (its catalog not loaded), so it is asked too; the
    client's acknowledgement comes with the one that answers, not after 10 s."""
    d = await started(Listening("mem"), other("other"))
    acked = anyio.Event()
    seen: list[Message] = []

    async def sink(note: Message) -> None:
        seen.append(note)
        acked.set()

    msg = modern(1, "subscriptions/listen", notifications={"toolsListChanged": True})
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.handle, msg, sink)
        with anyio.fail_after(PROMPT):
            await acked.wait()
        tg.cancel_scope.cancel()
    assert seen[0]["method"] == meta.ACKNOWLEDGED
    assert seen[0]["params"]["notifications"] == {"toolsListChanged": True}
