"""Policy enforcement in the dispatcher, in memory, against fake backends: what a caller may not
call it never sees in a list (server/tools, Listing Tools; server/prompts; server/resources),
in discovery (server/discover) or a subscription (basic/patterns/subscriptions); calling it
looks exactly like an unknown name (server/tools, Error Handling); a name that needs a scope
the caller lacks gets the step-up error (basic/authorization, Scope Challenge Handling). Legacy
clients (frontends/legacy/front.py) go through the same dispatcher and are filtered the same."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import anyio
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.backends.base import Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.config import parse
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.policy import Policy
from gateway.frontends.legacy.front import LegacyFront, Session
from gateway.origin import Origin
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.telemetry.metrics import GatewayCollector
from tests.support import BOUND

pytestmark = pytest.mark.anyio

INFO = GatewayInfo("mcp-gateway", "test")
META = meta.gateway_meta({"name": "test", "version": "1"})


class FakeBackend:
    """A modern MCP server in memory: fixed lists, calls answered with their name, a listen that
    acknowledges its filter and then tells of an update to every resource it has."""

    transport = "memory"

    def __init__(
        self,
        name: str,
        tools: Sequence[str] = (),
        prompts: Sequence[str] = (),
        resources: Sequence[str] = (),
        templates: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.lists: dict[str, list[dict[str, Any]]] = {
            "tools/list": [{"name": t, "inputSchema": {"type": "object"}} for t in tools],
            "prompts/list": [{"name": p} for p in prompts],
            "resources/list": [{"uri": u, "name": u} for u in resources],
            "resources/templates/list": [{"uriTemplate": t, "name": t} for t in templates],
        }
        self.received: list[Message] = []

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        await anyio.sleep_forever()

    async def notify(self, msg: Message) -> None:
        return None

    def asked(self, method: str) -> list[Message]:
        return [m for m in self.received if m["method"] == method]

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.received.append(msg)
        method, params = msg["method"], msg.get("params", {})
        result: dict[str, Any]
        if method == "server/discover":
            caps = {
                "tools": {"listChanged": True},
                "prompts": {},
                "resources": {"subscribe": True},
                "completions": {},
            }
            result = {
                "supportedVersions": [meta.MODERN_VERSION],
                "capabilities": caps,
                "instructions": f"how to use {self.name}",
                "_meta": {meta.SERVER_INFO: {"name": self.name, "version": "1"}},
            }
        elif method in self.lists:
            key = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources"}
            result = {key.get(method, "resourceTemplates"): self.lists[method]}
        elif method == "tools/call":
            if params["name"] not in [t["name"] for t in self.lists["tools/list"]]:
                return _error(msg, -32602, f"no such tool here: {params['name']}")
            result = {"content": [{"type": "text", "text": f"{self.name}:{params['name']}"}]}
        elif method == "prompts/get":
            result = {"messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}]}
        elif method == "resources/read":
            result = {"contents": [{"uri": params["uri"], "text": "body"}]}
        elif method == "completion/complete":
            result = {"completion": {"values": ["v"]}}
        elif method == "subscriptions/listen":
            return await self._listen(msg, sink)
        else:
            return _error(msg, codes.METHOD_NOT_FOUND, "Method not found")
        return {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}

    async def _listen(self, msg: Message, sink: NotificationSink) -> Message:
        wanted = msg["params"]["notifications"]
        await sink(
            {"jsonrpc": "2.0", "method": meta.ACKNOWLEDGED, "params": {"notifications": wanted}}
        )
        # Every resource's update, asked for or not, in list order: the gateway must pass on
        # only those of the client's subscriptions it may read.
        for item in self.lists["resources/list"]:
            params = {"uri": item["uri"]}
            await sink({"jsonrpc": "2.0", "method": meta.RESOURCE_UPDATED, "params": params})
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def _error(msg: Message, code: int, message: str) -> Message:
    return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": code, "message": message}}


def request(method: str, **params: Any) -> Message:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": META}}


def caller(subject: str = "ann", scopes: str = "") -> Origin:
    return Origin(
        "http", identity=Identity(subject, "cli", "https://as", frozenset(scopes.split()))
    )


async def _drop(_: Message) -> None:
    return None


POLICY = """
  default: allow
  rules:
    - deny: {backends: [gh], tools: ['delete_*'], prompts: [secret], resources: ['mem://private/*']}
    - require: {backends: [gh], tools: ['create_*']}
      scopes: [repo:write]
    - deny: {backends: [hr]}
      when: {subjects: [ann]}
