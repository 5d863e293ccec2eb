"""What the HTTP backend sends (backends/http_exchange.py, hop.py), read off the header lines a raw
server on 127.0.0.1 receives: the mirrored headers derived from the body (streamable-http,
Standard Request Headers), Mcp-Param-* from the x-mcp-header annotations learnt from tools/list
(Custom Headers from Tool Parameters), trace context only when well-formed (basic/index,
OpenTelemetry trace context), and nothing a client's body could turn into a header line of
its own.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gateway import errors
from gateway.backends import hop
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.http import HttpBackend
from gateway.config import ConfigInvalid
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from tests.support import (
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    request,
)
from tests.support.backend import (
    Peer,
    Request,
    Server,
    answer,
    backend_config,
    code_of,
    ignore,
    json_reply,
    result_for,
    running,
)

pytestmark = pytest.mark.anyio

VERSION = "2026-07-28"


# --- what is sent --------------------------------------------------------------------------------


async def test_the_request_is_sent_as_derived_from_the_body() -> None:
    """streamable-http, Standard Request Headers: Mcp-Method, Mcp-Name and MCP-Protocol-Version
    come from the body sent; the configured headers go too; nothing else of ours but the media
    types, and no cookie, compression or client header."""
    async with Server(answer) as server:
        config = backend_config(server.url("/path?q=1"), headers={"Authorization": "Bearer t"})
        async with running(config) as backend:
            msg = call(7, "search", query="x")
            got = await backend.request(msg, ignore, GATEWAY_CALL)
    assert got["id"] == 7 and got["result"] == {"resultType": "complete"}
    (sent,) = server.requests
    assert sent.request_line == b"POST /path?q=1 HTTP/1.1"
    assert sent.headers() == {
        "host": f"127.0.0.1:{server.port}",
        "user-agent": sent.headers()["user-agent"],
        "accept-encoding": "identity",
        "authorization": "Bearer t",
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-method": "tools/call",
        "mcp-protocol-version": VERSION,
        "mcp-name": "search",
        "content-length": str(len(sent.body)),
    }
    assert sent.headers()["user-agent"].startswith("mcp-gateway/")
    # The body as the client sent it, but for the id: the gateway's own on this hop (ids.py).
    assert sent.message == {**msg, "id": sent.message["id"]} and sent.message["id"] != 7


async def test_a_name_that_is_not_plain_is_sentinel_encoded() -> None:
    """streamable-http, Value Encoding: a name with non-ASCII or control characters travels
    base64-encoded, never as raw bytes in the header line."""
    async with Server(answer) as server, running(backend_config(server.url())) as backend:
        await backend.request(call(1, "zürich\r\nX-Injected: 1"), ignore, GATEWAY_CALL)
    (sent,) = server.requests
    encoded = base64.b64encode("zürich\r\nX-Injected: 1".encode()).decode()
    assert sent.headers()["mcp-name"] == f"=?base64?{encoded}?="
    assert not any(line.lower().startswith(b"x-injected") for line in sent.header_lines)


def regional_tools(_: Request) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "query": {"type": "string"},
        },
    }
    return {"resultType": "complete", "tools": [{"name": "regional", "inputSchema": schema}]}


async def lists_tools(peer: Peer) -> None:
    while (request := await peer.read_request()) is not None:
        result = regional_tools(request) if request.message["method"] == "tools/list" else None
        await peer.send(json_reply(result_for(request, result)))


async def test_mcp_param_headers_are_derived_from_the_tools_list_that_passed_through() -> None:
    """streamable-http, Custom Headers from Tool Parameters: the backend hop learns each tool's
    `x-mcp-header` annotations from the tools/list results it carries, and derives Mcp-Param-*
    from the arguments sent (sentinel-encoded when not plain); before that it knows none."""
    async with Server(lists_tools) as server, running(backend_config(server.url())) as backend:
        await backend.request(
            call(1, "regional", region="eu", n=3, query="q"), ignore, GATEWAY_CALL
        )
        await backend.request(request(2, "tools/list"), ignore, GATEWAY_CALL)
        await backend.request(
            call(3, "regional", region="Zürich", n=42, query="q"), ignore, GATEWAY_CALL
        )
        await backend.request(call(4, "other", region="eu"), ignore, GATEWAY_CALL)
    before, _, after, other = (r.headers() for r in server.requests)
    assert not any(name.startswith("mcp-param-") for name in before)
    zurich = base64.b64encode("Zürich".encode()).decode()
    assert after["mcp-param-region"] == f"=?base64?{zurich}?="
    assert after["mcp-param-n"] == "42"
    assert "mcp-param-query" not in after
    assert not any(name.startswith("mcp-param-") for name in other)


def traced(traceparent: object, tracestate: object = None) -> Message:
    msg = call(1, "t")
    msg["params"]["_meta"]["traceparent"] = traceparent
    if tracestate is not None:
        msg["params"]["_meta"]["tracestate"] = tracestate
    return msg


GOOD_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("parent", "state", "sent_parent", "sent_state"),
    [
        (GOOD_PARENT, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", True, True),
        (GOOD_PARENT, None, True, False),
        (GOOD_PARENT + "\r\nX-Injected: 1", None, False, False),
        ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-01", None, False, False),
        ("00-" + "0" * 32 + "-b7ad6b7169203331-01", None, False, False),
        ("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01", None, False, False),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None, False, False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", None, False, False),
        (42, None, False, False),
        (GOOD_PARENT, "rojo=1\r\nX-Injected: 1", True, False),
        (GOOD_PARENT, "rojo=1\x00", True, False),
        (GOOD_PARENT, "Rojo=1", True, False),
        (GOOD_PARENT, ",".join(f"k{i}=v" for i in range(33)), True, False),
        (GOOD_PARENT, "k=" + "v" * 255 + ",j=" + "v" * 255, True, False),  # over 512
        (GOOD_PARENT, "k=v,,tenant@sys=x y", True, True),
    ],
    ids=[
        "both-valid",
        "parent-only",
        "parent-crlf",
        "parent-uppercase",
        "parent-zero-trace",
        "parent-zero-span",
        "parent-version-ff",
        "parent-short",
        "parent-not-a-string",
        "state-crlf",
        "state-nul",
        "state-uppercase-key",
        "state-33-members",
        "state-too-long",
        "state-empty-member-and-tenant",
    ],
)
async def test_trace_context_becomes_headers_only_when_well_formed(
    parent: object, state: object, sent_parent: bool, sent_state: bool
) -> None:
    """basic/index, OpenTelemetry trace context: `_meta.traceparent`/`tracestate` are also sent
    as headers, but only when they are W3C trace context; otherwise they travel in `_meta`
    alone, and no control character from a client's body reaches a header line."""
    async with Server(answer) as server, running(backend_config(server.url())) as backend:
        await backend.request(traced(parent, state), ignore, GATEWAY_CALL)
    (sent,) = server.requests
    found = sent.headers()
    assert ("traceparent" in found) is sent_parent
    assert ("tracestate" in found) is sent_state
    if sent_parent:
        assert found["traceparent"] == parent
    if sent_state:
        assert found["tracestate"] == state
    assert not any(line.lower().startswith(b"x-injected") for line in sent.header_lines)
    assert sent.message["params"]["_meta"]["traceparent"] == parent  # still in the body


