"""Coarse timers for deadlines that almost never fire: every request has two (its backend
deadline, and the window after which a slow reply turns into an SSE stream), and nearly all are
cancelled within a millisecond.

An event-loop timer costs a heap entry in asyncio and a libuv timer in uvloop (about 2.5 us to
arm and cancel there); these cost a tuple pushed on a heap and a flag. They fire up to
`RESOLUTION` late, which no deadline of seconds notices. Cancelled timers stay in the heap until
they reach its top or until they are the majority, when the heap is rebuilt without them, so it
holds at most about twice the timers that are live.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import weakref
from collections.abc import Callable

RESOLUTION = 0.05
# Below this many cancelled entries the heap is never rebuilt (rebuilding a small heap costs
# more than the entries it drops).
_COMPACT_AT = 64


class Timer:
    __slots__ = ("_wheel", "callback", "cancelled")

    def __init__(self, wheel: Wheel, callback: Callable[[], object]) -> None:
        self._wheel = wheel
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        if not self.cancelled:
            self.cancelled = True
            self._wheel.forget_one()


class Wheel:
    """The coarse timers of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cancelled = 0
        self._ticking: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._heap) - self._cancelled

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        timer = Timer(self, callback)
        heapq.heappush(self._heap, (self._loop.time() + delay, next(self._seq), timer))
        if self._ticking is None:
            self._ticking = self._loop.call_later(RESOLUTION, self._tick)
        return timer

    def forget_one(self) -> None:
        self._cancelled += 1
        if self._cancelled > _COMPACT_AT and self._cancelled * 2 > len(self._heap):
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0

    def _tick(self) -> None:
        self._ticking = None
        heap = self._heap
        now = self._loop.time()
        due: list[Timer] = []
        while heap and (heap[0][2].cancelled or heap[0][0] <= now):
            _, _, timer = heapq.heappop(heap)
            if timer.cancelled:
                self._cancelled -= 1
            else:
                timer.cancelled = True  # fired: a later cancel() is a no-op
                due.append(timer)
        if heap:
            self._ticking = self._loop.call_later(RESOLUTION, self._tick)
        for timer in due:
            timer.callback()


_wheels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Wheel] = weakref.WeakKeyDictionary()


def wheel(loop: asyncio.AbstractEventLoop | None = None) -> Wheel:
    """The coarse timers of `loop` (the running loop by default)."""
    loop = loop or asyncio.get_running_loop()
    found = _wheels.get(loop)
    if found is None:
        found = _wheels[loop] = Wheel(loop)
    return found
