"""A full garbage collection soon after long-lived state ends, instead of whenever the
collector's own heuristics get to it.

A legacy client session holds its objects (its backend session, listen, tasks, callbacks that
are bound methods of their owners) long enough for them to reach the oldest generation, and many
of them are in reference cycles (a cancelled task's exception, traceback and frames among them):
when the session ends they are garbage only a full collection frees. With the young threshold
the gateway runs (app/process.py) and start-up's objects frozen, full collections are rare, so
the garbage of ended sessions piles up: measured, about 170 objects and 30 KB a session, RSS
+1.5-2 MB for every 64 sessions opened and ended (bench/README, issue 34). One full collection a
little after sessions end frees them all: within `DELAY` seconds, or as soon as `BATCH` of them
have ended, so a burst of short sessions does not grow the process by its garbage first.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

# Seconds between the end of some long-lived state and the collection that frees it, or sooner:
# after `BATCH` ends (a collection costs a few milliseconds; 64 legacy sessions left ~2 MB).
DELAY = 10.0
BATCH = 64


class _Pending:
    __slots__ = ("ends", "timer")

    def __init__(self) -> None:
        self.ends = 0
        self.timer: asyncio.Handle | None = None


_pending: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pending] = (
    weakref.WeakKeyDictionary()
)


def collect_soon() -> None:
    """One more end of long-lived state: a full collection within `DELAY` seconds, or at the
    next turn of the loop once `BATCH` ends are waiting (nothing outside a running loop)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    pending = _pending.get(loop)
    if pending is None:
        pending = _pending[loop] = _Pending()
    pending.ends += 1
    if pending.ends >= BATCH:
        if pending.timer is not None:
            pending.timer.cancel()
        pending.timer = loop.call_soon(_collect, loop)
    elif pending.timer is None:
        pending.timer = loop.call_later(DELAY, _collect, loop)


def _collect(loop: asyncio.AbstractEventLoop) -> None:
    _pending.pop(loop, None)  # (its timer is the one running now, or was cancelled for it)
    gc.collect()
