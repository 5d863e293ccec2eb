"""Backend faults seen through the gateway with raw JSON-RPC: a crashed or missing child, a hung
or timed-out call, garbage on a stdio backend's stdout, broken HTTP backends. Each failure must
reach the client promptly as our local error code (protocol/codes), and the gateway must keep
serving afterwards (basic/transports/stdio, basic/patterns/cancellation, basic/index).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import orjson
import pytest
import yaml
from aiohttp import web
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from gateway import config as gateway_config
from gateway.app import Gateway
from gateway.backends.stdio import StdioBackend
from gateway.protocol import codes
from tests.support import (
    BOUND,
    RUDE_SERVER,
    Handler,
    call,
    dead_url,
    messages,
    mirrored_headers,
    request,
    sdk_stdio_command,
    serve_http,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

Message = dict[str, Any]

# Interpreter + SDK import time of a freshly (re)started child; still bounded.
START_BOUND = 20.0


# --- building and sending requests ------------------------------------------------------------


async def post(session: aiohttp.ClientSession, url: str, msg: Message) -> Message:
    """The final reply to `msg` (notifications on the way are skipped)."""
    async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
        async for item in messages(resp):
            if "method" not in item:
                assert item.get("id") == msg["id"], item
                return item
    raise AssertionError(f"no reply to {msg['id']!r}")


async def assert_unavailable_promptly(
    session: aiohttp.ClientSession, url: str, within: float
) -> None:
    """A call and a list both get -31001 within `within` seconds, twice: no hang, still serving."""
    for rid, msg in ((1, call(1, "echo", text="hi")), (2, request(2, "tools/list"))):
        started = anyio.current_time()
        with anyio.fail_after(BOUND):
            reply = await post(session, url, msg)
        assert reply["id"] == rid
        assert error_code(reply) == codes.BACKEND_UNAVAILABLE, reply
        assert anyio.current_time() - started < within


def error_code(reply: Message) -> int | None:
    err = reply.get("error")
    return err.get("code") if isinstance(err, dict) else None


def text_of(reply: Message) -> str:
    assert "result" in reply, reply
    text: str = reply["result"]["content"][0]["text"]
    return text


# --- an in-process gateway with an HTTP front end ----------------------------------------------


def stdio_backend(command: list[str], **extra: object) -> dict[str, object]:
    return {"stdio": {"command": command[0], "args": command[1:]}, **extra}


def http_backend(url: str, **extra: object) -> dict[str, object]:
    # The hand-written backends here answer what each test needs, server/discover aside: pinned
    # modern, they are not probed (the probe has tests of its own in test_legacy_backends.py).
    return {"http": {"url": url}, "era": "modern", **extra}


def rude_command(notes: Path, requests: Path) -> list[str]:
    return [sys.executable, RUDE_SERVER, str(notes), str(requests)]


@asynccontextmanager
async def gateway(
    backend: dict[str, object],
) -> AsyncIterator[tuple[Gateway, aiohttp.ClientSession, str]]:
    """A gateway with one backend named `b`, its HTTP URL and a client session for it."""
    text = yaml.safe_dump(
        {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"b": backend}}
    )
    async with Gateway(gateway_config.parse(text)) as gw, aiohttp.ClientSession() as session:
        assert gw.http_url is not None
        yield gw, session, gw.http_url


def stdio_of(gw: Gateway) -> StdioBackend:
    backend = gw.transports[0]
    assert isinstance(backend, StdioBackend)
    return backend


async def read_json_lines(path: Path) -> list[Message]:
    if not await anyio.Path(path).exists():
        return []
    return [orjson.loads(line) for line in (await anyio.Path(path).read_bytes()).splitlines()]


async def wait_for_line(path: Path, match: Callable[[Message], bool]) -> Message:
    """The first JSON line of `path` that `match`es; the file is only observable by polling."""
    with anyio.fail_after(BOUND):
        while True:
            for msg in await read_json_lines(path):
                if match(msg):
                    return msg
            await anyio.sleep(0.01)


# --- stdio backends ----------------------------------------------------------------------------


async def test_child_gets_a_minimal_environment_plus_its_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway's own secrets stay out of a child unless the config names them."""
    monkeypatch.setenv("GATEWAY_TEST_SECRET", "do-not-leak")
    command = sdk_stdio_command()
    stdio = {"command": command[0], "args": command[1:], "env": {"ONLY_FOR_CHILD": "given"}}
    backend: dict[str, object] = {"stdio": stdio}
    async with gateway(backend) as (_, session, url):
        with anyio.fail_after(START_BOUND):
            leaked = await post(session, url, call(1, "getenv", name="GATEWAY_TEST_SECRET"))
            given = await post(session, url, call(2, "getenv", name="ONLY_FOR_CHILD"))
            path = await post(session, url, call(3, "getenv", name="PATH"))
    assert leaked["result"]["structuredContent"] == {"result": ""}
    assert given["result"]["structuredContent"] == {"result": "given"}
    assert path["result"]["structuredContent"]["result"] != ""


