"""MCP Apps (the `io.modelcontextprotocol/ui` extension) and merged extensions through one merged
server: pure tests of the capability merge, the ui:// URI mapping and the tool rewrite, then the
dispatcher in memory against fake app servers (basic/versioning, Extension Negotiation; MCP Apps
spec: UI Resource Format, Resource Discovery, Visibility). Real servers: tests/test_apps_e2e.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from gateway.backends.base import Call, NotificationSink
from gateway.config.operations import Rate, RateLimits
from gateway.core.apps import by_visible_name
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.ratelimit import RateLimiter
from gateway.origin import Origin
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing import apps, merge, names, uris
from gateway.routing import table as routes
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import CatalogData, Exposure
from tests.core.test_policy_dispatch import FakeBackend, _listen, caller, gateway, policy
from tests.support.memory_backend import MemoryBackend

pytestmark = pytest.mark.anyio

UI = apps.EXTENSION
MIME = "text/html;profile=mcp-app"
PREFIXED = Naming(PrefixMode.AUTO, backends=2)
INFO = GatewayInfo("mcp-gateway", "test")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- merging extensions (pure) ----------------------------------------------------------------


def test_extensions_of_several_backends_are_unioned_with_their_settings() -> None:
    """basic/versioning, Extension Negotiation: the merged server declares every extension a
    backend declares; settings the backends agree on are kept."""
    a = {"tools": {}, "extensions": {UI: {"mimeTypes": [MIME]}, "io.x/a": {}}}
    b = {"resources": {}, "extensions": {UI: {"mimeTypes": [MIME]}, "io.x/b": {"n": 1}}}
    merged = merge.capabilities([a, b], keep_experimental=False)
    assert merged["extensions"] == {UI: {"mimeTypes": [MIME]}, "io.x/a": {}, "io.x/b": {"n": 1}}
    assert a["extensions"] == {UI: {"mimeTypes": [MIME]}, "io.x/a": {}}  # inputs untouched


def test_differing_extension_settings_merge_by_the_documented_rule() -> None:
    """Objects key by key, lists unioned in order, a flag true if any is, any other conflict
    settled by the first backend (README, Extensions and MCP Apps)."""
    a = {"extensions": {"io.x/e": {"types": ["a", "b"], "deep": {"on": False}, "mode": "fast"}}}
    b = {
        "extensions": {
            "io.x/e": {"types": ["b", "c"], "deep": {"on": True, "more": 2}, "mode": "slow"}
        }
    }
    merged = merge.capabilities([a, b], keep_experimental=False)["extensions"]["io.x/e"]
    assert merged == {"types": ["a", "b", "c"], "deep": {"on": True, "more": 2}, "mode": "fast"}
    reverse = merge.capabilities([b, a], keep_experimental=False)["extensions"]["io.x/e"]
    assert reverse["mode"] == "slow" and reverse["types"] == ["b", "c", "a"]


def test_experimental_is_not_merged_across_backends() -> None:
    a: dict[str, Any] = {"experimental": {"x": {}}, "extensions": {UI: {}}}
    result = merge.discover_result(
        [("a", {"capabilities": a}), ("b", {"capabilities": {"tools": {}}})],
        prefixed=True,
        server={"name": "g", "version": "0"},
    )
    assert result["capabilities"] == {"extensions": {UI: {}}, "tools": {}}


# --- ui:// URIs (pure) ------------------------------------------------------------------------


def test_ui_uris_keep_their_scheme_under_prefixing() -> None:
    """MCP Apps, UI Resource Format: the URI MUST start with ui://; other URIs keep the
    gateway's own wrapper."""
    assert names.client_uri(PREFIXED, "alpha", "ui://alpha/view.html") == (
        "ui://alpha/alpha/view.html"
    )
    assert names.client_uri(PREFIXED, "alpha", "ui://dash") == "ui://alpha/dash"
    assert names.client_uri(PREFIXED, "alpha", "mem://x") == "mcp-gateway://alpha/mem://x"
    assert names.client_uri(Naming(), "alpha", "ui://alpha/view.html") == "ui://alpha/view.html"
    assert names.split_client_uri("ui://alpha/alpha/view.html") == ("alpha", "ui://alpha/view.html")
    assert names.split_client_uri("ui://alpha/dash") == ("alpha", "ui://dash")
    # Both wrappers name the same backend URI; a wrapper in another spelling names nothing.
    assert names.split_client_uri("mcp-gateway://alpha/ui://dash") == ("alpha", "ui://dash")
    for odd in ("UI://alpha/dash", "ui://alpha", "ui:///dash", "ui:alpha/dash"):
        assert names.split_client_uri(odd) is None, odd


