"""Server-Sent Events framing, both ways (the subset MCP uses: data lines, event types, event
ids and the reconnection time, comments), per the HTML Living Standard's event stream format."""

from __future__ import annotations

import re

MEDIA_TYPE = "text/event-stream"
KEEPALIVE = b":\r\n\r\n"
# A line ends with CRLF, LF or CR; CRLF first, so that it counts as one line end.
_LINE_END = re.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"
_CR, _SPACE = 13, 32


def event(data: bytes) -> bytes:
    """One SSE event carrying a single-line JSON message."""
    return b"event: message\r\ndata: " + data + b"\r\n\r\n"


class EventTooLarge(ValueError):
    """One event (its data, or a line still without an end) grew past the decoder's limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an SSE event over {limit} bytes")
        self.limit = limit


class Decoder:
    """Feeds on chunks of a response body and yields the data of each complete event.

    Linear in the bytes fed: the buffer is scanned once (a partial line is not scanned again
    when more of it arrives) and the consumed prefix is dropped once per feed, so one huge event
    costs what reading it costs. `max_event_bytes` bounds the data of one event plus any
    unfinished line, which is what the decoder holds; past it `feed` raises EventTooLarge
    (after giving the events that were complete before it, if any).

    `last_id` and `retry` are what a reconnection needs (2025-11-25 transports, Resumability and
    Redelivery): the last event id dispatched so far (it sticks until an event sets another;
    None until one does) and the reconnection time the server last asked for, in milliseconds.
    """

    def __init__(self, max_event_bytes: int | None = None) -> None:
        self._buffer = bytearray()
        self._scan = 0  # where to look for the next line end; before it, no line ends
        self._data: list[bytes] = []
        self._size = 0  # bytes of data held for the current event
        self._name = b""
        self._limit = max_event_bytes
        self._started = False
        self._failed: EventTooLarge | None = None
        self._id: bytes | None = None  # the last event id buffer (the standard's name)
        self.last_id: bytes | None = None
        self.retry: int | None = None

    def resumed(self) -> Decoder:
        """A decoder for the stream that takes this one up: nothing of a half-received event,
        the last event id and the reconnection time kept (as a reconnection keeps them)."""
        fresh = Decoder(self._limit)
        fresh._id = fresh.last_id = self.last_id
        fresh.retry = self.retry
        return fresh

    def feed(self, chunk: bytes) -> list[bytes]:
        return [data for _, data in self.feed_named(chunk)]

    def feed_named(self, chunk: bytes) -> list[tuple[str, bytes]]:
        """Each complete event as (event type, data); the type is "message" unless named."""
        return self._feed(chunk, final=False)

    def close(self) -> list[bytes]:
        """Events left when the body ends without a final blank line."""
        if not self._buffer and not self._data:
            return []
        return [data for _, data in self._feed(b"\n\n", final=True)]

    def _feed(self, chunk: bytes, *, final: bool) -> list[tuple[str, bytes]]:
        if self._failed is not None:
            raise self._failed
        events: list[tuple[str, bytes]] = []
        try:
            self._scan_lines(chunk, final, events)
        except EventTooLarge as exc:
            # Nothing more is read from this stream: what was held is dropped, and the events
            # completed before the one too large are still given (the next call raises).
            self._failed = exc
            self._buffer, self._data = bytearray(), []
            if not events:
                raise
        return events

    def _scan_lines(self, chunk: bytes, final: bool, events: list[tuple[str, bytes]]) -> None:
        buffer = self._buffer
        buffer += chunk
        if not self._started:
            if not final and len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                return  # perhaps the first bytes of a byte order mark
            self._started = True
            if buffer.startswith(_BOM):
                del buffer[: len(_BOM)]
        start = 0  # the first byte of the line being looked at
        for found in _LINE_END.finditer(buffer, self._scan):
            if found.end() == len(buffer) and buffer[-1] == _CR and not final:
                # A CR as the last byte may be the first half of a CRLF: decide next time.
                self._scan = found.start()
                break
            self._line(start, found.start(), events)
            start = found.end()
        else:
            self._scan = len(buffer)
        if start:
            del buffer[:start]  # once per feed (bytearray drops a prefix without copying it)
            self._scan -= start
        if self._limit is not None and self._size + len(buffer) > self._limit:
            raise EventTooLarge(self._limit)

    def _line(self, start: int, end: int, events: list[tuple[str, bytes]]) -> None:
        buffer = self._buffer
        if start == end:
            # Dispatch: the last event id is taken even from an event without data (the
            # priming event a server sends first is just that).
            self.last_id = self._id
            if self._data:
                data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                name = self._name.decode("utf-8", "replace") or "message"
                self._data = []
                self._size = 0
                events.append((name, data))
            self._name = b""
            return
        colon = buffer.find(b":", start, end)
        if colon == start:
            return  # a comment
        if colon < 0:
            field, value_at = bytes(buffer[start:end]), end
        else:
            field, value_at = bytes(buffer[start:colon]), colon + 1
            if value_at < end and buffer[value_at] == _SPACE:
                value_at += 1
        if field == b"data":
            self._size += end - value_at + 1
            if self._limit is not None and self._size > self._limit:
                raise EventTooLarge(self._limit)
            with memoryview(buffer) as view:
                self._data.append(bytes(view[value_at:end]))  # the one copy of the data
        elif field == b"event":
            self._name = bytes(buffer[value_at:end])
        elif field == b"id":
            value = bytes(buffer[value_at:end])
            if b"\0" not in value:
                self._id = value
        elif field == b"retry":
            value = bytes(buffer[value_at:end])
            if value.isdigit():  # (ASCII digits only, for bytes)
                # Past nine digits int() would be slow or refuse; no caller waits that long.
                self.retry = int(value) if len(value) <= 9 else 999_999_999
        # other fields are ignored
