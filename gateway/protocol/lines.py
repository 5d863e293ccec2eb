"""Newline-delimited framing (basic/transports/stdio): split a byte stream read in chunks into
lines, holding a partial line until the rest arrives. Pure: the transports do the reading."""

from __future__ import annotations


class LineSplitter:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        # The partial line held back, in the pieces it came in: joined once, when its end comes,
        # so a long line costs time in its length, not in its length times the reads.
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The complete lines `chunk` finishes, without their newlines."""
        if chunk.find(b"\n") < 0:  # (not `in`: see numbers.suspect)
            if chunk:
                self._parts.append(chunk)
                self._size += len(chunk)
            return []
        lines = chunk.split(b"\n")
        if self._parts:
            lines[0] = b"".join([*self._parts, lines[0]])
        rest = lines.pop()
        self._parts = [rest] if rest else []
        self._size = len(rest)
        return lines

    @property
    def overflowing(self) -> bool:
        """Whether the partial line held back is already longer than the limit."""
        return self._size > self._limit
