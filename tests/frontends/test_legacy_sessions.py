"""Legacy sessions on the Streamable HTTP front end, over raw HTTP (2025-11-25 basic/transports,
Session Management and Protocol Version Header; 2026-07-28 basic/versioning, Backward
Compatibility). The backend is the SDK test server over stdio."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import anyio
import anyio.abc
import orjson
import pytest
import yaml

from gateway.app import Gateway
from gateway.config import parse
from gateway.frontends.legacy import stores as sessions
from tests.frontends.test_http_transport_rules import (
    ACCEPT,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    Reply,
    post,
    request,
    send,
)
from tests.support import BOUND, START_BOUND, sdk_stdio_command

pytestmark = pytest.mark.anyio

SESSION = "Mcp-Session-Id"
GATEWAY_OVERLOADED = -31004
IDLE = 0.5


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def config(idle: float = 1800.0) -> str:
    command = sdk_stdio_command()
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0, "session_idle_timeout": idle}},
            "backends": {"sdk": {"stdio": {"command": command[0], "args": command[1:]}}},
        }
    )


@pytest.fixture(scope="module")
async def url() -> AsyncIterator[str]:
    async with Gateway(parse(config())) as gw:
        assert gw.http_url is not None
        yield gw.http_url


def legacy(method: str, params: dict[str, Any] | None = None, id_: int = 1) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def initialize(version: str = "2025-11-25") -> dict[str, Any]:
    return legacy(
        "initialize",
        {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "legacy-test", "version": "1"},
        },
        id_=0,
    )


async def open_session(
    url: str, extra: Sequence[tuple[str, str]] = (), version: str = "2025-11-25"
) -> str:
    with anyio.fail_after(START_BOUND):
        reply = await post(url, initialize(version), mirror=False, extra=extra, bound=None)
    assert reply.status == 200, reply.body
    session_id: str = reply.headers[SESSION]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    accepted = await post(url, initialized, mirror=False, extra=[(SESSION, session_id), *extra])
    assert accepted.status == 202
    return session_id


async def in_session(
    url: str, session_id: str, msg: dict[str, Any], extra: Sequence[tuple[str, str]] = ()
) -> Reply:
    return await post(url, msg, mirror=False, extra=[(SESSION, session_id), *extra])


def result_of(reply: Reply, id_: int = 1) -> dict[str, Any]:
    assert reply.status == 200, (reply.status, reply.body)
    msg = reply.json() if reply.content_type == "application/json" else reply.events()[-1]
    assert msg.get("id") == id_ and "error" not in msg, msg
    result: dict[str, Any] = msg["result"]
    return result


def echo(text: str, id_: int = 1) -> dict[str, Any]:
    return legacy("tools/call", {"name": "echo", "arguments": {"text": text}}, id_)


# --- opening a session --------------------------------------------------------------------------


async def test_initialize_mints_a_session_that_serves_requests(url: str) -> None:
    """Session Management 1-2: the id comes with the InitializeResult; requests carrying it are
    served (no Mcp-Method/Mcp-Name headers: those are modern)."""
    session_id = await open_session(url)
    assert len(session_id) >= 32 and all(0x21 <= ord(c) <= 0x7E for c in session_id)
    assert result_of(await in_session(url, session_id, echo("in session")))["content"][0][
        "text"
    ] == ("in session")
    tools = result_of(await in_session(url, session_id, legacy("tools/list", {}, 2)), 2)
    assert "echo" in {t["name"] for t in tools["tools"]}


async def test_a_legacy_client_sees_no_modern_result_fields(url: str) -> None:
    """2025-11-25 results have no `resultType` and no modern `_meta` keys (serverInfo and the
    like belong to 2026-07-28): the modern backend's are taken out on the way to a legacy
    client, which sees its own era only."""
    session_id = await open_session(url)
    for id_, msg in enumerate((echo("plain"), legacy("tools/list", {}), legacy("ping")), 1):
        msg["id"] = id_
        result = result_of(await in_session(url, session_id, msg), id_)
        assert "resultType" not in result, result
        assert not any(k.startswith("io.modelcontextprotocol/") for k in result.get("_meta", {}))


async def test_each_initialize_gets_its_own_session(url: str) -> None:
    assert await open_session(url) != await open_session(url)


@pytest.mark.parametrize(
    ("asked", "answered"),
    [("2025-11-25", "2025-11-25"), ("2025-06-18", "2025-06-18"), ("2024-01-01", "2025-11-25")],
)
async def test_version_negotiation(url: str, asked: str, answered: str) -> None:
    """basic/lifecycle, Version Negotiation: a supported version is echoed; otherwise the server
    answers with the latest it supports."""
    reply = await post(url, initialize(asked), mirror=False)
    assert reply.json()["result"]["protocolVersion"] == answered


async def test_capabilities_are_the_merged_servers(url: str) -> None:
    """The InitializeResult advertises what the backends offer, change notifications and
    resource subscriptions included (the gateway relays them to the session); `extensions` only
    when a backend declares one (this one declares none; tests/core/test_apps.py: one that does)."""
    caps = (await post(url, initialize(), mirror=False)).json()["result"]["capabilities"]
    assert "tools" in caps and "resources" in caps and "prompts" in caps
    assert "extensions" not in caps


async def test_a_legacy_request_without_a_session_is_400(url: str) -> None:
    """Session Management 2: requests other than initialize without the session header are
    refused with 400 (here: it lacks the modern fields too)."""
    reply = await post(url, echo("nobody"), mirror=False)
    assert reply.status == 400


async def test_initialize_inside_a_session_is_refused(url: str) -> None:
    session_id = await open_session(url)
    reply = await in_session(url, session_id, initialize())
    assert reply.status == 400
    assert reply.json()["error"]["code"] == INVALID_REQUEST


# --- ending a session ---------------------------------------------------------------------------


async def test_unknown_session_is_404_for_every_method(url: str) -> None:
    """Session Management 3: a request with an id the server does not know gets 404."""
    assert (await in_session(url, "no-such-session", echo("x"))).status == 404
    headers = [(SESSION, "no-such-session"), ("Accept", ACCEPT)]
    assert (await send("GET", url, None, headers)).status == 404
    assert (await send("DELETE", url, None, headers)).status == 404


async def test_delete_ends_the_session(url: str) -> None:
    """Session Management 5: DELETE terminates the session; the id is then unknown (404)."""
    session_id = await open_session(url)
    deleted = await send("DELETE", url, None, [(SESSION, session_id)])
    assert deleted.status == 204
    assert (await in_session(url, session_id, echo("after"))).status == 404


@pytest.mark.slow
async def test_an_idle_session_expires() -> None:
    """Session Management 3: the server may end a session; one idle past
    `session_idle_timeout` is ended, and its id gets 404."""
    async with Gateway(parse(config(idle=IDLE))) as gw:
        assert gw.http_url is not None
        with anyio.fail_after(START_BOUND):
            # Ready first: a session opened while the backend starts could idle out meanwhile.
            await gw.catalogs_loaded.wait()
        session_id = await open_session(gw.http_url)
        assert result_of(await in_session(gw.http_url, session_id, echo("alive")))
        # The thing under test is a timeout: wait it out (no request meanwhile, which would
        # count as use), then the next request finds the session gone.
        await anyio.sleep(IDLE * 1.5)
        reply = await in_session(gw.http_url, session_id, legacy("ping"))
        assert reply.status == 404


@pytest.mark.slow
async def test_sessions_beyond_the_limit_are_refused_until_one_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each session holds a listen on the backends: past MAX_SESSIONS open ones, `initialize`
    gets 503 with the gateway's overload error, until a session ends."""
    monkeypatch.setattr(sessions, "MAX_SESSIONS", 2)
    async with Gateway(parse(config())) as gw:
        assert gw.http_url is not None
        first = await open_session(gw.http_url)
        await open_session(gw.http_url)
        refused = await post(gw.http_url, initialize(), mirror=False)
        assert refused.status == 503
        assert refused.json()["error"]["code"] == GATEWAY_OVERLOADED
        assert refused.headers["Retry-After"] == "5"  # (sessions end on no schedule)
        assert SESSION not in refused.headers
        assert (await send("DELETE", gw.http_url, None, [(SESSION, first)])).status == 204
        await open_session(gw.http_url)


