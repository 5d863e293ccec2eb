"""The coarse timers (gateway/timers.py) that replace an event-loop timer per request."""

from __future__ import annotations

import asyncio
import functools

import anyio
import pytest

from gateway import timers
from tests.support import BOUND

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_timer_fires_after_its_delay_and_not_before() -> None:
    loop = asyncio.get_running_loop()
    fired = asyncio.Event()
    started = loop.time()
    at: list[float] = []

    def fire() -> None:
        at.append(loop.time())
        fired.set()

    timers.wheel().call_later(0.1, fire)
    with anyio.fail_after(BOUND):
        await fired.wait()
    assert at[0] - started >= 0.1


async def test_a_cancelled_timer_never_fires() -> None:
    fired: list[str] = []
    later = asyncio.Event()
    wheel = timers.wheel()
    wheel.call_later(0.01, lambda: fired.append("cancelled")).cancel()
    wheel.call_later(0.1, later.set)
    with anyio.fail_after(BOUND):
        await later.wait()
    assert fired == []


async def test_timers_fire_in_order_of_their_deadlines() -> None:
    order: list[int] = []
    done = asyncio.Event()
    wheel = timers.wheel()
    for n, delay in enumerate((0.15, 0.05, 0.1)):
        wheel.call_later(delay, functools.partial(order.append, n))
    wheel.call_later(0.2, done.set)
    with anyio.fail_after(BOUND):
        await done.wait()
    assert order == [1, 2, 0]


async def test_cancelling_a_fired_timer_changes_nothing() -> None:
    done = asyncio.Event()
    wheel = timers.wheel()
    timer = wheel.call_later(0.01, done.set)
    with anyio.fail_after(BOUND):
        await done.wait()
    timer.cancel()
    assert len(wheel) == 0


async def test_cancelled_timers_do_not_pile_up() -> None:
    """Requests arm and cancel a long deadline each: what the wheel holds stays the live timers
    instead of growing with every request until the deadlines pass."""
    wheel = timers.Wheel(asyncio.get_running_loop())
    live = [wheel.call_later(300, lambda: None) for _ in range(10)]
    for _ in range(10_000):
        wheel.call_later(300, lambda: None).cancel()
        wheel.call_later(10, lambda: None).cancel()
    assert len(wheel) == len(live)
    assert sum(len(lane) for lane in wheel._lanes.values()) == len(live)


async def test_timers_of_different_delays_fire_in_order_of_their_deadlines() -> None:
    """Each delay has its own lane; a tick fires what is due in all of them, earliest first."""
    loop = asyncio.get_running_loop()
    wheel = timers.Wheel(loop)
    order: list[str] = []
    wheel.call_later(0.02, functools.partial(order.append, "long"))
    wheel.call_later(0.01, functools.partial(order.append, "short"))
    done = asyncio.Event()
    wheel.call_later(0.2, done.set)
    with anyio.fail_after(BOUND):
        await done.wait()
    assert order == ["short", "long"]
    assert len(wheel._lanes) == 0  # lanes with nothing pending are dropped
