"""Virtual servers over real processes (issue 33): three servers (the issue's `docs` exactly,
`ops` with a policy of its own, `admin` with everything) over four real backends (the npm
reference servers `server-everything` and `server-memory`, the SDK test server over stdio, named
`time` as in the issue's example, and over HTTP), reached with the official SDK client in both
eras at each path; a client of one path is refused everything of another; a reload changes one
server under load while the others keep serving; and the process count shows one shared pool."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.subscriptions import ToolsListChanged

from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import codes
from tests.support import (
    BOUND,
    META,
    PYTHON,
    START_BOUND,
    call,
    gateway_command,
    messages,
    mirrored_headers,
    run_cli,
    sdk_stdio_command,
    start_sdk_http,
    until,
)
from tests.support.conformance import npm_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ERAS = ["auto", "legacy"]  # (the SDK client discovers the modern era; or opens a session)
DOCS_INSTRUCTIONS = "Docs tools only."
META_TOOLS = ["_search_tools", "_describe_tool", "_call_tool"]  # (core/toolsearch.py)
CALL = "_call_tool"
ECHO = {"message": "found by search"}
TASKS = "io.modelcontextprotocol/tasks"


@pytest.fixture(scope="module")
def sdk_url() -> Iterator[str]:
    proc, url = start_sdk_http("--label", "h")
    yield url
    proc.stop()


def stdio(command: list[str]) -> dict[str, Any]:
    return {"stdio": {"command": command[0], "args": command[1:]}}


def team_config(
    sdk_url: str, *, ops_tools: list[str] | None = None, extra: bool = False, search: str = "on"
) -> str:
    """The team's config: the issue's `docs` as written (`search`: its tool_search mode; "off"
    where a test pages through its tools), `ops` with its own policy, `admin` with every
    backend whole (`extra`: a fourth server, for reloads)."""
    backends = {
        "everything": stdio([*npm_server("server-everything"), "stdio"]),
        "time": stdio(sdk_stdio_command("--label", "t")),
        "memory": stdio(npm_server("server-memory")),
        "sdk": {"http": {"url": sdk_url}},
    }
    servers: dict[str, Any] = {
        "docs": {
            "backends": {
                "everything": {"tools": ["echo", "get-*"], "prompts": [], "resources": ["*"]},
                "time": {},
            },
            "namespacing": {"prefix": "auto"},
            "instructions": DOCS_INSTRUCTIONS,
            "tool_search": {"mode": search},
        },
        "ops": {
            "backends": {
                "time": {"tools": ops_tools or ["echo", "add", "boom", "whoami", "change_tools"]},
                "memory": {},
            },
            "policy": {"rules": [{"deny": {"backends": ["time"], "tools": ["boom"]}}]},
        },
        "admin": {"backends": {name: {} for name in backends}},
    }
    if extra:
        servers["extra"] = {"backends": {"memory": {"tools": ["read_graph"]}}}
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "fan_out": {"grace": 5},
            "backends": backends,
            "servers": servers,
        }
    )


@asynccontextmanager
async def team(sdk_url: str, search: str = "on") -> AsyncIterator[Gateway]:
    with anyio.fail_after(3 * START_BOUND):
        async with Gateway(parse(team_config(sdk_url, search=search))) as gw:
            await gw.catalogs_loaded.wait()
            yield gw


def at(gw: Gateway, path: str) -> str:
    assert gw.http_url is not None
    return gw.http_url.removesuffix("/mcp") + path


@asynccontextmanager
async def client(url: str, era: str = ERAS[0]) -> AsyncIterator[Client]:
    with anyio.fail_after(3 * START_BOUND):
        async with Client(url, mode=era) as found:
            yield found


async def tool_names(c: Client) -> list[str]:
    names: list[str] = []
    cursor: str | None = None
    while True:
        page = await c.list_tools(cursor=cursor)
        names += [t.name for t in page.tools]
        if (cursor := page.next_cursor) is None:
            return names


async def search(c: Client, query: str) -> list[str]:
    """The names `_search_tools` finds for `query` (its structured result)."""
    result = await c.call_tool("_search_tools", {"query": query, "limit": 10})
    assert not result.is_error and result.structured_content is not None
    return [t["name"] for t in result.structured_content["tools"]]


def docs_offers(name: str) -> bool:
    return name == "everything_echo" or name.startswith(("everything_get-", "time_"))


def ops_offers(name: str) -> bool:
    ops = ("time_echo", "time_add", "time_whoami", "time_change_tools")
    return name in ops or name.startswith("memory_")


def children() -> set[int]:
    """This process's children (an in-process gateway's stdio backends are among them)."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:
            found.add(int(entry.name))
    return found


