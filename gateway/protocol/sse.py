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
        self._name = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        return [data for _, data in self.feed_named(chunk)]

    def feed_named(self, chunk: bytes) -> list[tuple[str, bytes]]:
        """Each complete event as (event type, data); the type is "message" unless named."""
        self._buffer += chunk
        events: list[tuple[str, bytes]] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            end, after = cut
            line, self._buffer = self._buffer[:end], self._buffer[after:]
            if not line:
                if self._data:
                    name = self._name.decode("utf-8", "replace") or "message"
                    events.append((name, b"\n".join(self._data)))
                    self._data = []
                self._name = b""
            elif line.startswith(b"data:"):
                self._data.append(_value(line[5:]))
            elif line.startswith(b"event:"):
                self._name = _value(line[6:])
            # comments (":"), "id:" and "retry:" carry nothing the gateway needs

    def close(self) -> list[bytes]:
        """Events left when the body ends without a final blank line."""
        leftover = self.feed(b"\n\n") if self._buffer or self._data else []
        return leftover


def _value(field: bytes) -> bytes:
    return field[1:] if field.startswith(b" ") else field


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    cr, lf = buffer.find(b"\r"), buffer.find(b"\n")
    if cr == -1 and lf == -1:
        return None
    if cr != -1 and (lf == -1 or cr < lf):
        if cr + 1 == len(buffer):
            return None  # a lone CR at the end may be the first half of CRLF
        return (cr, cr + 2) if buffer[cr + 1 : cr + 2] == b"\n" else (cr, cr + 1)
    return lf, lf + 1
