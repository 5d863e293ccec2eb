"""Event-loop lag, measured: a task asks to wake every `interval` and records how late it woke.
Everything on the loop (requests, scrapes, this) waits as long when a callback holds the loop, so
the delay of this one wake-up is the delay every ready callback saw then."""

from __future__ import annotations

from collections.abc import Callable

import anyio

INTERVAL = 0.5


async def measure_lag(observe: Callable[[float], None], interval: float = INTERVAL) -> None:
    """Runs until cancelled: one observation (seconds late, >= 0) per wake-up."""
    while True:
        due = anyio.current_time() + interval
        await anyio.sleep(interval)
        observe(max(0.0, anyio.current_time() - due))
