"""The HTTP backend (gateway/backends/http.py on aiohttp's ClientSession) against raw servers on
127.0.0.1 (tests/support/backend.py), which control every reply byte and see every connection:
how replies are read (JSON and SSE; streamable-http, Sending Messages to the Server), keep-alive
and its expiry, and that nothing is ever sent twice. What is sent: test_backend_headers.py;
limits, deadlines and the pool: test_backend_limits.py.

Errors are asserted by JSON-RPC code (protocol/codes.py, errors.py). The only timed waits are
the backend's own deadlines (limits.idle_timeout) and STALL_CHECK.
"""

from __future__ import annotations

import gzip

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway import config as gateway_config
from gateway import errors
from gateway.app import Gateway
from gateway.backends.base import GATEWAY_CALL
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    mirrored_headers,
    request,
)
from tests.support.backend import (
    DISCOVERED,
    TOOLS,
    Peer,
    Server,
    answer,
    backend_config,
    chunk,
    code_of,
    head,
    ignore,
    json_reply,
    reply,
    result_for,
    running,
    settle,
    sse_event,
    sse_head,
)

pytestmark = pytest.mark.anyio

# How long a test lets a stalled transfer run to show that it stays stalled: there is no event
# for "nothing more happens", and unthrottled loopback moves the whole body in a fraction of it.
STALL_CHECK = 0.3


# --- replies ------------------------------------------------------------------------------------

BODY = orjson.dumps({"jsonrpc": "2.0", "id": 1, "result": {"resultType": "complete", "n": 1}})


def framed(framing: str, wire_id: object) -> bytes:
    """BODY as the backend writes it: under the id the gateway sent (ids.py)."""
    body = BODY.replace(b'"id":1', b'"id":' + orjson.dumps(wire_id))
    if framing == "content-length":
        return json_reply(body)
    if framing == "chunked":
        # A chunk extension and a trailer are legal and must not end up in the body.
        parts = (body[:5], body[5:20], body[20:])
        return (
            head("Content-Type: application/json", "Transfer-Encoding: chunked")
            + b"%x;ext=1\r\n%s\r\n" % (len(parts[0]), parts[0])
            + b"".join(chunk(part) for part in parts[1:])
            + b"0\r\nX-Trailer: t\r\n\r\n"
        )
    if framing == "sse":
        event = b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/x"}\r\n\r\n'
        return sse_head() + chunk(event) + chunk(b"data: " + body + b"\r\n\r\n") + b"0\r\n\r\n"
    assert framing == "close-delimited"
    return head("Content-Type: application/json") + body


@pytest.mark.parametrize("framing", ["content-length", "chunked", "close-delimited", "sse"])
async def test_a_reply_split_at_every_byte(framing: str) -> None:
    """A reply read whole whatever the framing and however it is split; the reply keeps the
    bytes it came as (forwarded unchanged; the client's id put back in place of the gateway's
    without encoding anything again); the connection is reused unless the reply ended
    with it, or (SSE) the stream had not ended yet when its response arrived: the gateway does
    not wait for the rest, it closes the connection."""

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            sent = await peer.read_request()
            assert sent is not None
            await peer.trickle(framed(framing, sent.message["id"]))
            if framing == "close-delimited":
                return  # its end is the end of the connection
        await answer(peer)

    notes: list[Message] = []

    async def sink(note: Message) -> None:
        notes.append(note)

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        with anyio.fail_after(BOUND):
            got = await backend.request(call(1, "t"), sink, GATEWAY_CALL)
            assert isinstance(got, jsonrpc.Received) and got.raw == BODY
            assert "result" in await backend.request(call(2, "t"), ignore, GATEWAY_CALL)
    assert notes == ([{"jsonrpc": "2.0", "method": "notifications/x"}] if framing == "sse" else [])
    reused = framing not in ("close-delimited", "sse")
    assert [len(peer.requests) for peer in server.peers] == ([2] if reused else [1, 1])


