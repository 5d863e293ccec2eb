"""Tasks extension (`io.modelcontextprotocol/tasks`) through a merged gateway, in memory: task ids
sealed on the way out and routed back (Task Creation, Task Polling), refused as unknown tasks when
forged, altered, oversized or another caller's (Error Handling: Protocol Errors; Security
Considerations: Auth binding), judged and rate-limited as the tool that created them, and split
per backend on a listen (Task Status Notifications)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from gateway import taskkey
from gateway.backends.base import Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.config import AuditConfig, Rate, RateLimits
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.ratelimit import RateLimiter
from gateway.frontends.legacy.front import without_tasks
from gateway.origin import Origin
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.routing import taskids
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.routing.taskids import TaskRef
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.otel import GatewayTelemetry
from tests.core.test_policy_dispatch import policy
from tests.support import BOUND, META

pytestmark = pytest.mark.anyio

INFO = GatewayInfo("mcp-gateway", "test")
KEY = b"k" * 32
EXTENSION = "io.modelcontextprotocol/tasks"
ASK = {"name": {"method": "elicitation/create", "params": {"mode": "form", "message": "Name?"}}}


class TaskBackend:
    """Makes a task of every `job` call; answers task methods for its own ids only."""

    transport = "memory"

    def __init__(self, name: str, malformed: object = None) -> None:
        self.name = name
        self.asked: list[Message] = []
        self.malformed = malformed  # the taskId of every task it makes, when set
        self.listening = anyio.Event()
        self.sink: NotificationSink | None = None

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        return None

    async def notify(self, msg: Message) -> None:
        return None

    def own(self) -> str:
        return f"{self.name}-task-1"

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.asked.append(msg)
        method, params = msg["method"], msg.get("params") or {}
        result: dict[str, Any]
        if method == "server/discover":
            result = {"capabilities": {"tools": {}, "extensions": {EXTENSION: {}}}}
        elif method == "tools/list":
            result = {"tools": [{"name": "job", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            task_id = self.own() if self.malformed is None else self.malformed
            result = {"resultType": "task", "taskId": task_id, "status": "working"}
            if task_id is ...:
                del result["taskId"]
        elif method == "tasks/get":
            if params.get("taskId") != self.own():
                return error(msg["id"], codes.INVALID_PARAMS, "Task not found")
            link = {"type": "resource_link", "uri": f"mem://{self.name}/out", "name": "out"}
            result = {
                "resultType": "complete",
                "taskId": self.own(),
                "status": "completed",
                "inputRequests": ASK,
                "result": {"content": [link], "isError": False},
                "extra": {"kept": True},
            }
        elif method == "subscriptions/listen":
            self.sink = sink
            ack = {"notifications": params["notifications"]}  # all of it honoured
            await sink(note("notifications/subscriptions/acknowledged", ack))
            self.listening.set()
            await anyio.sleep_forever()
            raise AssertionError
        else:
            result = {"resultType": "complete"}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}

    def task_requests(self) -> list[Message]:
        return [m for m in self.asked if str(m["method"]).startswith("tasks/")]


def error(id_: object, code: int, message: str) -> Message:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


def note(method: str, params: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def request(rid: int, method: str, **params: Any) -> Message:
    meta = {**META, "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": meta}}


def caller(subject: str) -> Origin:
    return Origin("http", identity=Identity(subject, "cli", "https://as"))


async def drop(_: Message) -> None:
    return None


async def gateway(*backends: TaskBackend, **extra: Any) -> Dispatcher:
    names = [b.name for b in backends]
    d = Dispatcher(
        list(backends),
        [Exposure(n, n) for n in names],
        Naming(PrefixMode.AUTO, backends=len(backends)),
        INFO,
        task_keys=extra.pop("task_keys", (KEY,)),
        **extra,
    )
    await d.catalogs.load_all()
    return d


async def create(d: Dispatcher, tool: str = "a_job", origin: Origin | None = None) -> str:
    reply = await d.serve(request(1, "tools/call", name=tool), drop, origin or Origin("http"))
    task_id: str = reply["result"]["taskId"]
    return task_id


def code(reply: Message) -> int:
    value: int = reply["error"]["code"]
    return value


# --- the sealed id itself -------------------------------------------------------------------


def test_a_sealed_id_carries_what_routing_needs_and_nothing_else_opens_it() -> None:
    ref = TaskRef("a", "own-1", "a_job", "job", taskids.caller_digest("who", KEY))
    sealed = taskids.seal(ref, KEY)
    assert taskids.unseal(sealed, [KEY]) == (ref, KEY)
    # Rotation: signed with the first key, accepted with any.
    assert taskids.unseal(sealed, [b"n" * 32, KEY]) == (ref, KEY)
    assert taskids.unseal(sealed, [b"n" * 32]) is None
    body, _, signature = sealed.rpartition(".")
    assert taskids.unseal(f"{body}.{'0' * len(signature)}", [KEY]) is None
    assert taskids.unseal(sealed[:-1] + ("a" if sealed[-1] != "a" else "b"), [KEY]) is None
    assert taskids.unseal("gt1." + "A" * taskids.MAX_ID, [KEY]) is None
    assert taskids.unseal(42, [KEY]) is None
    # The caller digest depends on the key: it tells nothing of the caller to another holder.
    assert taskids.caller_digest("who", KEY) != taskids.caller_digest("who", b"n" * 32)


# --- creating and routing -------------------------------------------------------------------


async def test_a_task_id_is_sealed_and_each_task_method_reaches_its_backend_under_its_own() -> None:
    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b)
    sealed = await create(d)
    assert sealed != a.own() and a.own() not in sealed
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        extra = (
            {"inputResponses": {"name": {"action": "accept"}}} if method == "tasks/update" else {}
        )
        reply = await d.serve(request(2, method, taskId=sealed, **extra), drop)
        assert "result" in reply, reply
        sent = a.task_requests()[-1]
        assert sent["params"]["taskId"] == a.own()
        if extra:  # input responses pass untouched
            assert sent["params"]["inputResponses"] == extra["inputResponses"]
    assert b.task_requests() == []
    got = await d.serve(request(3, "tasks/get", taskId=sealed), drop)
    result = got["result"]
    assert result["taskId"] == sealed
    assert result["inputRequests"] == ASK and result["extra"] == {"kept": True}
    # The completed result's URIs are shown as a tools/call reply's are (prefixed).
    assert result["result"]["content"][0]["uri"] == "mcp-gateway://a/mem://a/out"


async def test_forged_altered_oversized_and_foreign_ids_are_unknown_tasks() -> None:
    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b)
    sealed = await create(d)
    other_key = taskids.seal(TaskRef("a", a.own(), "a_job", "job", None), b"x" * 32)
    altered = sealed[:-2] + ("00" if not sealed.endswith("00") else "11")
    for bad in (a.own(), other_key, altered, "gt1." + "A" * 5000, 7, None):
        reply = await d.serve(request(2, "tasks/get", taskId=bad), drop)
        assert code(reply) == codes.INVALID_PARAMS, bad
    assert a.task_requests() == [] and b.task_requests() == []


async def test_only_the_caller_that_created_a_task_may_use_it() -> None:
    """Security Considerations, Auth binding: another caller's id is an unknown task."""
    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b)
    sealed = await create(d, origin=caller("ann"))
    for stranger in (caller("bob"), Origin("http")):
        reply = await d.serve(request(2, "tasks/get", taskId=sealed), drop, stranger)
        assert code(reply) == codes.INVALID_PARAMS
    assert a.task_requests() == []
    mine = await d.serve(request(3, "tasks/get", taskId=sealed), drop, caller("ann"))
    assert mine["result"]["status"] == "completed"