@pytest.mark.parametrize("era", ERAS)
async def test_each_path_is_a_server_of_its_own(sdk_url: str, era: str) -> None:
    """server/tools, Listing Tools and utilities/pagination, at each path, in both eras: each
    server lists (page after page) exactly its selection, names as the merged server's, and
    calls reach the backends; /mcp stays the whole merged server. (docs with its tool search
    off: test_tool_search_on_one_server has it on.)"""
    async with team(sdk_url, search="off") as gw:
        listed = gw._status()["gateway"]["listeners"]  # (the status page: each server's URL)
        assert listed["server docs"] == at(gw, "/mcp/docs")
        async with client(at(gw, "/mcp/admin"), era) as c:
            everything = await tool_names(c)
        async with client(at(gw, "/mcp"), era) as c:
            assert sorted(await tool_names(c)) == sorted(everything)
        async with client(at(gw, "/mcp/docs"), era) as c:
            # server/discover, or the InitializeResult of a legacy session: the server's own.
            assert (c.protocol_version == "2026-07-28") == (era == "auto")
            assert c.instructions == DOCS_INSTRUCTIONS
            assert c.server_info is not None and c.server_info.name == "docs"
            docs = await tool_names(c)
            assert sorted(docs) == sorted(n for n in everything if docs_offers(n))
            assert "time_echo" in docs and "everything_get-sum" in docs
            echoed = await c.call_tool("everything_echo", {"message": "from docs"})
            assert "from docs" in echoed.content[0].text  # type: ignore[union-attr]
            assert (await c.list_prompts()).prompts  # time's prompts; none of everything's
            assert all(p.name.startswith("time_") for p in (await c.list_prompts()).prompts)
            assert (await c.list_resources()).resources
        async with client(at(gw, "/mcp/ops"), era) as c:
            assert c.server_info is not None and c.server_info.name == "ops"
            ops = await tool_names(c)
            assert sorted(ops) == sorted(n for n in everything if ops_offers(n))
            added = await c.call_tool("time_add", {"a": 2, "b": 3})
            assert added.content[0].text == "5"  # type: ignore[union-attr]


