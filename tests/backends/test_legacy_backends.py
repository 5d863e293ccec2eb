"""Legacy backends behind the gateway (basic/versioning, Backward Compatibility with
Initialization-Based Versions; transports/stdio and streamable-http, Backward Compatibility).

The parity suites (test_parity.py: modern clients; test_legacy_clients.py: legacy clients) run
every pairing against the SDK server made legacy-only and against the HTTP+SSE transport too.
Here: the era probe and its pin, the session kept alive across restarts and expiry, and the
sealed `requestState` of a held call (basic/patterns/mrtr)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web

from gateway import config as gateway_config
from gateway.app import Gateway
from gateway.backends.era import held, listen, probe, translate
from gateway.protocol import codes, sse
from tests.support import (
    BOUND,
    META,
    START_BOUND,
    Message,
    call,
    messages,
    mirrored_headers,
    request,
    sdk_stdio_command,
    serve_http,
    start_sdk_http,
    stdio_backend,
)

pytestmark = pytest.mark.anyio

ELICITING = {**META, "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}


@asynccontextmanager
async def gateway(backend: dict[str, object]) -> AsyncIterator[tuple[Gateway, str]]:
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"b": backend}}
    )
    async with Gateway(gateway_config.parse(text)) as gw:
        assert gw.http_url is not None
        yield gw, gw.http_url


async def post(url: str, msg: Message, **headers: str) -> Message:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=orjson.dumps(msg), headers={**mirrored_headers(msg), **headers}
        ) as resp,
    ):
        async for item in messages(resp):
            if "method" not in item:
                return item
    raise AssertionError(f"no reply to {msg['id']!r}")


def text_of(reply: Message) -> str:
    assert "result" in reply, reply
    return str(reply["result"]["content"][0]["text"])


def ask(rid: int, **extra: Any) -> Message:
    msg = call(rid, "ask", question="why?")
    msg["params"]["_meta"] = ELICITING
    msg["params"].update(extra)
    return msg


def answered(rid: int, first: Message, answer: str = "because") -> Message:
    result = first["result"]
    (key,) = result["inputRequests"]
    content = {"action": "accept", "content": {"answer": answer}}
    return ask(rid, inputResponses={key: content}, requestState=result["requestState"])


def fake_legacy_result(method: str, text: str, version: str = "2025-11-25") -> dict[str, Any]:
    """What the fake legacy HTTP servers below answer: `initialize`, a one-tool list (`t`), and
    `text` for a call."""
    if method == "initialize":
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fake-legacy", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [{"name": "t", "inputSchema": {"type": "object"}}]}
    return {"content": [{"type": "text", "text": text}]}


# --- the era probe -------------------------------------------------------------------------


async def test_a_legacy_stdio_backend_is_probed_then_initialised() -> None:
    """The probe's -32601 is not a modern answer: the gateway falls back to `initialize`."""
    async with gateway(stdio_backend(sdk_stdio_command("--legacy-only"))) as (gw, url):
        with anyio.fail_after(START_BOUND):
            reply = await post(url, call(1, "echo", text="hi"))
        assert text_of(reply) == "hi"
        assert reply["result"]["resultType"] == "complete"  # added for the modern client
        assert gw.eras[0].era == "legacy"
        assert gw.eras[0].session is not None
        assert gw.eras[0].session.version == "2025-11-25"
        assert gw._backend_states()[0].era == "legacy"  # mcp_gateway_backend_era


async def test_a_modern_backend_is_probed_and_left_modern() -> None:
    async with gateway(stdio_backend(sdk_stdio_command())) as (gw, url):
        with anyio.fail_after(START_BOUND):
            assert text_of(await post(url, call(1, "echo", text="hi"))) == "hi"
        assert gw.eras[0].era == "modern" and gw.eras[0].session is None


async def test_a_backend_that_never_answers_the_probe_is_taken_for_legacy() -> None:
    """transports/stdio, Backward Compatibility: no answer within a reasonable timeout (the
    backend's connect_timeout) means legacy."""
    command = sdk_stdio_command("--legacy-only", "--silent-discover")
    async with gateway(stdio_backend(command, connect_timeout=0.5)) as (gw, url):
        with anyio.fail_after(START_BOUND):
            assert text_of(await post(url, call(1, "echo", text="late"))) == "late"
        assert gw.eras[0].era == "legacy"


