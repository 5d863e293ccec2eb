"""The gateway owns the JSON-RPC ids on the HTTP backend's hop (gateway/backends/ids.py): every
request goes out under an id and progress token of the gateway's, only the response with that
id ends it, and the client's id is put back without encoding the reply again.

Against a real misbehaving aiohttp server (tests/servers/unruly_http.py) that answers twice,
answers with a stray id or with the client's own id, routes replies by request id, and sends
progress for tokens it was never given; plus the id splice on its own. Errors by code.
"""

from __future__ import annotations

import logging

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway import config as gateway_config
from gateway import errors
from gateway.app import Gateway
from gateway.backends import ids
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.era.http_session import HttpSession
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from tests.servers import unruly_http
from tests.support import (
    BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    mirrored_headers,
)
from tests.support.backend import backend_config, code_of, ignore, running

pytestmark = pytest.mark.anyio
LOGGER = "gateway.backend"


def warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def tool_calls(server: unruly_http.Unruly) -> list[Message]:
    return [m for m in server.received if m.get("method") == "tools/call"]


# --- what goes out --------------------------------------------------------------------------------


async def test_the_backend_sees_ids_of_the_gateway_and_the_client_its_own() -> None:
    async with unruly_http.serving() as (server, url), running(backend_config(url)) as backend:
        with anyio.fail_after(BOUND):
            got = [
                await backend.request(call(1, "echo", x=i), ignore, GATEWAY_CALL) for i in range(3)
            ]
    assert [r["id"] for r in got] == [1, 1, 1]
    assert [r["result"]["echo"] for r in got] == [{"x": 0}, {"x": 1}, {"x": 2}]
    sent = [m["id"] for m in tool_calls(server)]
    assert len(set(sent)) == 3 and 1 not in sent
    assert all(isinstance(i, str) and i.startswith(ids.PREFIX) for i in sent)


# --- replies that are not the request's -----------------------------------------------------------


async def test_a_second_reply_on_one_stream_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """The first reply ends the request; the second, on the same stream, reaches nobody (one
    log line), and the next request gets its own reply."""
    caplog.set_level(logging.WARNING, LOGGER)
    async with unruly_http.serving() as (_, url), running(backend_config(url)) as backend:
        with anyio.fail_after(BOUND):
            got = await backend.request(call(1, "twice"), ignore, GATEWAY_CALL)
            following = await backend.request(call(2, "echo", after=True), ignore, GATEWAY_CALL)
    assert got["id"] == 1 and got["result"]["n"] == 1
    assert following["id"] == 2 and following["result"]["echo"] == {"after": True}
    assert len(warnings(caplog, "second reply")) == 1


async def test_a_stray_reply_is_dropped_and_the_request_waits_for_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    async with unruly_http.serving() as (_, url), running(backend_config(url)) as backend:
        with anyio.fail_after(BOUND):
            got = await backend.request(call(1, "stray"), ignore, GATEWAY_CALL)
    assert got["id"] == 1 and got["result"]["stray"] is False
    assert len(warnings(caplog, "someone-else")) == 1


@pytest.mark.parametrize(
    "msg",
    [
        call(1, "stray_json"),
        call(1, "client_id", as_id=1, json=True),
        call(1, "client_id", as_id=1),
    ],
    ids=["stray-json", "client-id-json", "client-id-sse"],
)
async def test_a_stream_that_ends_with_only_other_ids_fails_the_request(
    msg: Message, caplog: pytest.LogCaptureFixture
) -> None:
    """A reply under an id the request was not sent with (a stray one, or the client's own id
    echoed instead of the gateway's) is never taken for its reply: -31003, one log line."""
    caplog.set_level(logging.WARNING, LOGGER)
    async with unruly_http.serving() as (_, url), running(backend_config(url)) as backend:
        with anyio.fail_after(BOUND), pytest.raises(errors.BackendProtocolError) as caught:
            await backend.request(msg, ignore, GATEWAY_CALL)
    assert code_of(caught) == codes.BACKEND_PROTOCOL_ERROR
    assert len(warnings(caplog, "dropped a reply")) == 1


async def test_two_clients_with_the_same_id_never_see_each_others_replies() -> None:
    """Through the whole gateway, two clients both using id 1 at once, in front of a server
    that keeps its reply streams by request id: each gets its own reply (with the client's id
    the server would have sent one of them both replies and the other none)."""
    async with unruly_http.serving() as (server, url):
        text = yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0}},
                "backends": {"b": {"http": {"url": url}}},
            }
        )
        async with Gateway(gateway_config.parse(text)) as gw, aiohttp.ClientSession() as client:
            assert gw.http_url is not None
            gateway_url = gw.http_url
            replies: dict[str, Message] = {}

            async def one(who: str) -> None:
                msg = call(1, "routed", who=who, expect=2)
                async with client.post(
                    gateway_url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
                ) as resp:
                    replies[who] = orjson.loads(await resp.read())

            with anyio.fail_after(BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one, "A")
                    tg.start_soon(one, "B")
    assert {who: r.get("result", {}).get("who") for who, r in replies.items()} == {
        "A": "A",
        "B": "B",
    }
    assert [r["id"] for r in replies.values()] == [1, 1]
    routed = [m["id"] for m in tool_calls(server)]
    assert len(set(routed)) == 2


