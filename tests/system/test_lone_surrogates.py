"""Strings with lone surrogates cross the gateway unchanged (basic/index: messages are JSON-RPC,
i.e. JSON; RFC 8259 8.2 lets a string escape a lone surrogate, `"\\ud800"`, though it names no
character). orjson refuses them both ways; the gateway passes them on (protocol/jsonrpc.py),
from a client to a backend in a tool's arguments and from a backend to a client in its result,
on both front ends (HTTP, stdio) and every backend transport of the exact server. Bytes that
are not UTF-8, and text that is not JSON, are still a parse error."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator

import orjson
import pytest

from gateway.backends import ids
from gateway.protocol import headers, jsonrpc
from tests.servers.exact_server import LONE, LONE_DESCRIPTION
from tests.support.exact import BACKENDS, Gateway, gateways, post, tool_call

pytestmark = [pytest.mark.slow]

PARSE_ERROR = -32700
# A tool's arguments: lone high and low surrogates, one in a member name, one beside a pair.
ARGS = b'{"s":"\\ud800","t":"x\\udfffy","\\udbffk":["\\udc00","\\ud83d\\ude00\\ud800"]}'
# As the gateway writes them on (it encodes a client's request afresh): the lone surrogates as
# the same escapes, the pair as the character it stands for, in UTF-8.
ARGS_ON = ARGS.replace(b"\\ud83d\\ude00", "\U0001f600".encode())
# The backend's reply, encoded afresh the same way.
LONE_AGAIN = LONE.replace(b"\\ud83d\\ude00", "\U0001f600".encode())


HEADER_MISMATCH = -32020
PARAM_S = "Mcp-Param-S"  # (the `lone` tool mirrors its argument `s`)


def wtf8_b64(text: str) -> str:
    return base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()


S_HEADER = "=?base64?" + wtf8_b64("\ud800") + "?="


def envelope(params: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + params + b"}"


# --- the pure part -------------------------------------------------------------------------------


def test_a_lone_surrogate_is_read_and_written_back_as_its_escape() -> None:
    msg = jsonrpc.decode(envelope(b'{"name":"lone","arguments":' + ARGS + b"}"))
    assert isinstance(msg, dict)
    arguments = msg["params"]["arguments"]
    assert arguments["s"] == "\ud800" and arguments["t"] == "x\udfffy"
    assert arguments["\udbffk"] == ["\udc00", "\U0001f600\ud800"]
    # Rewritten (as the gateway rewrites a name): encoded afresh, the surrogates as escapes.
    out = jsonrpc.encode({**msg, "params": {**msg["params"], "name": "renamed"}})
    assert out == envelope(
        b'{"name":"renamed","arguments":{"s":"\\ud800","t":"x\\udfffy",'
        b'"\\udbffk":["\\udc00","\xf0\x9f\x98\x80\\ud800"]}}'
    )


def test_numbers_stay_exact_beside_a_lone_surrogate() -> None:
    """The fallback parser keeps what orjson's path keeps (protocol/numbers.py)."""
    params = b'{"s":"\\ud800","n":[123456789012345678901234567890,-0,1e400,0.5,7,-7]}'
    msg = jsonrpc.decode(envelope(params))
    assert isinstance(msg, dict)
    assert jsonrpc.encode(msg) == envelope(params)
    assert [type(n) for n in msg["params"]["n"][3:]] == [float, int, int]


def test_a_kept_reply_with_lone_surrogates_is_forwarded_as_its_bytes() -> None:
    raw = b'{"jsonrpc":"2.0","id":3,"result":{"structuredContent":' + LONE + b"}}"
    msg = jsonrpc.decode(raw, keep=True)
    assert isinstance(msg, jsonrpc.Received)
    assert jsonrpc.encode(msg) is raw


@pytest.mark.parametrize(
    "text",
    [
        b'{"s":"\\ud800"',  # not JSON, surrogate or not
        b'{"s":"\\ud800","n":NaN}',  # the stdlib reads NaN; JSON has none
        b'{"s":"\\ud800","b":"\xff"}',  # not UTF-8
        b'{"s":"\xed\xa0\x80"}',  # a surrogate encoded in the bytes: not UTF-8 either
        b'{"s":"\\ud800"}\x00',
        b'{"s":"\\uZZZZ\\ud800"}',
    ],
)
def test_what_is_not_json_is_still_a_parse_error(text: bytes) -> None:
    decoded = jsonrpc.decode(envelope(text))
    assert isinstance(decoded, jsonrpc.Invalid)
    assert decoded.code == PARSE_ERROR


def test_depth_is_still_bounded_beside_a_lone_surrogate() -> None:
    for depth, code in ((300, -32600), (3000, -32600)):
        nested = b"[" * depth + b"]" * depth
        decoded = jsonrpc.decode(envelope(b'{"s":"\\ud800","d":' + nested + b"}"))
        assert isinstance(decoded, jsonrpc.Invalid) and decoded.code == code
    shallow = jsonrpc.decode(envelope(b'{"s":"\\ud800","d":' + b"[" * 100 + b"]" * 100 + b"}"))
    assert isinstance(shallow, dict)


def test_a_header_value_with_a_lone_surrogate_is_base64_of_its_wtf8() -> None:
    encoded = headers.encode_value("a\ud800")
    assert encoded == "=?base64?" + wtf8_b64("a\ud800") + "?="
    assert headers.decode_value(encoded) == "a\ud800"