async def test_an_http_backend_that_never_answers_the_probe_is_taken_for_legacy() -> None:
    """transports/streamable-http, Backward Compatibility: the same over HTTP. The probe's POST
    runs out of time (a BackendTimeout, as on stdio), and the backend is initialised."""
    never = anyio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        method = body.get("method")
        if method == "server/discover":
            await never.wait()  # silent until the gateway gives up (and drops the connection)
        if "id" not in body:
            return web.Response(status=202)
        result = fake_legacy_result(method, "legacy")
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async with (
        serve_http(handler) as base,
        gateway({"http": {"url": f"{base}/mcp"}, "connect_timeout": 0.5}) as (gw, url),
    ):
        with anyio.fail_after(BOUND):
            assert text_of(await post(url, call(1, "t"))) == "legacy"
        assert gw.eras[0].era == "legacy"


async def test_a_pinned_era_is_not_probed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "gateway.backend")
    command = sdk_stdio_command("--legacy-only", "--silent-discover")
    backend = stdio_backend(command, era="legacy")
    async with gateway(backend) as (_, url):
        with anyio.fail_after(BOUND):
            assert text_of(await post(url, call(1, "echo", text="pinned"))) == "pinned"
    assert not any("speaks the" in r.getMessage() for r in caplog.records)


async def test_a_legacy_http_backend_is_probed_then_initialised() -> None:
    proc, sdk_url = start_sdk_http("--legacy-only")
    try:
        async with gateway({"http": {"url": sdk_url}}) as (gw, url):
            with anyio.fail_after(START_BOUND):
                assert text_of(await post(url, call(1, "echo", text="web"))) == "web"
            assert gw.eras[0].era == "legacy"
    finally:
        proc.stop()


@pytest.mark.slow
async def test_an_http_backend_that_failed_is_probed_again() -> None:
    """basic/versioning: the era is remembered until the backend fails; a modern server replaced
    by a legacy one on the same URL is probed again and served in its era."""
    proc, sdk_url = start_sdk_http()
    port = sdk_url.split(":")[2].split("/")[0]
    try:
        async with gateway({"http": {"url": sdk_url}}) as (gw, url):
            with anyio.fail_after(START_BOUND):
                assert text_of(await post(url, call(1, "echo", text="one"))) == "one"
            assert gw.eras[0].era == "modern"
            proc.stop()
            with anyio.fail_after(BOUND):
                down = await post(url, call(2, "echo", text="two"))
            assert down["error"]["code"] == codes.BACKEND_UNAVAILABLE
            proc, _ = start_sdk_http("--legacy-only", "--port", port)
            with anyio.fail_after(START_BOUND):
                # Down until the background retry finds it again (health.py).
                await gw.health[0].wait(down=False)
                assert text_of(await post(url, call(3, "echo", text="three"))) == "three"
            assert gw.eras[0].era == "legacy"
    finally:
        proc.stop()


# --- keeping the session -----------------------------------------------------------------


@pytest.mark.slow
async def test_a_restarted_stdio_child_gets_a_new_handshake() -> None:
    """A legacy child that dies mid-session is started again and initialised again before it
    serves: the next call works."""
    async with gateway(stdio_backend(sdk_stdio_command("--legacy-only"))) as (gw, url):
        with anyio.fail_after(START_BOUND):
            first_pid = int(text_of(await post(url, call(1, "whoami"))))
        os.kill(first_pid, signal.SIGKILL)
        with anyio.fail_after(START_BOUND):
            while True:
                reply = await post(url, call(2, "whoami"))
                if "result" in reply:
                    break
                assert reply["error"]["code"] == codes.BACKEND_UNAVAILABLE, reply
                await gw.eras[0].inner.ready()  # type: ignore[attr-defined]
        assert int(text_of(reply)) != first_pid
        assert gw.eras[0].session is not None


@pytest.mark.slow
async def test_an_expired_http_session_is_initialised_again() -> None:
    """A legacy HTTP server that no longer knows the session answers 404 (2025-11-25
    transports, Session Management); the gateway initialises again and the call goes on."""
    proc, sdk_url = start_sdk_http("--legacy-only")
    port = sdk_url.split(":")[2].split("/")[0]
    try:
        async with gateway({"http": {"url": sdk_url}}) as (gw, url):
            with anyio.fail_after(START_BOUND):
                first_pid = int(text_of(await post(url, call(1, "whoami"))))
            old = gw.eras[0].session
            proc.stop()  # a new server on the same port knows nothing of the session
            proc, _ = start_sdk_http("--legacy-only", "--port", port)
            with anyio.fail_after(START_BOUND):
                second = await post(url, call(2, "whoami"))
            assert int(text_of(second)) not in (first_pid, 0)
            assert gw.eras[0].session is not None and gw.eras[0].session is not old
    finally:
        proc.stop()