async def test_a_client_of_one_path_is_refused_everything_of_another(sdk_url: str) -> None:
    """A tool, a cursor and a legacy session of one server are nothing to another: -32602
    unknown tool, -32602 invalid cursor, 404 unknown session."""
    async with (
        team(sdk_url, search="off") as gw,  # (docs's list is paged: its tools, not the search)
        client(at(gw, "/mcp/docs")) as docs,
        client(at(gw, "/mcp/ops")) as ops,
    ):
        for tool in ("memory_read_graph", "sdk_echo", "everything_get-sum"):
            c = docs if tool != "everything_get-sum" else ops
            with pytest.raises(MCPError) as refused:
                await c.call_tool(tool, {})
            assert refused.value.error.code == codes.INVALID_PARAMS
        page = await docs.list_tools()
        assert page.next_cursor is not None  # (time pages by 10)
        with pytest.raises(MCPError) as refused:
            await ops.list_tools(cursor=page.next_cursor)
        assert refused.value.error.code == codes.INVALID_PARAMS
        # A legacy session opened at /mcp/docs is unknown at /mcp/ops.
        init = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        }
        headers = {"Accept": "application/json, text/event-stream"}
        async with aiohttp.ClientSession() as http:
            async with http.post(at(gw, "/mcp/docs"), json=init, headers=headers) as opened:
                assert opened.status == 200
                session = opened.headers["Mcp-Session-Id"]
            listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            headed = {**headers, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
            async with http.post(at(gw, "/mcp/ops"), json=listing, headers=headed) as other:
                assert other.status == 404
            async with http.post(at(gw, "/mcp/docs"), json=listing, headers=headed) as own:
                assert own.status == 200


@pytest.mark.parametrize("era", ERAS)
async def test_policy_inside_a_virtual_server(sdk_url: str, era: str) -> None:
    """ops's own policy denies time's `boom`: not listed, refused as unknown (-32602); admin,
    under the top-level (no) policy, calls it."""
    async with (
        team(sdk_url) as gw,
        client(at(gw, "/mcp/ops"), era) as ops,
        client(at(gw, "/mcp/admin"), era) as admin,
    ):
        assert "time_boom" not in await tool_names(ops)
        with pytest.raises(MCPError) as refused:
            await ops.call_tool("time_boom", {})
        assert refused.value.error.code == codes.INVALID_PARAMS
        try:
            reached = await admin.call_tool("time_boom", {})
            assert reached.is_error
        except MCPError as exc:  # (the tool's own failure, not a refusal)
            assert exc.error.code != codes.INVALID_PARAMS


async def test_listen_hears_only_the_servers_backends(sdk_url: str) -> None:
    """basic/patterns/subscriptions: a listen on a server is made of listens on its backends
    only; a list change of a backend it does not offer (sdk) is not heard there."""
    async with (
        team(sdk_url) as gw,
        client(at(gw, "/mcp/ops")) as ops,
        client(at(gw, "/mcp/admin")) as admin,
        ops.listen(tools_list_changed=True) as ops_sub,
        admin.listen(tools_list_changed=True) as admin_sub,
    ):
        assert ops_sub.honored.tools_list_changed and admin_sub.honored.tools_list_changed
        ops_events, admin_events = ops_sub.__aiter__(), admin_sub.__aiter__()
        await admin.call_tool("sdk_change_tools", {})
        with anyio.fail_after(BOUND):
            assert isinstance(await admin_events.__anext__(), ToolsListChanged)
        # Heard at admin (so relayed by now); then a change of a backend ops does offer.
        await admin.call_tool("time_change_tools", {})
        with anyio.fail_after(BOUND):
            assert isinstance(await ops_events.__anext__(), ToolsListChanged)
        with anyio.move_on_after(1.0) as nothing_more:
            await ops_events.__anext__()
        assert nothing_more.cancelled_caught  # (sdk's change never reached ops)


async def test_a_reload_changes_one_server_while_the_others_serve(sdk_url: str) -> None:
    """Hot reload: ops changed, a server added then removed, under steady calls to docs and
    admin: none of theirs fails, and each path serves its new config at once."""
    async with team(sdk_url) as gw:
        failures: list[BaseException] = []
        calls = 0
        stop = anyio.Event()
        tick = [anyio.Event()]  # set (and replaced) at each answered call

        async def answered(count: int) -> None:
            while calls < count:
                await tick[0].wait()

        async def steady(path: str, tool: str, arguments: dict[str, Any]) -> None:
            nonlocal calls
            async with client(at(gw, path)) as c:
                while not stop.is_set():
                    try:
                        result = await c.call_tool(tool, arguments)
                        assert not result.is_error
                        calls += 1
                        tick[0].set()
                        tick[0] = anyio.Event()
                    except Exception as exc:
                        failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(steady, "/mcp/docs", "everything_echo", {"message": "m"})
            tg.start_soon(steady, "/mcp/admin", "time_echo", {"text": "t"})
            with anyio.fail_after(3 * START_BOUND):
                await answered(20)
                changed = team_config(sdk_url, ops_tools=["echo"], extra=True)
                done = await gw.reload(lambda: parse(changed))
                assert done is not None
                async with client(at(gw, "/mcp/ops")) as ops:
                    assert sorted(n for n in await tool_names(ops) if n.startswith("time_")) == [
                        "time_echo"
                    ]
                async with client(at(gw, "/mcp/extra")) as extra:
                    assert await tool_names(extra) == ["read_graph"]
                before = calls
                assert await gw.reload(lambda: parse(team_config(sdk_url))) is not None
                await answered(before + 20)
            stop.set()
        assert failures == []
        async with (
            aiohttp.ClientSession() as http,
            http.post(at(gw, "/mcp/extra"), json={}) as gone,
        ):
            assert gone.status == 404


async def test_one_shared_pool_of_children(sdk_url: str) -> None:
    """The backends are one supervised pool: serving three more servers, in both eras, starts
    no process beyond what the merged server alone uses."""
    before = children()
    async with team(sdk_url) as gw:
        stdio_backends = [t for t in gw.transports if t.transport == "stdio"]
        for era in ERAS:
            async with client(at(gw, "/mcp"), era) as c:
                await tool_names(c)
                await c.call_tool("time_echo", {"text": "x"})
        merged_only = children() - before
        assert len(merged_only) >= len(stdio_backends) == 3
        for path in ("/mcp/docs", "/mcp/ops", "/mcp/admin"):
            for era in ERAS:
                async with client(at(gw, path), era) as c:
                    await tool_names(c)
                    await c.call_tool("time_echo", {"text": "x"})
        assert children() - before == merged_only


async def test_run_server_serves_one_virtual_server_on_stdio(sdk_url: str, tmp_path: Path) -> None:
    """`run --server docs`: the stdio front end is the docs server (its meta-tools, its
    tools called through them, its serverInfo), the backends are started once for it and the
    HTTP paths."""
    settings = yaml.safe_load(team_config(sdk_url))
    settings["listen"]["stdio"] = True
    config = tmp_path / "team.yaml"
    config.write_text(yaml.safe_dump(settings))
    command = gateway_command(config, "--server", "docs")
    params = StdioServerParameters(command=PYTHON, args=command[1:])
    with anyio.fail_after(3 * START_BOUND):
        async with Client(params) as c:
            assert c.server_info is not None and c.server_info.name == "docs"
            assert await tool_names(c) == META_TOOLS
            found = await search(c, "echo back the message")
            assert "everything_echo" in found and all(docs_offers(n) for n in found)
            echoed = await c.call_tool(CALL, {"name": "everything_echo", "arguments": ECHO})
            assert "found by search" in echoed.content[0].text  # type: ignore[union-attr]


def test_check_config_counts_what_each_server_shows(sdk_url: str, tmp_path: Path) -> None:
    """`check-config --catalogs`: each server (the merged one, then each virtual server) with
    its backends, how many items of each it shows and their tokens, from catalogs loaded as
    `run` loads them."""
    config = tmp_path / "team.yaml"
    config.write_text(team_config(sdk_url))
    done = run_cli("check-config", str(config), "--catalogs")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        "  server docs: /mcp/docs (serverInfo docs, prefix=auto, own instructions, tool search on)"
        in lines
    )
    # (the summary above lists each server's settings: its catalogs come after this line)
    lines = lines[lines.index("catalogs (backends started, their lists loaded, stopped again):") :]
    tokens, backends = {}, {}
    for name in ("default", "docs", "ops", "admin"):
        (at_line,) = [i for i, line in enumerate(lines) if line.startswith(f"  server {name}: ")]
        found = re.search(r"about (\d+) tokens", lines[at_line])
        assert found is not None, lines[at_line]
        tokens[name] = int(found.group(1))
        block = itertools.takewhile(lambda line: line.startswith("    "), lines[at_line + 1 :])
        backends[name] = {line.split(":")[0].split()[-1]: line for line in block}
    assert sorted(backends["docs"]) == ["everything", "time"]
    assert " prompts 0," in backends["docs"]["everything"]
    assert " tools 0," not in backends["docs"]["everything"]
    assert backends["ops"]["memory"].startswith("    backend memory: tools 9, ")
    assert 0 < tokens["docs"] < tokens["default"] and tokens["admin"] == tokens["default"]