@pytest.mark.parametrize(
    "backend_uri",
    ["ui://alpha/view.html", "ui://dash", "ui:///root.html", "ui://u@h:1/a/b?q=1#f", "ui://a/"],
)
def test_ui_uris_round_trip(backend_uri: str) -> None:
    shown = names.client_uri(PREFIXED, "ns", backend_uri)
    assert shown.startswith("ui://ns/")
    assert names.split_client_uri(shown) == ("ns", backend_uri)


def test_a_ui_uri_is_normalised_inside_its_namespace() -> None:
    """Policy rules are matched against the backend URI's normal form (routing/uris.py): the
    namespace is split off first, so dot segments and case cannot move a URI to another
    namespace or past a rule."""
    assert uris.normalize_client(PREFIXED, "ui://alpha/ALPHA/x/../secret.html") == (
        "ui://alpha/alpha/secret.html"
    )
    assert uris.normalize_client(PREFIXED, "ui://alpha/../beta/secret.html") == (
        "ui://alpha/../beta/secret.html"  # (`..` is the backend URI's authority: inert)
    )
    assert uris.normalize_client(PREFIXED, "mcp-gateway://alpha/ui://alpha/%76iew.html") == (
        "ui://alpha/alpha/view.html"
    )
    assert uris.readings("ui://alpha%2Fsecret.html") == ("ui://alpha/secret.html",)


# --- tools (pure) -----------------------------------------------------------------------------


def app_tool(name: str, uri: str | None, visibility: Sequence[str] | None = None) -> dict[str, Any]:
    ui: dict[str, Any] = {}
    if uri is not None:
        ui["resourceUri"] = uri
    if visibility is not None:
        ui["visibility"] = list(visibility)
    tool: dict[str, Any] = {"name": name, "inputSchema": {"type": "object"}}
    if ui:
        tool["_meta"] = {"ui": ui, "io.x/other": {"kept": True}}
    return tool


def test_a_tools_ui_resource_uri_is_rewritten_to_the_listed_uri() -> None:
    """MCP Apps, Resource Discovery: the host reads `_meta.ui.resourceUri` with resources/read;
    it is the URI the merged resources/list shows. The rest of `_meta` passes untouched."""
    exp = Exposure("alpha", "alpha")
    tool = app_tool("show", "ui://alpha/view.html", ["model", "app"])
    tool["_meta"]["ui/resourceUri"] = "ui://alpha/view.html"
    tool["_meta"]["ui"]["csp"] = {"connectDomains": ["https://x"]}
    shown = routes.expose_tool(PREFIXED, exp, tool)
    assert shown is not None
    listed = routes.expose_uri_field(PREFIXED, exp, {"uri": "ui://alpha/view.html"}, "uri")
    assert listed is not None
    assert shown["_meta"]["ui"]["resourceUri"] == listed["uri"] == "ui://alpha/alpha/view.html"
    assert shown["_meta"]["ui/resourceUri"] == listed["uri"]
    assert shown["_meta"]["ui"]["visibility"] == ["model", "app"]
    assert shown["_meta"]["ui"]["csp"] == {"connectDomains": ["https://x"]}
    assert shown["_meta"]["io.x/other"] == {"kept": True}
    assert tool["_meta"]["ui"]["resourceUri"] == "ui://alpha/view.html"  # the catalog's own
    # Unprefixed, a lone backend's tool is passed on as it came (single-backend transparency).
    assert routes.expose_tool(Naming(), exp, tool) is tool


