"""The replicas' messages to each other (`core/bus.py`, `cluster/bus.py`) over a real
`redis-server`: what one replica publishes every other hears and it does not; what Redis
carries is input (a malformed message is dropped and counted, a handler's failure does not end
the bus); Redis stopped loses messages, logged once, and the bus subscribes again by itself
when Redis is back; a gateway with `cluster.redis` runs one and exports its state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
import yaml
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.cluster.bus import PREFIX, RedisBus
from gateway.config import parse
from gateway.telemetry.api import Stats
from tests.support import BOUND, DEMO_STDIO, START_BOUND, until
from tests.support.redis_server import free_port, launch, redis_server, redis_url

pytestmark = pytest.mark.anyio

PASSWORD = "bus-password-Hq7Rk2Wz"
Heard = list[tuple[str, dict[str, Any]]]


@asynccontextmanager
async def running(url: str, topics: dict[str, Heard], **kw: Any) -> AsyncIterator[RedisBus]:
    """A bus that records what each of `topics` hears, subscribed."""
    bus = RedisBus(url, 0.5, kw.pop("retry_interval", 0.05), kw.pop("stats", Stats()))
    for topic, heard in topics.items():

        async def record(sender: str, body: dict[str, Any], heard: Heard = heard) -> None:
            if body.get("fail"):
                raise ValueError("a handler that fails")
            heard.append((sender, body))

        bus.on(topic, record)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.run)
            with anyio.fail_after(BOUND):
                await bus.ready.wait()
            yield bus
            tg.cancel_scope.cancel()
    finally:
        await bus.close()


async def test_every_other_replica_hears_a_message_and_the_sender_does_not() -> None:
    port = free_port()
    with redis_server(port):
        heard: list[Heard] = [[], [], []]
        async with (
            running(redis_url(port), {"changes": heard[0]}) as one,
            running(redis_url(port), {"changes": heard[1]}) as two,
            running(redis_url(port), {"changes": heard[2], "other": []}) as three,
        ):
            assert len({one.replica, two.replica, three.replica}) == 3
            assert await one.publish("changes", {"n": 1})
            await until(lambda: len(heard[1]) == 1 and len(heard[2]) == 1)
            assert heard[1] == heard[2] == [(one.replica, {"n": 1})]
            assert await two.publish("changes", {"n": 2})
            await until(lambda: len(heard[0]) == 1 and len(heard[2]) == 2)
            assert heard[0] == [(two.replica, {"n": 2})]
            assert heard[1] == [(one.replica, {"n": 1})]  # not its own
            assert two._stats.cluster_messages["changes", "sent"] == 1
            assert three._stats.cluster_messages["changes", "received"] == 2


async def test_what_redis_carries_is_input(caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    with redis_server(port):
        heard: Heard = []
        async with (
            running(redis_url(port), {"changes": heard}) as bus,
            Redis.from_url(redis_url(port)) as raw,
        ):
            stats = bus._stats
            for junk in (b"not json", b"[1, 2]", b'{"from": 7, "body": {}}', b'{"from": "x"}'):
                await raw.publish(PREFIX + "changes", junk)
            # A handler that fails is one warning, and the next message is handled.
            await raw.publish(PREFIX + "changes", b'{"from": "x", "body": {"fail": true}}')
            await raw.publish(PREFIX + "changes", b'{"from": "x", "body": {"n": 1}}')
            await until(lambda: len(heard) == 1)
            assert heard == [("x", {"n": 1})]
            assert stats.cluster_messages["changes", "malformed"] == 4
            assert stats.cluster_messages["changes", "received"] == 2
        failures = [r for r in caplog.records if "not handled" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is None


async def test_redis_stopped_loses_messages_and_the_bus_comes_back_by_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gateway")
    port = free_port()
    heard: Heard = []
    stats = Stats()
    redis = launch(port, PASSWORD)
    try:
        url = redis_url(port, PASSWORD)
        async with (
            running(url, {"changes": heard}, stats=stats) as bus,
            running(url, {"changes": []}) as other,
        ):
            assert stats.redis_pubsub_up is True
            redis.stop()
            await until(lambda: stats.redis_pubsub_up is False)
            assert not await other.publish("changes", {"n": 0})
            assert not await other.publish("changes", {"n": 0})
            assert other._stats.cluster_messages["changes", "unsent"] == 2
            redis = launch(port, PASSWORD)
            await until(lambda: stats.redis_pubsub_up is True and other.up)
            # (the other bus may publish before its own subscription is back: it is not ours)
            with anyio.fail_after(BOUND):
                while not heard:
                    assert await other.publish("changes", {"n": 1})
                    await anyio.sleep(0.02)
            assert heard[0] == (other.replica, {"n": 1})
            assert bus.up
    finally:
        redis.stop()
    lost = [r for r in caplog.records if "messages lost" in r.getMessage()]
    unsent = [r for r in caplog.records if "was not sent" in r.getMessage()]
    assert len(unsent) == 1  # once per change of state, not per message
    assert lost and all(r.exc_info is None for r in lost)
    assert not any(PASSWORD in r.getMessage() for r in caplog.records)


async def test_a_gateway_with_cluster_redis_runs_a_bus_and_exports_its_state() -> None:
    port = free_port()
    text = yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"demo": DEMO_STDIO},
            "cluster": {
                "secrets": ["bus-test-secret-0123456789abcdefghij"],
                "redis": redis_url(port),
            },
        }
    )
    heard: Heard = []

    async def record(sender: str, body: dict[str, Any]) -> None:
        heard.append((sender, body))

    with redis_server(port):
        with anyio.fail_after(START_BOUND):
            gateway = Gateway(parse(text))
            assert gateway.bus is not None
            gateway.bus.on("test", record)
            async with gateway as gw, running(redis_url(port), {}) as other:
                assert gw.bus is not None
                with anyio.fail_after(BOUND):
                    await gw.bus.ready.wait()
                scraped = gw.registry.get_sample_value("mcp_gateway_redis_pubsub_up")
                assert scraped == 1
                assert await other.publish("test", {"n": 1})
                await until(lambda: bool(heard))
                assert heard == [(other.replica, {"n": 1})]
                received = {"topic": "test", "outcome": "received"}
                assert gw.registry.get_sample_value("mcp_gateway_cluster_messages_total", received)
    without = yaml.safe_dump({"listen": {"stdio": True}, "backends": {"demo": DEMO_STDIO}})
    assert Gateway(parse(without)).bus is None
