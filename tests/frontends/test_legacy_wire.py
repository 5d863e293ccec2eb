"""What a legacy (2025-11-25) HTTP session gets on the wire, beside what a modern client gets from
the same gateway: JSON-RPC errors as 200 with the error in the body, results without the modern
era's members, and resource subscriptions that never miss an update while they change.

2025-11-25 basic/transports (Sending Messages to the Server, Session Management: a 404 means the
session is gone), server/resources (Subscriptions); 2026-07-28 server/utilities/caching (`ttlMs`,
`cacheScope` are of the modern era) and basic/transports (the modern status table)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway import errors
from gateway.app import Gateway
from gateway.config import parse
from gateway.protocol import codes, meta
from tests.frontends.test_http_transport_rules import post, request
from tests.frontends.test_legacy_sessions import SESSION, in_session, legacy, open_session
from tests.support import BOUND, sdk_stdio_command, until

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def url() -> AsyncIterator[str]:
    command = sdk_stdio_command()
    text = yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"sdk": {"stdio": {"command": command[0], "args": command[1:]}}},
        }
    )
    async with Gateway(parse(text)) as gw:
        assert gw.http_url is not None
        yield gw.http_url


# --- statuses -----------------------------------------------------------------------------------

# Requests that fail with a JSON-RPC error the modern status table maps to 404 or 400.
FAILING = [
    ("no/such/method", {}, codes.METHOD_NOT_FOUND, 404),
    ("resources/read", {"uri": "nope://nothing"}, codes.INVALID_PARAMS, 400),
    # (legacy only: no modern counterpart)
    ("logging/setLevel", {"level": "loud"}, codes.INVALID_PARAMS, None),
]


@pytest.mark.parametrize(("method", "params", "code", "modern_status"), FAILING)
async def test_a_sessions_json_rpc_errors_travel_as_200(
    url: str, method: str, params: dict[str, Any], code: int, modern_status: int | None
) -> None:
    """In a session the error is in the body of a 200, as the servers of that era send it: a 404
    would tell the client its session is gone, and clients that throw on a 4xx lose the code.
    The same request from a modern client keeps the modern table's status."""
    session_id = await open_session(url)
    reply = await in_session(url, session_id, legacy(method, params, 7))
    assert reply.status == 200, reply.body
    assert reply.json()["error"]["code"] == code and reply.json()["id"] == 7
    # The session lives on: its next request is answered.
    assert "result" in (await in_session(url, session_id, legacy("ping", None, 8))).json()
    if modern_status is None:
        return
    modern = await post(url, request(method, params))
    assert modern.status == modern_status and modern.json()["error"]["code"] == code


def test_the_legacy_table_keeps_only_what_a_client_must_act_on() -> None:
    """A step-up (403 with its challenge), a rate limit (429) and overload (503, Retry-After)
    keep their statuses in a session; everything else is 200."""
    assert dict(errors.LEGACY_HTTP_STATUS) == {
        codes.INSUFFICIENT_SCOPE: 403,
        codes.RATE_LIMITED: 429,
        codes.GATEWAY_OVERLOADED: 503,
        codes.SHARED_STATE_UNAVAILABLE: 503,
    }
    for code in (codes.METHOD_NOT_FOUND, codes.INVALID_PARAMS, codes.PARSE_ERROR):
        failed = {"jsonrpc": "2.0", "id": 1, "error": {"code": code, "message": "x"}}
        assert errors.http_status(failed, errors.LEGACY_HTTP_STATUS) == 200
        assert errors.http_status(failed) != 200


# --- results ------------------------------------------------------------------------------------

MODERN_ONLY = {"resultType", "ttlMs", "cacheScope"}


@pytest.mark.parametrize("method", ["tools/list", "prompts/list", "resources/list"])
async def test_a_sessions_results_carry_no_modern_members(url: str, method: str) -> None:
    """`resultType` and the cache hints `ttlMs`/`cacheScope` are 2026-07-28 members: a legacy
    client gets the list without them; a modern client of the same gateway gets them."""
    session_id = await open_session(url)
    reply = await in_session(url, session_id, legacy(method, {}, 3))
    result = reply.json()["result"]
    assert MODERN_ONLY.isdisjoint(result), result
    modern = (await post(url, request(method))).json()["result"]
    assert set(modern) >= MODERN_ONLY


# --- subscriptions ------------------------------------------------------------------------------

A = "mem://a"
B = "mem://b"


