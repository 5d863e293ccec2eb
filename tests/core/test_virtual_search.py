"""Tool search and the context budget per virtual server (issue 33), in memory: a server's
search finds, describes and calls only what that server offers, under its policy, and follows
its catalogs; each server's lists are estimated under its own name (the gauge
`mcp_gateway_catalog_tokens{server}`, the status page), and a reload turns a server's search on
or off and forgets a removed server's figures. Tool names and results: server/tools."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from gateway.app.servers import VirtualServers, tool_search
from gateway.app.views import catalog_rows, server_facts
from gateway.app.wiring import INFO, make_exposure, make_naming
from gateway.backends.base import NotificationSink
from gateway.config import Config, ConfigInvalid, parse
from gateway.config.search import ToolSearchConfig
from gateway.core import toolsearch
from gateway.core.budget import DEFAULT_SERVER, Budget
from gateway.core.dispatcher import Dispatcher
from gateway.core.virtual import VirtualDispatcher
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.routing.budget import backend_costs
from gateway.telemetry.api import NoTelemetry
from tests.support import until
from tests.support.memory_backend import FakeBackend, ignore, modern

pytestmark = pytest.mark.anyio

META_TOOLS = [toolsearch.FIND, toolsearch.DESCRIBE, toolsearch.CALL]


def tool(name: str, description: str, *arguments: str) -> dict[str, Any]:
    properties = {a: {"type": "string"} for a in arguments}
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": properties},
    }


class Lists:
    """A backend whose tools a test may change; a call answers with the tool's name."""

    def __init__(self, name: str, tools: list[dict[str, Any]]) -> None:
        self.tools = tools
        self.called: list[str] = []
        self.backend = FakeBackend(self.handle, name)

    async def handle(self, msg: Message, sink: NotificationSink) -> Message | None:
        method, params = msg["method"], msg.get("params") or {}
        if method == "server/discover":
            caps = {"tools": {"listChanged": True}}
            result: dict[str, Any] = {"capabilities": caps, "supportedVersions": ["2026-07-28"]}
        elif method == "tools/list":
            result = {"tools": list(self.tools)}
        elif method == "tools/call":
            self.called.append(params["name"])
            result = {"content": [{"type": "text", "text": f"ran {params['name']}"}]}
        else:
            return None
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


def everything() -> Lists:
    return Lists(
        "everything",
        [
            tool("echo", "Echoes back the message it is given.", "message"),
            tool("get-env", "Returns the environment variables of the server process."),
            tool("get-sum", "Adds two numbers and returns their sum.", "a", "b"),
            tool("add-note", "Writes a note into the shared notebook.", "text"),
            tool("restart-service", "Restarts a running service on the host.", "service"),
        ],
    )


def clock() -> Lists:
    return Lists(
        "time",
        [
            tool("get_current_time", "Current time in a timezone.", "timezone"),
            tool("convert_time", "Convert a time between timezones.", "time", "target"),
        ],
    )


CONFIG = """
listen: {http: {port: 0}}
backends:
  everything: {stdio: {command: x}}
  time: {stdio: {command: y}}
servers:
  docs:
    backends:
      everything: {tools: ["echo", "get-*"], prompts: [], resources: ["*"]}
      time: {}
    namespacing: {prefix: auto}
    instructions: "Docs tools only."
    tool_search: {mode: "on"}
  ops:
    backends:
      everything: {tools: ["restart-*", "echo"]}
      time: {tools: ["convert_time"]}
    tool_search: {mode: "on"}
    policy:
      rules:
        - deny: {backends: [everything], tools: ["echo"]}
  admin:
    backends: {everything: {}, time: {}}
"""


class Team:
    """The merged server and its virtual servers (app/servers.py `VirtualServers`, as the
    gateway runs them) over one pool of in-memory backends, their background work (catalog
    loads, index builds, budgets) in a task group."""

    def __init__(self, config: Config, tg: anyio.abc.TaskGroup) -> None:
        self.config = config
        self.lists = {"everything": everything(), "time": clock()}
        self.pool = {name: lists.backend for name, lists in self.lists.items()}
        self.main = Dispatcher(
            list(self.pool.values()),
            [make_exposure(b) for b in config.backends],
            make_naming(config),
            INFO,
            tool_search=config.tool_search,
        )
        self.main.catalogs.spawn = tg.start_soon
        self.budget = Budget()
        self.virtual = VirtualServers(config, self.main, self.pool, NoTelemetry(), self.budget)
        self.virtual.start(tg.start_soon)
        tg.start_soon(self.budget.follow, DEFAULT_SERVER, self.main.catalogs)

    def __getitem__(self, name: str) -> VirtualDispatcher:
        return self.virtual.served[name].dispatcher

    async def reload(self, text: str) -> None:
        self.config = parse(text)
        self.main.reconfigure(
            list(self.pool.values()),
            [make_exposure(b) for b in self.config.backends],
            make_naming(self.config),
            self.config.on_backend_failure,
            None,
            None,
            None,
            self.config.tool_search,
        )
        self.virtual.apply(self.config, self.pool)

    def offered(self, server: str) -> int:
        return len(self.pool if server == DEFAULT_SERVER else self[server].backends)

    async def estimated(self, *servers: str) -> None:
        """Until every one of `servers` has its backends' costs."""
        await until(
            lambda: all(
                len(self.budget.backends(s))
                == len(self.pool if s == DEFAULT_SERVER else self[s].backends)
                for s in servers
            ),
            wake=lambda: self.budget.changed.wait(),
        )