"""


def policy(text: str, backends: Sequence[str]) -> Policy:
    listed = "".join(f"  {b}: {{stdio: {{command: x}}}}\n" for b in backends)
    config = parse(f"listen: {{stdio: true}}\nbackends:\n{listed}policy:\n{text}")
    assert config.policy is not None
    return Policy(config.policy)


async def gateway(
    backends: Sequence[FakeBackend],
    rules: str | None = POLICY,
    mode: PrefixMode = PrefixMode.AUTO,
    forward_unknown: bool = False,
) -> Dispatcher:
    names = [b.name for b in backends]
    dispatcher = Dispatcher(
        backends,
        [Exposure(n, n, forward_unknown=forward_unknown) for n in names],
        Naming(mode, backends=len(backends)),
        INFO,
        policy=policy(rules, names) if rules is not None else None,
    )
    await dispatcher.catalogs.load_all()
    return dispatcher


def github() -> FakeBackend:
    return FakeBackend(
        "gh",
        tools=["search", "create_issue", "delete_repo"],
        prompts=["summary", "secret"],
        resources=["mem://public/a", "mem://private/b"],
        templates=["mem://public/{x}", "mem://private/{x}"],
    )


def hr() -> FakeBackend:
    return FakeBackend("hr", tools=["salaries"], prompts=["review"])


async def listed(d: Dispatcher, method: str, origin: Origin, field: str) -> list[str]:
    key = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources"}
    reply = await d.serve(request(method), _drop, origin)
    items = reply["result"][key.get(method, "resourceTemplates")]
    return [i[field] for i in items]


async def test_lists_leave_out_what_the_caller_may_not_call() -> None:
    d = await gateway([github(), hr()])
    bob, ann = caller("bob"), caller("ann")
    assert await listed(d, "tools/list", bob, "name") == [
        "gh_search",
        "gh_create_issue",
        "hr_salaries",
    ]
    # A tool that needs a scope stays listed: calling it tells the client what to step up to.
    assert await listed(d, "tools/list", ann, "name") == ["gh_search", "gh_create_issue"]
    assert await listed(d, "prompts/list", bob, "name") == ["gh_summary", "hr_review"]
    assert await listed(d, "prompts/list", ann, "name") == ["gh_summary"]
    assert await listed(d, "resources/list", bob, "uri") == ["mcp-gateway://gh/mem://public/a"]
    templates = await listed(d, "resources/templates/list", bob, "uriTemplate")
    assert templates == ["mcp-gateway://gh/mem://public/{x}"]
    assert d.telemetry.stats.policy_denials == {}  # hiding is not refusing


async def test_without_a_policy_every_caller_sees_everything() -> None:
    d = await gateway([github(), hr()], rules=None)
    names = await listed(d, "tools/list", caller("ann"), "name")
    assert names == ["gh_search", "gh_create_issue", "gh_delete_repo", "hr_salaries"]


def _without(reply: Message, name: str) -> Message:
    """The reply with the name it refers to taken out of its message."""
    error = dict(reply["error"])
    error["message"] = error["message"].replace(name, "NAME")
    return {**reply, "error": error}


def _ref(kind: str, name: str) -> dict[str, Any]:
    field = "name" if kind == "ref/prompt" else "uri"
    return {"ref": {"type": kind, field: name}}


PRIVATE = "mcp-gateway://gh/mem://private/b"
# method, params of a name, the denied name, a name nobody has
REFUSALS: list[tuple[str, Any, str, str]] = [
    ("tools/call", lambda n: {"name": n}, "gh_delete_repo", "gh_nothing"),
    ("tools/call", lambda n: {"name": n}, "hr_salaries", "hr_nothing"),
    ("prompts/get", lambda n: {"name": n}, "gh_secret", "gh_nothing"),
    ("resources/read", lambda n: {"uri": n}, PRIVATE, "nope://x"),
    ("completion/complete", lambda n: _ref("ref/prompt", n), "gh_secret", "gh_nothing"),
    (
        "completion/complete",
        lambda n: _ref("ref/resource", n),
        "mcp-gateway://gh/mem://private/{x}",
        "nope://{x}",
    ),
]


@pytest.mark.parametrize(("method", "params", "denied", "unknown"), REFUSALS)
async def test_a_denied_name_is_answered_exactly_like_an_unknown_one(
    method: str, params: Any, denied: str, unknown: str
) -> None:
    backends = [github(), hr()]
    d = await gateway(backends)
    ann = caller("ann")
    before = [len(b.received) for b in backends]
    refused = await d.serve(request(method, **params(denied)), _drop, ann)
    missing = await d.serve(request(method, **params(unknown)), _drop, ann)
    assert refused["error"]["code"] == codes.INVALID_PARAMS
    assert denied in refused["error"]["message"]
    assert _without(refused, denied) == _without(missing, unknown)
    assert [len(b.received) for b in backends] == before  # nothing reached a backend
    assert d.telemetry.stats.policy_denials == {"denied": 1}


async def test_an_allowed_call_goes_through_under_the_backends_own_name() -> None:
    gh = github()
    d = await gateway([gh, hr()])
    reply = await d.serve(request("tools/call", name="gh_search"), _drop, caller("ann"))
    assert reply["result"]["content"][0]["text"] == "gh:search"
    assert gh.asked("tools/call")[-1]["params"]["name"] == "search"
    read = await d.serve(
        request("resources/read", uri="mcp-gateway://gh/mem://public/a"), _drop, caller("ann")
    )
    assert read["result"]["contents"][0]["uri"] == "mcp-gateway://gh/mem://public/a"


async def test_a_call_needing_a_scope_the_token_lacks_gets_the_step_up_error() -> None:
    gh = github()
    d = await gateway([gh, hr()])
    reply = await d.serve(request("tools/call", name="gh_create_issue"), _drop, caller("ann"))
    assert reply["error"]["code"] == codes.INSUFFICIENT_SCOPE == -31007
    assert reply["error"]["data"] == {"scope": "repo:write"}
    assert gh.asked("tools/call") == []
    assert d.telemetry.stats.policy_denials == {"insufficient_scope": 1}
    # The same caller after a step-up: the call goes through.
    stepped = caller("ann", "repo:read repo:write")
    reply = await d.serve(request("tools/call", name="gh_create_issue"), _drop, stepped)
    assert reply["result"]["content"][0]["text"] == "gh:create_issue"


async def test_anonymous_callers_meet_the_policy_too() -> None:
    d = await gateway([github(), hr()])
    anonymous = Origin("http")
    reply = await d.serve(request("tools/call", name="gh_create_issue"), _drop, anonymous)
    assert reply["error"]["data"] == {"scope": "repo:write"}
    assert "hr_salaries" in await listed(d, "tools/list", anonymous, "name")  # when: subjects


async def test_the_single_unprefixed_backend_path_applies_the_policy() -> None:
    """One unprefixed backend told to (`forward_unknown`) answers for names missing from its
    catalog (README, single-backend transparency); a name the policy denies never reaches it."""
    gh = github()
    d = await gateway(
        [gh],
        "  rules:\n    - deny: {tools: ['delete_*', 'hidden_*']}\n",
        PrefixMode.AUTO,
        forward_unknown=True,
    )
    ann = caller("ann")
    refused = await d.serve(request("tools/call", name="hidden_tool"), _drop, ann)
    gateway_unknown = await d.serve(request("tools/call", name=5), _drop, ann)
    assert refused["error"]["code"] == codes.INVALID_PARAMS
    assert refused["error"]["message"] == "Unknown tool: hidden_tool"
    assert gateway_unknown["error"]["code"] == codes.INVALID_PARAMS
    assert gh.asked("tools/call") == []
    # A name the policy allows is still forwarded, and the backend answers in its own words.
    forwarded = await d.serve(request("tools/call", name="other_tool"), _drop, ann)
    assert forwarded["error"]["message"] == "no such tool here: other_tool"
    assert [m["params"]["name"] for m in gh.asked("tools/call")] == ["other_tool"]


async def test_discovery_leaves_out_a_backend_the_caller_can_see_nothing_of() -> None:
    d = await gateway([github(), hr()])
    bob = (await d.serve(request("server/discover"), _drop, caller("bob")))["result"]
    ann = (await d.serve(request("server/discover"), _drop, caller("ann")))["result"]
    assert "how to use hr" in bob["instructions"]
    assert "how to use hr" not in ann["instructions"]
    assert "how to use gh" in ann["instructions"]


async def test_discovery_does_not_advertise_a_capability_whose_items_are_all_hidden() -> None:
    rules = "  rules:\n    - deny: {prompts: ['*'], resources: ['*']}\n"
    other = FakeBackend("hr", tools=["salaries"], prompts=["review"], resources=["mem://hr/x"])
    d = await gateway([github(), other], rules)
    caps = (await d.serve(request("server/discover"), _drop, caller()))["result"]["capabilities"]
    assert "tools" in caps and "completions" in caps
    assert "prompts" not in caps and "resources" not in caps
    open_caps = (await gateway([github(), hr()], None)).catalogs.capabilities("gh")
    assert open_caps is not None and "prompts" in open_caps


async def _listen(d: Dispatcher, origin: Origin, uris: list[str], until: str) -> list[Message]:
    """A listen for `uris`' updates, until one for `until` arrives (the fake sends every
    resource's in list order, so all before it have been dealt with by then)."""
    seen: list[Message] = []
    done = anyio.Event()

    async def sink(note: Message) -> None:
        seen.append(note)
        if note["params"].get("uri") == until:
            done.set()

    msg = request("subscriptions/listen", notifications={"resourceSubscriptions": uris})
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.serve, msg, sink, origin)
        with anyio.fail_after(BOUND):
            await done.wait()
        d.close_streams()
    return seen