async def test_a_legacy_http_session_rides_on_every_request_and_ends_with_delete() -> None:
    """2025-11-25 transports, Session Management and Protocol Version Header: the session id the
    server gave at `initialize` and the agreed version go on every later request; a 404 means
    the session is gone (initialise again); shutdown ends the session with DELETE."""
    seen: list[tuple[str, str | None, str | None]] = []  # (method or verb, session, version)
    minted = iter(f"s{n}" for n in range(1, 10))
    live: dict[str, str | None] = {"session": None}

    async def handler(request: web.Request) -> web.StreamResponse:
        sid = request.headers.get("Mcp-Session-Id")
        version = request.headers.get("MCP-Protocol-Version")
        if request.method != "POST":
            seen.append((request.method, sid, version))
            return web.Response(status=204 if request.method == "DELETE" else 405)
        body = orjson.loads(await request.read())
        method = body.get("method")
        seen.append((method, sid, version))
        if method == "initialize":
            live["session"] = next(minted)
            result = fake_legacy_result(method, "", version="2025-06-18")
            reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
            return web.json_response(reply, headers={"Mcp-Session-Id": live["session"] or ""})
        if sid is None:  # what 2025-era servers answer to anything outside a session
            error = {"code": -32600, "message": "Bad Request: No valid session ID provided"}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=400)
        if sid != live["session"]:
            return web.Response(status=404)
        if "id" not in body:
            return web.Response(status=202)
        result = fake_legacy_result(method, f"session {sid}")
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async with (
        serve_http(handler) as base,
        gateway({"http": {"url": f"{base}/mcp"}, "connect_timeout": 0.5}) as (gw, url),
    ):
        with anyio.fail_after(BOUND):
            assert text_of(await post(url, call(1, "t"))) == "session s1"
            live["session"] = None  # the server forgets the session
            assert text_of(await post(url, call(2, "t"))) == "session s2"
        assert gw.eras[0].era == "legacy"
    # The probe (answered 400 without a modern error) came first, as a modern request.
    assert seen[0] == ("server/discover", None, "2026-07-28")
    opened = seen.index(("initialize", None, None))
    assert seen[opened + 1] == ("notifications/initialized", "s1", "2025-06-18")
    calls = [entry for entry in seen if entry[0] == "tools/call"]
    assert calls[0][1:] == ("s1", "2025-06-18")
    assert calls[-1][1:] == ("s2", "2025-06-18")
    assert seen[-1] == ("DELETE", "s2", "2025-06-18")


# --- held calls (basic/patterns/mrtr) -----------------------------------------------------


@pytest.fixture
async def legacy_gateway() -> AsyncIterator[str]:
    async with held_calls() as (_, url):
        yield url


@asynccontextmanager
async def held_calls() -> AsyncIterator[tuple[Gateway, str]]:
    async with gateway(stdio_backend(sdk_stdio_command("--legacy-only"))) as (gw, url):
        with anyio.fail_after(START_BOUND):
            assert text_of(await post(url, call(0, "echo", text="up"))) == "up"
        yield gw, url


async def test_a_backend_question_becomes_input_required_and_the_retry_completes(
    legacy_gateway: str,
) -> None:
    with anyio.fail_after(BOUND):
        first = await post(legacy_gateway, ask(1))
        result = first["result"]
        assert result["resultType"] == "input_required"
        (question,) = result["inputRequests"].values()
        assert question["method"] == "elicitation/create"
        assert question["params"]["message"] == "why?"
        final = await post(legacy_gateway, answered(2, first))
    assert final["id"] == 2
    assert text_of(final) == "answer: because"


async def test_a_question_nobody_answered_does_not_block_the_next_call(
    legacy_gateway: str,
) -> None:
    """stdio names no request in a server's question: it goes to the one call not already
    waiting for its client, so a client that never comes back does not hold others up."""
    with anyio.fail_after(BOUND):
        abandoned = await post(legacy_gateway, ask(1))
        assert abandoned["result"]["resultType"] == "input_required"
        second = await post(legacy_gateway, ask(2))
        assert second["result"]["resultType"] == "input_required"
        final = await post(legacy_gateway, answered(3, second, answer="still here"))
    assert text_of(final) == "answer: still here"


