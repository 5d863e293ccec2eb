"""Newline framing for stdio (basic/transports/stdio): lines split across and within reads."""

from __future__ import annotations

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