async def test_a_session_is_bound_to_the_credentials_that_opened_it(url: str) -> None:
    """security best practices, Session Hijacking: an id alone does not open someone else's
    session; with other credentials it is unknown (404)."""
    mine = [("Authorization", "Bearer mine")]
    session_id = await open_session(url, extra=mine)
    theirs = await in_session(url, session_id, echo("x"), extra=[("Authorization", "Bearer x")])
    assert theirs.status == 404
    assert (await in_session(url, session_id, echo("x"))).status == 404  # none is not mine
    assert result_of(await in_session(url, session_id, echo("ok"), extra=mine))


# --- headers and methods ------------------------------------------------------------------------


async def test_an_unsupported_protocol_version_header_is_400(url: str) -> None:
    """Protocol Version Header: an invalid or unsupported MCP-Protocol-Version gets 400; the
    negotiated one is accepted."""
    session_id = await open_session(url)
    bad = await in_session(url, session_id, echo("x"), [("MCP-Protocol-Version", "1999-01-01")])
    assert bad.status == 400
    good = await in_session(url, session_id, echo("y"), [("MCP-Protocol-Version", "2025-11-25")])
    assert result_of(good)


async def test_ping_and_set_level_are_answered_in_a_session(url: str) -> None:
    """basic/utilities/ping and server/utilities/logging (legacy era)."""
    session_id = await open_session(url)
    assert result_of(await in_session(url, session_id, legacy("ping"))) == {}
    set_level = legacy("logging/setLevel", {"level": "warning"})
    assert result_of(await in_session(url, session_id, set_level)) == {}
    loud = legacy("logging/setLevel", {"level": "loud"})
    assert (await in_session(url, session_id, loud)).json()["error"]["code"] == INVALID_PARAMS


