"""Transport rules of Streamable HTTP, checked with raw HTTP requests against the gateway's front
end (basic/transports/streamable-http; basic/index for `_meta` and error codes; basic/versioning).

No MCP client library here: every request is built by hand so the rules themselves are visible.
The gateway runs in-process on 127.0.0.1 with the SDK test server as its stdio backend.
"""

from __future__ import annotations

import base64
import gzip
import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.app import Gateway
from gateway.config import parse
from tests.support import BOUND, START_BOUND, sdk_stdio_command
from tests.support.listener import Serving, chunk, echo_call, mcp_request, port_of

pytestmark = pytest.mark.anyio

VERSION = "2026-07-28"
ACCEPT = "application/json, text/event-stream"
MAX_BODY = 2048
ALLOWED_ORIGIN = "https://app.example"
ALLOWED_HOST = "gw.example"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
HEADER_MISMATCH = -32020
UNSUPPORTED_PROTOCOL_VERSION = -32022

# Methods whose Mcp-Name header is required, and the params field it mirrors.
NAME_SOURCE = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
CREDENTIAL_HEADERS = ("Authorization", "Cookie", "Proxy-Authorization", "X-Api-Key")

Headers = list[tuple[str, str]]


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope, so one gateway (and one SDK child) serves every test of the module."""
    return "asyncio"


def gateway_config(backends: Mapping[str, object]) -> str:
    return yaml.safe_dump(
        {
            "listen": {
                "http": {
                    "host": "127.0.0.1",
                    "port": 0,
                    "path": "/mcp",
                    "allowed_origins": [ALLOWED_ORIGIN],
                    "allowed_hosts": [ALLOWED_HOST],
                    "max_body_bytes": MAX_BODY,
                }
            },
            "backends": dict(backends),
        }
    )


@pytest.fixture(scope="module")
async def url() -> AsyncIterator[str]:
    """The gateway's MCP endpoint, its stdio backend warmed up (child started, catalog known)."""
    command = sdk_stdio_command()
    backend = {"stdio": {"command": command[0], "args": command[1:]}}
    async with Gateway(parse(gateway_config({"sdk": backend}))) as gw:
        assert gw.http_url is not None
        warm_up = call("regional", {"region": "r", "query": "q"})
        with anyio.fail_after(START_BOUND):
            reply = await post(gw.http_url, warm_up, extra=[("Mcp-Param-Region", "r")], bound=None)
        assert reply.status == 200, reply.body
        yield gw.http_url


# --- request building -------------------------------------------------------------------------


def client_meta(**extra: object) -> dict[str, Any]:
    """The per-request `_meta` every modern request carries (basic/index, `_meta`)."""
    return {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "transport-rules", "version": "0.0.1"},
        **extra,
    }


def request(
    method: str, params: Mapping[str, Any] | None = None, *, id_: int | str = 1, **meta: object
) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        "params": {**(params or {}), "_meta": client_meta(**meta)},
    }


def call(
    tool: str, arguments: Mapping[str, Any], *, id_: int | str = 1, **meta: object
) -> dict[str, Any]:
    return request("tools/call", {"name": tool, "arguments": dict(arguments)}, id_=id_, **meta)


def echo(text: str = "hi", *, id_: int | str = 1) -> dict[str, Any]:
    return call("echo", {"text": text}, id_=id_)


def mirrored(body: Mapping[str, Any]) -> Headers:
    """The request metadata headers a conforming client derives from a body (plain values)."""
    params = body.get("params") or {}
    meta = params.get("_meta") or {}
    out: Headers = []
    version = meta.get("io.modelcontextprotocol/protocolVersion")
    if isinstance(version, str):
        out.append(("MCP-Protocol-Version", version))
    if "method" in body:
        out.append(("Mcp-Method", body["method"]))
    source = NAME_SOURCE.get(body.get("method", ""))
    if source is not None and isinstance(params.get(source), str):
        out.append(("Mcp-Name", params[source]))
    return out


def sentinel(value: str) -> str:
    """The Base64 sentinel encoding of a header value (streamable-http, Value Encoding)."""
    return "=?base64?" + base64.b64encode(value.encode()).decode("ascii") + "?="


# --- sending and reading ----------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip().lower()

    def json(self) -> dict[str, Any]:
        assert self.content_type == "application/json", (self.status, self.headers, self.body)
        value = orjson.loads(self.body)
        assert isinstance(value, dict)
        return value

    def events(self) -> list[dict[str, Any]]:
        """The JSON messages of an SSE body: events split on blank lines, `data:` lines joined."""
        assert self.content_type == "text/event-stream", (self.status, self.headers)
        text = self.body.decode().replace("\r\n", "\n").replace("\r", "\n")
        out: list[dict[str, Any]] = []
        for block in text.split("\n\n"):
            data = [
                line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")
            ]
            if data:
                out.append(orjson.loads("\n".join(data)))
        return out


