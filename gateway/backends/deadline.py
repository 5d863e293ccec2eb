"""The time a transport gives one request, when a layer above it decides otherwise.

The `Backend` seam carries only a message and a sink; a transport times each request by its
backend's `request_timeout`. The resilience layer (resilience.py) sets `OVERRIDE` around one
request it times itself: a tool with its own timeout (an idle timer above, reset by progress,
decides; the transport only keeps `CEILING` as a backstop), or a retry (what is left of the
request's time). A context variable, like `telemetry.api.SERVING`, so the seam stays one method.
"""

from __future__ import annotations

from contextvars import ContextVar

# Seconds; None: the transport's own request_timeout.
OVERRIDE: ContextVar[float | None] = ContextVar("transport_deadline", default=None)
# The backstop under a tool's own idle timeout: a day (a call that keeps sending progress may
# run that long; finite because aiohttp and the event loop's timers want a number).
CEILING = 86400.0


def within(default: float) -> float:
    """The deadline for the request being sent: the override, else the transport's own."""
    found = OVERRIDE.get()
    return default if found is None else found