async def test_backend_killed_mid_call_fails_fast_and_restarts() -> None:
    async with gateway(stdio_backend(sdk_stdio_command())) as (gw, session, url):
        with anyio.fail_after(START_BOUND):
            first_pid = int(text_of(await post(session, url, call(1, "whoami"))))
        assert first_pid == stdio_of(gw).pid

        msg = call(2, "slow", token="slow-2", seconds=30, steps=300)
        killed_at: float | None = None
        reply: Message | None = None
        with anyio.fail_after(BOUND):
            async with session.post(
                url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
            ) as resp:
                async for item in messages(resp):
                    if item.get("method") == "notifications/progress":
                        assert item["params"]["progressToken"] == "slow-2"
                        if killed_at is None:
                            # The call is now running in the child: kill it mid-call.
                            os.kill(first_pid, signal.SIGKILL)
                            killed_at = anyio.current_time()
                        continue
                    reply = item
                    break
        assert killed_at is not None, "no progress notification before the reply"
        assert reply is not None
        assert reply["id"] == 2
        assert error_code(reply) == codes.BACKEND_UNAVAILABLE, reply
        assert anyio.current_time() - killed_at < 1.0

        with anyio.fail_after(BOUND):
            second_pid = int(text_of(await post(session, url, call(3, "whoami"))))
        assert second_pid != first_pid
        assert stdio_of(gw).restarts >= 1


async def test_backend_that_cannot_start_fails_promptly_and_gateway_keeps_serving(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "no-such-mcp-server")
    async with gateway(stdio_backend([missing], connect_timeout=0.5)) as (_, session, url):
        # connect_timeout, plus (tools/call over HTTP) the catalog load's own wait.
        await assert_unavailable_promptly(session, url, within=1.5)


async def test_request_timeout_gives_backend_timeout_and_cancels_on_the_child() -> None:
    backend = stdio_backend(sdk_stdio_command(), request_timeout=0.5)
    async with gateway(backend) as (gw, session, url):
        # Started and answering (tools/list needs no catalog; the first one may time out while
        # the child imports the SDK, so ask until one is answered).
        with anyio.fail_after(START_BOUND):
            while error_code(await post(session, url, request("warm", "tools/list"))) is not None:
                pass
        started = anyio.current_time()
        with anyio.fail_after(BOUND):
            reply = await post(session, url, call(1, "slow", seconds=10, steps=1))
        assert reply["id"] == 1
        assert error_code(reply) == codes.BACKEND_TIMEOUT, reply
        assert anyio.current_time() - started < 2.0
        assert stdio_of(gw).in_flight == 0
        # The child is still the same process and still serves.
        with anyio.fail_after(BOUND):
            assert error_code(await post(session, url, request(2, "tools/list"))) is None


async def test_request_timeout_sends_cancelled_with_the_backend_id(tmp_path: Path) -> None:
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    backend = stdio_backend(rude_command(notes, requests), request_timeout=0.5)
    async with gateway(backend) as (gw, session, url):
        started = anyio.current_time()
        with anyio.fail_after(BOUND):
            reply = await post(session, url, call("client-7", "hang"))
        assert reply["id"] == "client-7"
        assert error_code(reply) == codes.BACKEND_TIMEOUT, reply
        # request_timeout, plus at most as much again for the catalog load of tools/call.
        assert anyio.current_time() - started < 2.0
        hung = await wait_for_line(
            requests, lambda m: m["method"] == "tools/call" and m["params"]["name"] == "hang"
        )
        cancelled = await wait_for_line(notes, lambda m: m["method"] == "notifications/cancelled")
        assert cancelled["params"]["requestId"] == hung["id"]
        assert stdio_of(gw).in_flight == 0


