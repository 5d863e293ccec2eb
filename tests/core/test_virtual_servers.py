"""Virtual servers in the engine (`servers:`, issue 33): each a dispatcher of its own over the
same backend objects, with its own selection, names, cursors, task ids and requestState. In
memory, against FakeBackends (fast)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.app.inventory import describe_catalogs, server_catalog
from gateway.app.servers import make
from gateway.app.wiring import INFO, make_exposure, make_naming
from gateway.backends.base import NotificationSink
from gateway.config import Config, parse
from gateway.config.describe import describe_servers
from gateway.core.budget import Budget
from gateway.core.dispatcher import Dispatcher
from gateway.core.virtual import VirtualDispatcher, unwrap_state, wrap_state
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import NoTelemetry
from tests.support.memory_backend import FakeBackend, ignore, modern, tool_call

pytestmark = pytest.mark.anyio

EVERYTHING_TOOLS = ["echo", "add", "get-env", "get-tiny-image", "long-task", "ask"]
TIME_TOOLS = ["get_current_time", "convert_time"]


def _tools(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "inputSchema": {"type": "object"}} for n in names]


def server(name: str, tools: list[str], page: int = 0) -> FakeBackend:
    """A backend with `tools` (paged `page` at a time, 0: one page), a prompt, a resource and
    a template; `long-task` makes a task, `ask` asks for input (MRTR), and it records what
    requestState and taskId it is sent."""

    async def handle(msg: Message, sink: NotificationSink) -> Message | None:
        method, params = msg["method"], msg.get("params") or {}
        result: dict[str, Any] | None = None
        if method == "server/discover":
            changes = {"listChanged": True}
            caps: dict[str, Any] = {"tools": changes, "prompts": changes, "resources": changes}
            result = {
                "capabilities": caps,
                "supportedVersions": ["2026-07-28"],
                "instructions": f"Ask {name}.",
            }
        elif method == "tools/list":
            start = int(params.get("cursor") or 0)
            end = start + page if page else len(tools)
            result = {"tools": _tools(tools[start:end])}
            if end < len(tools):
                result["nextCursor"] = str(end)
        elif method == "prompts/list":
            result = {"prompts": [{"name": f"{name}-prompt"}]}
        elif method == "resources/list":
            result = {"resources": [{"uri": f"{name}://doc", "name": "doc"}]}
        elif method == "resources/templates/list":
            result = {"resourceTemplates": [{"uriTemplate": f"{name}://t/{{id}}", "name": "t"}]}
        elif method == "tools/call" and params.get("name") == "long-task":
            result = {"resultType": "task", "taskId": "own-1", "status": "working"}
        elif method == "tools/call" and params.get("name") == "ask":
            if "requestState" in params:
                result = {"content": [{"type": "text", "text": params["requestState"]}]}
            else:
                result = {"resultType": "input_required", "requestState": "own-state"}
        elif method == "tasks/get":
            result = {"taskId": params.get("taskId"), "status": "working"}
        if result is None:
            return None
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}

    return FakeBackend(handle, name)


CONFIG = """
listen: {{http: {{port: 0}}}}
tasks: {{key_file: {key}}}
backends:
  everything: {{stdio: {{command: x}}}}
  time: {{stdio: {{command: y}}}}
servers:
  docs:
    backends:
      everything: {{tools: ["echo", "get-*"], prompts: [], resources: ["*"]}}
      time: {{}}
    namespacing: {{prefix: auto}}
    instructions: "Docs tools only."
  ops:
    backends:
      everything: {{tools: ["ask", "long-task", "echo"]}}
      time: {{tools: ["convert_time"], rename: {{convert_time: convert}}}}
    server_name: team-ops
  clock:
    backends:
      time: {{}}