async def post(
    url: str,
    body: Mapping[str, Any] | list[Any] | bytes,
    *,
    mirror: bool = True,
    replace: Mapping[str, str] | None = None,
    omit: Iterable[str] = (),
    extra: Sequence[tuple[str, str]] = (),
    bound: float | None = BOUND,
) -> Reply:
    """POST one message. Headers: the media types, the mirrored headers (if `mirror` and the body
    is an object), then `replace` overrides, `omit` removals and `extra` additions (which may
    repeat a header already present)."""
    headers: CIMultiDict[str] = CIMultiDict(
        [("Content-Type", "application/json"), ("Accept", ACCEPT)]
    )
    if mirror and isinstance(body, Mapping):
        headers.update(mirrored(body))
    headers.update(replace or {})
    for name in omit:
        headers.popall(name, None)
    for name, value in extra:
        headers.add(name, value)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return await send("POST", url, data, list(headers.items()), bound)


async def send(
    method: str, url: str, data: bytes | None, headers: Headers, bound: float | None = BOUND
) -> Reply:
    with anyio.fail_after(bound):
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=data, headers=headers) as resp,
        ):
            return Reply(resp.status, resp.headers, await resp.read())


def assert_error(reply: Reply, status: int, code: int, id_: int | str | None = 1) -> dict[str, Any]:
    """`status`, and a JSON-RPC error response with `code` answering `id_` (None: no id)."""
    assert reply.status == status, (reply.status, reply.body)
    msg = reply.json()
    assert msg.get("jsonrpc") == "2.0"
    assert msg["error"]["code"] == code, msg
    if id_ is None:
        assert "id" not in msg or msg["id"] is None, msg
    else:
        assert msg.get("id") == id_, msg
    return msg


def assert_refused(reply: Reply, status: int) -> None:
    """`status`; a body, where there is one, is a JSON-RPC error response without an id."""
    assert reply.status == status, (reply.status, reply.body)
    if reply.body:
        msg = reply.json()
        assert isinstance(msg["error"]["code"], int)
        assert msg.get("id") is None, msg


def result_of(reply: Reply, id_: int | str = 1) -> dict[str, Any]:
    assert reply.status == 200, (reply.status, reply.body)
    msg = reply.json()
    assert msg.get("id") == id_ and "error" not in msg, msg
    result = msg["result"]
    assert isinstance(result, dict)
    return result


def text_of(result: Mapping[str, Any]) -> str:
    assert result.get("isError") is not True, result
    text = result["content"][0]["text"]
    assert isinstance(text, str)
    return text


# --- HTTP method and media types --------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_get_and_delete_are_method_not_allowed(url: str, method: str) -> None:
    """streamable-http, Backward Compatibility / Earlier Streamable HTTP Revisions: GET or
    DELETE to the MCP endpoint without a legacy session gets 405 (the endpoint supports POST
    only), with a JSON-RPC error saying why (the old server sent an empty body)."""
    reply = await send(method, url, None, [("Accept", ACCEPT)])
    assert [m.strip() for m in reply.headers.get("Allow", "").split(",")] == ["POST"]
    assert_error(reply, 405, INVALID_REQUEST, id_=None)


async def test_content_type_other_than_json_is_unsupported_media_type(url: str) -> None:
    """streamable-http, Sending Messages: the POST body is a JSON-RPC message (application/json)."""
    reply = await post(url, echo(), replace={"Content-Type": "text/plain"})
    assert_refused(reply, 415)


async def test_accept_without_event_stream_is_not_acceptable(url: str) -> None:
    """streamable-http, Sending Messages 2: Accept lists application/json and
    text/event-stream."""
    reply = await post(url, echo(), replace={"Accept": "application/json"})
    assert_refused(reply, 406)


async def test_body_over_the_configured_limit_is_too_large(url: str) -> None:
    """streamable-http, Security & Endpoint: a body over `max_body_bytes` is refused with 413."""
    reply = await post(url, echo("x" * (MAX_BODY * 2)))
    assert_refused(reply, 413)


async def test_accept_split_over_two_header_lines_is_acceptable(url: str) -> None:
    """streamable-http, Sending Messages 2, with RFC 9110 5.3: Accept is a list field, so two
    Accept lines mean the same as one comma-separated line listing both types."""
    body = echo("split")
    accepts = [("Accept", "application/json"), ("Accept", "text/event-stream")]
    reply = await post(url, body, omit=["Accept"], extra=accepts)
    assert text_of(result_of(reply)) == "split"


async def test_body_exactly_at_the_limit_is_accepted_and_one_more_byte_is_not(url: str) -> None:
    """streamable-http, Security & Endpoint: `max_body_bytes` is the largest body accepted."""
    empty = len(orjson.dumps(echo("")))
    at_limit = echo("x" * (MAX_BODY - empty))
    assert len(orjson.dumps(at_limit)) == MAX_BODY
    assert text_of(result_of(await post(url, at_limit))) == "x" * (MAX_BODY - empty)
    over = echo("x" * (MAX_BODY - empty + 1))
    assert_refused(await post(url, over), 413)


async def test_compressed_body_inflating_over_the_limit_is_too_large(url: str) -> None:
    """streamable-http, Security & Endpoint: the limit applies to the body as decoded, so a
    small gzip body cannot smuggle a large message."""
    raw = orjson.dumps(echo("x" * (MAX_BODY * 8)))
    packed = gzip.compress(raw)
    assert len(packed) < MAX_BODY
    reply = await post(url, packed, extra=[*mirrored(echo()), ("Content-Encoding", "gzip")])
    assert_refused(reply, 413)


