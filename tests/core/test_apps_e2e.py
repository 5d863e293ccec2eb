"""MCP Apps through one merged gateway, end to end over real sockets: two copies of the apps test
server (tests/servers/apps_server.py, on the official SDK's Apps extension), `alpha` over
Streamable HTTP and `beta` over stdio, behind the gateway's HTTP front end, spoken to as a
modern client and as a 2025-11-25 session (basic/versioning, Extension Negotiation; MCP Apps
spec: UI Resource Format, Resource Discovery, Visibility, Client<>Server Capability
Negotiation)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import codes
from tests.frontends.test_http_transport_rules import Reply, assert_error, post, request
from tests.frontends.test_legacy_sessions import SESSION, in_session, legacy, result_of
from tests.support import BOUND, PYTHON, ROOT, START_BOUND, Proc

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

APPS_SERVER = str(ROOT / "tests" / "servers" / "apps_server.py")
UI = "io.modelcontextprotocol/ui"
MIME = "text/html;profile=mcp-app"
CAPS = "io.modelcontextprotocol/clientCapabilities"
HOST_CAPS: dict[str, Any] = {"extensions": {UI: {"mimeTypes": [MIME]}}}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def url() -> AsyncIterator[str]:
    alpha = Proc([PYTHON, APPS_SERVER, "http", "--port", "0", "--label", "alpha"])
    try:
        port = alpha.wait_for(r"READY (\d+)", stream="stdout").group(1)
        config = {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {
                "alpha": {"http": {"url": f"http://127.0.0.1:{port}/mcp"}},
                "beta": {
                    "stdio": {"command": PYTHON, "args": [APPS_SERVER, "stdio", "--label", "beta"]}
                },
            },
        }
        async with Gateway(parse(yaml.safe_dump(config))) as gw:
            assert gw.http_url is not None
            # Both catalogs known (a miss waits for the load that brings the name).
            for name in ("alpha_hello_alpha", "beta_hello_beta"):
                with anyio.fail_after(START_BOUND):
                    reply = await post(gw.http_url, call(name), bound=None)
                assert text_of(reply).startswith("hello from"), reply.body
            yield gw.http_url
    finally:
        alpha.stop()


def call(name: str, host: bool = False, id_: int = 1) -> dict[str, Any]:
    return ask("tools/call", {"name": name, "arguments": {}}, host, id_)


def ask(
    method: str, params: dict[str, Any] | None = None, host: bool = False, id_: int = 1
) -> dict[str, Any]:
    """A modern request; `host`: from a client declaring the ui extension."""
    return request(method, params, id_=id_, **{CAPS: HOST_CAPS if host else {}})


def last(reply: Reply) -> dict[str, Any]:
    assert reply.status == 200, (reply.status, reply.body)
    return reply.json() if reply.content_type == "application/json" else reply.events()[-1]


def result(reply: Reply) -> dict[str, Any]:
    msg = last(reply)
    assert "result" in msg, msg
    found: dict[str, Any] = msg["result"]
    return found


def text_of(reply: Reply) -> str:
    text: str = result(reply)["content"][0]["text"]
    return text


async def tools(url: str, host: bool) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in result(await post(url, ask("tools/list", host=host)))["tools"]}


async def test_discover_advertises_the_backends_extension(url: str) -> None:
    caps = result(await post(url, ask("server/discover")))["capabilities"]
    assert caps["extensions"] == {UI: {}}
    assert "tools" in caps and "resources" in caps


async def test_every_tools_ui_resource_is_listed_and_reads_from_its_backend(url: str) -> None:
    """Resource Discovery: each `_meta.ui.resourceUri` (and the deprecated flat key) is a ui://
    URI the merged resources/list shows, and resources/read of it returns the view of the
    backend the tool is from, its `_meta` as the backend sent it."""
    shown = await tools(url, host=True)
    resources = result(await post(url, ask("resources/list")))["resources"]
    listed = {r["uri"]: r for r in resources}
    assert set(listed) == {"ui://alpha/alpha/view.html", "ui://beta/beta/view.html"}
    for label in ("alpha", "beta"):
        view = f"ui://{label}/{label}/view.html"
        assert listed[view]["mimeType"] == MIME
        csp = {"connectDomains": [f"https://{label}.example"]}
        assert listed[view]["_meta"] == {"ui": {"csp": csp, "prefersBorder": True}}
        for tool in ("show", "refresh", "summary"):
            assert shown[f"{label}_{tool}"]["_meta"]["ui"]["resourceUri"] == view
        classic = shown[f"{label}_classic"]["_meta"]
        assert classic == {"ui/resourceUri": view, "other": {"kept": label}}
        read = result(await post(url, ask("resources/read", {"uri": view})))
        [content] = read["contents"]
        assert content["uri"] == view and content["mimeType"] == MIME
        assert f"<p>{label}</p>" in content["text"]
        assert content["_meta"] == {"ui": {"csp": csp, "prefersBorder": True}}


async def test_an_app_calls_its_servers_tools_by_their_own_names(url: str) -> None:
    """The view of a tool of `beta` calls `beta`'s tools by beta's names; they reach beta."""
    assert text_of(await post(url, call("hello_beta", host=True))) == "hello from beta"
    assert text_of(await post(url, call("hello_alpha", host=True))) == "hello from alpha"


async def test_an_own_name_two_backends_share_is_refused_naming_the_candidates(url: str) -> None:
    reply = await post(url, call("refresh", host=True))
    error = assert_error(reply, 400, codes.INVALID_PARAMS)
    assert error["error"]["data"] == {"candidates": ["alpha_refresh", "beta_refresh"]}


async def test_app_only_tools_are_shown_to_hosts_of_the_extension_only(url: str) -> None:
    """Visibility: a host keeps `["app"]` tools from its model; a client without the extension
    is not shown them. Either may still call them."""
    assert {"alpha_refresh", "beta_refresh", "alpha_show"} <= set(await tools(url, host=True))
    plain = set(await tools(url, host=False))
    assert "alpha_refresh" not in plain and "beta_refresh" not in plain
    assert {"alpha_show", "alpha_summary", "beta_classic"} <= plain
    assert text_of(await post(url, call("beta_refresh"))) == "refreshed by beta"


async def test_the_clients_extensions_reach_each_backend(url: str) -> None:
    """Extension Negotiation: the client's `extensions` arrive at every backend as it sent them."""
    for label in ("alpha", "beta"):
        seen = text_of(await post(url, call(f"{label}_seen_extensions", host=True)))
        assert orjson.loads(seen) == HOST_CAPS["extensions"]
        seen = text_of(await post(url, call(f"{label}_seen_extensions")))
        assert orjson.loads(seen) == {}


