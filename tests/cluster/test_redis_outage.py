"""The one Redis breaker (gateway/cluster/outage.py) every cluster adapter calls Redis through:
a failed call is reported, not retried; while a retry interval runs Redis is not asked; each
change of state is one log line. In memory, on a clock the test moves (the adapters' tests run
the same breaker against a real Redis that goes away: test_shared_rate_limits.py,
test_cluster_sessions.py, test_cluster_bus.py, test_oauth_cluster.py)."""

from __future__ import annotations

import logging

import anyio
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.cluster.outage import Breaker, RedisDown

pytestmark = pytest.mark.anyio

DOWN = "redis: test lost (%s)"
BACK = "redis: test back"


class Redis:
    """A command that fails while `down`, and counts how often it was asked."""

    def __init__(self) -> None:
        self.down = False
        self.asked = 0

    async def command(self) -> str:
        self.asked += 1
        await anyio.lowlevel.checkpoint()
        if self.down:
            raise RedisConnectionError("Error 111 connecting to 127.0.0.1:1")
        return "OK"


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway"]


async def test_while_the_retry_interval_runs_redis_is_not_asked_then_one_call_tries_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    shown: list[bool] = []
    redis = Redis()
    breaker = Breaker(
        1.0, down=DOWN, back=BACK, retry_interval=5.0, show=shown.append, clock=lambda: now[0]
    )
    caplog.set_level(logging.INFO, "gateway")
    assert await breaker.call(redis.command) == "OK" and shown == [True]

    redis.down = True
    for _ in range(3):
        with pytest.raises(RedisDown):
            await breaker.call(redis.command)
    assert redis.asked == 2  # the first failure asked; the two after it were refused unasked
    assert breaker.waiting() and shown == [True, False]
    assert lines(caplog) == ["redis: test lost (Error 111 connecting to 127.0.0.1:1)"]

    now[0] += 5.0  # the interval is over: the next call asks again (and fails, quietly)
    assert not breaker.waiting()
    with pytest.raises(RedisDown):
        await breaker.call(redis.command)
    assert redis.asked == 3 and len(lines(caplog)) == 1

    redis.down = False
    now[0] += 5.0
    assert await breaker.call(redis.command) == "OK"
    assert shown == [True, False, True] and lines(caplog)[1:] == [BACK]


async def test_without_a_retry_interval_every_call_asks_and_a_slow_one_fails_in_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def stalled() -> None:
        await anyio.sleep_forever()

    redis = Redis()
    breaker = Breaker(0.05, down=DOWN, back=None)
    caplog.set_level(logging.INFO, "gateway")
    with anyio.fail_after(5), pytest.raises(RedisDown) as down:
        await breaker.call(stalled)
    assert down.value.reason == "TimeoutError"
    redis.down = True
    with pytest.raises(RedisDown):
        await breaker.call(redis.command)
    assert redis.asked == 1 and not breaker.waiting()
    redis.down = False
    await breaker.call(redis.command)
    assert breaker.up is True and lines(caplog) == ["redis: test lost (TimeoutError)"]
