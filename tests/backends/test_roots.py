"""Roots for legacy backends (client/roots, both revisions; basic/patterns/mrtr for modern
clients): a backend's `roots/list` is answered with the roots of the client whose request it
belongs to, and with the backend's configured `roots:` when asked outside any request, for a
client without the capability, or when it is not certain whose request it is for. Never an
error, never one client's roots for another's request.

The backend is tests/servers/roots_server.py (it asks at start-up, as server-filesystem does,
and inside a call); server-filesystem itself from npm is in test_roots_filesystem.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from aiohttp import web
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp_types import ErrorData, ListRootsResult, Root, TextContent

from gateway import config as gateway_config
from gateway.backends.era import questions
from gateway.protocol import codes
from tests.backends.test_legacy_backends import gateway, post, text_of
from tests.support import (
    BOUND,
    META,
    PYTHON,
    ROOT,
    START_BOUND,
    Message,
    call,
    messages,
    mirrored_headers,
    serve_http,
    stdio_backend,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ROOTS_SERVER = [PYTHON, str(ROOT / "tests" / "servers" / "roots_server.py")]
CLIENT_ROOTS = [{"uri": "file:///home/alice/project", "name": "Alice's project"}]
WITH_ROOTS = {**META, "io.modelcontextprotocol/clientCapabilities": {"roots": {}}}


def configured(tmp_path: Path) -> list[dict[str, str]]:
    return [{"uri": tmp_path.as_uri()}, {"uri": (tmp_path / "b").as_uri(), "name": "B"}]


def answer_of(reply: Message) -> dict[str, Any]:
    """What the roots server was told, from its tool's text."""
    told: dict[str, Any] = orjson.loads(text_of(reply))
    return told


def with_roots(msg: Message, **extra: Any) -> Message:
    msg["params"]["_meta"] = {**msg["params"]["_meta"], **WITH_ROOTS}
    msg["params"].update(extra)
    return msg


@asynccontextmanager
async def roots_gateway(roots: object) -> AsyncIterator[str]:
    backend = stdio_backend(ROOTS_SERVER, roots=roots)
    async with gateway(backend) as (_, url):
        yield url


# --- asked outside any request -------------------------------------------------------------


async def test_a_question_at_start_up_gets_the_configured_roots(tmp_path: Path) -> None:
    """Asked right after `notifications/initialized`, before any client's request."""
    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            reply = await post(url, call(1, "startup_roots"))
    assert answer_of(reply) == {"result": {"roots": configured(tmp_path)}}


async def test_without_configured_roots_the_answer_is_an_empty_list() -> None:
    async with gateway(stdio_backend(ROOTS_SERVER)) as (_, url):
        with anyio.fail_after(START_BOUND):
            reply = await post(url, call(1, "startup_roots"))
    assert answer_of(reply) == {"result": {"roots": []}}


# --- asked inside a client's request ---------------------------------------------------------


async def test_a_client_without_roots_gets_the_configured_roots_mid_call(tmp_path: Path) -> None:
    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            reply = await post(url, call(1, "ask_roots"))
    assert reply["result"]["resultType"] == "complete"
    assert answer_of(reply) == {"result": {"roots": configured(tmp_path)}}


async def roots_through_input_required(url: str) -> Message:
    """A modern client with roots calls ask_roots: the backend's roots/list comes back as an
    InputRequiredResult, and the retry carries CLIENT_ROOTS; the retry's reply."""
    first = await post(url, with_roots(call(1, "ask_roots")))
    result = first["result"]
    assert result["resultType"] == "input_required"
    ((key, question),) = result["inputRequests"].items()
    assert question["method"] == "roots/list"
    retry = with_roots(
        call(2, "ask_roots"),
        inputResponses={key: {"roots": CLIENT_ROOTS}},
        requestState=result["requestState"],
    )
    return await post(url, retry)


async def test_a_modern_client_with_roots_gets_input_required_and_its_retry_answers(
    tmp_path: Path,
) -> None:
    """client/roots (2026-07-28): the question travels in an InputRequiredResult; the retry's
    inputResponses carry the client's roots to the legacy backend's waiting request."""
    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            final = await roots_through_input_required(url)
    assert final["id"] == 2
    assert answer_of(final) == {"result": {"roots": CLIENT_ROOTS}}


async def test_a_legacy_client_is_asked_for_its_own_roots(tmp_path: Path) -> None:
    """client/roots (2025-11-25): the legacy client gets a real `roots/list` request on its
    session and its answer reaches the backend."""
    asked: list[str] = []

    async def list_roots(context: ClientRequestContext) -> ListRootsResult | ErrorData:
        asked.append("roots/list")
        return ListRootsResult(roots=[Root.model_validate(root) for root in CLIENT_ROOTS])

    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            async with Client(url, mode="legacy", list_roots_callback=list_roots) as client:
                result = await client.call_tool("ask_roots", {})
    assert asked == ["roots/list"]
    content = result.content[0]
    assert isinstance(content, TextContent)
    assert orjson.loads(content.text) == {"result": {"roots": CLIENT_ROOTS}}


async def test_a_legacy_client_without_roots_gets_the_configured_ones(tmp_path: Path) -> None:
    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            async with Client(url, mode="legacy") as client:
                result = await client.call_tool("ask_roots", {})
    content = result.content[0]
    assert isinstance(content, TextContent)
    assert orjson.loads(content.text) == {"result": {"roots": configured(tmp_path)}}