async def open_legacy(url: str, capabilities: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A 2025-11-25 session (basic/lifecycle): its id and the InitializeResult."""
    init = legacy(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "legacy-host", "version": "1"},
        },
        id_=0,
    )
    with anyio.fail_after(BOUND):
        reply = await post(url, init, mirror=False)
    assert reply.status == 200, reply.body
    session_id = reply.headers[SESSION]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = await post(url, initialized, mirror=False, extra=[(SESSION, session_id)])
    assert accepted.status == 202
    return session_id, reply.json()["result"]


async def test_a_legacy_session_sees_the_same(url: str) -> None:
    """A host of the initialize era declares the extension in `initialize` (MCP Apps,
    Client<>Server Capability Negotiation) and is shown what a modern one is."""
    session_id, init = await open_legacy(url, HOST_CAPS)
    assert init["capabilities"]["extensions"] == {UI: {}}
    listed = result_of(await in_session(url, session_id, legacy("tools/list")))
    shown = {t["name"]: t for t in listed["tools"]}
    assert shown["beta_refresh"]["_meta"]["ui"]["resourceUri"] == "ui://beta/beta/view.html"
    read = legacy("resources/read", {"uri": "ui://beta/beta/view.html"})
    assert (
        "<p>beta</p>" in result_of(await in_session(url, session_id, read))["contents"][0]["text"]
    )
    own = legacy("tools/call", {"name": "hello_beta", "arguments": {}})
    assert result_of(await in_session(url, session_id, own))["content"][0]["text"] == (
        "hello from beta"
    )
    shared = last(await in_session(url, session_id, legacy("tools/call", {"name": "refresh"})))
    assert shared["error"]["code"] == codes.INVALID_PARAMS
    assert shared["error"]["data"] == {"candidates": ["alpha_refresh", "beta_refresh"]}
    # (Not asserted: the session's extensions as a backend sees them. These dual-era servers are
    # asked in the legacy era for a legacy client, on a session the gateway opened with its own
    # capabilities: backends/era/dual.py.)

    plain_id, _ = await open_legacy(url, {})
    listed = result_of(await in_session(url, plain_id, legacy("tools/list")))
    assert "alpha_refresh" not in {t["name"] for t in listed["tools"]}