async def test_an_sse_reply_arrives_piece_by_piece() -> None:
    """streamable-http, Sending Messages to the Server: notifications of a streamed reply reach
    the sink as they come, before the reply exists."""
    delivered = anyio.Event()

    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        token = request.message["params"]["_meta"]["progressToken"]
        note = {"jsonrpc": "2.0", "method": "notifications/progress"}
        note["params"] = {"progressToken": token, "progress": 1}  # type: ignore[assignment]
        await peer.send(sse_head() + sse_event(note))
        await delivered.wait()  # the reply is sent only once the notification has arrived
        await peer.send(chunk(b"data: " + result_for(request) + b"\n\n") + b"0\r\n\r\n")
        await answer(peer)

    async def sink(note: Message) -> None:
        assert note["params"]["progressToken"] == "p-1"
        delivered.set()

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        with anyio.fail_after(BOUND):
            got = await backend.request(call(1, "t", token="p-1"), sink, GATEWAY_CALL)
    assert got["id"] == 1 and delivered.is_set()
    assert len(server.peers) == 1


async def test_a_slow_consumer_stops_the_gateway_reading() -> None:
    """A client that does not take a streamed reply's notifications holds the backend back (the
    socket's flow control), instead of the gateway buffering the stream."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 65536}}
    count = 512  # 32 MiB of events
    flushed = anyio.Event()
    release = anyio.Event()

    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        peer.writer.write(sse_head() + sse_event(note) * count)
        await peer.writer.drain()
        flushed.set()
        await peer.send(chunk(b"data: " + result_for(request) + b"\n\n") + b"0\r\n\r\n")

    received = 0

    async def sink(_: Message) -> None:
        nonlocal received
        received += 1
        await release.wait()

    async def call_it() -> None:
        assert "result" in await backend.request(call(1, "t"), sink, GATEWAY_CALL)

    async with (
        Server(handler) as server,
        running(backend_config(server.url())) as backend,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(call_it)
        with anyio.move_on_after(STALL_CHECK):
            await flushed.wait()
        assert not flushed.is_set()
        size = len(sse_event(note)) * count
        assert server.peers[0].writer.transport.get_write_buffer_size() > size // 2
        release.set()
        with anyio.fail_after(BOUND):
            await flushed.wait()
    assert received == count


async def test_an_interim_reply_is_skipped() -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        await peer.send(head("Link: </style.css>; rel=preload", status="103 Early Hints"))
        await settle()
        await peer.send(json_reply(result_for(request)))

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        with anyio.fail_after(BOUND):
            assert "result" in await backend.request(call(1, "t"), ignore, GATEWAY_CALL)


@pytest.mark.parametrize(
    "empty",
    [
        head(status="202 Accepted", version="1.1") + b"",
        head("Content-Length: 0", status="202 Accepted"),
        head("Transfer-Encoding: chunked", status="202 Accepted") + b"0\r\n\r\n",
    ],
    ids=["no-length", "content-length-0", "empty-chunked"],
)
async def test_a_notification_is_accepted_and_its_connection_reused(empty: bytes) -> None:
    """streamable-http, Sending Messages to the Server: a notification is answered 202."""
    no_length = b"Content-Length" not in empty and b"chunked" not in empty

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(empty)
        if no_length:
            return  # without a length, a 202's body ends with the connection
        await answer(peer)

    async def second(peer: Peer) -> None:
        await answer(peer)

    async def either(peer: Peer) -> None:
        await (handler(peer) if peer.index == 0 else second(peer))

    async with Server(either) as server, running(backend_config(server.url())) as backend:
        with anyio.fail_after(BOUND):
            await backend.notify({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert "result" in await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert len(server.peers) == (2 if no_length else 1)


async def test_sequential_requests_share_one_connection_and_are_counted() -> None:
    stats = Stats()
    async with (
        Server(answer) as server,
        running(backend_config(server.url()), stats) as backend,
    ):
        replies = [await backend.request(call(i, "t"), ignore, GATEWAY_CALL) for i in range(5)]
    assert [r["id"] for r in replies] == list(range(5))
    assert len(server.peers) == 1
    assert stats.bytes["backend", "out"] == sum(len(r.body) for r in server.requests)
    assert stats.bytes["backend", "in"] == sum(len(result_for(r)) for r in server.requests)


@pytest.mark.parametrize(
    "closing",
    [("Connection: close", "1.1"), ("", "1.0")],
    ids=["connection-close", "http-1.0"],
)
async def test_a_reply_that_ends_its_connection_is_not_reused(closing: tuple[str, str]) -> None:
    line, version = closing

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            request = await peer.read_request()
            assert request is not None
            lines = [x for x in ("Content-Type: application/json", line) if x]
            await peer.send(reply(result_for(request), *lines, version=version))
        # Not closing from this side: the client has to close it if it may not be reused.
        await answer(peer)

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
        await server.until(lambda: server.peers[0].closed)
        assert (await backend.request(call(2, "t"), ignore, GATEWAY_CALL))["id"] == 2
    assert len(server.peers) == 2


async def test_a_reply_with_another_id_is_a_protocol_error() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(json_reply(BODY.replace(b'"id":1', b'"id":99')))

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        with pytest.raises(errors.BackendError) as caught:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


async def test_a_redirect_is_not_followed() -> None:
    """A backend cannot send the gateway's request (and its configured credentials) elsewhere."""
    async with Server(answer) as elsewhere:

        async def handler(peer: Peer) -> None:
            await peer.read_request()
            await peer.send(reply(b"", f"Location: {elsewhere.url()}", status="307 Temporary"))

        async with Server(handler) as server, running(backend_config(server.url())) as backend:
            with pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR
    assert elsewhere.requests == []


