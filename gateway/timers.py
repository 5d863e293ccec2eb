"""Coarse timers for deadlines that almost never fire: every request has two (its backend
deadline, and the window after which a slow reply turns into an SSE stream), and nearly all are
cancelled within a millisecond.

An event-loop timer costs a heap entry in asyncio and a libuv timer in uvloop (about 2.5 us to
arm and cancel there). The delays used are few and fixed (the JSON window, each backend's
timeout), so timers of one delay fall due in the order they were armed: each delay gets a lane,
an insertion-ordered dict, where arming is an insert and cancelling a delete. One loop timer
ticks every `RESOLUTION` while any timer is pending and fires the due ones at the front of each
lane; timers fire up to `RESOLUTION` late, which no deadline of seconds notices.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

RESOLUTION = 0.05


class Timer:
    __slots__ = ("_lane", "callback", "due")

    def __init__(self, lane: dict[Timer, None], callback: Callable[[], object], due: float) -> None:
        self._lane: dict[Timer, None] | None = lane
        self.callback = callback
        self.due = due

    def cancel(self) -> None:
        lane = self._lane
        if lane is not None:
            self._lane = None
            del lane[self]


class Wheel:
    """The coarse timers of one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lanes: dict[float, dict[Timer, None]] = {}
        self._ticking: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        lane = self._lanes.get(delay)
        if lane is None:
            lane = self._lanes[delay] = {}
        timer = Timer(lane, callback, self._loop.time() + delay)
        lane[timer] = None
        if self._ticking is None:
            self._ticking = self._loop.call_later(RESOLUTION, self._tick)
        return timer

    def _tick(self) -> None:
        self._ticking = None
        now = self._loop.time()
        due: list[Timer] = []
        for delay, lane in list(self._lanes.items()):
            fired: list[Timer] = []
            for timer in lane:
                if timer.due > now:
                    break
                fired.append(timer)
            for timer in fired:
                timer.cancel()  # out of its lane: a later cancel() is a no-op
            if not lane:
                del self._lanes[delay]  # delays that come and go do not accumulate lanes
            due.extend(fired)
        due.sort(key=lambda timer: timer.due)
        if self._lanes:
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