"""


class Team:
    """The merged server and its virtual servers over one pool of fake backends."""

    def __init__(self, config: Config, page: int = 0) -> None:
        self.config = config
        self.pool = {
            "everything": server("everything", EVERYTHING_TOOLS, page),
            "time": server("time", TIME_TOOLS, page),
        }
        self.main = Dispatcher(
            list(self.pool.values()),
            [make_exposure(b) for b in config.backends],
            make_naming(config),
            INFO,
        )
        self.servers: dict[str, VirtualDispatcher] = {
            s.name: make(config, s, self.main, self.pool, NoTelemetry()) for s in config.servers
        }

    async def load(self) -> None:
        await self.main.catalogs.load_all()

    def asked(self, backend: str, method: str) -> list[Message]:
        return [m for m in self.pool[backend].asked if m["method"] == method]


@pytest.fixture
async def team(tmp_path: Path) -> Team:
    found = Team(parse(CONFIG.format(key=tmp_path / "task-key")))
    await found.load()
    return found


async def ask(dispatcher: Dispatcher, msg: Message) -> Message:
    return await dispatcher.handle(msg, ignore)


async def names(
    dispatcher: Dispatcher, method: str = "tools/list", key: str = "tools"
) -> list[str]:
    reply = await ask(dispatcher, modern(1, method))
    field = {"resources": "uri", "resourceTemplates": "uriTemplate"}.get(key, "name")
    return sorted(item[field] for item in reply["result"][key])


def code(reply: Message) -> int | None:
    error = reply.get("error")
    return error["code"] if isinstance(error, dict) else None


async def test_each_server_lists_its_selection_by_name_and_glob(team: Team) -> None:
    """server/tools, Listing Tools: a virtual server lists what it selects, under its naming."""
    assert await names(team.servers["docs"]) == [
        "everything_echo",
        "everything_get-env",
        "everything_get-tiny-image",
        "time_convert_time",
        "time_get_current_time",
    ]
    assert await names(team.servers["ops"]) == [
        "everything_ask",
        "everything_echo",
        "everything_long-task",
        "time_convert",
    ]
    # One backend under prefix auto: its own names.
    assert await names(team.servers["clock"]) == ["convert_time", "get_current_time"]
    # The merged server is unchanged: every tool of both.
    assert len(await names(team.main)) == len(EVERYTHING_TOOLS) + len(TIME_TOOLS)


async def test_an_empty_selection_offers_none_of_a_kind(team: Team, tmp_path: Path) -> None:
    """`prompts: []`: none of that backend's prompts, and discovery leaves its capability out
    when no other backend of the server has any."""
    docs = team.servers["docs"]
    assert await names(docs, "prompts/list", "prompts") == ["time_time-prompt"]
    reply = await ask(docs, modern(1, "prompts/get", name="everything_everything-prompt"))
    assert code(reply) == codes.INVALID_PARAMS
    # A selection of [] for a server's only backend: no capability at all.
    text = CONFIG.format(key=tmp_path / "k").replace(
        "clock:\n    backends:\n      time: {}", "clock:\n    backends:\n      time: {prompts: []}"
    )
    only = Team(parse(text))
    await only.load()
    found = await ask(only.servers["clock"], modern(1, "server/discover"))
    assert "prompts" not in found["result"]["capabilities"]
    assert "tools" in found["result"]["capabilities"]


async def test_a_tool_another_server_offers_is_unknown_here(team: Team) -> None:
    """server/tools, Error Handling: a call of a tool the server does not offer is -32602
    unknown tool, whether another server offers it or the merged server does; nothing reaches
    the backend."""
    before = len(team.asked("everything", "tools/call"))
    for name in ("everything_add", "everything_ask", "add", "ask"):
        assert code(await ask(team.servers["docs"], tool_call(1, name))) == codes.INVALID_PARAMS
    assert code(await ask(team.servers["ops"], tool_call(1, "time_get_current_time"))) == (
        codes.INVALID_PARAMS
    )
    # The renamed tool goes by its new name only.
    ops = team.servers["ops"]
    assert code(await ask(ops, tool_call(1, "time_convert_time"))) == codes.INVALID_PARAMS
    assert "result" in await ask(ops, tool_call(1, "time_convert"))
    assert team.asked("time", "tools/call")[-1]["params"]["name"] == "convert_time"
    assert len(team.asked("everything", "tools/call")) == before


async def test_a_tool_may_be_in_several_servers(team: Team) -> None:
    for name in ("docs", "ops"):
        reply = await ask(team.servers[name], tool_call(1, "everything_echo", text="hi"))
        assert "result" in reply
    assert [m["params"]["name"] for m in team.asked("everything", "tools/call")] == ["echo"] * 2


async def test_resources_follow_the_selection(tmp_path: Path) -> None:
    """server/resources: resources and templates by URI glob; a URI the selection leaves out is
    unknown, though it would route by its namespace, and one of a selected template is read."""
    text = CONFIG.format(key=tmp_path / "k").replace('resources: ["*"]', 'resources: ["*://t/*"]')
    team = Team(parse(text))
    await team.load()
    docs, ops = team.servers["docs"], team.servers["ops"]
    assert await names(docs, "resources/list", "resources") == ["mcp-gateway://time/time://doc"]
    assert await names(docs, "resources/templates/list", "resourceTemplates") == [
        "mcp-gateway://everything/everything://t/{id}",
        "mcp-gateway://time/time://t/{id}",
    ]
    left_out = "mcp-gateway://everything/everything://doc"
    assert code(await ask(docs, modern(1, "resources/read", uri=left_out))) == (
        codes.INVALID_PARAMS
    )
    reply = await ask(
        docs, modern(1, "resources/read", uri="mcp-gateway://everything/everything://t/5")
    )
    assert "result" in reply  # (by the selected template)
    assert team.asked("everything", "resources/read")[-1]["params"]["uri"] == "everything://t/5"
    clock = team.servers["clock"]
    reply = await ask(clock, modern(1, "resources/read", uri="everything://doc"))
    assert code(reply) == codes.INVALID_PARAMS
    assert await names(ops, "resources/templates/list", "resourceTemplates") == [
        "mcp-gateway://everything/everything://t/{id}",
        "mcp-gateway://time/time://t/{id}",
    ]


async def test_discovery_is_the_servers_own(team: Team) -> None:
    """server/discover: the server's serverInfo name and instructions, not the gateway's."""
    docs = await ask(team.servers["docs"], modern(1, "server/discover"))
    ops = await ask(team.servers["ops"], modern(1, "server/discover"))
    clock = await ask(team.servers["clock"], modern(1, "server/discover"))
    info = "io.modelcontextprotocol/serverInfo"
    assert docs["result"]["_meta"][info]["name"] == "docs"
    assert ops["result"]["_meta"][info]["name"] == "team-ops"
    # One backend: still the virtual server, not the backend shown through.
    assert clock["result"]["_meta"][info]["name"] == "clock"
    assert docs["result"]["instructions"] == "Docs tools only."
    # Without its own: one backend under its names, that backend's as written; several, each
    # under its namespace (as the merged server's).
    assert clock["result"]["instructions"] == "Ask time."
    assert "namespace `time`" in ops["result"]["instructions"]


async def test_one_catalog_load_per_backend_for_every_server(team: Team) -> None:
    """The catalogs are the merged server's: three servers over two backends made two loads,
    and each server's table was built from them."""
    assert len(team.asked("everything", "server/discover")) == 1
    assert len(team.asked("time", "server/discover")) == 1
    for dispatcher in team.servers.values():
        assert dispatcher.catalogs.table.tools  # routed without a load of its own