async def test_a_listen_never_relays_updates_of_resources_the_caller_may_not_read() -> None:
    gh = FakeBackend("gh", resources=["mem://private/b", "mem://public/a"])
    d = await gateway([gh, hr()])
    private, public = "mcp-gateway://gh/mem://private/b", "mcp-gateway://gh/mem://public/a"
    seen = await _listen(d, caller("ann"), [private, public], public)
    ack, *updates = seen
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [public]}
    assert [u["params"]["uri"] for u in updates] == [public]
    # The backend was never asked for the private one either.
    asked = gh.asked("subscriptions/listen")[0]["params"]["notifications"]
    assert asked == {"resourceSubscriptions": ["mem://public/a"]}


async def test_the_denials_metric_counts_refused_requests_by_reason() -> None:
    d = await gateway([github(), hr()])
    ann = caller("ann")
    await listed(d, "tools/list", ann, "name")
    for name in ("gh_delete_repo", "hr_salaries", "gh_create_issue"):
        await d.serve(request("tools/call", name=name), _drop, ann)
    registry = CollectorRegistry()
    registry.register(GatewayCollector(d.telemetry.stats, list, lambda: 0))
    text = generate_latest(registry).decode()
    assert 'mcp_gateway_policy_denials_total{reason="denied"} 2.0' in text
    assert 'mcp_gateway_policy_denials_total{reason="insufficient_scope"} 1.0' in text