async def test_chunked_body_over_the_configured_limit_is_too_large(url: str) -> None:
    """streamable-http, Security & Endpoint: the limit holds without a Content-Length too."""
    body = orjson.dumps(echo("x" * (MAX_BODY * 2)))

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    headers = [("Content-Type", "application/json"), ("Accept", ACCEPT), *mirrored(echo())]
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=chunks(), headers=headers) as resp,
        ):
            assert "Content-Length" not in resp.request_info.headers
            assert resp.status == 413


# --- message shape ----------------------------------------------------------------------------


async def test_batch_array_is_invalid_request(url: str) -> None:
    """streamable-http, Sending Messages 4: the body is a single request or notification."""
    reply = await post(url, [echo()], extra=mirrored(echo()))
    assert_error(reply, 400, INVALID_REQUEST, id_=None)


async def test_posted_response_is_invalid_request(url: str) -> None:
    """streamable-http, Sending Messages 4: the client MUST NOT send JSON-RPC responses."""
    response = {"jsonrpc": "2.0", "id": 7, "result": {"resultType": "complete"}}
    reply = await post(url, response, extra=[("MCP-Protocol-Version", VERSION)])
    assert reply.status == 400
    assert reply.json()["error"]["code"] == INVALID_REQUEST


@pytest.mark.parametrize(
    "extra", [{"result": {"resultType": "complete"}}, {"error": {"code": -1, "message": "x"}}]
)
async def test_a_request_carrying_a_result_or_error_is_invalid_request(
    url: str, extra: dict[str, Any]
) -> None:
    """basic/index, Requests and Responses: a message is a request or a response, not both. One
    with a `method` and a `result` (or `error`) is answered -32600 by the gateway with the
    status of the error table (400), and not served: the echo tool would have answered 200."""
    body = {**echo("not served", id_="both"), **extra}
    reply = await post(url, body)
    assert_error(reply, 400, INVALID_REQUEST, id_="both")


async def test_null_id_is_invalid_request(url: str) -> None:
    """basic/index, Requests: the id MUST NOT be null."""
    body: dict[str, Any] = {**echo(), "id": None}
    reply = await post(url, body)
    assert_error(reply, 400, INVALID_REQUEST, id_=None)


async def test_invalid_json_is_parse_error_without_id(url: str) -> None:
    """basic/index, Error Responses: a parse error carries no id (it could not be read)."""
    reply = await post(url, b'{"jsonrpc": "2.0", "id": 1, "method": ', extra=mirrored(echo()))
    assert_error(reply, 400, PARSE_ERROR, id_=None)


async def test_notification_is_accepted_with_empty_202(url: str) -> None:
    """streamable-http, Sending Messages 5: an accepted notification gets 202 and no body."""
    note = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 12345, "_meta": client_meta()},
    }
    reply = await post(url, note)
    assert reply.status == 202
    assert reply.body == b""


# --- request metadata headers -----------------------------------------------------------------


async def test_missing_protocol_version_header_is_header_mismatch(url: str) -> None:
    """streamable-http, Protocol Version Header / Server Validation: MCP-Protocol-Version is
    required on every POST."""
    reply = await post(url, echo(), omit=["MCP-Protocol-Version"])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_protocol_version_header_differing_from_meta_is_header_mismatch(url: str) -> None:
    """streamable-http, Protocol Version Header: the header MUST match `_meta`'s
    protocolVersion."""
    reply = await post(url, echo(), replace={"MCP-Protocol-Version": "2025-11-25"})
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_missing_method_header_is_header_mismatch(url: str) -> None:
    """streamable-http, Standard Request Headers / Server Validation: Mcp-Method is required."""
    reply = await post(url, echo(), omit=["Mcp-Method"])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_method_header_differing_from_body_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Validation: Mcp-Method must equal the body's method."""
    reply = await post(url, echo(), replace={"Mcp-Method": "tools/list"})
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_method_header_value_is_case_sensitive(url: str) -> None:
    """streamable-http, Case Sensitivity: header values such as method names are
    case-sensitive."""
    reply = await post(url, echo(), replace={"Mcp-Method": "Tools/Call"})
    assert_error(reply, 400, HEADER_MISMATCH)


NAMED_REQUESTS = {
    "tools/call": echo(),
    "resources/read": request("resources/read", {"uri": "mem://greeting"}),
    "prompts/get": request("prompts/get", {"name": "greet", "arguments": {"name": "Ada"}}),
}