async def test_another_replica_with_the_keys_routes_a_task_and_judges_it_by_its_policy() -> None:
    """Nothing is in memory: a gateway with the same keys (a replica, a restart) serves the id,
    under its policy: a caller no longer allowed the tool gets an unknown task."""
    a, b = TaskBackend("a"), TaskBackend("b")
    sealed = await create(await gateway(a, b), origin=caller("ann"))
    same = await gateway(a, b)
    reply = await same.serve(request(2, "tasks/get", taskId=sealed), drop, caller("ann"))
    assert reply["result"]["taskId"] == sealed
    rules = "  rules:\n    - deny: {backends: [a], tools: [job]}\n"
    denied = await gateway(a, b, policy=policy(rules, ["a", "b"]))
    refused = await denied.serve(request(3, "tasks/get", taskId=sealed), drop, caller("ann"))
    assert code(refused) == codes.INVALID_PARAMS
    assert len(a.task_requests()) == 1


async def test_polls_count_against_the_creating_tools_rate_limit() -> None:
    a, b = TaskBackend("a"), TaskBackend("b")
    limits = RateLimits(tools={"a_job": Rate(rate=0.001, burst=2)})
    d = await gateway(a, b, limiter=RateLimiter(limits, Counter()))
    ann = caller("ann")
    sealed_a = await create(d, origin=ann)  # one token
    sealed_b = await create(d, "b_job", ann)  # another tool: its own bucket
    first = await d.serve(request(2, "tasks/get", taskId=sealed_a), drop, ann)
    assert "result" in first
    second = await d.serve(request(3, "tasks/get", taskId=sealed_a), drop, ann)
    assert code(second) == codes.RATE_LIMITED
    other = await d.serve(request(4, "tasks/get", taskId=sealed_b), drop, ann)
    assert "result" in other


