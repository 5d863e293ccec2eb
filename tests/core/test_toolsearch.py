"""Tool search in the engine (README "Tool search"), in memory: the meta-tools listed instead of
the catalog, a search and a description answered from the index, a call through `_call_tool`
forwarded as the tool's own call, the policy's view, the limits, and the index following a
backend's list change without holding a request. Tool names and results: server/tools."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest

from gateway.backends.base import NotificationSink
from gateway.config import ConfigInvalid, describe, parse
from gateway.config.access import PolicyConfig, PolicyRule, PolicyTarget
from gateway.config.operations import Rate, RateLimits
from gateway.config.search import ToolSearchConfig
from gateway.core import toolsearch
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.policy import Policy
from gateway.core.ratelimit import RateLimiter
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.routing import budget, names
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.search import Index
from gateway.routing.table import Exposure
from tests.support import ROOT, until
from tests.support.memory_backend import FakeBackend, ignore, modern, tool_call

CATALOG: dict[str, list[dict[str, Any]]] = orjson.loads(
    (ROOT / "tests" / "core" / "search_catalog.json").read_bytes()
)
ON = ToolSearchConfig(mode="on")
CHANGED: Message = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}


def server(name: str, tools: list[dict[str, Any]]) -> FakeBackend:
    """A backend listing `tools` (a list the test may change), answering calls as MemoryBackend."""

    async def handler(msg: Message, sink: NotificationSink) -> Message | None:
        if msg["method"] == "tools/list":
            return {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": list(tools)}}
        return None

    return FakeBackend(handler, name)


async def engine(
    config: ToolSearchConfig | None = ON,
    policy: Policy | None = None,
    backends: list[FakeBackend] | None = None,
    naming: Naming | None = None,
) -> Dispatcher:
    found = backends or [server(name, list(tools)) for name, tools in CATALOG.items()]
    dispatcher = Dispatcher(
        found,
        [Exposure(backend=b.name, namespace=b.name) for b in found],
        naming or Naming(backends=len(found)),
        GatewayInfo("mcp-gateway", "test"),
        policy=policy,
        tool_search=config,
    )
    await dispatcher.catalogs.load_all()
    return dispatcher


async def listed(dispatcher: Dispatcher) -> list[str]:
    reply = await dispatcher.handle(modern(1, "tools/list"), ignore)
    return [t["name"] for t in reply["result"]["tools"]]


async def searched(dispatcher: Dispatcher, query: str, **more: Any) -> list[dict[str, Any]]:
    reply = await dispatcher.handle(meta_call(2, toolsearch.FIND, query=query, **more), ignore)
    result = reply["result"]
    # The same as JSON text, for clients that read only content (Structured Content).
    assert orjson.loads(result["content"][0]["text"]) == result["structuredContent"]
    found: list[dict[str, Any]] = result["structuredContent"]["tools"]
    return found


def meta_call(rid: int, tool: str, **arguments: Any) -> Message:
    """A tools/call of a meta-tool (whose arguments may hold a `name`)."""
    return modern(rid, "tools/call", name=tool, arguments=arguments)


def code(reply: Message) -> int:
    error: dict[str, Any] = reply["error"]
    return int(error["code"])


@pytest.mark.anyio
async def test_tools_list_shows_the_meta_tools_instead_of_the_catalog() -> None:
    """tools/list (server/tools, Listing Tools) with search on: the three meta-tools, one page;
    off (and by default): the whole catalog."""
    assert await listed(await engine()) == [toolsearch.FIND, toolsearch.DESCRIBE, toolsearch.CALL]
    whole = await listed(await engine(None))
    assert "filesystem_read_text_file" in whole and len(whole) == 36
    assert await listed(await engine(ToolSearchConfig(mode="off"))) == whole


@pytest.mark.anyio
async def test_auto_turns_on_past_the_threshold() -> None:
    """mode auto: the meta-tools while the catalog is estimated above threshold_tokens."""
    small = await engine(ToolSearchConfig(mode="auto", threshold_tokens=1_000_000))
    assert len(await listed(small)) == 36
    large = await engine(ToolSearchConfig(mode="auto", threshold_tokens=1000))
    assert await listed(large) == [toolsearch.FIND, toolsearch.DESCRIBE, toolsearch.CALL]


@pytest.mark.anyio
async def test_auto_reads_the_context_budgets_estimate_of_the_full_list() -> None:
    """`auto`'s figure is the context budget's estimate (routing/budget.py) of the tools/list
    a client would get: the meta-tools from one token past it, the whole list at it."""
    whole = await engine(None)
    reply = await whole.handle(modern(1, "tools/list"), ignore)
    tokens = budget.estimate_tokens(reply["result"]["tools"])
    past = await engine(ToolSearchConfig(mode="auto", threshold_tokens=tokens - 1))
    assert await listed(past) == [toolsearch.FIND, toolsearch.DESCRIBE, toolsearch.CALL]
    at = await engine(ToolSearchConfig(mode="auto", threshold_tokens=tokens))
    assert len(await listed(at)) == 36


@pytest.mark.anyio
async def test_a_search_finds_tools_by_what_they_do() -> None:
    """A search answers with the best matches by namespaced name, title, one-line
    description and arguments (required ones named)."""
    dispatcher = await engine()
    found = await searched(dispatcher, "list the files in a directory")
    assert found[0]["name"] == "filesystem_list_directory"
    assert len(found) == toolsearch.DEFAULT_LIMIT
    first = found[0]
    assert first["title"] == "List Directory"
    assert "\n" not in first["description"]
    assert first["arguments"] == {"path": "string"} and first["required"] == ["path"]
    # Words of a name in a programmer's spelling meet a model's words.
    assert (await searched(dispatcher, "get file info"))[0]["name"] == "filesystem_get_file_info"
    assert (await searched(dispatcher, "sum of two numbers"))[0]["name"] == "everything_get-sum"
    assert await searched(dispatcher, "zzz qqq") == []


@pytest.mark.anyio
async def test_describe_gives_the_tool_as_the_whole_list_shows_it() -> None:
    dispatcher = await engine()
    reply = await dispatcher.handle(
        meta_call(3, toolsearch.DESCRIBE, name="filesystem_edit_file"), ignore
    )
    whole = await (await engine(None)).handle(modern(4, "tools/list"), ignore)
    shown = next(t for t in whole["result"]["tools"] if t["name"] == "filesystem_edit_file")
    assert reply["result"]["structuredContent"] == shown
    unknown = await dispatcher.handle(meta_call(5, toolsearch.DESCRIBE, name="nope"), ignore)
    assert code(unknown) == codes.INVALID_PARAMS


@pytest.mark.anyio
async def test_call_tool_is_the_tools_own_call() -> None:
    """`_call_tool` reaches the backend as a call of the tool under its own name, with the
    arguments and the request's `_meta` (progress token) and task field as they came; the
    result is the tool's. The tool stays callable directly."""
    dispatcher = await engine()
    memory = next(b for b in dispatcher.backends.values() if b.name == "memory")
    assert isinstance(memory, FakeBackend)
    msg = meta_call(6, toolsearch.CALL, name="memory_search_nodes", arguments={"query": "Ada"})
    msg["params"]["_meta"] = {**msg["params"]["_meta"], "progressToken": "p1"}
    msg["params"]["task"] = {"ttl": 1000}
    reply = await dispatcher.handle(msg, ignore)
    sent = memory.calls()[-1]["params"]
    assert sent["name"] == "search_nodes" and sent["arguments"] == {"query": "Ada"}
    assert sent["_meta"]["progressToken"] == "p1" and sent["task"] == {"ttl": 1000}
    assert reply["result"]["content"] == [{"type": "text", "text": "{'query': 'Ada'}"}]
    direct = await dispatcher.handle(tool_call(7, "memory_read_graph"), ignore)
    assert "result" in direct and memory.calls()[-1]["params"]["name"] == "read_graph"


