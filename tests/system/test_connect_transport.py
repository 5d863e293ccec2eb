"""`connect URL --transport auto|http|sse` (2025-11-25 and 2026-07-28 basic/transports, Backward
Compatibility, for clients): auto tries Streamable HTTP and falls back to the 2024-11-05 HTTP+SSE
transport when the POST is answered 404/405 without a JSON-RPC error. Real servers throughout:
the SDK's Streamable HTTP and SSE servers, and small aiohttp servers for the refusals."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import orjson
import pytest
from aiohttp import web

from gateway.backends import fallback
from gateway.config import BackendConfig, HttpTarget, SseTarget
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from tests.support import PYTHON, Proc, call, dead_url, request, serve_http

pytestmark = pytest.mark.anyio


def remote(url: str) -> BackendConfig:
    return BackendConfig(name="remote", target=HttpTarget(url=url, headers={"X-Team": "blue"}))


@pytest.mark.parametrize(
    ("status", "body", "legacy"),
    [
        (404, b"Not Found", True),
        (405, b"", True),
        (404, b'{"jsonrpc":"2.0","id":"x","error":{"code":-32601,"message":"no"}}', False),
        (400, b"Bad Request", False),
        (200, b'{"jsonrpc":"2.0","id":"x","result":{}}', False),
        (401, b"", False),
    ],
)
def test_only_a_404_or_405_without_a_jsonrpc_error_means_http_sse(
    status: int, body: bytes, legacy: bool
) -> None:
    assert fallback.is_legacy_refusal(status, body) is legacy


def test_the_sse_form_keeps_the_url_headers_and_limits() -> None:
    config = fallback.as_sse(remote("http://127.0.0.1:1/sse"))
    assert isinstance(config.target, SseTarget)
    assert config.target.url == "http://127.0.0.1:1/sse"
    assert dict(config.target.headers) == {"X-Team": "blue"}
    assert config.name == "remote" and config.era == "legacy"


async def test_auto_settles_on_http_sse_for_the_sdks_sse_server(
    sdk_sse: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "gateway.backend"):
        settled = await fallback.settle(remote(sdk_sse))
    assert isinstance(settled.target, SseTarget) and settled.target.url == sdk_sse
    assert [r.message for r in caplog.records if "transport:" in r.message] == [
        f"backend remote: transport: HTTP+SSE (2024-11-05); the POST to {sdk_sse} was "
        "answered HTTP 405"
    ]


async def test_auto_keeps_streamable_http_for_the_sdks_http_server(
    sdk_http: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, "gateway.backend"):
        settled = await fallback.settle(remote(sdk_http))
    assert isinstance(settled.target, HttpTarget)
    assert sum("transport: Streamable HTTP" in r.message for r in caplog.records) == 1


async def test_auto_keeps_streamable_http_for_a_2025_era_http_server(sdk_legacy_http: str) -> None:
    """A legacy-era Streamable HTTP server refuses `server/discover` with a JSON-RPC error: it
    is still Streamable HTTP (its era is the era layer's business)."""
    settled = await fallback.settle(remote(sdk_legacy_http))
    assert isinstance(settled.target, HttpTarget) and settled.era == "auto"


async def test_a_modern_404_for_an_unknown_method_never_tries_sse() -> None:
    seen: list[str] = []

    async def modern(request: web.Request) -> web.Response:
        seen.append(request.method)
        error = {"jsonrpc": "2.0", "id": "x", "error": {"code": -32601, "message": "no"}}
        return web.json_response(error, status=404)

    async with serve_http(modern) as base:
        settled = await fallback.settle(remote(f"{base}/mcp"))
    assert isinstance(settled.target, HttpTarget)
    assert seen == ["POST"]  # no GET for an SSE stream


async def test_a_redirect_is_not_followed() -> None:
    """Followed, it would reach a 404 elsewhere and be taken for HTTP+SSE (THREAT_MODEL.md)."""
    seen: list[str] = []

    async def moved(request: web.Request) -> web.Response:
        seen.append(request.path)
        raise web.HTTPTemporaryRedirect("/elsewhere")

    async with serve_http(moved) as base:
        settled = await fallback.settle(remote(f"{base}/mcp"))
    assert isinstance(settled.target, HttpTarget)
    assert seen == ["/mcp"]


async def test_a_server_not_reached_stays_streamable_http(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "gateway.backend"):
        settled = await fallback.settle(remote(dead_url()))
    assert isinstance(settled.target, HttpTarget)
    assert any("not reached" in r.message for r in caplog.records)


@contextmanager
def connect(*args: str) -> Iterator[Proc]:
    proc = Proc([PYTHON, "-m", "gateway", "connect", *args], stdin=True)
    try:
        yield proc
    finally:
        proc.stop()


def discover(proc: Proc) -> Message:
    """What a modern client asks first (basic/versioning): the gateway answers for its backend."""
    return ask(proc, request("discover", "server/discover"))


def ask(proc: Proc, msg: Message) -> Message:
    assert proc.popen.stdin is not None
    proc.popen.stdin.write(orjson.dumps(msg) + b"\n")
    proc.popen.stdin.flush()
    line = proc.wait_for(rf'"id":{orjson.dumps(msg["id"]).decode()}[,}}]', stream="stdout")
    reply: Message = orjson.loads(line.string)
    return reply


@pytest.mark.slow
def test_connect_auto_reaches_an_http_sse_server_and_says_so(sdk_sse: str) -> None:
    with connect(sdk_sse) as proc:
        assert "result" in discover(proc)
        reply = ask(proc, call(1, "echo", text="through"))
        assert reply["result"]["content"][0]["text"] == "through", (reply, proc.output())
        proc.wait_for(r"backend remote: transport: HTTP\+SSE")


@pytest.mark.slow
def test_connect_transport_http_to_an_sse_server_fails_with_an_error_code(sdk_sse: str) -> None:
    """With --wait the start goes on, and each request fails with its code (without it, the
    start ends at once: tests/cli/test_first_hour.py)."""
    with connect(sdk_sse, "--transport", "http", "--wait") as proc:
        reply = ask(proc, call(1, "echo", text="through"))
        assert reply["error"]["code"] == codes.BACKEND_UNAVAILABLE, reply
        assert not any("transport:" in line for line in proc.lines["stderr"])


@pytest.mark.slow
def test_connect_transport_sse_needs_no_probe(sdk_sse: str) -> None:
    with connect(sdk_sse, "--transport", "sse") as proc:
        assert "result" in discover(proc)
        reply = ask(proc, call(1, "echo", text="through"))
        assert reply["result"]["content"][0]["text"] == "through", reply
