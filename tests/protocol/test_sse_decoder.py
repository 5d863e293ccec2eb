"""The SSE decoder (gateway/protocol/sse.py) on its own: the event stream format of the HTML
Living Standard as Streamable HTTP and HTTP+SSE use it (streamable-http, Sending Messages to
the Server; 2025-11-25 transports, Backwards Compatibility), incremental, linear and bounded.
"""

from __future__ import annotations

import pytest

from gateway.protocol import sse

STREAM = (
    b"event: endpoint\r\ndata: /messages/?s=1\r\n\r\n"
    b": a comment\n"
    b"data: a\r\ndata: b\r\rdata:c\n\n"
    b"id: 7\rretry: 10\revent: e\rdata: d\r\n\r\n"
    b"data\n\n"  # a field without a colon: data with an empty value
    b"event: nothing\n\n"  # no data: no event
    b"data:  two spaces\n\n"
)
EVENTS = [
    ("endpoint", b"/messages/?s=1"),
    ("message", b"a\nb"),
    ("message", b"c"),
    ("e", b"d"),
    ("message", b""),
    ("message", b" two spaces"),
]


def decode(*chunks: bytes, limit: int | None = None) -> list[tuple[str, bytes]]:
    decoder = sse.Decoder(limit)
    out: list[tuple[str, bytes]] = []
    for piece in chunks:
        out += decoder.feed_named(piece)
    return out


def test_a_stream_in_one_piece() -> None:
    assert decode(STREAM) == EVENTS


def test_a_stream_split_at_every_byte() -> None:
    """However the body arrives, the same events: every single split, and every byte alone."""
    for cut in range(len(STREAM) + 1):
        assert decode(STREAM[:cut], STREAM[cut:]) == EVENTS, cut
    assert decode(*(STREAM[i : i + 1] for i in range(len(STREAM)))) == EVENTS


def test_a_stream_split_twice_everywhere() -> None:
    small = b"data: x\r\n\r\ndata: y\r\rdata: z\n\n"
    whole = decode(small)
    assert [data for _, data in whole] == [b"x", b"y", b"z"]
    for i in range(len(small) + 1):
        for j in range(i, len(small) + 1):
            assert decode(small[:i], small[i:j], small[j:]) == whole, (i, j)


@pytest.mark.parametrize("end", [b"\r\n", b"\n", b"\r"], ids=["crlf", "lf", "cr"])
def test_each_line_end(end: bytes) -> None:
    decoder = sse.Decoder()
    body = b"event: x" + end + b"data: 1" + end + end + b"data: 2" + end + end
    assert decoder.feed_named(body) == [("x", b"1")] + ([] if end == b"\r" else [("message", b"2")])
    # A final CR may still be half of a CRLF: the body's end settles it.
    assert decoder.close() == ([b"2"] if end == b"\r" else [])


def test_a_lone_cr_at_the_end_of_a_chunk_waits_for_the_next() -> None:
    """A CR that ends a chunk may be half of a CRLF: it is one line end either way."""
    decoder = sse.Decoder()
    assert decoder.feed(b"data: 1\r") == []
    assert decoder.feed(b"\n\r") == []  # CRLF ended the data line; this CR may be half of one
    assert decoder.feed(b"\n") == [b"1"]
    decoder = sse.Decoder()
    assert decoder.feed(b"data: 2\r") == []
    assert decoder.feed(b"\r") == []  # the first CR was a line end after all
    assert decoder.feed(b"data: 3\n\n") == [b"2", b"3"]  # the second CR was a blank line
    assert decoder.close() == []


def test_close_gives_what_the_body_left_without_a_blank_line() -> None:
    decoder = sse.Decoder()
    assert decoder.feed(b"data: x\r") == []
    assert decoder.close() == [b"x"]
    decoder = sse.Decoder()
    assert decoder.feed(b"data: partial") == []
    assert decoder.close() == [b"partial"]
    assert sse.Decoder().close() == []


def test_a_byte_order_mark_is_dropped_only_at_the_start() -> None:
    assert decode(b"\xef\xbb", b"\xbfdata: 1\n\n") == [("message", b"1")]
    assert decode(b"data: \xef\xbb\xbf1\n\n") == [("message", b"\xef\xbb\xbf1")]


def test_a_32_mib_event_in_4_kib_chunks_is_linear() -> None:
    """One event the size of the old quadratic case (8 s of a blocked loop): fed 4 KiB at a
    time it completes at the cost of reading it (the suite's per-test timeout is the
    backstop)."""
    size = 32 * 1024 * 1024
    body = b"event: message\ndata: " + b"x" * size + b"\n\n"
    decoder = sse.Decoder(64 * 1024 * 1024)
    events: list[bytes] = []
    for at in range(0, len(body), 4096):
        events += decoder.feed(body[at : at + 4096])
    assert len(events) == 1 and len(events[0]) == size


def test_many_small_events_in_one_chunk() -> None:
    body = b"data: {}\n\n" * 100_000
    assert len(sse.Decoder(1024).feed(body)) == 100_000


@pytest.mark.parametrize(
    "body",
    [
        b"data: " + b"x" * 2000 + b"\n\n",  # one data line
        b"data: " + b"x" * 600 + b"\n" + b"data: " + b"x" * 600 + b"\n",  # lines of one event
        b": " + b"x" * 2000,  # a line that never ends, even a comment
    ],
    ids=["one-line", "many-lines", "endless-line"],
)
def test_an_event_over_the_limit_raises(body: bytes) -> None:
    decoder = sse.Decoder(1024)
    with pytest.raises(sse.EventTooLarge):
        for at in range(0, len(body), 100):
            decoder.feed(body[at : at + 100])


def test_the_limit_is_per_event() -> None:
    """Many events, each within the limit, are fine however many there are."""
    decoder = sse.Decoder(1024)
    event = b"data: " + b"x" * 1000 + b"\n\n"
    assert len(decoder.feed(event * 50)) == 50


def test_events_before_the_one_too_large_are_still_given() -> None:
    decoder = sse.Decoder(1024)
    assert decoder.feed(b"data: 1\n\ndata: " + b"x" * 2000) == [b"1"]
    with pytest.raises(sse.EventTooLarge):
        decoder.feed(b"\n\n")


def test_the_last_event_id_and_retry_whatever_the_split() -> None:
    """HTML Living Standard, event stream interpretation: `id` sets the last event id at the
    event's end (an event without data too; one with a NUL is ignored), `retry` takes only
    ASCII digits; what a resumption needs (2025-11-25 transports, Resumability and Redelivery)."""
    stream = (
        b"id: p-1\nretry: 250\ndata:\n\nid: p-2\ndata: x\n\nid: bad\x00\nretry: 1x\ndata: y\n\n"
    )
    for cut in range(len(stream) + 1):
        decoder = sse.Decoder()
        decoder.feed(stream[:cut])
        decoder.feed(stream[cut:])
        assert (decoder.last_id, decoder.retry) == (b"p-2", 250), cut
    half = sse.Decoder()
    half.feed(b"id: p-1\n\nid: p-2\ndata: never ended")
    assert half.last_id == b"p-1"