@pytest.mark.parametrize("era", ERAS)
async def test_tool_search_on_one_server(sdk_url: str, era: str) -> None:
    """The issue's acceptance config (docs with `tool_search: {mode: "on"}`, ops, admin), the
    SDK client in both eras at /mcp/docs: tools/list (server/tools, Listing Tools) shows the
    meta-tools; `_search_tools` finds an `everything` tool docs offers and not one only ops
    and admin offer (memory's); `_call_tool` calls it; ops lists its tools as before; the
    token gauge has a series for docs, and the status page a row."""
    async with team(sdk_url) as gw:
        async with client(at(gw, "/mcp/docs"), era) as c:
            assert await tool_names(c) == META_TOOLS
            found = await search(c, "echo back the message")
            assert "everything_echo" in found and all(docs_offers(n) for n in found)
            assert "memory_read_graph" not in await search(c, "read the knowledge graph")
            echoed = await c.call_tool(CALL, {"name": "everything_echo", "arguments": ECHO})
            assert "found by search" in echoed.content[0].text  # type: ignore[union-attr]
            with pytest.raises(MCPError) as refused:
                await c.call_tool(CALL, {"name": "memory_read_graph", "arguments": {}})
            assert refused.value.error.code == codes.INVALID_PARAMS
        async with client(at(gw, "/mcp/ops"), era) as c:
            assert "memory_read_graph" in await tool_names(c)
        # (each server's figures once every backend it offers is estimated)
        offered = {"default": 4, "docs": 2, "ops": 2, "admin": 4}
        await until(
            lambda: all(len(gw.budget.backends(s)) == n for s, n in offered.items()),
            wake=lambda: gw.budget.changed.wait(),
        )
        labels = {"server": "docs", "kind": "tools"}
        assert (gw.registry.get_sample_value("mcp_gateway_catalog_tokens", labels) or 0) > 0
        # The status page's Servers table: each server, docs's tokens its own (a selection).
        rows = {row["name"]: row for row in gw._status()["servers"]}
        assert {"default", "docs", "ops", "admin"} <= rows.keys()
        assert 0 < rows["docs"]["total_tokens"] < rows["default"]["total_tokens"]