def test_visibility_defaults_to_model_and_app() -> None:
    """MCP Apps, Visibility: absent means both."""
    assert not apps.app_only(app_tool("t", "ui://x"))
    assert apps.app_callable(app_tool("t", "ui://x"))
    assert apps.app_only(app_tool("t", "ui://x", ["app"]))
    assert not apps.app_callable(app_tool("t", "ui://x", ["model"]))
    assert apps.app_only(app_tool("t", "ui://x", []))
    assert not apps.app_only({"name": "t", "_meta": {"ui": {"visibility": "app"}}})  # malformed


def catalogs() -> dict[str, CatalogData]:
    def data(label: str) -> CatalogData:
        view = f"ui://{label}/view.html"
        return CatalogData(
            tools=(
                app_tool("show", view),
                app_tool("refresh", view, ["app"]),
                app_tool("summary", view, ["model"]),
                app_tool(f"hello_{label}", None),
            ),
            resources=({"uri": view, "name": "view", "mimeType": MIME},),
        )

    plain = CatalogData(tools=(app_tool("plain_only", None), app_tool("show", None)))
    return {"alpha": data("alpha"), "beta": data("beta"), "plain": plain}


EXPOSURES = [Exposure(n, n) for n in ("alpha", "beta", "plain")]


def test_own_names_route_only_for_app_servers_and_app_callable_tools() -> None:
    """MCP Apps, Visibility: "app" is callable by the app of the same server; a model-only tool
    is not the app's, and a server without any UI has no app."""
    table = routes.build(Naming(PrefixMode.AUTO, backends=3), EXPOSURES, catalogs())
    assert table.own_tools["show"] == ("alpha_show", "beta_show")  # not plain's: it has no UI
    assert table.own_tools["refresh"] == ("alpha_refresh", "beta_refresh")
    assert table.own_tools["hello_alpha"] == ("alpha_hello_alpha",)
    assert "summary" not in table.own_tools
    assert "plain_only" not in table.own_tools
    route = table.own_tool("hello_alpha")
    assert route is not None and (route.backend, route.name) == ("alpha", "hello_alpha")
    assert table.own_tool("show") is None  # ambiguous
    # Unprefixed nothing is added: client-visible names are the own names.
    assert routes.build(Naming(PrefixMode.NEVER), EXPOSURES, catalogs()).own_tools == {}


def test_a_client_visible_name_wins_over_an_own_name() -> None:
    data = catalogs()
    data["beta"] = CatalogData(tools=(app_tool("alpha_show", "ui://b"), app_tool("x", None)))
    table = routes.build(Naming(PrefixMode.AUTO, backends=3), EXPOSURES, data)
    assert "alpha_show" not in table.own_tools  # beta's own name is alpha's visible name


def test_a_filtered_out_tool_has_no_own_name() -> None:
    exposures = [Exposure("alpha", "alpha", deny=("refresh",)), *EXPOSURES[1:]]
    table = routes.build(Naming(PrefixMode.AUTO, backends=3), exposures, catalogs())
    assert table.own_tools["refresh"] == ("beta_refresh",)


def test_by_visible_name_rewrites_only_exact_own_names() -> None:
    table = routes.build(Naming(PrefixMode.AUTO, backends=3), EXPOSURES, catalogs())
    msg: Message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    msg["params"] = {"name": "hello_beta"}
    out = by_visible_name(table, msg, None, None)
    assert out["params"]["name"] == "beta_hello_beta" and msg["params"]["name"] == "hello_beta"
    for name in ("HELLO_BETA", "hello_beta ", "beta_hello_beta", "nothing"):
        same = {**msg, "params": {"name": name}}
        assert by_visible_name(table, same, None, None) is same


def test_client_declares_the_extension_in_its_capabilities() -> None:
    def msg(caps: object) -> Message:
        return {"method": "tools/list", "params": {"_meta": {meta.CLIENT_CAPABILITIES: caps}}}

    assert apps.client_declares(msg({"extensions": {UI: {"mimeTypes": [MIME]}}}))
    assert apps.client_declares(msg({"extensions": {UI: {}}}))
    assert not apps.client_declares(msg({"extensions": {"io.x/other": {}}}))
    assert not apps.client_declares(msg({}))
    assert not apps.client_declares(msg({"extensions": {UI: True}}))
    assert not apps.client_declares({"method": "tools/list"})