async def test_a_cursor_of_one_server_is_refused_by_another(tmp_path: Path) -> None:
    """basic/utilities/pagination: a cursor is opaque and only the server that issued it takes
    it; another server's is -32602, never a page of its lists."""
    team = Team(parse(CONFIG.format(key=tmp_path / "k")), page=1)
    await team.load()
    first = await ask(team.servers["docs"], modern(1, "tools/list"))
    cursor = first["result"]["nextCursor"]
    again = await ask(team.servers["docs"], modern(2, "tools/list", cursor=cursor))
    assert "result" in again
    for other in (team.servers["ops"], team.main):
        assert code(await ask(other, modern(3, "tools/list", cursor=cursor))) == (
            codes.INVALID_PARAMS
        )


async def test_a_task_of_one_server_is_unknown_to_another(team: Team) -> None:
    """Tasks extension: a task id is sealed with the server's own key, even over one backend
    (where the merged server would pass it through); another server refuses it."""
    reply = await ask(team.servers["ops"], tool_call(1, "everything_long-task"))
    task_id = reply["result"]["taskId"]
    assert task_id != "own-1"
    got = await ask(team.servers["ops"], modern(2, "tasks/get", taskId=task_id))
    assert got["result"]["taskId"] == task_id
    for other in (team.servers["docs"], team.main):
        assert code(await ask(other, modern(3, "tasks/get", taskId=task_id))) == (
            codes.INVALID_PARAMS
        )


async def test_a_request_state_is_the_servers_own(team: Team, tmp_path: Path) -> None:
    """basic/patterns/mrtr: a requestState handed out by one server is refused by another
    offering the same tool, before the backend sees it; its own is unwrapped for the backend."""
    ops = team.servers["ops"]
    first = await ask(ops, tool_call(1, "everything_ask"))
    state = first["result"]["requestState"]
    assert state != "own-state"
    retry = await ask(ops, modern(2, "tools/call", name="everything_ask", requestState=state))
    assert retry["result"]["content"][0]["text"] == "own-state"
    # Another server whose selection has the same tool.
    other = Team(
        parse(CONFIG.format(key=tmp_path / "k").replace('["echo", "get-*"]', '["echo", "ask"]'))
    )
    await other.load()
    elsewhere = other.servers["docs"]
    reply = await ask(elsewhere, modern(3, "tools/call", name="everything_ask", requestState=state))
    assert code(reply) == codes.INVALID_PARAMS
    forged = await ask(ops, modern(4, "tools/call", name="everything_ask", requestState="x" * 40))
    assert code(forged) == codes.INVALID_PARAMS


def test_wrapped_states_need_the_key() -> None:
    wrapped = wrap_state("s.t", b"k" * 32)
    assert unwrap_state(wrapped, [b"k" * 32]) == "s.t"
    assert unwrap_state(wrapped, [b"j" * 32]) is None
    assert unwrap_state("short", [b"k" * 32]) is None