@pytest.mark.parametrize("bad", [..., 42, "x" * (taskids.MAX_BACKEND_ID + 1)])
async def test_a_malformed_create_task_result_is_a_backend_protocol_error(
    bad: object, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = TaskBackend("a", malformed=bad), TaskBackend("b")
    d = await gateway(a, b)
    with caplog.at_level(logging.DEBUG, logger="gateway"):
        reply = await d.serve(request(1, "tools/call", name="a_job"), drop)
    assert code(reply) == codes.BACKEND_PROTOCOL_ERROR
    mine = [r for r in caplog.records if "created a task" in r.getMessage()]
    assert len(mine) == 1 and mine[0].exc_info is None


async def test_one_unprefixed_backend_without_policy_or_identity_is_transparent() -> None:
    a = TaskBackend("a")
    d = await gateway(a)
    own = await create(d, "job")
    assert own == a.own()
    reply = await d.serve(request(2, "tasks/get", taskId=own), drop)
    assert reply["result"]["taskId"] == own and a.task_requests()[-1]["params"]["taskId"] == own
    # A caller with an identity is bound to its task even there.
    sealed = await create(d, "job", caller("ann"))
    assert sealed != a.own()
    reply = await d.serve(request(3, "tasks/get", taskId=sealed), drop, caller("bob"))
    assert code(reply) == codes.INVALID_PARAMS


async def test_a_lazy_key_is_read_once_when_first_needed() -> None:
    calls: list[int] = []

    def load() -> bytes:
        calls.append(1)
        return KEY

    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b, task_keys=load)
    assert calls == []
    sealed = await create(d)
    await d.serve(request(2, "tasks/get", taskId=sealed), drop)
    assert calls == [1]
    assert taskids.unseal(sealed, [KEY]) is not None


async def test_the_audit_line_of_a_task_method_names_its_tool_and_backend(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(AuditConfig(path=str(path)))
    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b, telemetry=GatewayTelemetry(None, None, audit=audit))
    sealed = await create(d)
    await d.handle(request(2, "tasks/get", taskId=sealed), drop, caller("ann"))
    audit.close()
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert records[-1]["method"] == "tasks/get"
    assert (records[-1]["name"], records[-1]["backend"]) == ("a_job", "a")


# --- listens --------------------------------------------------------------------------------


