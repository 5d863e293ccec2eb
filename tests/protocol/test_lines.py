"""Newline framing for stdio (basic/transports/stdio): lines split across and within reads."""

from __future__ import annotations

import time

from gateway.backends.stdio import HeadLines
from gateway.protocol.lines import LineSplitter


def test_lines_split_across_reads_come_out_whole() -> None:
    splitter = LineSplitter(100)
    assert splitter.feed(b'{"a":1}\n{"b"') == [b'{"a":1}']
    assert splitter.feed(b':2}\n{"c":3}\n') == [b'{"b":2}', b'{"c":3}']
    assert splitter.feed(b"") == []


def test_a_partial_line_over_the_limit_is_reported_after_the_complete_ones() -> None:
    splitter = LineSplitter(4)
    assert splitter.feed(b"ok\n123") == [b"ok"]
    assert not splitter.overflowing
    assert splitter.feed(b"45") == []
    assert splitter.overflowing


def test_a_long_line_read_in_small_pieces_costs_time_in_its_length() -> None:
    """A 16 MiB line in 4 KiB reads: the held part is joined once, at its end (adding each read
    to it was quadratic: 4096 copies of up to 16 MiB, seconds instead of milliseconds)."""
    splitter = LineSplitter(32 * 1024 * 1024)
    piece = b"x" * 4096
    started = time.monotonic()
    for _ in range(4096):
        assert splitter.feed(piece) == []
    (line,) = splitter.feed(b"\nnext")
    assert time.monotonic() - started < 1.0
    assert len(line) == 16 * 1024 * 1024
    assert not splitter.overflowing
    assert splitter.feed(b"\n") == [b"next"]


def test_stderr_lines_keep_their_heads_and_count_the_rest() -> None:
    lines = HeadLines(4)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"cdefg\nhi\n") == [(b"abcd", 3), (b"hi", 0)]
    assert lines.feed(b"x" * 1000) == []
    assert lines.feed(b"\n") == [(b"xxxx", 996)]