async def test_a_server_without_policy_never_guesses_names(team: Team) -> None:
    """A name the server does not list is not forwarded to its only backend on a guess (as the
    merged server does for one unprefixed backend, README single-backend transparency)."""
    clock = team.servers["clock"]
    assert code(await ask(clock, tool_call(1, "not_listed"))) == codes.INVALID_PARAMS
    assert not [m for m in team.asked("time", "tools/call") if m["params"]["name"] == "not_listed"]


async def test_policy_inside_a_virtual_server(tmp_path: Path) -> None:
    """A server's own `policy:` decides there (a denied tool is an unknown one); the others
    keep the top-level one (none here)."""
    text = CONFIG.format(key=tmp_path / "k") + (
        "    policy:\n"
        "      default: allow\n"
        "      rules:\n"
        "        - deny: {backends: [time], tools: [get_current_time]}\n"
    )
    team = Team(parse(text))
    await team.load()
    clock = team.servers["clock"]
    assert await names(clock) == ["convert_time"]
    assert code(await ask(clock, tool_call(1, "get_current_time"))) == codes.INVALID_PARAMS
    assert "result" in await ask(team.servers["docs"], tool_call(2, "time_get_current_time"))


async def test_own_rate_limits_are_the_servers_buckets(tmp_path: Path) -> None:
    """A server's `rate_limits:` are buckets of its own: spending them leaves the others'."""
    text = CONFIG.format(key=tmp_path / "k") + (
        "    rate_limits:\n      overall: {rate: 0.001, burst: 1}\n"
    )
    team = Team(parse(text))
    await team.load()
    clock, docs = team.servers["clock"], team.servers["docs"]
    assert "result" in await ask(clock, tool_call(1, "convert_time"))
    assert code(await ask(clock, tool_call(2, "convert_time"))) == codes.RATE_LIMITED
    assert "result" in await ask(docs, tool_call(3, "time_convert_time"))


async def test_check_config_lists_each_server_and_its_counts(team: Team) -> None:
    """check-config: each server, its path and settings, and per backend its selection; with
    `--catalogs`, what each server shows of each backend and what that costs a model, from the
    loaded catalogs (app/inventory.py, here over the fake backends)."""
    lines = describe_servers(team.config)
    assert lines[0] == "  server docs: /mcp/docs (serverInfo docs, prefix=auto, own instructions)"
    assert lines[1] == "    everything: tools echo, get-*; prompts none; resources *"
    assert "  server ops: /mcp/ops (serverInfo team-ops)" in lines
    assert "    time: tools convert_time; prompts all; resources all; 1 renamed" in lines
    budget = Budget()
    found = [
        await server_catalog(
            budget, s.name, team.servers[s.name].catalogs, [b.name for b in s.backends]
        )
        for s in team.config.servers
    ]
    text = describe_catalogs(found).splitlines()
    docs = text.index(next(t for t in text if t.startswith("  server docs: ")))
    assert text[docs + 1].startswith(
        "    backend everything: tools 3, prompts 0, resources 1, templates 1; about "
    )
    ops = text.index(next(t for t in text if t.startswith("  server ops: ")))
    assert text[ops + 2].startswith(
        "    backend time: tools 1, prompts 1, resources 1, templates 1; about "
    )
    assert all(server.complete for server in found)


def test_the_docs_team_example_is_a_valid_config() -> None:
    """The docs' "Virtual servers" page: its worked example loads, with the three servers it
    names."""
    page = Path(__file__).parents[2] / "docs" / "guides" / "virtual-servers.md"
    example = page.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    config = parse(example)
    assert [s.name for s in config.servers] == ["docs", "ops", "admin"]
    assert [s.path for s in config.servers] == ["/mcp/docs", "/oncall", "/mcp/admin"]
    ops = config.servers[1]
    assert ops.selection["time"].rename == {"convert_time": "tz"}
    assert ops.selection["tickets"].prompts == ()


async def test_a_listen_asks_only_what_the_server_offers(team: Team) -> None:
    """basic/patterns/subscriptions: a listen on a server is planned over its backends only,
    and not for the changes of a list it selects nothing of (docs: no prompts of everything)."""
    wanted = {"toolsListChanged": True, "promptsListChanged": True}
    docs, clock = team.servers["docs"], team.servers["clock"]
    readable, hidden = docs._judge(None)
    plans = docs.subscriptions._plan(wanted, readable, hidden)
    assert plans["everything"].flags == {"toolsListChanged": True}
    assert plans["time"].flags == wanted
    readable, hidden = clock._judge(None)
    assert set(clock.subscriptions._plan(wanted, readable, hidden)) == {"time"}