# --- the dispatcher, in memory ----------------------------------------------------------------


class AppServer(MemoryBackend):
    """A modern app server in memory: it declares the ui extension and serves a view, a tool
    bound to it, an app-only one, a model-only one and one of its own name; it answers calls
    and reads with its name, and keeps what it was sent."""

    def __init__(self, name: str, ui: bool = True) -> None:
        super().__init__(name)
        self.received: list[Message] = []
        data = catalogs()[name] if ui else catalogs()["plain"]
        self.tools = list(data.tools)
        self.resources = list(data.resources)
        self.caps: dict[str, Any] = {"tools": {}, "resources": {"subscribe": True}}
        if ui:
            self.caps["extensions"] = {UI: {}}

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.received.append(msg)
        method, params = msg["method"], msg.get("params", {})
        result: dict[str, Any]
        if method == "server/discover":
            result = {"supportedVersions": [meta.MODERN_VERSION], "capabilities": self.caps}
        elif method == "tools/list":
            result = {"tools": self.tools}
        elif method == "resources/list":
            result = {"resources": self.resources}
        elif method == "resources/templates/list":
            result = {"resourceTemplates": []}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": f"{self.name}:{params['name']}"}]}
        elif method == "resources/read":
            uri = params["uri"]
            result = {"contents": [{"uri": uri, "mimeType": MIME, "text": f"{self.name}:{uri}"}]}
        else:
            error = {"code": codes.METHOD_NOT_FOUND, "message": "Method not found"}
            return {"jsonrpc": "2.0", "id": msg["id"], "error": error}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}

    def ran(self) -> list[str]:
        return [m["params"]["name"] for m in self.received if m["method"] == "tools/call"]


async def merged(
    servers: Sequence[AppServer],
    rules: str | None = None,
    limiter: RateLimiter | None = None,
    mode: PrefixMode = PrefixMode.AUTO,
) -> Dispatcher:
    names_ = [s.name for s in servers]
    d = Dispatcher(
        servers,
        [Exposure(n, n) for n in names_],
        Naming(mode, backends=len(servers)),
        INFO,
        policy=policy(rules, names_) if rules is not None else None,
        limiter=limiter,
    )
    await d.catalogs.load_all()
    return d


def ask(method: str, ui: bool = False, **params: Any) -> Message:
    caps: dict[str, Any] = {"extensions": {UI: {"mimeTypes": [MIME]}}} if ui else {}
    fields = {**meta.gateway_meta({"name": "t", "version": "1"}), meta.CLIENT_CAPABILITIES: caps}
    return {"jsonrpc": "2.0", "id": 3, "method": method, "params": {**params, "_meta": fields}}


async def _drop(_: Message) -> None:
    return None


async def serve(d: Dispatcher, msg: Message, origin: Origin | None = None) -> Message:
    return await d.serve(msg, _drop, origin or Origin("http"))


async def test_discover_advertises_the_extension_of_several_backends() -> None:
    d = await merged([AppServer("alpha"), AppServer("beta")])
    caps = (await serve(d, ask("server/discover")))["result"]["capabilities"]
    assert caps["extensions"] == {UI: {}}


async def test_a_backend_the_caller_sees_nothing_of_adds_no_extension() -> None:
    """Policy (dispatcher `_as_seen`): a backend hidden from the caller is left out of discovery,
    its extensions with it."""
    rules = "  default: allow\n  rules:\n    - deny: {backends: [alpha]}\n"
    d = await merged([AppServer("alpha"), AppServer("plain", ui=False)], rules)
    caps = (await serve(d, ask("server/discover"), caller()))["result"]["capabilities"]
    assert "extensions" not in caps
    d = await merged([AppServer("alpha"), AppServer("plain", ui=False)])
    caps = (await serve(d, ask("server/discover"), caller()))["result"]["capabilities"]
    assert caps["extensions"] == {UI: {}}