@pytest.fixture
async def team() -> AsyncIterator[Team]:
    async with anyio.create_task_group() as tg:
        found = Team(parse(CONFIG), tg)
        await found.main.catalogs.load_all()
        yield found
        tg.cancel_scope.cancel()


async def listed(dispatcher: Dispatcher) -> list[str]:
    reply = await dispatcher.handle(modern(1, "tools/list"), ignore)
    return [t["name"] for t in reply["result"]["tools"]]


def meta_call(rid: int, tool: str, **arguments: Any) -> Message:
    """A tools/call of a meta-tool (whose arguments may hold a `name`)."""
    return modern(rid, "tools/call", name=tool, arguments=arguments)


async def found(dispatcher: Dispatcher, query: str) -> list[str]:
    reply = await dispatcher.handle(meta_call(2, toolsearch.FIND, query=query, limit=10), ignore)
    return [t["name"] for t in reply["result"]["structuredContent"]["tools"]]


def code(reply: Message) -> int | None:
    error = reply.get("error")
    return error["code"] if isinstance(error, dict) else None


async def test_a_servers_search_finds_only_what_it_offers(team: Team) -> None:
    """docs with tool_search on lists the meta-tools; its search finds its own tools under its
    names and never one only another server offers; describing or calling that one through the
    meta-tools is -32602 unknown tool, as calling it by name is, and no backend sees it."""
    docs = team["docs"]
    assert await listed(docs) == META_TOOLS
    assert "everything_get-sum" in await found(docs, "add two numbers sum")
    assert await found(docs, "restart a running service") == []  # (only ops offers it)
    assert "everything_restart-service" in await found(team["ops"], "restart a running service")
    assert sorted(await found(docs, "timezone")) == ["time_convert_time", "time_get_current_time"]
    describe = meta_call(3, toolsearch.DESCRIBE, name="everything_restart-service")
    assert code(await docs.handle(describe, ignore)) == codes.INVALID_PARAMS
    through = meta_call(4, toolsearch.CALL, name="everything_restart-service", arguments={})
    assert code(await docs.handle(through, ignore)) == codes.INVALID_PARAMS
    assert team.lists["everything"].called == []
    # Its own tools: described as its list would show them, and called by the meta-tool.
    described = await docs.handle(meta_call(5, toolsearch.DESCRIBE, name="everything_echo"), ignore)
    assert described["result"]["structuredContent"]["name"] == "everything_echo"
    echo = meta_call(6, toolsearch.CALL, name="everything_echo", arguments={"message": "hi"})
    reply = await docs.handle(echo, ignore)
    assert reply["result"]["content"][0]["text"] == "ran echo"
    assert team.lists["everything"].called == ["echo"]  # (the backend's own name)
    # Servers without search, and the merged server, list their tools as before.
    assert "everything_add-note" in await listed(team["admin"])
    assert "everything_add-note" in await listed(team.main)


async def test_a_servers_search_is_under_its_own_policy(team: Team) -> None:
    """ops's policy denies everything's echo: its search never finds it and `_call_tool` of
    it is -32602, as a call by name is; docs and admin, under no policy, find it."""
    ops = team["ops"]
    assert "everything_echo" not in await found(ops, "echoes back the message")
    assert "everything_echo" in await found(team["docs"], "echoes back the message")
    through = meta_call(1, toolsearch.CALL, name="everything_echo", arguments={"message": "x"})
    assert code(await ops.handle(through, ignore)) == codes.INVALID_PARAMS
    assert team.lists["everything"].called == []


async def test_a_servers_index_follows_a_list_change(team: Team) -> None:
    """A backend's notifications/tools/list_changed reaches the merged server (the one the
    backends report to); the shared catalog is loaded again and each server's index rebuilt
    from its own table: docs finds the new tool its globs select, ops (not selecting it) does
    not."""
    docs, ops = team["docs"], team["ops"]
    assert await found(docs, "weather forecast") == []
    search = docs.search
    assert search is not None
    builds = search.builds
    team.lists["everything"].tools.append(tool("get-weather", "The weather forecast for a city."))
    team.main.backend_notification("everything", {"method": "notifications/tools/list_changed"})
    await until(lambda: search.builds > builds, wake=lambda: search.built.wait())
    assert await found(docs, "weather forecast") == ["everything_get-weather"]
    assert await found(ops, "weather forecast") == []


