"""Tasks extension end to end over real sockets and pipes: a gateway (Streamable HTTP front end)
in front of two tasks_server.py backends over HTTP and one over stdio. A modern client declaring
the extension creates a task on each, polls it through input_required, answers its elicitation
with tasks/update and gets the completed result; cancels one; is refused a task id it was not
given; must mirror the task id in Mcp-Name (Streamable HTTP: Routing Headers) while each HTTP
backend checks the gateway mirrors the backend's own id; listens for notifications/tasks; and
finds its task again after the gateway restarts (the key file survives it)."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import pytest
import yaml

from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    VERSION,
    Proc,
    http_backend,
    messages,
    start_gateway_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SERVER = str(ROOT / "tests" / "servers" / "tasks_server.py")
EXTENSION = "io.modelcontextprotocol/tasks"
INVALID_PARAMS = -32602
HEADER_MISMATCH = -32020
Message = dict[str, Any]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def start_http_server(label: str) -> tuple[Proc, str]:
    proc = Proc([PYTHON, SERVER, "http", "--port", "0", "--label", label])
    port = proc.wait_for(r"READY (\d+)", stream="stdout").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    a, url_a = start_http_server("a")
    b, url_b = start_http_server("b")
    yield {"a": url_a, "b": url_b}
    a.stop()
    b.stop()


def config(directory: Path, servers: dict[str, str], stdio: bool = True) -> Path:
    backends: dict[str, object] = {n: http_backend(u) for n, u in servers.items()}
    if stdio:
        backends["c"] = stdio_backend([PYTHON, SERVER, "stdio", "--label", "c"])
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": backends,
        "tasks": {"key_file": "state/task-key"},
    }
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def gateway(servers: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = start_gateway_http(config(tmp_path_factory.mktemp("tasks"), servers))
    yield url
    proc.stop()


def request(rid: int | str, method: str, **params: Any) -> Message:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}


def headers(msg: Message, name: str | None = None) -> dict[str, str]:
    """A conforming client's headers; `name`: an Mcp-Name other than the body's."""
    params = msg["params"]
    source = params.get("taskId", params.get("name", params.get("uri")))
    out = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": msg["method"],
    }
    if name is not None or isinstance(source, str):
        out["Mcp-Name"] = name if name is not None else source
    return out


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=4 * BOUND)) as session:
        yield session


async def post(http: aiohttp.ClientSession, url: str, msg: Message, name: str | None = None) -> Any:
    async with http.post(url, json=msg, headers=headers(msg, name)) as resp:
        async for reply in messages(resp):
            if reply.get("id") == msg["id"]:
                return reply
    raise AssertionError(f"no reply to {msg['method']}")


async def create(http: aiohttp.ClientSession, url: str, tool: str) -> str:
    reply = await post(http, url, request("c", "tools/call", name=tool, arguments={}))
    result = reply["result"]
    assert result["resultType"] == "task" and result["status"] == "working"
    task_id: str = result["taskId"]
    return task_id


async def test_the_merged_discovery_offers_the_extension(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """Tasks, Capability Negotiation: several backends offering the extension, the merged
    server offers it too, so a client learns it may get task handles."""
    reply = await post(http, gateway, request("d", "server/discover"))
    assert EXTENSION in reply["result"]["capabilities"]["extensions"]


async def test_a_task_on_each_backend_goes_from_working_to_completed(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """Task Polling, Task Update Requests: each backend's own id never reaches the client; the
    elicitation passes untouched; the result's link is shown as a tools/call reply's is."""
    for backend in ("a", "b", "c"):
        task_id = await create(http, gateway, f"{backend}_slow_job")
        assert not task_id.startswith(f"{backend}-")
        got = (await post(http, gateway, request(1, "tasks/get", taskId=task_id)))["result"]
        assert got["status"] == "input_required" and got["taskId"] == task_id
        assert got["inputRequests"]["name"]["method"] == "elicitation/create"
        answer = {"name": {"action": "accept", "content": {"name": "Luca"}}}
        updated = await post(
            http, gateway, request(2, "tasks/update", taskId=task_id, inputResponses=answer)
        )
        assert updated["result"]["resultType"] == "complete"
        got = (await post(http, gateway, request(3, "tasks/get", taskId=task_id)))["result"]
        assert got["status"] == "working"
        got = (await post(http, gateway, request(4, "tasks/get", taskId=task_id)))["result"]
        assert got["status"] == "completed" and got["taskId"] == task_id
        text, link = got["result"]["content"]
        assert text["text"] == f"Hello, Luca from {backend}"
        direct = await post(http, gateway, request(5, "tools/call", name=f"{backend}_link"))
        assert (
            link["uri"] == direct["result"]["content"][0]["uri"] != f"file:///{backend}/report.txt"
        )


async def test_a_cancelled_task_stays_cancelled(gateway: str, http: aiohttp.ClientSession) -> None:
    task_id = await create(http, gateway, "b_slow_job")
    cancelled = await post(http, gateway, request(1, "tasks/cancel", taskId=task_id))
    assert cancelled["result"]["resultType"] == "complete"
    got = await post(http, gateway, request(2, "tasks/get", taskId=task_id))
    assert got["result"]["status"] == "cancelled"


async def test_an_id_the_gateway_did_not_issue_is_an_unknown_task(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """Error Handling: an invalid or nonexistent taskId is -32602, even a backend's real own id."""
    task_id = await create(http, gateway, "a_slow_job")
    for bad in ("a-1", task_id[:-1] + ("0" if task_id[-1] != "0" else "1"), "x" * 5000):
        reply = await post(http, gateway, request(1, "tasks/get", taskId=bad))
        assert reply["error"]["code"] == INVALID_PARAMS