@pytest.mark.parametrize("method", sorted(NAMED_REQUESTS))
async def test_missing_name_header_is_header_mismatch(url: str, method: str) -> None:
    """streamable-http, Standard Request Headers: Mcp-Name is required for tools/call,
    resources/read and prompts/get."""
    body = NAMED_REQUESTS[method]
    accepted = await post(url, body)
    assert result_of(accepted)["resultType"] == "complete"
    reply = await post(url, body, omit=["Mcp-Name"])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_name_header_differing_from_body_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Validation: Mcp-Name must equal params.name."""
    reply = await post(url, echo(), replace={"Mcp-Name": "add"})
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_base64_name_header_matching_body_is_accepted(url: str) -> None:
    """streamable-http, Value Encoding: servers decode a sentinel-encoded Mcp-Name before
    comparing it with the body."""
    reply = await post(url, echo("encoded"), replace={"Mcp-Name": sentinel("echo")})
    assert text_of(result_of(reply)) == "encoded"


async def test_base64_non_ascii_name_header_matching_body_is_accepted(url: str) -> None:
    """streamable-http, Value Encoding: a non-ASCII Mcp-Name source (here a resource URI) is
    carried Base64-encoded and matches the body once decoded."""
    uri = "mem://items/café"
    body = request("resources/read", {"uri": uri})
    reply = await post(url, body, replace={"Mcp-Name": sentinel(uri)})
    contents = result_of(reply)["contents"]
    assert contents[0]["uri"] == uri
    assert contents[0]["text"] == "item café"


async def test_base64_name_header_of_a_different_name_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Validation: the decoded Mcp-Name is compared, not the raw one."""
    reply = await post(url, echo(), replace={"Mcp-Name": sentinel("add")})
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_raw_non_ascii_name_header_is_header_mismatch(url: str) -> None:
    """streamable-http, Value Encoding / Server Validation: a header value with characters
    outside visible ASCII, not Base64-encoded, is invalid even when it equals the body."""
    uri = "mem://items/café"
    reply = await post(url, request("resources/read", {"uri": uri}), replace={"Mcp-Name": uri})
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_malformed_base64_name_header_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Validation: a sentinel whose Base64 does not decode is malformed."""
    reply = await post(url, echo(), replace={"Mcp-Name": "=?base64?not*base64?="})
    assert_error(reply, 400, HEADER_MISMATCH)


@pytest.mark.parametrize("header", ["Mcp-Name", "Mcp-Method", "MCP-Protocol-Version"])
async def test_repeated_header_is_header_mismatch(url: str, header: str) -> None:
    """streamable-http, Server Validation: a header sent twice is malformed, even when both
    copies match the body."""
    value = dict(mirrored(echo()))[header]
    reply = await post(url, echo(), extra=[(header, value)])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_header_names_are_case_insensitive(url: str) -> None:
    """streamable-http, Case Sensitivity: header names compare case-insensitively."""
    body = echo("lower")
    lowered = [(name.lower(), value) for name, value in mirrored(body)]
    reply = await post(url, body, mirror=False, extra=lowered)
    assert text_of(result_of(reply)) == "lower"


# --- Mcp-Param-{Name} from x-mcp-header --------------------------------------------------------


def regional(region: str = "us-west1") -> dict[str, Any]:
    return call("regional", {"region": region, "query": "q"})


async def test_param_header_missing_while_argument_present_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Behavior for Custom Headers: a client that omits the header while
    the value is in the body is rejected."""
    reply = await post(url, regional())
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_param_header_differing_from_argument_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Behavior for Custom Headers: the header must match the body."""
    reply = await post(url, regional("us-west1"), extra=[("Mcp-Param-Region", "eu-west1")])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_param_header_equal_to_argument_is_accepted(url: str) -> None:
    """streamable-http, Custom Headers from Tool Parameters: a matching Mcp-Param-Region
    passes and the tool runs."""
    reply = await post(url, regional("us-west1"), extra=[("Mcp-Param-Region", "us-west1")])
    assert text_of(result_of(reply)) == "us-west1:q"


async def test_base64_param_header_matching_argument_is_accepted(url: str) -> None:
    """streamable-http, Value Encoding: a sentinel-encoded Mcp-Param value is decoded before
    comparison."""
    reply = await post(url, regional("Zürich"), extra=[("Mcp-Param-Region", sentinel("Zürich"))])
    assert text_of(result_of(reply)) == "Zürich:q"


async def test_param_header_name_is_case_insensitive(url: str) -> None:
    """streamable-http, Case Sensitivity: `mcp-param-region` is the Mcp-Param-Region header."""
    reply = await post(url, regional("ap-south1"), extra=[("mcp-param-REGION", "ap-south1")])
    assert text_of(result_of(reply)) == "ap-south1:q"


async def test_repeated_param_header_is_header_mismatch(url: str) -> None:
    """streamable-http, Server Validation: a param header sent twice is malformed."""
    twice = [("Mcp-Param-Region", "us-west1"), ("Mcp-Param-Region", "us-west1")]
    reply = await post(url, regional("us-west1"), extra=twice)
    assert_error(reply, 400, HEADER_MISMATCH)


@pytest.mark.parametrize("header", ["1e3", "1000.0", "1_000"])
async def test_string_param_header_is_compared_exactly(url: str, header: str) -> None:
    """streamable-http, Server Validation: the header must match the body value; only integer
    parameters are compared numerically, and `region` is a string."""
    reply = await post(url, regional("1000"), extra=[("Mcp-Param-Region", header)])
    assert_error(reply, 400, HEADER_MISMATCH)


async def test_param_header_absent_with_argument_absent_is_accepted(url: str) -> None:
    """streamable-http, Server Behavior for Custom Headers: with the parameter not in the
    arguments, the server MUST NOT expect the header (the tool itself may then fail)."""
    reply = await post(url, call("regional", {"query": "q"}))
    assert reply.status == 200, reply.body
    assert reply.json()["id"] == 1


# --- method and version -----------------------------------------------------------------------


async def test_unknown_method_is_not_found_404(url: str) -> None:
    """streamable-http, Protocol Version Header: an unimplemented method gets 404 with -32601."""
    reply = await post(url, request("nope/nothing"))
    assert_error(reply, 404, METHOD_NOT_FOUND)


async def test_unsupported_protocol_version_lists_supported_versions(url: str) -> None:
    """basic/versioning, Protocol Version Negotiation: 400 UnsupportedProtocolVersionError with
    `data.supported`."""
    body = echo()
    body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1900-01-01"
    reply = await post(url, body)
    msg = assert_error(reply, 400, UNSUPPORTED_PROTOCOL_VERSION)
    assert VERSION in msg["error"]["data"]["supported"]


async def test_request_without_meta_is_invalid_params(url: str) -> None:
    """basic/index, `_meta`: every request carries its protocol version and capabilities."""
    body = echo()
    del body["params"]["_meta"]
    reply = await post(url, body, extra=[("MCP-Protocol-Version", VERSION)])
    assert_error(reply, 400, INVALID_PARAMS)


async def test_meta_without_client_capabilities_is_invalid_params(url: str) -> None:
    """basic/index, `_meta`: clientCapabilities is required on every request."""
    body = echo()
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    reply = await post(url, body)
    assert_error(reply, 400, INVALID_PARAMS)


async def test_initialize_from_a_legacy_client_opens_a_session(url: str) -> None:
    """basic/versioning, Backward Compatibility: a dual-era server answers `initialize` and
    serves the client under the negotiated legacy revision; on HTTP the session is named by a
    minted Mcp-Session-Id (2025-11-25 transports, Session Management)."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "legacy", "version": "1"},
        },
    }
    reply = await post(url, body, mirror=False)
    assert reply.status == 200, reply.body
    assert reply.json()["result"]["protocolVersion"] == "2025-11-25"
    session_id = reply.headers["Mcp-Session-Id"]
    assert len(session_id) >= 32 and all(0x21 <= ord(c) <= 0x7E for c in session_id)