async def test_a_reload_turns_one_servers_search_on_or_off(team: Team) -> None:
    """Reload: docs's search off (its tools listed again), admin's on; ops keeps its own; a
    server without `tool_search:` takes the top level's."""
    text = CONFIG.replace('    tool_search: {mode: "on"}\n  ops:', "  ops:").replace(
        "    backends: {everything: {}, time: {}}",
        '    backends: {everything: {}, time: {}}\n    tool_search: {mode: "on"}',
    )
    ops_search = team["ops"].search
    await team.reload(text)
    assert "everything_echo" in await listed(team["docs"])
    assert team["docs"].search is None
    assert await listed(team["admin"]) == META_TOOLS
    assert team["ops"].search is ops_search  # (kept, its index with it)
    await team.reload('tool_search: {mode: "on"}\n' + text)
    assert await listed(team["docs"]) == META_TOOLS  # (the top level's)
    assert await listed(team.main) == META_TOOLS
    off = text.replace("  ops:\n", '  ops:\n    tool_search: {mode: "off"}\n', 1).replace(
        '    tool_search: {mode: "on"}\n    policy:', "    policy:"
    )
    await team.reload('tool_search: {mode: "on"}\n' + off)
    assert "everything_restart-service" in await listed(team["ops"])


async def test_each_server_has_its_own_budget(team: Team) -> None:
    """The context budget per server: what docs's lists cost (its selection, under its names)
    is a series of its own in `mcp_gateway_catalog_tokens{server}` and a row of the status
    page, beside the merged server's (`default`)."""
    await team.estimated(DEFAULT_SERVER, "docs", "ops", "admin")
    budget = team.budget
    docs = budget.costs("docs")
    assert docs["tools"].items == 3 + 2  # (echo, get-env, get-sum; both of time's)
    # restart-service, echo (its policy hides it from callers, not from the figure: README
    # "Context budget"), convert_time.
    assert budget.costs("ops")["tools"].items == 3
    # ... exactly what its sources cost, and less than the merged server's lists.
    catalogs = team["docs"].catalogs
    expected = sum(
        cost.tokens
        for exposure, data in catalogs.sources()
        if data is not None
        for cost in backend_costs(catalogs.naming, exposure, data).values()
    )
    assert budget.tokens("docs") == expected
    assert 0 < budget.tokens("docs") < budget.tokens(DEFAULT_SERVER)
    assert budget.tokens("admin") == budget.tokens(DEFAULT_SERVER)  # (everything, same names)
    rows = {(server, kind): tokens for server, kind, _, tokens in catalog_rows(budget)}
    assert rows["docs", "tools"] == docs["tools"].tokens
    facts = {f.name: f for f in server_facts(budget)}
    assert set(facts) == {DEFAULT_SERVER, "docs", "ops", "admin"}
    assert facts["docs"].backend_tokens["everything"] < facts["admin"].backend_tokens["everything"]


async def test_a_list_change_moves_each_servers_budget(team: Team) -> None:
    """A list change moves the figures of the servers that offer what changed: docs (whose
    glob selects the new tool) and the merged server, not ops."""
    await team.estimated(DEFAULT_SERVER, "docs", "ops")
    before = {s: team.budget.tokens(s) for s in (DEFAULT_SERVER, "docs", "ops")}
    team.lists["everything"].tools.append(tool("get-weather", "The weather forecast for a city."))
    team.main.backend_notification("everything", {"method": "notifications/tools/list_changed"})
    await until(
        lambda: (
            team.budget.tokens("docs") > before["docs"]
            and team.budget.tokens(DEFAULT_SERVER) > before[DEFAULT_SERVER]
        ),
        wake=lambda: team.budget.changed.wait(),
    )
    assert team.budget.tokens("ops") == before["ops"]


async def test_a_removed_server_is_forgotten(team: Team) -> None:
    """Reload removing ops: its series and status row go at once and do not come back (its
    budget task ends with it); an added server gets its own."""
    await team.estimated("docs", "ops")
    await team.reload(CONFIG.replace("  ops:\n", "  fresh:\n", 1))
    assert "ops" not in team.budget.servers()
    await team.estimated("fresh")
    for _ in range(5):  # (the removed server's task, had it stored again, would have by now)
        await anyio.lowlevel.checkpoint()
    assert "ops" not in team.budget.servers()
    assert "ops" not in {f.name for f in server_facts(team.budget)}


def test_the_merged_servers_name_is_reserved() -> None:
    """`default` names the merged server in the metrics and on the status page."""
    assert DEFAULT_SERVER == "default"
    with pytest.raises(ConfigInvalid, match=r"servers\.default"):
        parse(CONFIG.replace("  admin:", "  default:"))


def test_the_top_level_search_is_a_servers_default() -> None:
    """A server without `tool_search:` has the top level's; one with it, its own."""
    config = parse("tool_search: {mode: auto, threshold_tokens: 5}\n" + CONFIG)
    docs, _, admin = config.servers
    assert docs.tool_search == ToolSearchConfig(mode="on") and admin.tool_search is None
    assert tool_search(config, admin) == ToolSearchConfig(mode="auto", threshold_tokens=5)
    assert tool_search(config, docs) == ToolSearchConfig(mode="on")