async def test_with_several_requests_in_flight_the_configured_roots_are_given(
    tmp_path: Path,
) -> None:
    """A shared stdio child's question names no request: with two clients' calls in flight it
    is not certain whose it is, so neither client's roots are used (and neither is asked)."""
    async with roots_gateway(configured(tmp_path)) as url, aiohttp.ClientSession() as http:
        with anyio.fail_after(START_BOUND):
            assert "result" in await post(url, call(0, "startup_roots"))  # started
        parked = with_roots(call(1, "park", token="p"))
        with anyio.fail_after(BOUND):
            async with http.post(
                url, data=orjson.dumps(parked), headers=mirrored_headers(parked)
            ) as resp:
                stream = messages(resp)
                progress = await anext(stream)  # the park call is in flight on the child
                assert progress["method"] == "notifications/progress"
                other = await post(url, with_roots(call(2, "ask_roots")))
                released = [m async for m in stream if "method" not in m]
    assert other["result"]["resultType"] == "complete"  # not input_required: nobody asked
    assert answer_of(other) == {"result": {"roots": configured(tmp_path)}}
    assert answer_of(released[0]) == {"released": True}


async def test_a_question_on_the_gateways_own_request_gets_the_configured_roots(
    tmp_path: Path,
) -> None:
    """A request asking for logs makes the gateway send the legacy backend `logging/setLevel`
    first; a question asked while that is the one request in flight is the gateway's to answer
    (configured roots), not left unanswered, and not the client's to see."""
    async with roots_gateway(configured(tmp_path)) as url:
        with anyio.fail_after(START_BOUND):
            assert "result" in await post(url, call(0, "startup_roots"))  # started
        logged = with_roots(call(1, "level_roots"))
        logged["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "debug"
        with anyio.fail_after(BOUND):
            reply = await post(url, logged)
    assert reply["result"]["resultType"] == "complete"
    assert answer_of(reply) == {"result": {"roots": configured(tmp_path)}}


def test_the_gateways_own_answers() -> None:
    """ping and roots/list are answered alone; elicitation and sampling only a client can."""
    roots = (gateway_config.Root("file:///a"), gateway_config.Root("file:///b", "B"))
    ask: Message = {"jsonrpc": "2.0", "id": 7, "method": "roots/list"}
    assert questions.unattended(ask, roots) == {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"roots": [{"uri": "file:///a"}, {"uri": "file:///b", "name": "B"}]},
    }
    assert questions.unattended({**ask, "method": "ping"}, ())["result"] == {}  # type: ignore[index]
    elicit = {**ask, "method": "elicitation/create"}
    assert questions.unattended(elicit, roots) is None
    refused = questions.refuse_unattended(elicit, roots, "only a client")
    assert refused["error"]["code"] == codes.METHOD_NOT_FOUND


# --- a legacy HTTP backend ---------------------------------------------------------------


async def test_an_http_backend_gets_configured_roots_on_its_get_stream_and_a_clients_in_a_call(
    tmp_path: Path,
) -> None:
    """2025-11-25 transports, Listening for Messages from the Server: a question on the GET
    stream belongs to no request (configured roots); one on a call's reply stream is that
    call's (the modern client with roots gets input_required, its retry answers)."""
    answers: dict[str, asyncio.Future[Message]] = {}
    loop = asyncio.get_running_loop()

    def waiting(qid: str) -> asyncio.Future[Message]:
        return answers.setdefault(qid, loop.create_future())

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            question = {"jsonrpc": "2.0", "id": "on-get", "method": "roots/list"}
            await resp.write(b"data: " + orjson.dumps(question) + b"\n\n")
            await waiting("on-get")
            await asyncio.Event().wait()  # open until the gateway goes (then cancelled)
            return resp
        if request.method == "DELETE":
            return web.Response(status=204)
        body = orjson.loads(await request.read())
        session = {"Mcp-Session-Id": "s1"}
        if "method" not in body:  # an answer to one of our questions
            waiting(str(body["id"])).set_result(body)
            return web.Response(status=202, headers=session)
        method = body["method"]
        if "id" not in body:
            return web.Response(status=202, headers=session)
        if method == "server/discover":
            error = {"code": -32601, "message": "Method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": body["id"], "error": error})
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake-roots", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "ask_roots", "inputSchema": {"type": "object"}}]}
        else:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **session})
            await resp.prepare(request)
            question = {"jsonrpc": "2.0", "id": "in-call", "method": "roots/list"}
            await resp.write(b"data: " + orjson.dumps(question) + b"\n\n")
            told = await waiting("in-call")
            text = orjson.dumps({k: v for k, v in told.items() if k in ("result", "error")})
            result = {"content": [{"type": "text", "text": text.decode()}]}
            reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
            await resp.write(b"data: " + orjson.dumps(reply) + b"\n\n")
            return resp
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.json_response(reply, headers=session)

    async with (
        serve_http(handler) as base,
        gateway({"http": {"url": f"{base}/mcp"}, "roots": configured(tmp_path)}) as (_, url),
    ):
        with anyio.fail_after(BOUND):
            final = await roots_through_input_required(url)
            on_get = await waiting("on-get")
    assert on_get["result"] == {"roots": configured(tmp_path)}
    assert answer_of(final) == {"result": {"roots": CLIENT_ROOTS}}