async def test_session_id_is_ignored_and_never_echoed(url: str) -> None:
    """streamable-http, Earlier Streamable HTTP Revisions: ignore Mcp-Session-Id; do not mint or
    echo session ids."""
    reply = await post(url, echo("session"), extra=[("Mcp-Session-Id", "abc")])
    assert text_of(result_of(reply)) == "session"
    assert "Mcp-Session-Id" not in reply.headers


async def test_last_event_id_is_ignored(url: str) -> None:
    """streamable-http, Earlier Streamable HTTP Revisions: Last-Event-ID is ignored; streams
    are not resumable."""
    reply = await post(url, echo("fresh"), extra=[("Last-Event-ID", "0")])
    assert text_of(result_of(reply)) == "fresh"


# --- origin and host (DNS rebinding) ----------------------------------------------------------


async def test_foreign_origin_is_forbidden(url: str) -> None:
    """streamable-http, Security & Endpoint 1: an invalid Origin gets 403."""
    reply = await post(url, echo(), extra=[("Origin", "http://evil.example")])
    assert_refused(reply, 403)


async def test_localhost_origin_is_accepted(url: str) -> None:
    """streamable-http, Security & Endpoint 1: a loopback Origin is valid for a local server."""
    reply = await post(url, echo("local"), extra=[("Origin", "http://localhost:1234")])
    assert text_of(result_of(reply)) == "local"


async def test_configured_origin_is_accepted(url: str) -> None:
    """streamable-http, Security & Endpoint 1: an origin in `allowed_origins` is valid."""
    reply = await post(url, echo("allowed"), extra=[("Origin", ALLOWED_ORIGIN)])
    assert text_of(result_of(reply)) == "allowed"


async def test_foreign_host_on_loopback_listener_is_forbidden(url: str) -> None:
    """streamable-http, Security & Endpoint (DNS rebinding): a loopback listener refuses a
    Host that names another machine."""
    reply = await post(url, echo(), extra=[("Host", "evil.example")])
    assert_refused(reply, 403)


async def test_configured_host_is_accepted(url: str) -> None:
    """streamable-http, Security & Endpoint: a host in `allowed_hosts` is accepted."""
    reply = await post(url, echo("host"), extra=[("Host", f"{ALLOWED_HOST}:8443")])
    assert text_of(result_of(reply)) == "host"


# --- response forms ---------------------------------------------------------------------------


async def test_plain_call_replies_with_a_json_object(url: str) -> None:
    """streamable-http, Sending Messages 6: a request is answered with application/json (or
    SSE); with nothing to stream, one JSON object."""
    reply = await post(url, echo("plain", id_="req-9"))
    assert reply.content_type == "application/json"
    assert text_of(result_of(reply, "req-9")) == "plain"


async def test_progress_is_streamed_as_sse_before_the_response(url: str) -> None:
    """streamable-http, Receiving Messages: an SSE stream (X-Accel-Buffering: no) carries the
    request's notifications, then its response."""
    body = call("slow", {"seconds": 0.3, "steps": 3}, id_=42, progressToken="my-token")
    reply = await post(url, body)
    assert reply.status == 200
    assert reply.content_type == "text/event-stream"
    assert reply.headers.get("X-Accel-Buffering") == "no"
    *notes, final = reply.events()
    assert len(notes) == 3
    for i, note in enumerate(notes, start=1):
        assert note["method"] == "notifications/progress"
        assert "id" not in note
        assert note["params"]["progressToken"] == "my-token"
        assert note["params"]["progress"] == i
    assert final["id"] == 42
    assert text_of(final["result"]) == "done"


