"""Picking up a legacy backend's SSE stream that ended before it was done (2025-11-25
transports, Resumability and Redelivery; the SSE `retry` field).

A stream whose server gave event ids is taken up again with a GET carrying `Last-Event-ID`,
after the reconnection time the server asked for (capped); the server replays what followed
on that stream. A stream without event ids cannot be resumed: its request may have run, and
the POST is never sent again (-31005). The modern era dropped resumability (2026-07-28
streamable-http): a modern backend's broken stream is never resumed.

Bounded both ways: each wait is at most MAX_DELAY, and after MAX_ATTEMPTS reconnections in a
row that bring no message (refused, broken, or ended empty) the request fails with -31005.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from gateway.backends import hop
from gateway.backends.http_exchange import Reading
from gateway.config.model import DEFAULT_MAX_RESUME_DELAY, DEFAULT_MAX_RESUMPTIONS
from gateway.errors import BackendConnectionLost, BackendTimeout, SessionExpired
from gateway.protocol import sse
from gateway.protocol.jsonrpc import Message

LAST_EVENT_ID = "Last-Event-ID"
# Reconnections in a row that bring no message before the stream is given up, and the longest
# wait before one whatever `retry` the server asked for (seconds): the defaults of the
# backend's `limits.max_resumptions` and `limits.max_resume_delay`.
MAX_ATTEMPTS = DEFAULT_MAX_RESUMPTIONS
MAX_DELAY = DEFAULT_MAX_RESUME_DELAY
# The wait when the server gave no `retry` (the SSE standard leaves it to the client).
DEFAULT_DELAY = 1.0
# A refusal that another attempt will not change (408 and 429 are worth another try).
_FINAL = frozenset(range(400, 500)) - {408, 429}


def delay(decoder: sse.Decoder, longest: float = MAX_DELAY) -> float:
    """How long to wait before reconnecting (seconds)."""
    retry = decoder.retry
    return min(DEFAULT_DELAY if retry is None else retry / 1000, longest)


def last_event_id(decoder: sse.Decoder) -> str | None:
    """The last event id as a header value; None without one, or when it cannot be a header
    value (then the stream cannot be resumed)."""
    raw = decoder.last_id
    if not raw or not raw.isascii():
        return None
    text = raw.decode("ascii")
    return text if hop.plain(text) else None


# One reconnection: a GET with this Last-Event-ID within these seconds (None: no deadline),
# read to its end; the response if it came, None if it failed in a way another GET may not
# (no connection, broken, ended without it). Raises BackendConnectionLost for a refusal that
# another attempt will not change, BackendTimeout past the deadline.
Attempt = Callable[[str, float | None], Awaitable[Message | None]]


def final(status: int) -> bool:
    """Whether an HTTP status refusing a reconnection is worth no other attempt."""
    return status in _FINAL


async def resume(
    name: str,
    reading: Reading,
    attempt: Attempt,
    within: float | None,
    *,
    attempts: int = MAX_ATTEMPTS,
    longest: float = MAX_DELAY,
) -> Message:
    """The response of a stream that ended early, from as many GETs as it takes (bounded)."""
    deadline = None if within is None else anyio.current_time() + within
    failed = 0
    while True:
        last = last_event_id(reading.decoder)
        if last is None:
            raise BackendConnectionLost(name, "the stream ended before the reply (no event id)")
        if failed >= attempts:
            raise BackendConnectionLost(
                name, f"the stream ended before the reply and {failed} resumptions failed"
            )
        wait = delay(reading.decoder, longest)
        left = None if deadline is None else deadline - anyio.current_time() - wait
        if left is not None and left <= 0:
            raise BackendTimeout(name, f"no reply within {within:g}s")
        await anyio.sleep(wait)
        reading.decoder = reading.decoder.resumed()
        before = reading.messages
        try:
            reply = await attempt(last, left)
        except SessionExpired:
            # (never SessionExpired from here: that would have the request sent again)
            raise BackendConnectionLost(name, "the session ended before the reply") from None
        if reply is not None:
            return reply
        failed = 0 if reading.messages > before else failed + 1