async def test_a_compressed_reply_is_not_inflated() -> None:
    """The gateway asks for identity replies; a backend that sends gzip anyway (here a small
    bomb: 1 KiB that would inflate to 64 MiB) gets its bytes taken for what they are, which is
    not JSON-RPC, and nothing is inflated."""
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(reply(bomb, "Content-Type: application/json", "Content-Encoding: gzip"))

    stats = Stats()
    async with Server(handler) as server, running(backend_config(server.url()), stats) as backend:
        with pytest.raises(errors.BackendError) as caught:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR
    assert stats.bytes["backend", "in"] <= len(bomb)


# --- never twice ------------------------------------------------------------------------------


def test_aiohttp_retries_only_idempotent_methods() -> None:
    """The rule the gateway relies on (aiohttp/client.py, RFC 9112 Retrying Requests): a request
    on a reused connection that closed is re-sent only for idempotent methods, never POST."""
    assert "POST" not in aiohttp.client.IDEMPOTENT_METHODS


async def test_a_reused_connection_closed_after_reading_a_call_is_not_sent_again() -> None:
    """The race the old client retried into: the backend reads a tools/call on a kept-alive
    connection and closes it without answering. It may have acted on it, so the call arrives
    exactly once and the caller is told the connection was lost (not "unavailable")."""

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            first = await peer.read_request()
            assert first is not None
            await peer.send(json_reply(result_for(first)))
            await peer.read_request()
            return  # closed, unanswered
        await answer(peer)

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        await backend.request(request(1, "tools/list"), ignore, GATEWAY_CALL)
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
            await backend.request(call(2, "delete_everything"), ignore, GATEWAY_CALL)
        assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
        assert isinstance(caught.value, errors.BackendConnectionLost)
        # The next call goes out on a new connection and is served.
        assert (await backend.request(call(3, "t"), ignore, GATEWAY_CALL))["id"] == 3
    arrivals = [r.message["params"].get("name") for r in server.requests]
    assert arrivals == [None, "delete_everything", "t"]
    assert [len(peer.requests) for peer in server.peers] == [2, 1]


async def read_and_close(peer: Peer) -> None:
    await peer.read_request()


async def test_a_fresh_connection_closed_unanswered_is_not_sent_again() -> None:
    async with Server(read_and_close) as server, running(backend_config(server.url())) as backend:
        with pytest.raises(errors.BackendError) as caught:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "partial",
    [
        b"HTTP/1.1 200 OK\r\nContent-",
        head("Content-Type: application/json", "Content-Length: 100") + b'{"jsonrpc"',
        head("Content-Type: application/json", "Transfer-Encoding: chunked") + b"a\r\nabcd",
        sse_head() + chunk(b": a comment\n\n"),
    ],
    ids=["in-the-head", "content-length-body", "chunked-body", "sse"],
)
async def test_a_connection_closed_mid_reply_is_lost_not_retried(partial: bytes) -> None:
    """Part of a reply means the backend acted on the request; sending it again could repeat
    it. (An SSE stream that ends properly without its reply is tests/backends/test_faults.py's.)"""

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(partial)

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_CONNECTION_LOST
    assert len(server.requests) == 1


