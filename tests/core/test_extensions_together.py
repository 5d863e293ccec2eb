"""Two backends that each offer the Tasks and the Apps extensions behind one gateway, over real
sockets and pipes (extensions/tasks "Task Polling", "Task Update Requests", "Task
Cancellation"; extensions/apps "Resource Discovery"): a modern client creates a task on each,
polls it, answers its input request, cancels another, and reads each app's UI by the URI its
tool names; a 2025-11-25 client reads the same UIs and is offered Apps but not Tasks (kept off
for that era, README "Tasks (extension)")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import anyio
import pytest
import yaml

from tests.core.test_tasks_e2e import post, request
from tests.frontends.test_http_transport_rules import post as rules_post
from tests.frontends.test_legacy_sessions import (
    in_session,
    initialize,
    legacy,
    open_session,
    result_of,
)
from tests.support import BOUND, PYTHON, ROOT, Proc, http_backend, start_gateway_http, stdio_backend

pytestmark = pytest.mark.anyio

SERVER = str(ROOT / "tests" / "servers" / "tasks_server.py")
TASKS = "io.modelcontextprotocol/tasks"
UI = "io.modelcontextprotocol/ui"
LABELS = ("alpha", "beta")  # alpha over HTTP, beta over stdio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    alpha = Proc([PYTHON, SERVER, "http", "--port", "0", "--label", "alpha", "--apps", "yes"])
    port = alpha.wait_for(r"READY (\d+)", stream="stdout").group(1)
    backends = {
        "alpha": http_backend(f"http://127.0.0.1:{port}/mcp"),
        "beta": stdio_backend([PYTHON, SERVER, "stdio", "--label", "beta", "--apps", "yes"]),
    }
    directory = tmp_path_factory.mktemp("together")
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": backends,
        "tasks": {"key_file": "state/task-key"},
    }
    (directory / "gateway.yaml").write_text(yaml.safe_dump(doc))
    proc, url = start_gateway_http(directory / "gateway.yaml")
    yield url
    proc.stop()
    alpha.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=4 * BOUND)) as session:
        yield session


def ui_of(tools: list[dict[str, Any]], name: str) -> str:
    found = [t for t in tools if t["name"] == name]
    assert found, [t["name"] for t in tools]
    uri: str = found[0]["_meta"]["ui"]["resourceUri"]
    return uri


async def test_a_modern_client_uses_tasks_and_apps_of_both_backends(
    gateway: str, http: aiohttp.ClientSession
) -> None:
    with anyio.fail_after(4 * BOUND):
        found = await post(http, gateway, request("d", "server/discover"))
    assert {TASKS, UI} <= found["result"]["capabilities"]["extensions"].keys()
    tools = (await post(http, gateway, request("l", "tools/list")))["result"]["tools"]
    listed = (await post(http, gateway, request("r", "resources/list")))["result"]["resources"]
    for label in LABELS:
        # The app's UI, by exactly the URI its tool names: listed, read, still a ui:// URI.
        view = ui_of(tools, f"{label}_slow_job")
        assert view.startswith("ui://") and view in [r["uri"] for r in listed]
        read = await post(http, gateway, request("v", "resources/read", uri=view))
        assert "result" in read, read
        assert label in read["result"]["contents"][0]["text"]
        # A task: created, polled into input_required, answered, polled to its result.
        call = request("c", "tools/call", name=f"{label}_slow_job", arguments={})
        created = (await post(http, gateway, call))["result"]
        assert created["resultType"] == "task"
        task = created["taskId"]
        polled = (await post(http, gateway, request("g1", "tasks/get", taskId=task)))["result"]
        assert polled["status"] == "input_required" and polled["taskId"] == task
        ask = polled["inputRequests"]["name"]
        assert ask["method"] == "elicitation/create"  # passed through untouched
        answer = {"name": {"action": "accept", "content": {"name": "Ada"}}}
        update = request("u", "tasks/update", taskId=task, inputResponses=answer)
        assert "error" not in await post(http, gateway, update)
        statuses: list[str] = []
        while not statuses or statuses[-1] == "working":
            got = await post(http, gateway, request("g", "tasks/get", taskId=task))
            statuses.append(got["result"]["status"])
        assert statuses == ["working", "completed"]
        assert got["result"]["result"]["content"][0]["text"] == f"Hello, Ada from {label}"
        # Another task, cancelled.
        other = (await post(http, gateway, call))["result"]["taskId"]
        assert "error" not in await post(http, gateway, request("x", "tasks/cancel", taskId=other))
        gone = await post(http, gateway, request("g", "tasks/get", taskId=other))
        assert gone["result"]["status"] == "cancelled"


async def test_a_legacy_client_reads_the_apps_and_gets_no_tasks(gateway: str) -> None:
    session = await open_session(gateway)
    listed = result_of(await in_session(gateway, session, legacy("tools/list", {}, 1)), 1)
    for label in LABELS:
        view = ui_of(listed["tools"], f"{label}_slow_job")
        read = legacy("resources/read", {"uri": view}, 2)
        contents = result_of(await in_session(gateway, session, read), 2)["contents"]
        assert label in contents[0]["text"]
        call = legacy("tools/call", {"name": f"{label}_slow_job", "arguments": {}}, 3)
        done = result_of(await in_session(gateway, session, call), 3)
        assert done.get("resultType") != "task" and "taskId" not in done


async def test_a_legacy_initialize_offers_apps_but_not_tasks(gateway: str) -> None:
    with anyio.fail_after(4 * BOUND):
        reply = await rules_post(gateway, initialize(), mirror=False, bound=None)
    extensions = result_of(reply, 0)["capabilities"]["extensions"]
    assert UI in extensions and TASKS not in extensions