@pytest.mark.parametrize(
    "method",
    ["tools/call\r\nX-Injected: 1", "tools/call\n", "a\x00b", "é/x", " padded"],
    ids=["crlf", "lf", "nul", "non-ascii", "leading-space"],
)
async def test_a_method_that_cannot_be_a_header_is_refused(method: str) -> None:
    """streamable-http, Standard Request Headers: Mcp-Method carries the method as it is, so a
    method that is not a plain header value is refused (-32600) instead of being sent."""
    async with Server(answer) as server, running(backend_config(server.url())) as backend:
        with pytest.raises(errors.Refused) as refused:
            await backend.request(request(1, method), ignore, GATEWAY_CALL)
        assert code_of(refused) == codes.INVALID_REQUEST
        await backend.notify({"jsonrpc": "2.0", "method": method})  # dropped, with a warning
        # The next request on the same backend is served normally.
        assert "result" in await backend.request(request(2, "tools/list"), ignore, GATEWAY_CALL)
    assert [r.message["method"] for r in server.requests] == ["tools/list"]


def test_learnt_tools_are_bounded() -> None:
    learnt = hop.ToolHeaders(limit=3)
    schema = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": "R"}}}
    tools = [{"name": f"t{i}", "inputSchema": schema} for i in range(5)]
    learnt.learn({"jsonrpc": "2.0", "id": 1, "result": {"tools": tools}})
    assert len(learnt) == 3
    assert learnt.params(call(1, "t4", r="x"), "t4") == [("Mcp-Param-R", "x")]
    assert learnt.params(call(1, "t0", r="x"), "t0") == []


def test_a_backend_url_without_a_host_is_a_config_error() -> None:
    with pytest.raises(ConfigInvalid):
        HttpBackend(backend_config("http:///mcp"))


def test_a_configured_header_that_could_end_its_line_is_a_config_error() -> None:
    for headers in ({"X-Evil": "a\r\nInjected: yes"}, {"X-Evil": "a\x00b"}, {"X Evil": "1"}):
        with pytest.raises(ConfigInvalid):
            HttpBackend(backend_config("http://127.0.0.1:1/mcp", headers=headers))


def test_a_tools_list_page_seen_before_is_not_walked_again_but_a_changed_one_is() -> None:
    """The same page under another request id is recognised by its bytes; a changed schema is
    a different page and is learnt."""

    def page(rid: int, header: str) -> Message:
        schema = {"type": "object", "properties": {"r": {"type": "string", "x-mcp-header": header}}}
        body = {
            "jsonrpc": "2.0",
            "id": rid,
            "result": {"tools": [{"name": "t", "inputSchema": schema}]},
        }
        decoded = jsonrpc.decode(orjson.dumps(body), keep=True)
        assert isinstance(decoded, dict)
        return decoded

    learnt = hop.ToolHeaders()
    learnt.learn(page(1, "R"))
    assert learnt.params(call(1, "t", r="x"), "t") == [("Mcp-Param-R", "x")]
    learnt.learn(page(2, "R"))
    assert learnt.params(call(2, "t", r="x"), "t") == [("Mcp-Param-R", "x")]
    learnt.learn(page(3, "Other"))
    assert learnt.params(call(3, "t", r="x"), "t") == [("Mcp-Param-Other", "x")]