@pytest.mark.anyio
async def test_call_tool_refuses_what_names_no_tool() -> None:
    """Bad input to `_call_tool`: -32602, as a malformed tools/call's; a name no tool has:
    -32602, as an unknown tool's (server/tools, Error Handling)."""
    dispatcher = await engine()
    for arguments in (
        {},
        {"name": 3},
        {"name": toolsearch.FIND},
        {"name": "memory_read_graph", "arguments": []},
        {"name": "memory_nope"},
    ):
        reply = await dispatcher.handle(meta_call(8, toolsearch.CALL, **arguments), ignore)
        assert code(reply) == codes.INVALID_PARAMS, arguments
    bare = modern(9, "tools/call", name=toolsearch.CALL, arguments="x")
    assert code(await dispatcher.handle(bare, ignore)) == codes.INVALID_PARAMS


@pytest.mark.anyio
async def test_a_caller_never_finds_describes_or_calls_what_it_may_not_see() -> None:
    """The policy's view (core/policy.py): a denied tool is not found, and describing or
    calling it through the meta-tools is refused exactly as an unknown name is."""
    deny = PolicyRule("deny", PolicyTarget(backends=("filesystem",), tools=("list_directory*",)))
    dispatcher = await engine(policy=Policy(PolicyConfig(rules=(deny,))))
    found = [t["name"] for t in await searched(dispatcher, "list the files in a directory")]
    assert found and not any(n.startswith("filesystem_list_directory") for n in found)
    hidden = "filesystem_list_directory"
    unknown = "filesystem_no_such_tool"
    for name in (hidden, unknown):
        described = await dispatcher.handle(meta_call(10, toolsearch.DESCRIBE, name=name), ignore)
        called = await dispatcher.handle(meta_call(11, toolsearch.CALL, name=name), ignore)
        assert code(described) == code(called) == codes.INVALID_PARAMS
        assert described["error"]["message"] == f"Unknown tool: {name}"
        assert called["error"]["message"] == f"Unknown tool: {name}"