async def test_concurrent_clients_with_the_same_id_get_their_own_replies(url: str) -> None:
    """basic/index, Requests: ids are per sender, so two clients both using id 1 over one
    stdio backend each get their own reply."""
    texts = [f"client-{i}" for i in range(6)]
    replies: dict[str, Reply] = {}

    async def one(text: str) -> None:
        replies[text] = await post(url, echo(text, id_=1))

    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            for text in texts:
                tg.start_soon(one, text)
    for text in texts:
        assert text_of(result_of(replies[text], 1)) == text


# --- the backend hop --------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    headers: CIMultiDict[str]
    body: dict[str, Any]


@pytest.fixture
async def recording_backend() -> AsyncIterator[tuple[str, list[Seen]]]:
    """A minimal HTTP MCP server that records every request and answers each with a result."""
    seen: list[Seen] = []

    async def handle(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append(Seen(CIMultiDict(request.headers), body))
        if "id" not in body:
            return web.Response(status=202)
        result = {"resultType": "complete", "content": [], "ttlMs": 0}
        if body["method"] == "server/discover":  # the era probe
            result = {"resultType": "complete", "supportedVersions": [VERSION], "capabilities": {}}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    app = web.Application()
    app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/mcp", seen
    finally:
        await runner.cleanup()


async def test_client_credentials_are_never_forwarded_to_the_backend(
    recording_backend: tuple[str, list[Seen]],
) -> None:
    """basic/authorization (token passthrough is forbidden) and streamable-http, Request
    Metadata: the backend gets the gateway's own mirrored headers and its configured static
    headers, never the client's credentials."""
    backend_url, seen = recording_backend
    backend = {"http": {"url": backend_url, "headers": {"X-Static": "yes"}}}
    async with Gateway(parse(gateway_config({"fake": backend}))) as gw:
        assert gw.http_url is not None
        credentials = [
            ("Authorization", "Bearer secret"),
            ("Cookie", "a=b"),
            ("Proxy-Authorization", "Basic c2VjcmV0"),
            ("X-Api-Key", "secret"),
        ]
        reply = await post(gw.http_url, echo("creds", id_=5), extra=credentials)
        assert result_of(reply, 5)["content"] == []
    calls = [s for s in seen if s.body.get("method") == "tools/call"]
    assert len(calls) == 1
    got = calls[0].headers
    for name in CREDENTIAL_HEADERS:
        assert name not in got, (name, got)
    assert not any("secret" in value for value in got.values()), got
    assert got.getall("Mcp-Method") == ["tools/call"]
    assert got.getall("Mcp-Name") == ["echo"]
    assert got.getall("MCP-Protocol-Version") == [VERSION]
    assert got.getall("X-Static") == ["yes"]
    for request_seen in seen:
        for name in CREDENTIAL_HEADERS:
            assert name not in request_seen.headers


# --- notifications and responses carry the mirrored headers too ----------------------------------


def notification(method: str = "notifications/cancelled") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": {"requestId": 1, "_meta": client_meta()}}


@pytest.mark.parametrize(
    ("replace", "omit"),
    [({"Mcp-Method": "tools/call"}, ()), ({"MCP-Protocol-Version": "2025-11-25"}, ())]
    + [({}, ("MCP-Protocol-Version",))],
    ids=["other-method", "other-version", "no-version"],
)
async def test_a_notification_with_mismatched_headers_is_header_mismatch(
    url: str, replace: dict[str, str], omit: tuple[str, ...]
) -> None:
    """streamable-http, Server Validation and Protocol Version Header: a notification POST is
    checked as a request is: MCP-Protocol-Version is required on every POST, and a mirrored
    header it carries must match its body (the old server accepted these with 202)."""
    reply = await post(url, notification(), replace=replace, omit=omit)
    assert_error(reply, 400, HEADER_MISMATCH, id_=None)


async def test_a_notification_without_mcp_method_is_accepted(url: str) -> None:
    """streamable-http, Standard Request Headers: Mcp-Method is required of requests; this
    revision defines no header requirements of notifications beyond the version."""
    reply = await post(url, notification(), omit=["Mcp-Method"])
    assert (reply.status, reply.body) == (202, b"")


@pytest.mark.parametrize(
    "headers",
    [[("Mcp-Method", "tools/call"), ("MCP-Protocol-Version", VERSION)], []],
    ids=["with-method", "no-version"],
)
async def test_a_posted_response_with_mismatched_headers_is_header_mismatch(
    url: str, headers: Headers
) -> None:
    """A response has no method to mirror, and MCP-Protocol-Version is required on every POST:
    a response failing either check is a header mismatch before it is refused as a response."""
    response = {"jsonrpc": "2.0", "id": 7, "result": {}}
    reply = await post(url, response, extra=headers)
    assert_error(reply, 400, HEADER_MISMATCH, id_=7)


# --- Origin and Host, parsed, on every path -------------------------------------------------


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/nowhere"])
@pytest.mark.parametrize(
    "header", [("Host", "evil.example"), ("Origin", "http://evil.example")], ids=["host", "origin"]
)
async def test_the_guard_covers_every_path_of_the_listener(
    url: str, path: str, header: tuple[str, str]
) -> None:
    """streamable-http, Security & Endpoint (DNS rebinding): a page on a rebound name could read
    /metrics and /healthz of a loopback listener as well as call /mcp, so the Origin and Host
    checks apply to every path (the old server answered the operator paths for any Host)."""
    other = url.rsplit("/", 1)[0] + path
    assert_refused(await send("GET", other, None, [header]), 403)
    if path != "/nowhere":
        assert (await send("GET", other, None, [])).status in (200, 503)


def raw(url: str) -> Serving:
    return Serving(port_of(url))


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example@127.0.0.1", 403),
        ("127.0.0.1@evil.example", 403),
        ("127.0.0.1:8080", 200),
        ("[::1]:8080", 200),
        ("[::1]", 200),
        ("localhost", 200),
        ("LOCALHOST:1", 200),
        ("::1", 403),
        ("127.0.0.1:80:80", 403),
        ("127.0.0.1:http", 403),
        ("gw.example", 200),
        ("evil.example", 403),
    ],
)
async def test_the_host_field_is_parsed_as_an_authority(url: str, host: str, status: int) -> None:
    """RFC 9110 7.2 (Host = uri-host [":" port]): userinfo is no part of a Host, so
    `evil.example@127.0.0.1` does not name 127.0.0.1 (the old server let it through); ports
    and bracketed IPv6 literals are understood; a malformed value is refused."""
    srv = raw(url)
    try:
        resp = await srv.exchange(mcp_request(echo_call("host"), host=host))
    finally:
        srv.abort_all()
    assert resp.status == status, resp.body