async def test_a_modern_request_for_a_legacy_method_is_method_not_found(url: str) -> None:
    """2026-07-28: ping and logging/setLevel are not methods of the modern era."""
    for method in ("ping", "logging/setLevel"):
        reply = await post(url, request(method))
        assert reply.json()["error"]["code"] == METHOD_NOT_FOUND


async def test_a_modern_request_ignores_a_session_header(url: str) -> None:
    """A request with modern `_meta` is served statelessly, whatever session id it carries."""
    msg = request("tools/call", {"name": "echo", "arguments": {"text": "modern"}})
    reply = await post(url, msg, extra=[(SESSION, "whatever")])
    assert reply.json()["result"]["content"][0]["text"] == "modern"


async def test_client_notifications_and_responses_are_accepted(url: str) -> None:
    """Sending Messages 4: notifications and responses get 202 with no body."""
    session_id = await open_session(url)
    note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    assert (await in_session(url, session_id, note)).status == 202
    response = {"jsonrpc": "2.0", "id": 99, "result": {}}
    assert (await in_session(url, session_id, response)).status == 202


async def test_cancelled_notification_ends_a_request_in_flight(url: str) -> None:
    """basic/utilities/cancellation (legacy): notifications/cancelled for a request of the
    session stops it; its POST is answered at once instead of after the 30 s call. The first
    progress event shows the call is running before the cancellation is sent."""
    session_id = await open_session(url)
    slow = legacy(
        "tools/call",
        {"name": "slow", "arguments": {"seconds": 30, "steps": 300}, "_meta": {"progressToken": 1}},
        7,
    )
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "test"},
    }
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, SESSION: session_id}
    events: list[dict[str, Any]] = []
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=orjson.dumps(slow), headers=headers) as resp,
        ):
            assert resp.content_type == "text/event-stream"
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                events.append(orjson.loads(line[5:]))
                if len(events) == 1:
                    assert events[0]["method"] == "notifications/progress"
                    assert (await in_session(url, session_id, cancel)).status == 202
    assert "error" in events[-1] and events[-1]["id"] == 7


# --- the GET stream -----------------------------------------------------------------------------


async def test_get_opens_the_session_stream_until_the_session_ends(url: str) -> None:
    """Listening for Messages from the Server: GET with the session opens an SSE stream (one at
    a time: a second gets 409); DELETE ends the session and the stream with it."""
    session_id = await open_session(url)
    headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as http,
            http.get(url, headers=headers) as stream,
        ):
            assert stream.status == 200
            assert stream.content_type == "text/event-stream"
            assert (await stream.content.readline()).startswith(b":")  # a keep-alive comment
            second = await send("GET", url, None, headers)
            assert second.status == 409
            assert (await send("DELETE", url, None, [(SESSION, session_id)])).status == 204
            rest = await stream.content.read()
            assert b"data:" not in rest


