"""Work too long for one stretch of the event loop (tool search's index, a context budget's
estimate of a big catalog), done in passes in a worker thread: the work is a generator whose
every `next` does one pass (routing/search.py `Index.passes`, routing/budget.py `cost_passes`).

Why passes and a thread rather than one whole build in a thread: a worker thread holds the GIL
while it computes, and each time the loop's thread lets go of it (any syscall: a socket read or
write) the worker takes it back for up to the interpreter's switch interval (5 ms), so one
request met that wait at each of its reads and writes. A pass ends well within the interval and
the thread then waits for the loop to hand it the next one, so the loop waits at most a pass.
Why not passes on the loop: a request takes several turns of the loop, and each turn would run
a pass; bench/README.md "Issue 33: a reindex that holds up nothing" has the figures.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import anyio.to_thread

T = TypeVar("T")

# Items a pass handles: ~1.5 ms of the index's work at 1,000 tools (about 23 us a tool), a
# multiple of the token estimate's chunk (routing/budget.py CHUNK).
PER_PASS = 64


async def run(steps: Generator[None, None, T]) -> T:
    """Run the generator to its end in a worker thread, a pass at a time; its return value.
    Cancelled, it stops after the pass under way."""
    while True:
        done, value = await anyio.to_thread.run_sync(_step, steps)
        if done:
            return value  # type: ignore[return-value]


def _step(steps: Generator[None, None, T]) -> tuple[bool, T | None]:
    try:
        next(steps)
    except StopIteration as end:
        return True, end.value
    return False, None