@pytest.mark.parametrize(
    ("authority", "status"),
    [("evil.example", 403), ("evil.example:80", 403), ("user@127.0.0.1", 403), ("{local}", 200)],
)
async def test_an_absolute_form_target_is_checked_against_the_allowed_hosts(
    url: str, authority: str, status: int
) -> None:
    """RFC 9112 3.2.2: with an absolute-form target the server ignores Host and takes the
    target's authority, so that is what is checked (the old server only routed by its path)."""
    srv = raw(url)
    authority = authority.replace("{local}", f"127.0.0.1:{srv.port}")
    try:
        data = mcp_request(echo_call("absolute"), target=f"http://{authority}/mcp")
        resp = await srv.exchange(data)
    finally:
        srv.abort_all()
    assert resp.status == status, resp.body
    if status == 200:
        assert resp.json()["result"]["content"][0]["text"] == "absolute"


# --- header values: OWS --------------------------------------------------------------------------


@pytest.mark.parametrize("padding", ["  ", "\t", " \t "])
async def test_mirrored_header_values_are_compared_without_surrounding_whitespace(
    url: str, padding: str
) -> None:
    """RFC 9110 5.5: whitespace around a field value is not part of it, so `Mcp-Name: echo  `
    matches the body's "echo" (the old server took the spaces as part of the name: 400)."""
    srv = raw(url)
    msg = echo_call("padded")
    try:
        data = mcp_request(msg, f"Mcp-Method:{padding}tools/call{padding}", mirror=False)
        data = data.replace(b"\r\n\r\n", f"\r\nMcp-Name: echo{padding}\r\n\r\n".encode(), 1)
        resp = await srv.exchange(data)
    finally:
        srv.abort_all()
    assert resp.json()["result"]["content"][0]["text"] == "padded"


# --- error bodies, codings, framing ---------------------------------------------------------------


async def test_a_client_chosen_coding_cannot_inject_json_members(url: str) -> None:
    """Error bodies are encoded as JSON, never assembled as text: a Content-Encoding value full
    of quotes is quoted in the message, and the reply has the members of an error, no more."""
    evil = 'x", "injected": true, "error": {"code": 1}, "y": "'
    reply = await post(url, echo(), extra=[("Content-Encoding", evil)])
    msg = assert_error(reply, 415, INVALID_REQUEST, id_=None)
    assert set(msg) == {"jsonrpc", "error"}
    assert set(msg["error"]) == {"code", "message"}
    assert evil in msg["error"]["message"]


@pytest.mark.parametrize(
    "data",
    [b"not gzip at all", gzip.compress(b'{"jsonrpc":"2.0"}')[:-8]],
    ids=["garbage", "no-trailer"],
)
async def test_a_corrupt_gzip_body_is_400(url: str, data: bytes) -> None:
    """A body that is not the gzip it says it is gets 400 with a JSON-RPC error (the old server
    handed the handler an empty body, answered 200)."""
    reply = await post(url, data, extra=[*mirrored(echo()), ("Content-Encoding", "gzip")])
    assert_error(reply, 400, INVALID_REQUEST, id_=None)


async def test_a_gzip_body_is_served(url: str) -> None:
    body = gzip.compress(orjson.dumps(echo("packed")))
    reply = await post(url, body, extra=[*mirrored(echo()), ("Content-Encoding", "gzip")])
    assert text_of(result_of(reply)) == "packed"