async def test_an_idle_connection_is_closed_by_the_gateway_before_the_backend_would() -> None:
    """limits.idle_timeout (default 4 s, below the 5 s keep-alive of common servers): the
    gateway closes a pooled connection idle that long, so it never reuses one the backend is
    about to close."""
    idle = 0.3
    async with Server(answer) as server:
        config = backend_config(server.url(), limits={"idle_timeout": idle})
        async with running(config) as backend:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
            answered = anyio.current_time()
            await server.until(lambda: server.peers[0].closed)
            assert anyio.current_time() - answered >= idle * 0.9
            assert (await backend.request(call(2, "t"), ignore, GATEWAY_CALL))["id"] == 2
    assert [len(peer.requests) for peer in server.peers] == [1, 1]


@pytest.mark.parametrize(
    "unsolicited",
    [
        json_reply(b'{"jsonrpc":"2.0","id":2,"result":{"stale":true}}'),
        b"HTTP/1.1 200 OK\r\nContent-Len",
        b"garbage\r\n\r\n",
    ],
    ids=["a-whole-reply", "part-of-a-head", "garbage"],
)
async def test_unsolicited_bytes_on_an_idle_connection_do_not_become_the_next_reply(
    unsolicited: bytes,
) -> None:
    """A backend that writes to a connection while it sits idle in the pool: the next request
    does not take those bytes for its reply; it goes out once, on a clean connection."""

    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            first = await peer.read_request()
            assert first is not None
            await peer.send(json_reply(result_for(first)))
            await settle()
            await peer.send(unsolicited)
            wrote.set()
        await answer(peer)

    wrote = anyio.Event()
    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
        with anyio.fail_after(BOUND):
            await wrote.wait()
        await settle()
        got = await backend.request(call(2, "t"), ignore, GATEWAY_CALL)
        assert got["result"] == {"resultType": "complete"} and got["id"] == 2
    assert len(server.requests) == 2


async def test_a_client_is_told_by_code_that_the_backend_connection_was_lost() -> None:
    """Through the whole gateway: the call whose connection broke after it went out reaches the
    backend once, and the client gets the connection-lost error (200 with a JSON-RPC error, as
    every error of ours); the next call is served."""
    calls: list[Message] = []

    async def handler(peer: Peer) -> None:
        while (got := await peer.read_request()) is not None:
            if got.message.get("method") == "tools/call":
                calls.append(got.message)
                if len(calls) == 1:
                    return  # closed after reading the call, unanswered
            result = {"server/discover": DISCOVERED, "tools/list": TOOLS}.get(
                str(got.message.get("method"))
            )
            await peer.send(json_reply(result_for(got, result)))

    async with Server(handler) as server:
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0}},
                "backends": {"b": {"http": {"url": server.url()}}},
            }
        )
        async with Gateway(gateway_config.parse(text)) as gw, aiohttp.ClientSession() as client:
            assert gw.http_url is not None
            for rid in (1, 2):
                msg = call(rid, "t")
                with anyio.fail_after(BOUND):
                    async with client.post(
                        gw.http_url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
                    ) as resp:
                        status, body = resp.status, orjson.loads(await resp.read())
                if rid == 1:
                    assert status == 200
                    assert body["error"]["code"] == codes.BACKEND_CONNECTION_LOST, body
                else:
                    assert body["result"] == {"resultType": "complete"}, body
    assert len(calls) == 2  # (each call once, under ids of the gateway's)


async def test_the_media_type_is_read_case_insensitively() -> None:
    async def handler(peer: Peer) -> None:
        request = await peer.read_request()
        assert request is not None
        event = chunk(b"data: " + result_for(request) + b"\n\n")
        stream = head(
            "Content-Type: Text/Event-Stream; charset=utf-8", "Transfer-Encoding: chunked"
        )
        await peer.send(stream + event + b"0\r\n\r\n")

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        assert (await backend.request(call(1, "t"), ignore, GATEWAY_CALL))["id"] == 1


async def test_a_connection_the_backend_closed_while_idle_is_replaced() -> None:
    async def handler(peer: Peer) -> None:
        if peer.index == 0:
            request = await peer.read_request()
            assert request is not None
            await peer.send(json_reply(result_for(request)))
            return  # closes the kept-alive connection
        await answer(peer)

    async with Server(handler) as server, running(backend_config(server.url())) as backend:
        await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
        await server.until(lambda: server.live == 0)
        await settle()
        assert (await backend.request(call(2, "t"), ignore, GATEWAY_CALL))["id"] == 2
    assert [len(peer.requests) for peer in server.peers] == [1, 1]