@pytest.mark.anyio
async def test_limits_are_refused_or_capped() -> None:
    """max_query_length: a longer query is -32602; max_results caps what a caller asks for;
    a cursor on the one-page meta-tool list is expired (-32602)."""
    config = ToolSearchConfig(mode="on", max_results=3, max_query_length=20)
    dispatcher = await engine(config)
    assert len(await searched(dispatcher, "file", limit=50)) == 3
    assert len(await searched(dispatcher, "file", limit=2)) == 2
    too_long = meta_call(12, toolsearch.FIND, query="f" * 21)
    assert code(await dispatcher.handle(too_long, ignore)) == codes.INVALID_PARAMS
    assert len(await searched(dispatcher, "f" * 20)) == 0
    for bad in ({"query": 1}, {"query": "file", "limit": 0}, {"query": "file", "limit": True}):
        reply = await dispatcher.handle(meta_call(13, toolsearch.FIND, **bad), ignore)
        assert code(reply) == codes.INVALID_PARAMS, bad
    paged = await dispatcher.handle(modern(14, "tools/list", cursor="x"), ignore)
    assert code(paged) == codes.INVALID_PARAMS


@pytest.fixture
async def spawning() -> AsyncIterator[anyio.abc.TaskGroup]:
    async with anyio.create_task_group() as tg:
        yield tg
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_list_change_is_found_and_reindexing_holds_no_request(
    spawning: anyio.abc.TaskGroup,
) -> None:
    """A backend's notifications/tools/list_changed: its catalog is loaded again and the
    index rebuilt in the background; until then a search answers from the index it has."""
    tools = [{"name": "alpha", "description": "first", "inputSchema": {"type": "object"}}]
    backend = server("one", tools)
    other = server("two", [{"name": "beta", "inputSchema": {"type": "object"}}])
    dispatcher = await engine(backends=[backend, other])
    dispatcher.catalogs.spawn = lambda run: spawning.start_soon(run)
    search = dispatcher.search
    assert search is not None
    assert await searched(dispatcher, "walrus") == []
    old = await search.index()
    tools.append({"name": "walrus", "description": "Counts walruses.", "inputSchema": {}})
    dispatcher.backend_notification("one", {"method": "notifications/tools/list_changed"})
    await until(lambda: search.builds >= 2, wake=lambda: search.built.wait())
    assert [t["name"] for t in await searched(dispatcher, "walrus")] == ["one_walrus"]
    # A table replaced (a catalog load) with an index at hand: the old one answers at once,
    # the new one is built in the background.
    current = await search.index()
    assert current is not old
    dispatcher.catalogs.invalidate("two")
    await dispatcher.catalogs.refresh("two")
    assert await search.index() is current
    await until(lambda: search.builds >= 3, wake=lambda: search.built.wait())
    assert await search.index() is not current