# --- legacy clients (frontends/legacy/front.py) ----------------------------------------------


async def legacy(
    d: Dispatcher, origin: Origin, session: Session, method: str, **params: Any
) -> Message:
    msg = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return await LegacyFront(d).handle(session, msg, _drop, origin)


async def test_a_legacy_client_is_filtered_the_same() -> None:
    d = await gateway([github(), hr()])
    ann = caller("ann")
    session = Session()
    init = await legacy(d, ann, session, "initialize", protocolVersion="2025-11-25")
    assert "how to use hr" not in init["result"]["instructions"]
    tools = await legacy(d, ann, session, "tools/list")
    assert [t["name"] for t in tools["result"]["tools"]] == ["gh_search", "gh_create_issue"]
    denied = await legacy(d, ann, session, "tools/call", name="hr_salaries")
    unknown = await legacy(d, ann, session, "tools/call", name="hr_nothing")
    assert _without(denied, "hr_salaries") == _without(unknown, "hr_nothing")
    scoped = await legacy(d, ann, session, "tools/call", name="gh_create_issue")
    assert scoped["error"]["code"] == codes.INSUFFICIENT_SCOPE
    session.close()


async def test_a_legacy_subscription_to_a_resource_it_may_not_read_brings_no_updates() -> None:
    gh = FakeBackend("gh", resources=["mem://private/b", "mem://public/a"])
    d = await gateway([gh, hr()])
    private, public = "mcp-gateway://gh/mem://private/b", "mcp-gateway://gh/mem://public/a"
    delivered: list[Message] = []
    arrived = anyio.Event()

    async def deliver(note: Message) -> None:
        delivered.append(note)
        if note["params"].get("uri") == public:
            arrived.set()

    session = Session(deliver=deliver)
    ann = caller("ann")
    await legacy(d, ann, session, "initialize", protocolVersion="2025-11-25")
    # Refused exactly as an unknown URI is (a legacy subscribe to any URI succeeds).
    assert await legacy(d, ann, session, "resources/subscribe", uri=private) == await legacy(
        d, ann, session, "resources/subscribe", uri="nope://x"
    )
    assert "result" in await legacy(d, ann, session, "resources/subscribe", uri=public)
    with anyio.fail_after(BOUND):
        await arrived.wait()
    uris = [n["params"]["uri"] for n in delivered if n["method"] == meta.RESOURCE_UPDATED]
    assert private not in uris and public in uris
    session.close()
    if session.watcher is not None:
        with pytest.raises(asyncio.CancelledError):
            await session.watcher