async def test_an_input_request_is_answered_only_where_it_was_asked(sdk_url: str) -> None:
    """basic/patterns/mrtr: time's `ask` answers a modern call with input_required and a
    requestState; a retry carrying it at another path offering the same tool (admin) is
    -32602 before the backend sees it; at docs, where it was asked, the answer goes through."""
    async with team(sdk_url) as gw, aiohttp.ClientSession() as http:

        async def post(path: str, msg: dict[str, Any]) -> dict[str, Any]:
            async with http.post(at(gw, path), json=msg, headers=mirrored_headers(msg)) as got:
                reply: dict[str, Any] = await got.json()
                return reply

        def asking(rid: int) -> dict[str, Any]:
            msg = call(rid, "time_ask", question="colour?")
            caps: dict[str, Any] = {"elicitation": {"form": {}}}
            msg["params"]["_meta"] = {**META, "io.modelcontextprotocol/clientCapabilities": caps}
            return msg

        asked = await post("/mcp/docs", asking(1))
        result = asked["result"]
        assert result["resultType"] == "input_required"
        (key,) = result["inputRequests"]
        retry = asking(2)
        retry["params"]["requestState"] = result["requestState"]
        retry["params"]["inputResponses"] = {
            key: {"action": "accept", "content": {"answer": "blue"}}
        }
        elsewhere = await post("/mcp/admin", retry)
        assert elsewhere["error"]["code"] == codes.INVALID_PARAMS
        here = await post("/mcp/docs", retry)
        assert here["result"]["content"][0]["text"] == "answer: blue"


async def test_a_task_is_known_only_to_the_server_that_made_it(tmp_path: Path) -> None:
    """Tasks extension, over tests/servers/tasks_server.py: two servers offering the same one
    backend (where the merged server would pass task ids through) each seal their own; a task
    made at one path is polled there and is -32602 at the other."""
    tasks_server = str(Path(__file__).parents[1] / "servers" / "tasks_server.py")
    text = yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"c": stdio([PYTHON, tasks_server, "stdio", "--label", "c"])},
            "tasks": {"key_file": str(tmp_path / "task-key")},
            "servers": {"one": {"backends": {"c": {}}}, "two": {"backends": {"c": {}}}},
        }
    )
    meta = {**META, "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}}}

    def request(rid: int, method: str, **params: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}

    with anyio.fail_after(3 * START_BOUND):
        async with Gateway(parse(text)) as gw, aiohttp.ClientSession() as http:

            async def post(path: str, msg: dict[str, Any], name: str) -> dict[str, Any]:
                headed = {
                    "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": "2026-07-28",
                    "Mcp-Method": msg["method"],
                    "Mcp-Name": name,  # (the tool's name, or the task's id: routing headers)
                }
                async with http.post(at(gw, path), json=msg, headers=headed) as got:
                    async for reply in messages(got):
                        if reply.get("id") == msg["id"]:
                            return reply
                raise AssertionError(f"no reply to {msg['method']}")

            made = await post("/mcp/one", request(1, "tools/call", name="slow_job"), "slow_job")
            task_id = made["result"]["taskId"]
            assert not task_id.startswith("c-")  # (sealed: not the backend's own id)
            here = await post("/mcp/one", request(2, "tasks/get", taskId=task_id), task_id)
            assert here["result"]["taskId"] == task_id
            there = await post("/mcp/two", request(3, "tasks/get", taskId=task_id), task_id)
            assert there["error"]["code"] == codes.INVALID_PARAMS


class Changes:
    """A legacy session's message handler counting the tools list changes it receives."""

    def __init__(self) -> None:
        self.seen = 0
        self.arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            self.seen += 1
            self.arrived.set()
            self.arrived = anyio.Event()


async def test_a_legacy_session_hears_its_servers_list_changes(sdk_url: str) -> None:
    """server/tools List Changed, legacy era: a session at /mcp/ops is told of a list change
    of a backend ops offers (its watch is a listen planned over ops's backends, as a modern
    client's: test_listen_hears_only_the_servers_backends)."""
    changes = Changes()
    async with team(sdk_url) as gw:
        with anyio.fail_after(3 * START_BOUND):
            async with Client(at(gw, "/mcp/ops"), mode="legacy", message_handler=changes) as ops:
                # The session's watch opens with it: change until one is heard (each call's
                # own notification comes back through the watch).
                while changes.seen == 0:
                    await ops.call_tool("time_change_tools", {})
                    with anyio.move_on_after(0.5):
                        await changes.arrived.wait()