async def test_every_listed_resource_uri_of_a_tool_reads_from_its_backend() -> None:
    """MCP Apps, Resource Discovery: "Host MUST use resources/read to fetch the referenced
    resource URI"; the merged list shows it, and the read reaches the backend under its own."""
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta])
    tools = (await serve(d, ask("tools/list", ui=True)))["result"]["tools"]
    listed = {r["uri"] for r in (await serve(d, ask("resources/list")))["result"]["resources"]}
    assert listed == {"ui://alpha/alpha/view.html", "ui://beta/beta/view.html"}
    bound = {t["_meta"]["ui"]["resourceUri"] for t in tools if "_meta" in t}
    assert bound == listed
    for uri in bound:
        reply = await serve(d, ask("resources/read", uri=uri))
        content = reply["result"]["contents"][0]
        assert content["uri"] == uri  # as the client knows it
        label = uri.split("/")[2]
        assert content["text"] == f"{label}:ui://{label}/view.html"


async def test_app_only_tools_are_listed_only_to_clients_of_the_extension() -> None:
    """MCP Apps, Visibility: a host keeps app-only tools from its model; a client that does not
    declare the extension renders no app, so the merged list leaves them out for it. They stay
    callable."""
    d = await merged([AppServer("alpha"), AppServer("beta")])
    seen = [t["name"] for t in (await serve(d, ask("tools/list")))["result"]["tools"]]
    assert "alpha_refresh" not in seen and "alpha_show" in seen and "alpha_summary" in seen
    seen = [t["name"] for t in (await serve(d, ask("tools/list", ui=True)))["result"]["tools"]]
    assert "alpha_refresh" in seen and "beta_refresh" in seen
    reply = await serve(d, ask("tools/call", name="alpha_refresh"))
    assert reply["result"]["content"][0]["text"] == "alpha:refresh"


async def test_a_lone_unprefixed_backend_lists_its_app_only_tools_as_it_does() -> None:
    """Single-backend transparency: the backend sees the client's capabilities itself."""
    d = await merged([AppServer("alpha")])
    tools = (await serve(d, ask("tools/list")))["result"]["tools"]
    assert [t["name"] for t in tools] == ["show", "refresh", "summary", "hello_alpha"]
    assert tools[0]["_meta"]["ui"]["resourceUri"] == "ui://alpha/view.html"


async def test_an_app_calls_its_servers_tools_by_their_own_names() -> None:
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta])
    reply = await serve(d, ask("tools/call", name="hello_beta"))
    assert reply["result"]["content"][0]["text"] == "beta:hello_beta"
    assert beta.ran() == ["hello_beta"] and alpha.ran() == []


async def test_an_own_name_two_app_servers_share_is_refused_naming_the_candidates() -> None:
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta])
    reply = await serve(d, ask("tools/call", name="refresh"))
    assert reply["error"]["code"] == codes.INVALID_PARAMS
    assert reply["error"]["data"] == {"candidates": ["alpha_refresh", "beta_refresh"]}
    assert alpha.ran() == beta.ran() == []


async def test_a_model_only_tool_is_not_callable_by_its_own_name() -> None:
    """MCP Apps, Visibility: a tool without "app" is not the app's to call."""
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta])
    reply = await serve(d, ask("tools/call", name="summary"))
    assert reply["error"]["code"] == codes.INVALID_PARAMS
    assert "data" not in reply["error"]
    assert alpha.ran() == beta.ran() == []


async def test_an_own_name_call_is_judged_by_the_policy_as_the_visible_name() -> None:
    """The policy's rules name the backend's own tools: denied by one name, denied by both,
    exactly as an unknown name (server/tools, Error Handling)."""
    rules = "  default: allow\n  rules:\n    - deny: {backends: [beta], tools: ['hello_*']}\n"
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta], rules)
    for name in ("hello_beta", "beta_hello_beta"):
        reply = await serve(d, ask("tools/call", name=name), caller())
        assert reply["error"]["code"] == codes.INVALID_PARAMS
        assert "data" not in reply["error"]
    assert beta.ran() == []