def chunked(
    msg: dict[str, Any], *extra: str, coding: str = "chunked", version: str = "1.1"
) -> bytes:
    """`msg` POSTed with a chunked body (its head says Transfer-Encoding: `coding`)."""
    head = mcp_request(msg, *extra, f"Transfer-Encoding: {coding}", version=version, body=None)
    return head + chunk(orjson.dumps(msg)) + b"0\r\n\r\n"


async def test_http_1_0_with_transfer_encoding_is_never_kept_alive(url: str) -> None:
    """RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing: the server
    answers it, then closes the connection, whatever keep-alive it asked for (aiohttp would keep
    it; the old server did)."""
    srv = raw(url)
    data = chunked(echo("old"), "Connection: keep-alive", version="1.0")
    try:
        client = await srv.connect()
        await client.send(data)
        resp = await client.response()
        assert resp.json()["result"]["content"][0]["text"] == "old"
        assert resp.closes
        assert await client.closed_by_server()
    finally:
        srv.abort_all()


@pytest.mark.parametrize(
    "lines",
    [["gzip, chunked"], ["gzip", "chunked"], ["chunked", "gzip"], ["chunked, chunked"]],
    ids=["gzip-chunked", "two-lines", "chunked-not-last", "chunked-twice"],
)
async def test_a_transfer_coding_other_than_chunked_is_not_processed(
    url: str, lines: list[str]
) -> None:
    """RFC 9112 6.1: a transfer coding the server does not understand gets 501 (or 400 where
    aiohttp's parser already finds the framing broken); `gzip, chunked` is not read as a request
    (aiohttp's parser frames it as chunked and would hand the gzip bytes on)."""
    srv = raw(url)
    first, *more = lines
    data = chunked(echo("coded"), *(f"Transfer-Encoding: {v}" for v in more), coding=first)
    try:
        client = await srv.connect()
        await client.send(data)
        resp = await client.response()
        assert resp.status in (400, 501)
        if resp.status == 501:
            assert resp.json()["error"]["code"] == INVALID_REQUEST
        assert await client.closed_by_server()
    finally:
        srv.abort_all()


async def test_ten_thousand_header_lines_in_one_read_are_refused(url: str) -> None:
    """The issue: 10,000 header lines (118 KB) arriving in one read were answered 200 by the old
    server; with the default max_headers they are refused, and the gateway goes on."""
    srv = raw(url)
    lines = [f"X-Filler-{i}: {i}" for i in range(10_000)]
    try:
        resp = await srv.exchange(mcp_request(echo(), *lines))
        assert resp.status in (400, 431)
    finally:
        srv.abort_all()
    assert text_of(result_of(await post(url, echo("after")))) == "after"


async def test_an_unknown_path_is_404_with_a_json_body(url: str) -> None:
    other = url.rsplit("/", 1)[0] + "/other"
    reply = await post(other, echo())
    assert_error(reply, 404, INVALID_REQUEST, id_=None)


async def test_bad_input_costs_no_traceback_in_any_log(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Bad input is at most one log line, never a traceback, aiohttp's loggers included: a
    garbage request, a head too large, a corrupt body, a body cut off by a disconnect."""
    caplog.set_level(logging.DEBUG)
    srv = raw(url)
    try:
        assert (await srv.exchange(b"\x16\x03\x01 not http\r\n\r\n")).status == 400
        assert (await srv.exchange(mcp_request(echo(), "X-Big: " + "a" * 9000))).status == 400
        corrupt = await srv.exchange(
            mcp_request(echo(), "Content-Encoding: deflate")[:-5] + b"zzzzz"
        )
        assert corrupt.status == 400
        cut = await srv.connect()
        await cut.send(mcp_request(echo())[:-10])
        await cut.close()
    finally:
        srv.abort_all()
    assert text_of(result_of(await post(url, echo("after")))) == "after"
    assert not [r for r in caplog.records if r.exc_info or r.exc_text], [
        (r.name, r.getMessage()) for r in caplog.records if r.exc_info
    ]
    assert not [r for r in caplog.records if r.name.startswith("aiohttp")]


async def test_a_client_closing_its_stream_cancels_the_request(url: str) -> None:
    """streamable-http, Cancellation: closing the response stream cancels the request, down to
    the backend (the SDK server's `hold` notes its cancellation; `was_cancelled` reports it)."""
    body = call("hold", {"key": "modern-gone"}, id_=31, progressToken="p")
    headers = [("Content-Type", "application/json"), ("Accept", ACCEPT), *mirrored(body)]
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(body), headers=headers) as resp,
        ):
            assert resp.content_type == "text/event-stream"
            async for line in resp.content:
                if line.startswith(b"data:"):
                    break
    reply = await post(url, call("was_cancelled", {"key": "modern-gone"}, id_=32))
    assert text_of(result_of(reply, 32)) == "cancelled"


@pytest.mark.parametrize("target", ["/m%63p", "/mcp?session=1", "/mcp?next=%2Fother"])
async def test_the_endpoint_is_found_by_its_decoded_path_without_the_query(
    url: str, target: str
) -> None:
    """RFC 9112 3.2.1 / RFC 3986 3.3-3.4: the route is the path before "?", percent-decoded."""
    srv = raw(url)
    try:
        resp = await srv.exchange(mcp_request(echo_call("routed"), target=target))
    finally:
        srv.abort_all()
    assert resp.json()["result"]["content"][0]["text"] == "routed"