async def test_a_hidden_tools_header_annotations_are_not_given_out() -> None:
    gh = github()
    schema = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}}
    for tool in gh.lists["tools/list"]:
        tool["inputSchema"] = schema
    d = await gateway([gh, hr()])
    anyone = Identity("ann", None, None)
    assert await d.param_headers("gh_search", anyone) is not None
    assert await d.param_headers("gh_delete_repo", anyone) is None
    route = d.catalogs.table.tool("gh_delete_repo")
    assert route is not None and route.param_headers  # the table knows them; the caller won't
    assert not d.shows_tool(route, anyone)
    assert (await gateway([gh, hr()], None)).shows_tool(route, anyone)


async def test_rules_name_the_backends_own_names_whatever_the_client_sees() -> None:
    """A rename (or the namespace prefix) changes what the client sees, not what a rule means."""
    gh, other = github(), hr()
    d = Dispatcher(
        [gh, other],
        [Exposure("gh", "g", rename={"delete_repo": "tidy"}), Exposure("hr", "hr")],
        Naming(PrefixMode.AUTO, backends=2),
        INFO,
        policy=policy(POLICY, ["gh", "hr"]),
    )
    await d.catalogs.load_all()
    names = await listed(d, "tools/list", caller("bob"), "name")
    assert "g_tidy" not in names and "g_search" in names
    refused = await d.serve(request("tools/call", name="g_tidy"), _drop, caller("bob"))
    assert refused["error"]["message"] == "Unknown tool: g_tidy"
    assert gh.asked("tools/call") == []


async def test_a_listen_asks_no_list_changes_of_a_backend_the_caller_sees_nothing_of() -> None:
    gh, other = github(), hr()
    d = await gateway([gh, other])
    public = "mcp-gateway://gh/mem://public/a"
    wanted = {"toolsListChanged": True, "resourceSubscriptions": [public]}
    seen: list[Message] = []
    acked = anyio.Event()

    async def sink(note: Message) -> None:
        seen.append(note)
        acked.set()

    msg = request("subscriptions/listen", notifications=wanted)
    async with anyio.create_task_group() as tg:
        tg.start_soon(d.serve, msg, sink, caller("ann"))
        with anyio.fail_after(BOUND):
            await acked.wait()
        d.close_streams()
    assert seen[0]["params"]["notifications"] == wanted
    assert other.asked("subscriptions/listen") == []  # ann sees nothing of hr
    asked = gh.asked("subscriptions/listen")[0]["params"]["notifications"]
    assert asked == {"toolsListChanged": True, "resourceSubscriptions": ["mem://public/a"]}
