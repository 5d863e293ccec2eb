"""Nesting past the gateway's bound (jsonrpc.MAX_DEPTH) gets a clean JSON-RPC error, never a 500
or a traceback (basic/index: a request that is not a valid JSON-RPC request gets -32600 Invalid
Request); a backend's reply nested past it fails its caller with a backend protocol error
(-31003) at once. The well-behaved request after each is still served."""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from gateway.protocol import codes, jsonrpc
from tests.support.exact import Gateway, gateways, post, tool_call

pytestmark = [pytest.mark.slow]

LEVELS = [100, 251, 252, 600, 1023, 1024, 5000]
# envelope, params and arguments are three of a request's levels
OWN_LEVELS = 3


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def nested_request(rid: str, levels: int) -> bytes:
    lists = levels - OWN_LEVELS
    return tool_call(rid, "deep", b'{"depth":1,"v":' + b"[" * lists + b"1" + b"]" * lists + b"}")


def deep_reply_request(rid: str, depth: int) -> bytes:
    return tool_call(rid, "deep", b'{"depth":%d}' % depth)


def code_of(reply: bytes) -> int | None:
    return jsonrpc.error_code(orjson.loads(reply))


# --- the pure part -------------------------------------------------------------------------------


@pytest.mark.parametrize("levels", [jsonrpc.MAX_DEPTH - 1, jsonrpc.MAX_DEPTH])
def test_a_message_up_to_the_bound_is_accepted(levels: int) -> None:
    for opened, closed in ((b"[", b"]"), (b'{"a":', b"}")):
        inner = opened * (levels - 2) + b"1" + closed * (levels - 2)
        msg = jsonrpc.decode(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"v":' + inner + b"}}")
        assert isinstance(msg, dict)
        assert orjson.loads(jsonrpc.encode(msg)) == orjson.loads(orjson.dumps(msg))


@pytest.mark.parametrize("levels", [jsonrpc.MAX_DEPTH + 1, 1024, 1025, 5000])
def test_a_message_past_the_bound_is_refused_with_its_id(levels: int) -> None:
    inner = b"[" * (levels - 2) + b"1" + b"]" * (levels - 2)
    request = jsonrpc.decode(
        b'{"jsonrpc":"2.0","id":"r","method":"m","params":{"v":' + inner + b"}}"
    )
    assert isinstance(request, jsonrpc.Invalid)
    assert (request.code, request.id, request.response) == (codes.INVALID_REQUEST, "r", False)
    reply = jsonrpc.decode(b'{"jsonrpc":"2.0","id":7,"result":{"v":' + inner + b"}}", keep=True)
    assert isinstance(reply, jsonrpc.Invalid)
    assert (reply.code, reply.id, reply.response) == (codes.INVALID_REQUEST, 7, True)


def test_brackets_inside_strings_do_not_count() -> None:
    text = orjson.dumps("[" * 5000)
    msg = jsonrpc.decode(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"t":' + text + b"}}")
    assert isinstance(msg, dict)


# --- through the gateway -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    with gateways(tmp_path_factory.mktemp("nesting")) as running:
        yield running


def expected(levels: int) -> int | None:
    return None if levels <= jsonrpc.MAX_DEPTH else codes.INVALID_REQUEST


def assert_clean_log(gateway: Gateway) -> None:
    log = gateway.log()
    assert "Traceback" not in log, log
    assert "-32603" not in log and "nternal error" not in log, log


@pytest.mark.anyio
@pytest.mark.parametrize("levels", LEVELS)
async def test_deep_requests_through_the_http_front_end(
    started: dict[str, Gateway], levels: int
) -> None:
    gateway = started["stdio"]
    status, events = await post(gateway.url, nested_request("h", levels), "deep")
    assert len(events) == 1, events
    if expected(levels) is None:
        assert status == 200
        assert b'"result"' in events[0]
    else:
        assert status == 400
        assert code_of(events[0]) == expected(levels)
        assert orjson.loads(events[0])["id"] == "h"
    status, events = await post(gateway.url, deep_reply_request("ok", 1), "deep")
    assert status == 200 and b'"result"' in events[-1]
    assert_clean_log(gateway)


@pytest.mark.parametrize("levels", LEVELS)
def test_deep_requests_through_the_stdio_front_end(
    started: dict[str, Gateway], levels: int
) -> None:
    gateway = started["http"]
    rid = f"s{levels}"
    gateway.send_line(nested_request(rid, levels))
    reply = gateway.reply_line(rid)
    if expected(levels) is None:
        assert b'"result"' in reply
    else:
        assert code_of(reply) == expected(levels)
    gateway.send_line(deep_reply_request(f"ok{levels}", 1))
    assert b'"result"' in gateway.reply_line(f"ok{levels}")
    assert_clean_log(gateway)


@pytest.mark.anyio
@pytest.mark.parametrize("back", ["stdio", "http"])
@pytest.mark.parametrize("depth", [100, 260, 600, 2000])
async def test_a_deep_backend_reply_is_a_backend_protocol_error(
    started: dict[str, Gateway], back: str, depth: int
) -> None:
    gateway = started[back]
    status, events = await post(gateway.url, deep_reply_request("d", depth), "deep")
    assert status == 200
    assert len(events) == 1, events
    if depth + 3 <= jsonrpc.MAX_DEPTH:  # (envelope, result, its member)
        assert b'"result"' in events[0]
    else:
        assert code_of(events[0]) == codes.BACKEND_PROTOCOL_ERROR
    # through the stdio front end too, and the backend still serves the next request
    rid = f"d{depth}"
    gateway.send_line(deep_reply_request(rid, depth))
    reply = gateway.reply_line(rid)
    if depth + 3 <= jsonrpc.MAX_DEPTH:
        assert b'"result"' in reply
    else:
        assert code_of(reply) == codes.BACKEND_PROTOCOL_ERROR
    status, events = await post(gateway.url, deep_reply_request("ok", 1), "deep")
    assert status == 200 and b'"result"' in events[-1]
    assert_clean_log(gateway)


def test_a_message_at_the_bound_still_encodes_a_few_levels_deeper() -> None:
    # The headroom the bound leaves: a backend's question put inside an `input_required`
    # result (result, inputRequests, its key) must still be encodable by orjson.
    inner = b"[" * (jsonrpc.MAX_DEPTH - 2) + b"1" + b"]" * (jsonrpc.MAX_DEPTH - 2)
    msg = jsonrpc.decode(b'{"jsonrpc":"2.0","id":1,"method":"m","params":{"v":' + inner + b"}}")
    assert isinstance(msg, dict)
    wrapped = jsonrpc.result(1, {"resultType": "input_required", "inputRequests": {"k": msg}})
    assert jsonrpc.encode(wrapped).startswith(b'{"jsonrpc":"2.0"')
