"""Newline-delimited framing (basic/transports/stdio): split a byte stream read in chunks into
lines, holding a partial line until the rest arrives. Pure: the transports do the reading."""

from __future__ import annotations


class LineSplitter:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete lines `chunk` finishes, without their newlines."""
        lines = (self._pending + chunk).split(b"\n")
        self._pending = lines.pop()
        return lines

    @property
    def overflowing(self) -> bool:
        """Whether the partial line held back is already longer than the limit."""
        return len(self._pending) > self._limit