async def test_a_listen_asks_each_backend_for_its_own_task_ids_and_relays_the_sealed_one() -> None:
    """Task Status Notifications: taskIds split per backend, the acknowledgement and each
    notifications/tasks in the client's ids; an id the caller may not use is left out."""
    a, b = TaskBackend("a"), TaskBackend("b")
    d = await gateway(a, b)
    sealed_a, sealed_b = await create(d), await create(d, "b_job")
    got: list[Message] = []
    arrived = anyio.Event()

    async def sink(msg: Message) -> None:
        got.append(msg)
        if msg["method"] == "notifications/tasks":
            arrived.set()

    wanted = {"taskIds": [sealed_a, sealed_b, "forged"], "x-ext": True}
    listen = request(9, "subscriptions/listen", notifications=wanted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.serve, listen, sink)
        with anyio.fail_after(BOUND):
            await a.listening.wait()
            await b.listening.wait()
        for backend, own in ((a, a.own()), (b, b.own())):
            sent = [m for m in backend.asked if m["method"] == "subscriptions/listen"][-1]
            assert sent["params"]["notifications"] == {"taskIds": [own], "x-ext": True}
        assert a.sink is not None
        link = {"type": "resource_link", "uri": "mem://a/out", "name": "out"}
        done = {"taskId": a.own(), "status": "completed", "result": {"content": [link]}}
        meta = {"io.modelcontextprotocol/subscriptionId": "gateway"}
        await a.sink(note("notifications/tasks", {**done, "_meta": meta}))
        await a.sink(note("notifications/tasks", {**done, "taskId": "not-asked"}))
        with anyio.fail_after(BOUND):
            await arrived.wait()
        d.close_streams()
    ack = got[0]
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert sorted(ack["params"]["notifications"]["taskIds"]) == sorted([sealed_a, sealed_b])
    assert ack["params"]["notifications"]["x-ext"] is True  # an extension's field, acknowledged
    tasks = [m for m in got if m["method"] == "notifications/tasks"]
    assert len(tasks) == 1 and tasks[0]["params"]["taskId"] == sealed_a
    assert tasks[0]["params"]["result"]["content"][0]["uri"] == "mcp-gateway://a/mem://a/out"


# --- eras -----------------------------------------------------------------------------------


def test_a_legacy_clients_capabilities_never_declare_the_tasks_extension() -> None:
    """A 2025-11-25 client cannot follow a modern task: backends are never told it can."""
    caps = {"elicitation": {}, "extensions": {EXTENSION: {}, "io.example/other": {"v": 1}}}
    assert without_tasks(caps) == {"elicitation": {}, "extensions": {"io.example/other": {"v": 1}}}
    plain: dict[str, Any] = {"roots": {}}
    assert without_tasks(plain) is plain


# --- the key file ---------------------------------------------------------------------------


def test_the_key_file_is_made_once_owner_only_and_read_again(tmp_path: Path) -> None:
    where = tmp_path / "state" / "task-key"
    first = taskkey.load(str(where))
    assert where.stat().st_mode & 0o777 == 0o600
    assert taskkey.load(str(where)) == first and len(first) == taskkey.KEY_BYTES
    assert [p.name for p in where.parent.iterdir()] == ["task-key"]  # no temporary left


def test_an_unusable_key_file_falls_back_to_a_key_of_the_process_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    where = tmp_path / "task-key"
    where.write_text("not hex\n")
    where.chmod(0o600)
    with caplog.at_level(logging.DEBUG, logger="gateway"):
        one, two = taskkey.load(str(where)), taskkey.load(str(where))
    assert one != two and len(one) == taskkey.KEY_BYTES
    warned = [r for r in caplog.records if "task key" in r.getMessage()]
    assert len(warned) == 2 and all(r.exc_info is None for r in warned)  # one per load


def test_the_default_key_file_is_under_xdg_state_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/var/lib/x")
    assert taskkey.default_path() == Path("/var/lib/x/mcp-gateway/task-key")
    monkeypatch.setenv("XDG_STATE_HOME", "relative")
    assert taskkey.default_path() == Path.home() / ".local/state/mcp-gateway/task-key"
