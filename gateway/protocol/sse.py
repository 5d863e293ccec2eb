"""Server-Sent Events framing, both ways (the subset MCP uses: data lines, comments)."""

from __future__ import annotations

KEEPALIVE = b":\r\n\r\n"


def event(data: bytes) -> bytes:
    """One SSE event carrying a single-line JSON message."""
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


class Decoder:
    """Feeds on chunks of a response body and yields the data of each complete event."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        self._buffer += chunk
        events: list[bytes] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, after = cut
            line, self._buffer = self._buffer[:end], self._buffer[after:]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            # comments (":"), "event:", "id:" and "retry:" carry nothing the gateway needs

    def close(self) -> list[bytes]:
        """Events left when the body ends without a final blank line."""
        leftover = self.feed(b"\n\n") if self._buffer or self._data else []
        return leftover


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
    if cr == -1 and lf == -1:
        return None
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buffer):
            return None  # a lone CR at the end may be the first half of CRLF
        return (cr, cr + 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)
    return lf, lf + 1