@dataclass(eq=False)
class _Listen:
    uris: frozenset[str]
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class ListeningServer:
    """A modern MCP server on 127.0.0.1 whose resources can be subscribed to. When a listen
    arrives it first tells every listen already open that `A` changed (a change that happens
    while a client's subscriptions change), then acknowledges the new one only once the test
    says so."""

    def __init__(self) -> None:
        self.listens: list[_Listen] = []
        self.arrived: list[frozenset[str]] = []
        self.release = asyncio.Event()
        self.release.set()  # acknowledge at once until a test says otherwise

    async def handle(self, request: web.Request) -> web.StreamResponse:
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        method = msg["method"]
        if method == "subscriptions/listen":
            return await self._listen(request, msg)
        result: dict[str, Any]
        if method == "server/discover":
            result = {
                "supportedVersions": [meta.MODERN_VERSION],
                "capabilities": {"resources": {"subscribe": True}},
                "serverInfo": {"name": "listening", "version": "1"},
            }
        elif method == "resources/list":
            result = {"resources": [{"uri": A, "name": "a"}, {"uri": B, "name": "b"}]}
        elif method == "resources/templates/list":
            result = {"resourceTemplates": []}
        else:
            error = {"code": codes.METHOD_NOT_FOUND, "message": "Method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": msg["id"], "error": error})
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def _listen(self, request: web.Request, msg: dict[str, Any]) -> web.StreamResponse:
        wanted = msg["params"]["notifications"]
        uris = frozenset(wanted.get("resourceSubscriptions") or ())
        self.arrived.append(uris)
        for other in self.listens:
            if A in other.uris:
                await other.queue.put(_note(msg["id"], meta.RESOURCE_UPDATED, {"uri": A}))
        mine = _Listen(uris)
        self.listens.append(mine)
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        try:
            await self.release.wait()
            honoured = {"resourceSubscriptions": sorted(uris)}
            await _event(stream, _note(msg["id"], meta.ACKNOWLEDGED, {"notifications": honoured}))
            while True:
                await _event(stream, await mine.queue.get())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.listens.remove(mine)
        return stream


def _note(listen_id: object, method: str, params: dict[str, Any]) -> dict[str, Any]:
    ids = {meta.SUBSCRIPTION_ID: listen_id}
    return {"jsonrpc": "2.0", "method": method, "params": {**params, "_meta": ids}}


async def _event(stream: web.StreamResponse, msg: dict[str, Any]) -> None:
    await stream.write(b"data: " + orjson.dumps(msg) + b"\n\n")


@pytest.fixture
async def listening() -> AsyncIterator[tuple[ListeningServer, str]]:
    server = ListeningServer()
    app = web.Application()
    app.router.add_post("/mcp", server.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield server, f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()


async def test_a_change_while_the_subscriptions_change_is_not_lost(
    listening: tuple[ListeningServer, str],
) -> None:
    """resources/subscribe re-plans the session's watch (one modern listen). The watch it
    replaces keeps listening until the new one is acknowledged, so an update that happens in
    between reaches the session's GET stream; and the subscribe is answered only once the new
    watch is in place."""
    server, backend_url = listening
    text = yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"listening": {"http": {"url": backend_url}, "era": "modern"}},
        }
    )
    async with Gateway(parse(text)) as gw:
        url = gw.http_url
        assert url is not None
        session_id = await open_session(url)
        events = asyncio.Queue[dict[str, Any]]()

        async def read_events(stream: aiohttp.ClientResponse) -> None:
            async for line in stream.content:
                if line.startswith(b"data:"):
                    await events.put(orjson.loads(line[5:]))

        headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
        with anyio.fail_after(BOUND):
            async with (
                aiohttp.ClientSession() as http,
                http.get(url, headers=headers) as stream,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(read_events, stream)
                first = await in_session(url, session_id, legacy("resources/subscribe", {"uri": A}))
                assert first.json()["result"] == {}
                assert frozenset({A}) in server.arrived
                server.release.clear()  # the next listen's acknowledgement waits
                answered = asyncio.get_running_loop().create_task(
                    in_session(url, session_id, legacy("resources/subscribe", {"uri": B}, 2))
                )
                # Told to the watch that is being replaced, while its successor is not yet
                # acknowledged: the session hears it.
                event = await events.get()
                assert event == {
                    "jsonrpc": "2.0",
                    "method": "notifications/resources/updated",
                    "params": {"uri": A},
                }
                assert server.arrived[-1] == frozenset({A, B})
                assert not answered.done()  # the subscribe waits for its watch
                server.release.set()
                second = await answered
                assert second.json()["result"] == {}
                # The replaced watch has ended: one listen is left, asking for both.
                await until(lambda: len(server.listens) == 1)
                assert server.listens[0].uris == frozenset({A, B})
                tg.cancel_scope.cancel()
