"""Numbers cross the gateway as the same JSON values (basic/index, JSON-RPC messages carry JSON
values; the gateway forwards what it does not own unchanged): integers past 64 bits, decimals
longer than a double, `-0`, and exponents out of a double's range, in a tool's arguments on the
way to the backend, in its result and in its progress notification on the way back, on every
pairing of front end (HTTP, stdio) and backend (stdio, HTTP)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import orjson
import pytest

from gateway.protocol import jsonrpc, numbers
from tests.servers.exact_server import FIRST, NUMBERS
from tests.support.exact import BACKENDS, Gateway, gateways, numbers_of, post, tool_call

pytestmark = [pytest.mark.slow]

ARGS = (
    b'{"big":123456789012345678901234567890,"neg":-987654321098765432109876543210,'
    b'"list":[1,-123456789012345678901234567890,{"deep":[18446744073709551616]}],'
    b'"a":0.1000000000000000055511151231257827,"pi":3.141592653589793238462643383279,'
    b'"zeros":[-0,-0.0,0],"huge":1e400,"tiny":1E-400,"plain":[42,0.5,-7],'
    b'"text":"123456789012345678901234567890 -0, 1e-400"}'
)


def envelope(params: bytes) -> bytes:
    return b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + params + b"}"


# --- the pure part -------------------------------------------------------------------------------


def test_every_number_is_written_back_as_it_was_read() -> None:
    msg = jsonrpc.decode(envelope(ARGS))
    assert isinstance(msg, dict)
    assert numbers_of(jsonrpc.encode(msg)) == [b"1", *numbers_of(ARGS)]
    # A rewrite elsewhere in the message re-encodes it; the numbers stay as they were.
    out = {**msg, "params": {**msg["params"], "name": "renamed"}}
    assert numbers_of(jsonrpc.encode(out)) == [b"1", *numbers_of(ARGS)]


def test_strings_that_look_like_numbers_stay_strings() -> None:
    msg = jsonrpc.decode(envelope(ARGS))
    assert isinstance(msg, dict)
    assert msg["params"]["text"] == "123456789012345678901234567890 -0, 1e-400"
    assert msg["params"]["plain"] == [42, 0.5, -7]


def test_the_cheap_check_passes_common_messages_by() -> None:
    common = envelope(
        b'{"name":"echo","arguments":{"text":"at 2026-12-03T20:13:00Z, id 3f2e4b1a-9c0d",'
        b'"n":42,"t":0.7,"big":922337203685477},"_meta":{"progressToken":"t-1"}}'
    )
    assert not numbers.suspect(common)
    for number in (b"12345678901234567", b"-0", b"1E-400", b"0.1000000000000000055"):
        assert numbers.suspect(envelope(b'{"v":[' + number + b"]}"))


@pytest.mark.parametrize(
    ("token", "carried"),
    [
        (b"18446744073709551615", True),  # u64: orjson keeps integers up to here
        (b"18446744073709551616", False),
        (b"-9223372036854775808", True),
        (b"-9223372036854775809", False),
        (b"-0", False),
        (b"-0.0", True),
        (b"0.1", True),
        (b"0.1000000000000000055511151231257827", False),
        (b"1e400", False),
        (b"1E-400", False),
        (b"5e-324", True),
        (b"1.5e300", True),
        (b"1" * 5000, False),  # (past the 4300 digits int() reads: not read at all)
        (b"-" + b"9" * 5000, False),
    ],
)
def test_which_numbers_orjson_carries(token: bytes, carried: bool) -> None:
    assert numbers.carried(token) is carried


def test_an_integer_of_thousands_of_digits_is_carried_as_written() -> None:
    """Python's int() refuses a text of more than 4300 digits: decode must not raise on it."""
    params = b'{"n":' + b"7" * 5000 + b"}"
    msg = jsonrpc.decode(envelope(params))
    assert isinstance(msg, dict)
    assert jsonrpc.encode(msg) == envelope(params)


def test_a_number_cannot_become_a_member_name() -> None:
    # (swapping a number for a string before parsing must not make invalid JSON valid)
    bad = envelope(b'{"a":1,123456789012345678901234567890:2}')
    decoded = jsonrpc.decode(bad)
    assert isinstance(decoded, jsonrpc.Invalid)
    assert decoded.code == -32700


def test_a_string_cannot_pass_for_a_number() -> None:
    forged = envelope(b'{"v":"\\u0000' + b"0" * 16 + b':0","w":123456789012345678901234567890}')
    msg = jsonrpc.decode(forged)
    assert isinstance(msg, dict)
    assert msg["params"]["v"] == "\x00" + "0" * 16 + ":0"


def test_a_kept_reply_with_such_numbers_is_still_forwarded_as_its_bytes() -> None:
    raw = b'{"jsonrpc":"2.0","id":3,"result":' + NUMBERS + b"}"
    msg = jsonrpc.decode(raw, keep=True)
    assert isinstance(msg, dict)
    assert jsonrpc.encode(msg) is raw
    msg["id"] = 4
    assert jsonrpc.encode(msg) == raw.replace(b'"id":3', b'"id":4')


# --- through the gateway -------------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    with gateways(tmp_path_factory.mktemp("exact")) as running:
        yield running


def arguments_received(reply: bytes) -> bytes:
    """The `arguments` text of the request the exact server received (it answers with it)."""
    # (the reply holds numbers orjson refuses: only its one string is parsed)
    quoted = re.search(rb'"text":("(?:[^"\\]|\\.)*")', reply)
    assert quoted is not None, reply
    received: bytes = orjson.loads(quoted.group(1)).encode()
    start = received.index(b'"arguments":') + len(b'"arguments":')
    return received[start : received.index(b',"_meta":')]


def check(reply: bytes, note: bytes) -> None:
    assert b'"result"' in reply, reply
    assert numbers_of(arguments_received(reply)) == numbers_of(ARGS)
    assert numbers_of(reply) == numbers_of(NUMBERS)
    assert numbers_of(note) == [FIRST]


@pytest.mark.anyio
@pytest.mark.parametrize("back", BACKENDS)
async def test_numbers_cross_the_http_front_end_unchanged(
    started: dict[str, Gateway], back: str
) -> None:
    status, events = await post(started[back].url, tool_call("h", "raw", ARGS, "p-h"), "raw")
    assert status == 200
    replies = [e for e in events if b'"result"' in e]
    notes = [e for e in events if b"notifications/progress" in e]
    assert len(replies) == 1 and len(notes) == 1, events
    check(replies[0], notes[0])


@pytest.mark.parametrize("back", BACKENDS)
def test_numbers_cross_the_stdio_front_end_unchanged(
    started: dict[str, Gateway], back: str
) -> None:
    gateway = started[back]
    gateway.send_line(tool_call("s", "raw", ARGS, "p-s"))
    reply = gateway.reply_line("s")
    note = gateway.stdout_line(r'notifications/progress.*"p-s"')
    check(reply, note)
