"""Limits, deadlines and the connection pool of the HTTP backend (backends/http.py, web.py),
against raw servers on 127.0.0.1 (tests/support/backend.py): every limit a backend can push on
(backends.NAME.http.limits: max_headers, max_header_bytes, max_reply_bytes, max_event_bytes,
max_connections) is passed while a well-behaved backend, or the next call, is served; connect
and request deadlines; cancellation. Errors are asserted by code.
"""

from __future__ import annotations

from contextlib import suppress

import anyio
import pytest

from gateway import errors
from gateway.backends.base import GATEWAY_CALL
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    request,
)
from tests.support.backend import (
    Peer,
    Server,
    answer,
    backend_config,
    chunk,
    code_of,
    free_port,
    head,
    hold,
    ignore,
    json_reply,
    result_for,
    running,
    settle,
    sse_event,
    sse_head,
    stalled_listener,
)

pytestmark = pytest.mark.anyio

# How long a test lets time pass to show that a deadline does not fire: there is no event for
# "nothing happens".
STALL_CHECK = 0.3


# --- limits -------------------------------------------------------------------------------------


async def abusive_and_fine(
    abuse: bytes, *, limits: dict[str, object] | None = None, closes: bool = True
) -> pytest.ExceptionInfo[errors.BackendError]:
    """One backend that abuses (answers its first call with `abuse`) while another, well-behaved
    backend is called at the same time; then the abusive one's next call, which is served.
    With `closes`, the gateway must have closed the abused connection (a reply whose framing
    was complete, a body refused only for its size, may leave it reusable)."""

    async def abusive(peer: Peer) -> None:
        if peer.index == 0:
            await peer.read_request()
            peer.writer.write(abuse)
            with suppress(ConnectionError):
                await peer.writer.drain()
        await answer(peer)  # (a connection the gateway kept is served as usual)

    async with Server(abusive) as bad, Server(answer) as good:
        bad_config = backend_config(bad.url(), limits=limits or {})
        async with running(bad_config) as bad_backend, running(backend_config(good.url())) as fine:
            caught: list[pytest.ExceptionInfo[errors.BackendError]] = []

            async def abused() -> None:
                with pytest.raises(errors.BackendError) as info:
                    await bad_backend.request(call(1, "t"), ignore, GATEWAY_CALL)
                caught.append(info)

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(abused)
                    assert (await fine.request(call(2, "t"), ignore, GATEWAY_CALL))["id"] == 2
                if closes:  # by the gateway, not left to the backend
                    await bad.until(lambda: bad.peers[0].closed)
                assert (await bad_backend.request(call(3, "t"), ignore, GATEWAY_CALL))["id"] == 3
    return caught[0]


async def test_ten_thousand_response_header_lines_are_a_protocol_error() -> None:
    """limits.max_headers (default 100): more header fields in a reply end it with -31003."""
    abuse = head("Content-Type: application/json", *["X-A: b"] * 10_000, "Content-Length: 2")
    caught = await abusive_and_fine(abuse + b"{}")
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


async def test_max_headers_is_the_configured_count() -> None:
    abuse = head("Content-Type: application/json", *["X-A: b"] * 20, "Content-Length: 2")
    caught = await abusive_and_fine(abuse + b"{}", limits={"max_headers": 16})
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


async def test_a_header_line_over_max_header_bytes_is_a_protocol_error() -> None:
    """limits.max_header_bytes (default 8190) bounds each header line of a reply."""
    abuse = head("Content-Type: application/json", "X-Big: " + "a" * 2000, "Content-Length: 2")
    caught = await abusive_and_fine(abuse + b"{}", limits={"max_header_bytes": 1024})
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_json_reply_over_max_reply_bytes_is_refused(framing: str) -> None:
    """limits.max_reply_bytes (default 64 MiB): a bigger JSON reply is refused, not buffered;
    with a declared length, before it is read."""
    body = b'{"jsonrpc":"2.0","id":1,"result":{"x":"' + b"x" * 5000 + b'"}}'
    if framing == "content-length":
        abuse = json_reply(body)
    else:
        abuse = head("Content-Type: application/json", "Transfer-Encoding: chunked")
        abuse += b"".join(chunk(body[i : i + 500]) for i in range(0, len(body), 500))
    caught = await abusive_and_fine(abuse, limits={"max_reply_bytes": 4096}, closes=False)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