# --- progress -------------------------------------------------------------------------------------


async def test_progress_travels_under_a_token_of_the_gateway() -> None:
    """basic/utilities/progress: the backend sees a token of the gateway's, the client gets its
    own back; progress for any other token on the stream is not this client's and is dropped,
    and a request that asked for no progress gets none."""
    notes: list[Message] = []

    async def sink(note: Message) -> None:
        notes.append(note)

    async with unruly_http.serving() as (_, url), running(backend_config(url)) as backend:
        with anyio.fail_after(BOUND):
            got = await backend.request(call(1, "progress", token="tok-A"), sink, GATEWAY_CALL)
            asked = list(notes)
            notes.clear()
            await backend.request(call(2, "progress"), sink, GATEWAY_CALL)
    seen = got["result"]["token_seen"]
    assert seen != "tok-A" and isinstance(seen, str) and seen.startswith(ids.PREFIX)
    assert [n["params"]["progressToken"] for n in asked] == ["tok-A"]
    assert notes == []


# --- cancellation ---------------------------------------------------------------------------------


async def test_a_legacy_server_is_told_of_a_cancellation_under_the_id_it_was_sent() -> None:
    """2025-11-25 transports: closing the stream is not cancellation; the backend gets
    `notifications/cancelled` naming the id it received, never the client's."""

    def cancelled() -> list[Message]:
        return [m for m in server.received if m.get("method") == "notifications/cancelled"]

    async with (
        unruly_http.serving(legacy=True) as (server, url),
        running(backend_config(url)) as backend,
    ):
        session = HttpSession(backend)
        session.begin_session()
        session.agreed(unruly_http.LEGACY)
        async with anyio.create_task_group() as tg:
            tg.start_soon(backend.request, call(1, "hang"), ignore, GATEWAY_CALL)
            await server.until(lambda: bool(tool_calls(server)))
            tg.cancel_scope.cancel()
        await server.until(lambda: bool(cancelled()))
    (sent,) = tool_calls(server)
    assert [m["params"]["requestId"] for m in cancelled()] == [sent["id"]]
    assert sent["id"] != 1


# --- the id splice on its own ---------------------------------------------------------------------


def sent_as(wire: str, client_id: jsonrpc.RequestId = 1) -> ids.Sent:
    return ids.outbound({"jsonrpc": "2.0", "id": client_id, "method": "m"}, wire)[1]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":"gw-7","result":{"id":"gw-8"}}',
        b'{"id" : "gw-7", "jsonrpc":"2.0","result":{}}',
        b'{"result":{"id":1},"jsonrpc":"2.0","id":"gw-7"}',
        b'{"result":{}, "id": "gw-7" , "jsonrpc" : "2.0" }\n',
    ],
    ids=["first", "spaced-first", "last", "before-jsonrpc"],
)
def test_the_clients_id_replaces_the_gateways_in_the_bytes(raw: bytes) -> None:
    reply = jsonrpc.decode(raw, keep=True)
    assert isinstance(reply, jsonrpc.Received)
    out = ids.restore(reply, sent_as("gw-7", "client-1"))
    assert isinstance(out, jsonrpc.Received) and out.raw == raw.replace(b'"gw-7"', b'"client-1"')
    assert orjson.loads(jsonrpc.encode(out)) == {**orjson.loads(raw), "id": "client-1"}


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jsonrpc":"2.0","id":"gw-7","result":{"echo":"gw-7"}}',  # twice in the text
        b'{"jsonrpc":"2.0","result":{"x":{"id":"gw-7"}},"id":"gw\\u002d7","more":1}',
        b'{"jsonrpc":"2.0","id":"gw-7","result":{},"id":"gw-7"}',  # a duplicate member
    ],
    ids=["echoed", "escaped", "duplicate"],
)
def test_an_id_whose_place_is_not_certain_is_encoded_afresh(raw: bytes) -> None:
    reply = jsonrpc.decode(raw, keep=True)
    assert isinstance(reply, jsonrpc.Received) and ids.answers(reply, sent_as("gw-7"))
    out = ids.restore(reply, sent_as("gw-7", 42))
    assert orjson.loads(jsonrpc.encode(out))["id"] == 42
    assert out["result"] == orjson.loads(raw)["result"]