async def test_a_candidate_the_policy_hides_is_neither_named_nor_counted() -> None:
    rules = "  default: allow\n  rules:\n    - deny: {backends: [alpha], tools: [refresh]}\n"
    alpha, beta = AppServer("alpha"), AppServer("beta")
    d = await merged([alpha, beta], rules)
    reply = await serve(d, ask("tools/call", name="refresh"), caller())
    assert reply["result"]["content"][0]["text"] == "beta:refresh"
    rules = "  default: allow\n  rules:\n    - deny: {tools: [refresh]}\n"
    d = await merged([alpha, beta], rules)
    reply = await serve(d, ask("tools/call", name="refresh"), caller())
    assert reply["error"]["code"] == codes.INVALID_PARAMS and "data" not in reply["error"]
    assert alpha.ran() == []


async def test_an_own_name_call_takes_the_visible_names_rate_limit() -> None:
    """A tool's own rate limit (names as clients see them) holds whichever name it is called by."""
    limits = RateLimits(tools={"beta_hello_beta": Rate(0.001, 1)})
    limiter = RateLimiter(limits, Counter(), lambda: 1000.0)
    beta = AppServer("beta")
    d = await merged([AppServer("alpha"), beta], limiter=limiter)
    assert "result" in await serve(d, ask("tools/call", name="hello_beta"))
    reply = await serve(d, ask("tools/call", name="beta_hello_beta"))
    assert reply["error"]["code"] == codes.RATE_LIMITED
    reply = await serve(d, ask("tools/call", name="hello_beta"))
    assert reply["error"]["code"] == codes.RATE_LIMITED
    assert beta.ran() == ["hello_beta"]


DENY_VIEW = "  default: allow\n  rules:\n    - deny: {resources: ['ui://alpha/secret*']}\n"
SECRET_SPELLINGS = [
    "ui://alpha/alpha/secret.html",
    "ui://alpha/ALPHA/secret.html",
    "ui://alpha/alpha/x/../secret.html",
    "ui://alpha/alpha/%73ecret.html",
    "ui://alpha/alpha/x%2F..%2Fsecret.html",
    "mcp-gateway://alpha/ui://alpha/secret.html",
    "mcp-gateway://alpha/UI://alpha/secret.html",
]


@pytest.mark.parametrize("uri", SECRET_SPELLINGS)
async def test_a_denied_ui_resource_stays_denied_in_every_spelling(uri: str) -> None:
    """THREAT_MODEL.md, Policy bypass: a rule on a backend's ui:// URI holds however the
    namespaced URI is spelt; the refusal is an unknown resource's."""
    alpha = AppServer("alpha")
    alpha.resources.append({"uri": "ui://alpha/secret.html", "name": "secret", "mimeType": MIME})
    d = await merged([alpha, AppServer("beta")], DENY_VIEW)
    listed = await serve(d, ask("resources/list"), caller())
    assert "ui://alpha/alpha/secret.html" not in {r["uri"] for r in listed["result"]["resources"]}
    reply = await serve(d, ask("resources/read", uri=uri), caller())
    assert reply["error"]["code"] == codes.INVALID_PARAMS, reply
    assert [m for m in alpha.received if m["method"] == "resources/read"] == []
    ok = await serve(d, ask("resources/read", uri="ui://alpha/alpha/view.html"), caller())
    assert ok["result"]["contents"][0]["text"] == "alpha:ui://alpha/view.html"


async def test_a_listen_relays_updates_of_ui_resources_under_their_namespaced_uri() -> None:
    """basic/patterns/subscriptions: a subscription to the listed ui:// URI is asked of the
    backend under its own, and its updates come back under the listed one; a denied view's never
    do."""
    rules = "  default: allow\n  rules:\n    - deny: {resources: ['ui://gh/secret*']}\n"
    gh = FakeBackend("gh", resources=["ui://gh/secret.html", "ui://gh/view.html"])
    d = await gateway([gh, FakeBackend("hr", tools=["x"])], rules)
    secret, view = "ui://gh/gh/secret.html", "ui://gh/gh/view.html"
    ack, *updates = await _listen(d, caller("ann"), [secret, view], view)
    assert ack["params"]["notifications"] == {"resourceSubscriptions": [view]}
    assert [u["params"]["uri"] for u in updates] == [view]
    asked = gh.asked("subscriptions/listen")[0]["params"]["notifications"]
    assert asked == {"resourceSubscriptions": ["ui://gh/view.html"]}