async def test_the_events_of_one_reply_over_max_reply_bytes_are_refused() -> None:
    """limits.max_reply_bytes bounds a streamed reply too: all its events together."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "x" * 900}}
    caught = await abusive_and_fine(
        sse_head() + sse_event(note) * 10, limits={"max_reply_bytes": 4096}
    )
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


@pytest.mark.parametrize("ended", [True, False], ids=["whole-event", "endless-line"])
async def test_one_sse_event_over_max_event_bytes_is_refused(ended: bool) -> None:
    """limits.max_event_bytes (default 16 MiB): one bigger event (or a line that never ends)
    is refused and its connection closed."""
    data = b"data: " + b"x" * 5000
    caught = await abusive_and_fine(
        sse_head() + chunk(data + (b"\n\n" if ended else b"")),
        limits={"max_event_bytes": 4096},
    )
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    ],
    ids=["status-code", "status-line", "content-length", "header-line", "two-lengths"],
)
async def test_a_malformed_head_is_a_protocol_error(garbage: bytes) -> None:
    caught = await abusive_and_fine(garbage)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR


# --- connecting, deadlines, cancellation, the pool ------------------------------------------


async def test_connection_refused_is_unavailable() -> None:
    config = backend_config(f"http://127.0.0.1:{free_port()}/mcp")
    async with running(config) as backend:
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
        assert not backend.up
    assert code_of(caught) == codes.BACKEND_UNAVAILABLE


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # not about the loop
async def test_a_connect_that_does_not_complete_in_time_is_unavailable() -> None:
    with stalled_listener() as listener:
        port = listener.getsockname()[1]
        config = backend_config(f"http://127.0.0.1:{port}/", _backend={"connect_timeout": 0.2})
        async with running(config) as backend:
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_UNAVAILABLE


async def test_the_request_timeout_closes_the_connection() -> None:
    async with Server(hold) as server:
        config = backend_config(server.url(), _backend={"request_timeout": 0.2})
        async with running(config) as backend:
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
            await server.until(lambda: server.peers[0].closed)
    assert code_of(caught) == codes.BACKEND_TIMEOUT
    assert len(server.requests) == 1


async def test_the_request_timeout_covers_a_stream_that_never_replies() -> None:
    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(sse_head() + chunk(b": waiting\n\n"))
        await peer.wait_closed_by_client()

    async with Server(handler) as server:
        config = backend_config(server.url(), _backend={"request_timeout": 0.2})
        async with running(config) as backend:
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
            await server.until(lambda: server.peers[0].closed)
    assert code_of(caught) == codes.BACKEND_TIMEOUT


async def test_cancelling_the_caller_closes_the_connection() -> None:
    """streamable-http, Cancellation: the request is cancelled by closing its connection, which
    does not go back to the pool."""
    async with Server(hold) as server, running(backend_config(server.url())) as backend:
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.request, call(1, "t"), ignore, GATEWAY_CALL)
            await server.until(lambda: len(server.requests) == 1)
            tg.cancel_scope.cancel()
        await server.until(lambda: server.peers[0].closed)


async def test_max_connections_bounds_concurrent_connections() -> None:
    """limits.max_connections (default 100): more concurrent calls wait for a connection."""
    go = anyio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await go.wait()
            await peer.send(json_reply(result_for(request)))

    results: dict[int, Message] = {}
    async with Server(handler) as server:
        config = backend_config(server.url(), limits={"max_connections": 2})
        async with running(config) as backend:

            async def one(i: int) -> None:
                results[i] = await backend.request(call(i, "t"), ignore, GATEWAY_CALL)

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    for i in range(6):
                        tg.start_soon(one, i)
                    await server.until(lambda: len(server.requests) == 2)
                    await anyio.wait_all_tasks_blocked()
                    assert len(server.peers) == 2
                    go.set()
    assert {i: r["id"] for i, r in results.items()} == {i: i for i in range(6)}
    assert server.max_live == 2


async def test_waiting_for_a_pooled_connection_is_not_a_connect_timeout() -> None:
    """The connect timeout bounds connecting only: a call queued behind a busy pool waits
    within its own request_timeout."""
    go = anyio.Event()

    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            await go.wait()
            await peer.send(json_reply(result_for(request)))

    async with Server(handler) as server:
        config = backend_config(
            server.url(), limits={"max_connections": 1}, _backend={"connect_timeout": 0.1}
        )
        async with running(config) as backend:
            async with anyio.create_task_group() as tg:
                tg.start_soon(backend.request, call(1, "t"), ignore, GATEWAY_CALL)
                await server.until(lambda: len(server.requests) == 1)
                queued: list[Message] = []

                async def second() -> None:
                    queued.append(await backend.request(call(2, "t"), ignore, GATEWAY_CALL))

                tg.start_soon(second)
                # Past connect_timeout while queued for the only connection: nothing to wait on
                # shows that no deadline fires, so time is let pass.
                await anyio.sleep(STALL_CHECK)
                go.set()
            assert queued[0]["id"] == 2


async def test_listen_streams_never_use_up_the_connections_calls_need() -> None:
    async def handler(peer: Peer) -> None:
        while (request := await peer.read_request()) is not None:
            if request.message["method"] == "subscriptions/listen":
                await peer.send(sse_head() + chunk(b": listening\n\n"))
                await peer.wait_closed_by_client()
                return
            await peer.send(json_reply(result_for(request)))

    async with Server(handler) as server:
        config = backend_config(server.url(), limits={"max_connections": 1})
        async with running(config) as backend, anyio.create_task_group() as tg:

            async def listen(i: int) -> None:
                msg = request(f"l{i}", "subscriptions/listen")
                await backend.request(msg, ignore, GATEWAY_CALL, long_lived=True)

            for i in range(3):
                tg.start_soon(listen, i)
            await server.until(lambda: len(server.requests) == 3)
            with anyio.fail_after(BOUND):
                assert (await backend.request(call(1, "t"), ignore, GATEWAY_CALL))["id"] == 1
            tg.cancel_scope.cancel()


async def test_a_body_that_turns_malformed_ends_the_call_within_its_deadline() -> None:
    """A chunk size that is not hex, after the head: the call fails no later than
    request_timeout and the connection is closed. (aiohttp 3.14.5 closes the connection at once
    but leaves the body's reader waiting, so the deadline is what ends the call today.)"""

    async def handler(peer: Peer) -> None:
        await peer.read_request()
        await peer.send(sse_head() + chunk(b": fine\n\n"))
        await settle()
        await peer.send(b"zz\r\n")
        await peer.wait_closed_by_client()

    async with Server(handler) as server:
        config = backend_config(server.url(), _backend={"request_timeout": 0.3})
        async with running(config) as backend:
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
            await server.until(lambda: server.peers[0].closed)
    assert code_of(caught) in (codes.BACKEND_PROTOCOL_ERROR, codes.BACKEND_TIMEOUT)


async def test_a_stopped_backend_is_unavailable() -> None:
    async with Server(answer) as server:
        async with running(backend_config(server.url())) as backend:
            await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
        with pytest.raises(errors.BackendError) as caught:
            await backend.request(call(2, "t"), ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_UNAVAILABLE
    assert len(server.requests) == 1