async def test_a_tampered_request_state_is_refused(legacy_gateway: str) -> None:
    with anyio.fail_after(BOUND):
        first = await post(legacy_gateway, ask(1))
        retry = answered(2, first)
        state = retry["params"]["requestState"]
        payload, mac = state.split(".")
        retry["params"]["requestState"] = f"{payload[:-2]}AA.{mac}"
        reply = await post(legacy_gateway, retry)
    assert reply["error"]["code"] == codes.INVALID_PARAMS


async def test_a_request_state_is_bound_to_its_caller(legacy_gateway: str) -> None:
    """Someone else's retry (other credentials) cannot take over the held call."""
    with anyio.fail_after(BOUND):
        first = await post(legacy_gateway, ask(1), Authorization="Bearer alice")
        stolen = await post(legacy_gateway, answered(2, first), Authorization="Bearer mallory")
        assert stolen["error"]["code"] == codes.INVALID_PARAMS
        # The call is still held for its owner.
        own = await post(legacy_gateway, answered(3, first), Authorization="Bearer alice")
    assert text_of(own) == "answer: because"


async def test_a_held_call_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody retries: the held call is given up (its question answered with an error, the call
    cancelled on the backend) and a late retry is refused."""
    monkeypatch.setattr(held, "HOLD_TTL", 0.0)
    async with held_calls() as (gw, url):
        with anyio.fail_after(BOUND):
            first = await post(url, ask(1))
            late = await post(url, answered(2, first))
            assert late["error"]["code"] == codes.INVALID_PARAMS
            assert text_of(await post(url, call(3, "echo", text="after"))) == "after"
        assert not gw.eras[0]._held


# --- the HTTP+SSE transport's limits ---------------------------------------------------


async def test_an_sse_event_over_max_event_bytes_drops_the_stream_and_it_is_made_again() -> None:
    """2025-11-25 transports, Backwards Compatibility (HTTP+SSE): the server's one stream is
    bounded per event by limits.max_event_bytes. Past it the stream is dropped (not buffered)
    and opened again; the session on the new stream serves the call."""
    streams: list[asyncio.Queue[Message]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            body = orjson.loads(await request.read())
            if "id" in body and "method" in body:
                result = fake_legacy_result(body["method"], "after", version="2024-11-05")
                reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
                await streams[int(request.query["s"])].put(reply)
            return web.Response(status=202)
        queue: asyncio.Queue[Message] = asyncio.Queue()
        streams.append(queue)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(f"event: endpoint\ndata: /sse?s={len(streams) - 1}\n\n".encode())
        if len(streams) == 1:
            await resp.write(b"event: message\ndata: " + b"x" * 5000 + b"\n\n")
        while True:
            msg = await queue.get()
            await resp.write(b"event: message\ndata: " + orjson.dumps(msg) + b"\n\n")

    async with serve_http(handler, "/sse") as base:
        backend: dict[str, object] = {
            "sse": {"url": f"{base}/sse", "limits": {"max_event_bytes": 4096}}
        }
        async with gateway(backend) as (gw, url):
            with anyio.fail_after(BOUND):
                assert text_of(await post(url, call(1, "t"))) == "after"
            assert len(streams) >= 2
            assert gw.transports[0].restarts >= 1  # type: ignore[union-attr]


async def test_an_sse_stream_that_keeps_failing_is_logged_once_until_it_is_back() -> None:
    """HTTP+SSE reconnects forever with backoff; the log says so once per loss (a warning) and
    once when the stream is open again, not once per retry."""
    refusals = 3
    gets = 0
    records: list[logging.LogRecord] = []
    back = anyio.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)
            if "stream open again" in record.getMessage():
                back.set()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal gets
        if request.method == "POST":
            body = orjson.loads(await request.read())
            if "id" in body and "method" in body:
                result = fake_legacy_result(body["method"], "ok", version="2024-11-05")
                await stream.put({"jsonrpc": "2.0", "id": body["id"], "result": result})
            return web.Response(status=202)
        gets += 1
        if gets <= refusals:
            return web.Response(status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"event: endpoint\ndata: /sse\n\n")
        while True:
            msg = await stream.get()
            await resp.write(b"event: message\ndata: " + orjson.dumps(msg) + b"\n\n")

    stream: asyncio.Queue[Message] = asyncio.Queue()
    backend_log = logging.getLogger("gateway.backend")
    seen = Seen(logging.DEBUG)
    backend_log.addHandler(seen)
    level = backend_log.level
    backend_log.setLevel(logging.DEBUG)
    try:
        async with serve_http(handler, "/sse") as base, gateway({"sse": {"url": f"{base}/sse"}}):
            with anyio.fail_after(BOUND):
                await back.wait()
    finally:
        backend_log.removeHandler(seen)
        backend_log.setLevel(level)
    reconnecting = [r for r in records if "reconnecting in" in r.getMessage()]
    assert len(reconnecting) >= refusals
    assert [r.levelno for r in reconnecting].count(logging.WARNING) == 1
    assert sum("stream open again" in r.getMessage() for r in records) == 1


# --- pure parts ---------------------------------------------------------------------------


def test_to_legacy_drops_only_the_modern_fields() -> None:
    msg = request(7, "tools/call", {"name": "t", "requestState": "s", "inputResponses": {}}, 9)
    msg["params"]["_meta"]["traceparent"] = "00-abc"
    out = translate.to_legacy(msg)
    assert out["params"] == {"name": "t", "_meta": {"progressToken": 9, "traceparent": "00-abc"}}
    assert out["id"] == 7 and msg["params"]["requestState"] == "s"  # the input is untouched
    bare = translate.to_legacy(request(8, "tools/list"))
    assert bare["params"] == {}


def test_only_a_discover_result_or_a_modern_version_error_is_modern() -> None:
    assert probe.is_modern_answer({"id": 1, "result": {"supportedVersions": ["2026-07-28"]}})
    version_error = {
        "code": codes.UNSUPPORTED_PROTOCOL_VERSION,
        "message": "no",
        "data": {"supported": ["2026-07-28"], "requested": "x"},
    }
    assert probe.is_modern_answer({"id": 1, "error": version_error})
    assert not probe.is_modern_answer({"id": 1, "error": {"code": -32601, "message": "no"}})
    assert not probe.is_modern_answer({"id": 1, "error": {"code": -32602, "message": "no"}})
    assert not probe.is_modern_answer({"id": 1, "result": {"content": []}})


def test_a_seal_opens_only_for_its_caller_before_expiry() -> None:
    sealer = held.Sealer()
    token = sealer.seal("h", "alice", expires=100.0)
    assert sealer.open(token, "alice", now=99.0) == "h"
    assert sealer.open(token, "bob", now=99.0) is None
    assert sealer.open(token, "alice", now=100.0) is None
    assert held.Sealer().open(token, "alice", now=99.0) is None  # another gateway's key
    assert sealer.open("garbage", "alice", now=0.0) is None


def test_required_capability_names_the_elicitation_mode() -> None:
    assert translate.required_capability("elicitation", {}) == {"elicitation": {"form": {}}}
    assert translate.required_capability("elicitation", {"mode": "url"}) == {
        "elicitation": {"url": {}}
    }
    assert translate.required_capability("sampling", {}) == {"sampling": {}}


def test_sse_events_keep_their_type_across_chunks() -> None:
    """2024-11-05 HTTP+SSE: the first event is `endpoint`, messages are `message` events."""
    decoder = sse.Decoder()
    assert decoder.feed_named(b"event: endpoint\r\ndata: /messages/?s") == []
    assert decoder.feed_named(b"=1\r\n\r\ndata: {}\n\n:keepalive\n\n") == [
        ("endpoint", b"/messages/?s=1"),
        ("message", b"{}"),
    ]
    assert decoder.feed_named(b"event:message\ndata: [1]\n\n") == [("message", b"[1]")]


def test_the_end_of_a_session_reaches_a_listen_that_fell_behind() -> None:
    """A listen whose client stopped reading loses notifications, never the end of its
    session (it would otherwise wait on a dead session forever)."""
    listener = listen._Listener({}, set())
    note: Message = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
    for _ in range(listen.LISTEN_QUEUE + 5):
        listener.offer(note)
    listener.offer(None)
    drained = [listener.queue.get_nowait() for _ in range(listener.queue.qsize())]
    assert len(drained) == listen.LISTEN_QUEUE
    assert drained[-1] is None