async def test_changes_reach_the_session_stream(url: str) -> None:
    """server/tools and server/resources, List Changed and Subscriptions (legacy): a list
    change of a backend reaches the session's GET stream as notifications/tools/list_changed,
    and after resources/subscribe an update of that resource as notifications/resources/updated
    (no modern subscription id). The gateway holds one modern subscriptions/listen for it."""
    session_id = await open_session(url)
    headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](16)

    async def read_events(stream: aiohttp.ClientResponse) -> None:
        async for line in stream.content:
            if line.startswith(b"data:"):
                await send.send(orjson.loads(line[5:]))

    touch = legacy("tools/call", {"name": "touch", "arguments": {"uri": "mem://greeting"}})
    with anyio.fail_after(BOUND):
        async with (
            send,
            receive,
            aiohttp.ClientSession() as http,
            http.get(url, headers=headers) as stream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(read_events, stream)
            subscribe = legacy("resources/subscribe", {"uri": "mem://greeting"}, 2)
            assert result_of(await in_session(url, session_id, subscribe), 2) == {}
            # The watch restarts with the new subscription; touch until an update comes.
            event: dict[str, Any] | None = None
            while event is None:
                assert result_of(await in_session(url, session_id, touch))
                with anyio.move_on_after(0.2):
                    event = await receive.receive()
            assert event == {
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"uri": "mem://greeting"},
            }
            change = legacy("tools/call", {"name": "change_tools", "arguments": {}}, 3)
            assert result_of(await in_session(url, session_id, change), 3)
            while event["method"] == "notifications/resources/updated":  # late touches
                event = await receive.receive()
            assert event["method"] == "notifications/tools/list_changed"
            assert "_meta" not in event.get("params", {})
            tg.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_disconnect_does_not_cancel_a_legacy_request(url: str) -> None:
    """2025-11-25 transports, Sending Messages to the Server: disconnection SHOULD NOT be taken
    for the client cancelling its request. The listener cancels a modern request whose client
    leaves; a legacy one runs on in its session: the backend's `hold` is still not cancelled
    when `was_cancelled` has waited its 5 s for it."""
    session_id = await open_session(url)
    hold = legacy(
        "tools/call",
        {"name": "hold", "arguments": {"key": "legacy-gone"}, "_meta": {"progressToken": 1}},
        8,
    )
    headers = {"Content-Type": "application/json", "Accept": ACCEPT, SESSION: session_id}
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as http,
            http.post(url, data=orjson.dumps(hold), headers=headers) as resp,
        ):
            assert resp.content_type == "text/event-stream"
            async for line in resp.content:
                if line.startswith(b"data:"):
                    assert orjson.loads(line[5:])["method"] == "notifications/progress"
                    break
    # The connection is gone (the session closed it with the response unread).
    probe = legacy("tools/call", {"name": "was_cancelled", "arguments": {"key": "legacy-gone"}}, 9)
    extra = [(SESSION, session_id)]
    reply = await post(url, probe, mirror=False, extra=extra, bound=BOUND + 2)
    assert result_of(reply, 9)["content"][0]["text"] == "not cancelled"
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 8, "reason": "done"},
    }
    assert (await in_session(url, session_id, cancel)).status == 202


@pytest.mark.slow
async def test_shutdown_ends_a_session_stream_gracefully() -> None:
    """A stopping gateway ends a session's GET stream as a response ends (its last chunk, not a
    cut connection), before it ends the sessions."""
    stop = anyio.Event()
    stopped = anyio.Event()

    async def serve(*, task_status: anyio.abc.TaskStatus[str]) -> None:
        try:
            async with Gateway(parse(config())) as gw:
                assert gw.http_url is not None
                task_status.started(gw.http_url)
                await stop.wait()
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg, aiohttp.ClientSession() as http:
        with anyio.fail_after(START_BOUND):
            gateway_url: str = await tg.start(serve)
        session_id = await open_session(gateway_url)
        headers = [(SESSION, session_id), ("Accept", "text/event-stream")]
        with anyio.fail_after(BOUND):
            async with http.get(gateway_url, headers=headers) as stream:
                assert (await stream.content.readline()).startswith(b":")
                stop.set()
                rest = await stream.read()  # raises if the body is cut short
            await stopped.wait()
    assert b"data:" not in rest