def test_a_client_id_with_a_lone_surrogate_goes_back_into_a_kept_reply() -> None:
    """The id swapped into a backend's kept bytes (backends/ids.py) is written as JSON too."""
    request = jsonrpc.decode(b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    assert isinstance(request, dict)
    _, sent = ids.outbound(request, "gw-1")
    reply = jsonrpc.decode(b'{"jsonrpc":"2.0","id":"gw-1","result":{}}', keep=True)
    assert isinstance(reply, jsonrpc.Received)
    restored = ids.restore(reply, sent)
    assert jsonrpc.encode(restored) == b'{"jsonrpc":"2.0","id":"\\ud800","result":{}}'


def test_a_string_cannot_pass_for_a_set_aside_one() -> None:
    """`dumps` marks the strings it writes itself; a peer's string shaped like a mark stays
    the peer's text."""
    forged = jsonrpc.dumps(["\ud800", "\x00" + "0" * 16 + ":0"])
    assert forged == b'["\\ud800","\\u0000' + b"0" * 16 + b':0"]'


def test_what_is_not_json_still_fails_to_encode() -> None:
    with pytest.raises(orjson.JSONEncodeError):
        jsonrpc.dumps({"s": "\ud800", "v": {1, 2}})


# --- through the gateway -------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    with gateways(tmp_path_factory.mktemp("lone")) as running:
        yield running


def check(reply: bytes, back: str) -> None:
    """The backend got the arguments with the client's lone surrogates (it quotes the text of
    the arguments it read), and its own reach the client: from the modern HTTP backend as its
    very bytes (the pair stays an escape: the reply was not encoded again); from the others,
    whose replies the gateway changes (the id of a stdio one, a legacy result), encoded afresh,
    with the same escapes."""
    msg = jsonrpc.decode(reply)
    assert isinstance(msg, dict) and "result" in msg, reply
    assert msg["result"]["content"][0]["text"].encode() == ARGS_ON
    kept = b'"structuredContent":' + LONE + b"}" in reply
    again = b'"structuredContent":' + LONE_AGAIN + b"}" in reply
    assert kept if back == "http" else kept or again, reply


@pytest.mark.anyio
@pytest.mark.parametrize("back", BACKENDS)
async def test_lone_surrogates_cross_the_http_front_end_both_ways(
    started: dict[str, Gateway], back: str
) -> None:
    url = started[back].url
    status, events = await post(url, tool_call("h", "lone", ARGS), "lone", {PARAM_S: S_HEADER})
    assert status == 200, events
    [reply] = [e for e in events if b'"result"' in e]
    check(reply, back)
    assert "Traceback" not in started[back].log()


@pytest.mark.parametrize("back", BACKENDS)
def test_lone_surrogates_cross_the_stdio_front_end_both_ways(
    started: dict[str, Gateway], back: str
) -> None:
    gateway = started[back]
    gateway.send_line(tool_call("s", "lone", ARGS))
    check(gateway.reply_line("s"), back)
    assert "Traceback" not in gateway.log()


@pytest.mark.anyio
async def test_a_mirrored_header_that_does_not_match_is_still_refused(
    started: dict[str, Gateway],
) -> None:
    """streamable-http, Custom Headers from Tool Parameters: the `x-mcp-header` of `s` must
    match the body; for a lone surrogate that is base64 of its WTF-8 bytes (UTF-8 cannot hold
    it), anything else is -32020. A tool name holding one is routed like any other (its
    Mcp-Name, both from the client and to the backend, is such base64), not a crash."""
    url = started["http"].url
    plain = {PARAM_S: "x"}
    status, events = await post(url, tool_call("m", "lone", ARGS), "lone", plain)
    assert status == 400 and jsonrpc.error_code(orjson.loads(events[0])) == HEADER_MISMATCH
    odd_name = tool_call("n", "NAME", b"{}").replace(b'"NAME"', b'"lone\\udc00"')
    status, events = await post(url, odd_name, "=?base64?" + wtf8_b64("lone\udc00") + "?=")
    assert status == 200, events  # (one backend: names pass as they are, to be answered)
    reply = jsonrpc.decode(events[0])
    assert isinstance(reply, dict) and "result" in reply, events
    assert "Traceback" not in started["http"].log()


def test_a_tool_list_the_gateway_rebuilds_keeps_a_lone_surrogate(
    started: dict[str, Gateway],
) -> None:
    """tools/list is answered from the gateway's catalog (encoded afresh): a description with
    a lone surrogate is written with the same escape."""
    gateway = started["stdio"]
    meta = b'{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    meta += b'"io.modelcontextprotocol/clientCapabilities":{}}'
    gateway.send_line(
        b'{"jsonrpc":"2.0","id":"list","method":"tools/list","params":{"_meta":' + meta + b"}}"
    )
    reply = gateway.reply_line("list")
    assert b'"description":' + LONE_DESCRIPTION in reply, reply


def test_invalid_utf8_from_a_client_is_still_a_parse_error(started: dict[str, Gateway]) -> None:
    gateway = started["stdio"]
    gateway.send_line(tool_call("bad", "lone", b'{"s":"\\ud800","b":"\xff"}'))
    line = gateway.stdout_line(r'"code":-32700')
    assert re.search(rb'"code":-32700', line)
