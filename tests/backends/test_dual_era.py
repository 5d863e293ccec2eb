"""Both eras on one backend: the era follows the client (basic/versioning, Backward
Compatibility with Initialization-Based Versions; 2025-11-25 basic/transports, Session
Management). The SDK's own dual-era server is covered by the parity matrix
(test_legacy_clients.py, the server's requests mid-call); here a small dual-era HTTP server
shows what the SDK does not let a test observe: which backend session each request used, and
the DELETE when the client's session ends."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway.app import Gateway
from gateway.backends.era import layer as era_layer
from gateway.config import parse
from tests.frontends.test_http_transport_rules import post, send
from tests.frontends.test_legacy_sessions import SESSION, echo, in_session, open_session, result_of
from tests.support import BOUND, START_BOUND, call, serve_http

pytestmark = pytest.mark.anyio

IDLE = 0.5


class DualEraServer:
    """Answers `server/discover` (modern) and `initialize` (legacy, a new session each); a
    tool call returns the session it came on, or "modern"."""

    def __init__(self, legacy: bool = True) -> None:
        self.legacy = legacy
        self._ids = itertools.count(1)
        self.opened: list[str] = []
        self.deleted: list[str] = []
        self.initializes = 0
        self.gone = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        session = request.headers.get(SESSION)
        if request.method == "DELETE":
            assert session is not None
            self.deleted.append(session)
            self.gone.set()
            return web.Response(status=204)
        if request.method == "GET":
            return web.Response(status=405)
        body = orjson.loads(await request.read())
        if "id" not in body:
            return web.Response(status=202)
        method = body["method"]
        headers: dict[str, str] = {}
        result: dict[str, Any]
        if method == "server/discover":
            result = {
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "dual", "version": "1"}},
            }
        elif method == "initialize":
            self.initializes += 1
            if not self.legacy:
                error = {"code": -32022, "message": "initialize is not a 2026-07-28 method"}
                return web.json_response(
                    {"jsonrpc": "2.0", "id": body["id"], "error": error}, status=400
                )
            headers[SESSION] = f"s{next(self._ids)}"
            self.opened.append(headers[SESSION])
            result = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "dual", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}
        else:
            modern = "io.modelcontextprotocol/protocolVersion" in body["params"].get("_meta", {})
            text = "modern" if modern else f"session {session}"
            result = {"content": [{"type": "text", "text": text}]}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.json_response(reply, headers=headers)


@asynccontextmanager
async def gateway(server: DualEraServer, idle: float = 1800.0) -> AsyncIterator[str]:
    async with serve_http(server.handle) as backend_url:
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0, "session_idle_timeout": idle}},
                "backends": {"dual": {"http": {"url": f"{backend_url}/mcp"}}},
            }
        )
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            yield gw.http_url


def text(reply_result: dict[str, Any]) -> str:
    return str(reply_result["content"][0]["text"])


async def test_each_legacy_client_session_gets_its_own_backend_session() -> None:
    """A legacy client's calls go to the dual-era backend in the legacy era, on a backend
    session of that client's alone; a modern client's stay modern."""
    server = DualEraServer()
    async with gateway(server) as url:
        first = await open_session(url)
        second = await open_session(url)
        with anyio.fail_after(BOUND):
            one = text(result_of(await in_session(url, first, echo("x"))))
            two = text(result_of(await in_session(url, second, echo("x"))))
            again = text(result_of(await in_session(url, first, echo("x", id_=2)), 2))
            modern = await post(url, call(3, "echo", text="x"))
        assert one.startswith("session s") and two.startswith("session s") and one != two
        assert again == one  # the same backend session for the same client session
        assert len(server.opened) == 2
        assert text(result_of(modern, 3)) == "modern"


async def test_a_legacy_client_session_is_not_held_up_by_a_stream_nobody_opens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client session's backend session (a lane) follows no GET stream of its own, so its
    opening must not wait for one: with the wait for a session's stream made longer than the
    test's bound, the first call of a legacy client still comes back within it (it used to
    take the whole wait, a second by default, at every client session's first request)."""
    monkeypatch.setattr(era_layer, "STREAM_READY_WAIT", 60.0)
    server = DualEraServer()
    async with gateway(server) as url:
        session = await open_session(url)
        with anyio.fail_after(BOUND):
            reply = text(result_of(await in_session(url, session, echo("x"))))
        assert reply.startswith("session s") and len(server.opened) == 1


async def test_the_backend_session_ends_with_the_client_session() -> None:
    """Session Management: a backend session the gateway no longer needs is ended with
    DELETE, when the client's session ends."""
    server = DualEraServer()
    async with gateway(server) as url:
        session = await open_session(url)
        with anyio.fail_after(BOUND):
            used = text(result_of(await in_session(url, session, echo("x"))))
            deleted = await send("DELETE", url, None, [(SESSION, session)])
            assert deleted.status == 204
            await server.gone.wait()
        assert server.deleted == [used.removeprefix("session ")]


async def test_a_backend_session_ends_when_its_client_session_idles_out() -> None:
    """Session Management: the client session that expired (swept on the store's next use)
    takes its backend session with it."""
    server = DualEraServer()
    async with gateway(server, idle=IDLE) as url:
        session = await open_session(url)
        with anyio.fail_after(BOUND):
            used = text(result_of(await in_session(url, session, echo("x"))))
        # The thing under test is a timeout: wait it out, then use the store.
        await anyio.sleep(IDLE * 1.5)
        await open_session(url)
        with anyio.fail_after(BOUND):
            await server.gone.wait()
        assert server.deleted == [used.removeprefix("session ")]


async def test_backend_sessions_still_open_end_at_shutdown() -> None:
    server = DualEraServer()
    async with gateway(server) as url:
        session = await open_session(url)
        with anyio.fail_after(BOUND):
            used = text(result_of(await in_session(url, session, echo("x"))))
    assert server.deleted == [used.removeprefix("session ")]


async def test_a_modern_only_backend_keeps_serving_legacy_clients_in_its_era() -> None:
    """A backend that refuses `initialize` speaks only the modern era: legacy clients are
    served in it as before, and it is asked once, not on every request."""
    server = DualEraServer(legacy=False)
    async with gateway(server) as url:
        first = await open_session(url)
        second = await open_session(url)
        with anyio.fail_after(START_BOUND):
            assert text(result_of(await in_session(url, first, echo("x")))) == "modern"
            assert text(result_of(await in_session(url, second, echo("x")))) == "modern"
        assert server.initializes == 1