@pytest.mark.anyio
async def test_no_namespaced_name_can_take_a_meta_tools_name() -> None:
    """Under prefixing every client-visible name begins with its namespace, which begins with
    a letter or digit (routing/names.py; config: namespaces), however it is sanitised or
    shortened; the meta-tools' names begin with `_`."""
    assert all(n.startswith("_") for n in toolsearch.NAMES)
    naming = Naming(PrefixMode.ALWAYS, max_length=16)
    for namespace in ("a", "9x", "ns.dot", "n-s"):
        for own in ("_search_tools", " _call_tool", "x" * 200, "_", "é"):
            assert not names.client_name(naming, namespace, own).startswith("_")


@pytest.mark.anyio
async def test_an_unprefixed_tool_named_like_a_meta_tool_is_shadowed() -> None:
    """One backend, unprefixed: its own tool of a meta-tool's name is left out of the index and
    the name is the meta-tool's."""
    own = [
        {"name": toolsearch.FIND, "description": "a search of its own", "inputSchema": {}},
        {"name": "lookup", "description": "search records", "inputSchema": {}},
    ]
    dispatcher = await engine(backends=[server("solo", own)])
    assert [t["name"] for t in await searched(dispatcher, "search")] == ["lookup"]


def test_the_config_section() -> None:
    """`tool_search:` (README "Tool search"): YAML's bare on/off read as the words written."""
    base = "listen: {stdio: true}\nbackends: {a: {stdio: {command: python}}}\n"
    assert parse(base, env={}).tool_search == ToolSearchConfig()
    bare = parse(base + "tool_search: {mode: on, max_results: 4}\n", env={}).tool_search
    assert bare == ToolSearchConfig(mode="on", max_results=4)
    assert parse(base + "tool_search: {mode: off}\n", env={}).tool_search.mode == "off"
    auto = parse(base + "tool_search: {mode: auto, threshold_tokens: 500}\n", env={})
    assert auto.tool_search == ToolSearchConfig(mode="auto", threshold_tokens=500)
    # check-config says so (and nothing while it is off).
    assert "tool search  auto above 500 tokens" in describe(auto)
    assert "tool search" not in describe(parse(base, env={}))


def test_config_problems() -> None:
    base = "listen: {stdio: true}\nbackends: {a: {stdio: {command: python}}}\n"
    for section, where in (
        ("{mode: sometimes}", "tool_search.mode"),
        ("{max_results: 0}", "tool_search.max_results"),
        ("{threshold: 3}", "tool_search.threshold"),
    ):
        with pytest.raises(ConfigInvalid) as caught:
            parse(base + f"tool_search: {section}\n", "c.yaml", env={})
        assert any(where in p for p in caught.value.problems), caught.value.problems


@pytest.mark.anyio
async def test_a_backend_that_arrives_late_is_found_at_once(spawning: anyio.abc.TaskGroup) -> None:
    """A search after a backend's first catalog arrives (one that started late) waits for the
    index that has it rather than answer from one that lacks the backend."""
    one = server("one", [{"name": "alpha", "description": "first", "inputSchema": {}}])
    two = server("two", [{"name": "walrus", "description": "Counts walruses.", "inputSchema": {}}])
    dispatcher = Dispatcher(
        [one, two],
        [Exposure(backend=b.name, namespace=b.name) for b in (one, two)],
        Naming(backends=2),
        GatewayInfo("mcp-gateway", "test"),
        tool_search=ON,
        start_wait=0,
    )
    dispatcher.catalogs.spawn = lambda run: spawning.start_soon(run)
    await dispatcher.catalogs.refresh("one")
    assert await searched(dispatcher, "walrus") == []
    await dispatcher.catalogs.refresh("two")
    assert [t["name"] for t in await searched(dispatcher, "walrus")] == ["two_walrus"]