async def test_closing_the_http_request_cancels_the_call_on_the_child(tmp_path: Path) -> None:
    """streamable-http, Cancellation: a closed response stream cancels the backend request."""
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    async with gateway(stdio_backend(rude_command(notes, requests))) as (gw, session, url):
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, session, url, call("client-9", "hang"))
            hung = await wait_for_line(
                requests, lambda m: m["method"] == "tools/call" and m["params"]["name"] == "hang"
            )
            tg.cancel_scope.cancel()  # the client gives up: its connection closes
        cancelled = await wait_for_line(notes, lambda m: m["method"] == "notifications/cancelled")
        assert cancelled["params"]["requestId"] == hung["id"]
        assert stdio_of(gw).in_flight == 0


async def test_timed_out_request_closes_its_notification_stream(tmp_path: Path) -> None:
    """Regression: a timed-out call once left its notification stream to the garbage collector.
    Requests now keep no stream; what must not outlive a timeout is the request's entry."""
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    backend = stdio_backend(rude_command(notes, requests), request_timeout=0.3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        async with gateway(backend) as (gw, session, url):
            with anyio.fail_after(START_BOUND):
                reply = await post(session, url, call(1, "hang"))
            assert error_code(reply) == codes.BACKEND_TIMEOUT, reply
            assert stdio_of(gw).in_flight == 0
            gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not [m for m in leaks if "MemoryObjectSendStream" in m], leaks


async def test_garbage_from_a_stdio_backend_is_dropped_and_replies_still_arrive(
    tmp_path: Path,
) -> None:
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    async with gateway(stdio_backend(rude_command(notes, requests))) as (gw, session, url):
        with anyio.fail_after(START_BOUND):
            first = await post(session, url, call(1, "ok"))
        assert text_of(first) == "ok"
        pid = stdio_of(gw).pid
        for rid in range(2, 5):
            with anyio.fail_after(BOUND):
                assert text_of(await post(session, url, call(rid, "ok"))) == "ok"
        with anyio.fail_after(BOUND):
            listed = await post(session, url, request(5, "tools/list"))
        assert {t["name"] for t in listed["result"]["tools"]} == {"ok", "hang"}
        # Garbage is dropped line by line; it does not cost a restart of the child.
        assert stdio_of(gw).pid == pid
        assert stdio_of(gw).restarts == 0


async def test_an_endless_stderr_line_costs_the_child_nothing(tmp_path: Path) -> None:
    # The child writes one 80 MiB stderr "line", then serves: its stderr is drained as it comes
    # (a full pipe would block it) and it keeps answering, without a restart. (It once shrank
    # the line limit to 1000 bytes, which hid that a long line took time in its square.)
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    rude = rude_command(notes, requests)
    prelude = (
        "import os, sys; sys.stderr.write('x' * 80 * 1024 * 1024); sys.stderr.flush(); "
        f"os.execv(sys.executable, {rude!r})"
    )
    async with gateway(stdio_backend([sys.executable, "-c", prelude])) as (gw, session, url):
        with anyio.fail_after(BOUND):
            first = await post(session, url, call(1, "ok"))
        assert text_of(first) == "ok"
        with anyio.fail_after(BOUND):
            assert text_of(await post(session, url, call(2, "ok"))) == "ok"
        assert stdio_of(gw).restarts == 0


# --- HTTP backends -----------------------------------------------------------------------------


@asynccontextmanager
async def fake_backend(handler: Handler) -> AsyncIterator[str]:
    """A tiny HTTP server on 127.0.0.1 answering every request with `handler`."""
    async with serve_http(handler) as base:
        yield f"{base}/mcp"


async def not_json(_: web.Request) -> web.StreamResponse:
    return web.Response(status=200, body=b"not json", content_type="application/json")


async def server_error(_: web.Request) -> web.StreamResponse:
    html = "<html><body><h1>500 Internal Server Error</h1></body></html>"
    return web.Response(status=500, text=html, content_type="text/html")


async def stream_without_reply(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    token = body.get("params", {}).get("_meta", {}).get("progressToken")
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if token is not None:
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": token, "progress": 1, "total": 2},
        }
        await resp.write(b"event: message\r\ndata: " + orjson.dumps(note) + b"\r\n\r\n")
    await resp.write(b": a comment, then the stream ends\r\n\r\n")
    await resp.write_eof()
    return resp


@pytest.mark.parametrize(
    ("handler", "code"),
    [
        pytest.param(not_json, codes.BACKEND_PROTOCOL_ERROR, id="200-json-not-json"),
        pytest.param(server_error, codes.BACKEND_UNAVAILABLE, id="500-html"),
        # The request went out and may have run: -31005, never sent again (a modern stream
        # is not resumable, 2026-07-28 streamable-http).
        pytest.param(stream_without_reply, codes.BACKEND_CONNECTION_LOST, id="sse-without-reply"),
    ],
)
async def test_broken_http_backend_gives_a_local_error(handler: Handler, code: int) -> None:
    async with (
        fake_backend(handler) as backend_url,
        gateway(http_backend(backend_url, connect_timeout=0.5)) as (_, session, url),
    ):
        for rid, msg in (
            (1, call(1, "echo", token="t-1", text="hi")),
            (2, request(2, "tools/list")),
        ):
            started = anyio.current_time()
            with anyio.fail_after(BOUND):
                reply = await post(session, url, msg)
            assert reply["id"] == rid
            assert error_code(reply) == code, reply
            assert anyio.current_time() - started < 1.0


async def test_http_backend_where_nothing_listens_is_unavailable() -> None:
    backend = http_backend(dead_url(), connect_timeout=0.5)
    async with gateway(backend) as (_, session, url):
        await assert_unavailable_promptly(session, url, within=1.0)


async def test_notification_to_an_http_backend_where_nothing_listens_is_accepted() -> None:
    backend = http_backend(dead_url(), connect_timeout=0.5)
    note: Message = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    async with gateway(backend) as (_, session, url):
        headers = mirrored_headers(note)
        with anyio.fail_after(BOUND):
            async with session.post(url, data=orjson.dumps(note), headers=headers) as resp:
                status = resp.status
                await resp.read()
            reply = await post(session, url, request(1, "tools/list"))
        assert error_code(reply) == codes.BACKEND_UNAVAILABLE, reply
        assert status == 202


class _Inbound(anyio.abc.ByteReceiveStream):
    def __init__(self, recv: MemoryObjectReceiveStream[bytes]) -> None:
        self._recv = recv

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self._recv.receive()

    async def aclose(self) -> None:
        await self._recv.aclose()


class _Outbound(anyio.abc.ByteSendStream):
    def __init__(self, send: MemoryObjectSendStream[bytes]) -> None:
        self._send = send

    async def send(self, item: bytes) -> None:
        await self._send.send(item)

    async def aclose(self) -> None:
        await self._send.aclose()


async def test_stdio_front_end_is_not_held_up_by_a_notification_to_a_hung_http_backend() -> None:
    release = anyio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if "id" not in body:
            await release.wait()  # a notification: hang until the test ends
            return web.Response(status=202)
        result = {"resultType": "complete", "tools": []}
        reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    in_send, in_recv = anyio.create_memory_object_stream[bytes](16)
    out_send, out_recv = anyio.create_memory_object_stream[bytes](16)
    note: Message = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    try:
        async with fake_backend(handler) as backend_url:
            text = yaml.safe_dump(
                {"listen": {"stdio": True}, "backends": {"b": http_backend(backend_url)}}
            )
            async with (
                Gateway(gateway_config.parse(text)) as gw,
                anyio.create_task_group() as tg,
                in_send,
                in_recv,
                out_send,
                out_recv,
            ):
                tg.start_soon(gw.serve_stdio, _Inbound(in_recv), _Outbound(out_send))
                await in_send.send(orjson.dumps(note) + b"\n")
                await in_send.send(orjson.dumps(request("after-note", "tools/list")) + b"\n")
                try:
                    with anyio.fail_after(BOUND):
                        reply = orjson.loads(await out_recv.receive())
                finally:
                    tg.cancel_scope.cancel()
                assert reply["id"] == "after-note"
                assert reply["result"]["tools"] == []
    finally:
        release.set()


async def test_a_cancelled_call_closes_the_http_backend_stream() -> None:
    """Cancellation on the HTTP hop is closing the response stream: the backend sees its client
    go away (streamable-http, Cancellation)."""
    started, gone = anyio.Event(), anyio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if body["method"] != "tools/call":
            result = {
                "resultType": "complete",
                "supportedVersions": ["2026-07-28"],
                "capabilities": {"tools": {}},
                "tools": [{"name": "wait", "inputSchema": {"type": "object"}}],
            }
            reply = {"jsonrpc": "2.0", "id": body["id"], "result": result}
            return web.Response(body=orjson.dumps(reply), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            gone.set()  # aiohttp cancels the handler when the client disconnects
        return response

    async with (
        fake_backend(handler) as backend_url,
        gateway(http_backend(backend_url)) as (_, session, url),
    ):
        async with anyio.create_task_group() as tg:
            tg.start_soon(post, session, url, call("c-1", "wait"))
            with anyio.fail_after(BOUND):
                await started.wait()
            tg.cancel_scope.cancel()
        with anyio.fail_after(BOUND):
            await gone.wait()