async def test_mcp_name_must_mirror_the_task_id(gateway: str, http: aiohttp.ClientSession) -> None:
    """Streamable HTTP, Routing Headers: a mismatched (or missing) Mcp-Name is the front end's
    header mismatch, before anything is routed (an id the gateway never issued would otherwise
    be an unknown task, -32602)."""
    task_id = await create(http, gateway, "a_slow_job")
    for body_id in (task_id, "never-issued"):
        msg = request(1, "tasks/get", taskId=body_id)
        async with http.post(gateway, json=msg, headers=headers(msg, "another")) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == HEADER_MISMATCH
        missing = {k: v for k, v in headers(msg).items() if k != "Mcp-Name"}
        async with http.post(gateway, json=msg, headers=missing) as resp:
            assert (await resp.json())["error"]["code"] == HEADER_MISMATCH


async def test_a_listen_on_task_ids_gets_notifications_with_the_sealed_ids(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """Task Status Notifications: one listen over two backends (HTTP and stdio)."""
    on_a = await create(http, gateway, "a_slow_job")
    on_c = await create(http, gateway, "c_slow_job")
    msg = request("listen", "subscriptions/listen", notifications={"taskIds": [on_a, on_c]})
    seen: dict[str, str] = {}
    with anyio.fail_after(BOUND):
        async with http.post(gateway, json=msg, headers=headers(msg)) as resp:
            stream = messages(resp)
            ack = await anext(stream)
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            assert sorted(ack["params"]["notifications"]["taskIds"]) == sorted([on_a, on_c])
            async for note in stream:
                assert note["method"] == "notifications/tasks"
                seen[note["params"]["taskId"]] = note["params"]["status"]
                if len(seen) == 2:
                    break
            await post(http, gateway, request(1, "tasks/cancel", taskId=on_c))
            async for note in stream:
                if note["params"]["status"] == "cancelled":
                    assert note["params"]["taskId"] == on_c
                    break
    assert seen == {on_a: "working", on_c: "working"}


async def test_a_client_without_the_extension_gets_no_task(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """Capability Negotiation: the backend decides by the client's own declaration, which the
    gateway passes as it came."""
    msg = request(1, "tools/call", name="a_slow_job", arguments={})
    msg["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"] = {}
    reply = await post(http, gateway, msg)
    assert reply["result"]["content"][0]["text"] == "done without a task"


async def test_a_legacy_client_declaring_the_extension_gets_no_task(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    """A 2025-11-25 session: its capabilities reach backends without the tasks extension, and
    its `initialize` result does not offer the extension (kept off for that era), though the
    modern discovery does."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"extensions": {EXTENSION: {}}},
            "clientInfo": {"name": "legacy", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with http.post(gateway, json=init, headers=accept) as resp:
        session = resp.headers["Mcp-Session-Id"]
        initialized = [m async for m in messages(resp) if m.get("id") == 1]
    assert EXTENSION not in initialized[0]["result"]["capabilities"].get("extensions", {})
    legacy = {**accept, "Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(gateway, json=done, headers=legacy) as resp:
        assert resp.status == 202
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "a_slow_job", "arguments": {}},
    }
    async with http.post(gateway, json=call, headers=legacy) as resp:
        replies = [m async for m in messages(resp) if m.get("id") == 2]
    assert replies[0]["result"]["content"][0]["text"] == "done without a task"


async def test_a_task_outlives_a_gateway_restart(
    servers: dict[str, str], tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """Clients SHOULD persist task ids to resume polling after a restart (Task Polling): the id
    carries its route, and the key file (made once, owner-only) signs it again."""
    path = config(tmp_path, servers, stdio=False)
    first, url = start_gateway_http(path)
    try:
        task_id = await create(http, url, "b_slow_job")
    finally:
        first.stop()
    key = tmp_path / "state" / "task-key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    second, url = start_gateway_http(path)
    try:
        got = await post(http, url, request(1, "tasks/get", taskId=task_id))
    finally:
        second.stop()
    assert got["result"]["taskId"] == task_id and got["result"]["status"] == "input_required"