@pytest.mark.anyio
async def test_a_reload_turns_search_on_and_off() -> None:
    """`tool_search:` is reloaded (README "Reloading the config"): the dispatcher's
    `reconfigure` turns it on, changes it, and turns it off."""
    dispatcher = await engine(None)
    backends = list(dispatcher.backends.values())
    exposures = [Exposure(backend=b.name, namespace=b.name) for b in backends]
    naming = Naming(backends=len(backends))

    def reload(config: ToolSearchConfig | None) -> None:
        dispatcher.reconfigure(backends, exposures, naming, "fail_open", None, None, None, config)

    reload(ON)
    assert await listed(dispatcher) == [toolsearch.FIND, toolsearch.DESCRIBE, toolsearch.CALL]
    search = dispatcher.search
    reload(ToolSearchConfig(mode="on", max_results=1))
    assert dispatcher.search is search and len(await searched(dispatcher, "file", limit=5)) == 1
    reload(ToolSearchConfig(mode="off"))
    assert len(await listed(dispatcher)) == 36
    assert dispatcher.catalogs.on_rebuilt == []  # (the index no longer follows the catalogs)


@pytest.mark.anyio
async def test_call_tool_takes_the_tools_own_rate_limit() -> None:
    """THREAT_MODEL.md, Tool search: a tool's own rate limit holds whether it is called by its
    name or through `_call_tool` (the call is rewritten before rate limits see it)."""
    limits = RateLimits(tools={"memory_read_graph": Rate(0.001, 1)})
    found = [server(name, list(tools)) for name, tools in CATALOG.items()]
    dispatcher = Dispatcher(
        found,
        [Exposure(backend=b.name, namespace=b.name) for b in found],
        Naming(backends=len(found)),
        GatewayInfo("mcp-gateway", "test"),
        limiter=RateLimiter(limits, Counter(), lambda: 1000.0),
        tool_search=ON,
    )
    await dispatcher.catalogs.load_all()
    assert "result" in await dispatcher.handle(tool_call(20, "memory_read_graph"), ignore)
    through = meta_call(21, toolsearch.CALL, name="memory_read_graph")
    assert code(await dispatcher.handle(through, ignore)) == codes.RATE_LIMITED


@pytest.mark.anyio
async def test_list_changes_in_a_burst_cost_a_load_at_a_time(
    spawning: anyio.abc.TaskGroup,
) -> None:
    """THREAT_MODEL.md, Tool search: a backend announcing list changes in a loop has its
    catalog loaded one at a time: those announced before a load began cost that load, those
    announced during it one more."""
    tools = [{"name": "alpha", "description": "first", "inputSchema": {}}]
    loads: list[int] = []
    engines: list[Dispatcher] = []

    async def handler(msg: Message, sink: NotificationSink) -> Message | None:
        if msg["method"] != "tools/list":
            return None
        loads.append(len(tools))
        if len(loads) == 2:  # the first load after the burst: more announced while it runs
            for _ in range(20):
                engines[0].backend_notification("one", CHANGED)
        return {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": list(tools)}}

    dispatcher = await engine(backends=[FakeBackend(handler, "one"), server("two", [])])
    engines.append(dispatcher)
    dispatcher.catalogs.spawn = lambda run: spawning.start_soon(run)
    search = dispatcher.search
    assert search is not None
    await search.index()
    tools.append({"name": "walrus", "description": "Counts walruses.", "inputSchema": {}})
    for _ in range(50):
        dispatcher.backend_notification("one", CHANGED)
    catalogs = dispatcher.catalogs
    await until(lambda: "one" not in catalogs._refreshing)
    # (the index follows the table the last load built, in the background)
    await until(lambda: search._indexed is catalogs.table, wake=lambda: search.built.wait())
    assert len(loads) == 3  # the first load, one for the burst, one for those during it
    assert [t["name"] for t in await searched(dispatcher, "walrus")] == ["one_walrus"]


@pytest.mark.anyio
async def test_an_index_that_cannot_be_built_is_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure building the index (a bug, or a list it cannot read) is one warning and an
    internal error (-32603) for the search, never a traceback, and the gateway goes on."""

    def broken(entries: object, per_pass: int) -> None:
        raise ValueError("unreadable")

    dispatcher = await engine()
    monkeypatch.setattr(Index, "passes", broken)
    reply = await dispatcher.handle(meta_call(30, toolsearch.FIND, query="file"), ignore)
    assert code(reply) == codes.INTERNAL_ERROR
    assert [r.levelname for r in caplog.records if "index not rebuilt" in r.message] == ["WARNING"]
    assert not any(r.exc_info for r in caplog.records)
    assert "result" in await dispatcher.handle(tool_call(31, "memory_read_graph"), ignore)
