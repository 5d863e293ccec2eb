"""Rate limits shared by replicas through Redis (`cluster.redis`).

A real `redis-server` (Debian's, `make ci-deps`) started by each test on a free loopback port,
and two `Gateway`s in this process with one config, as a load balancer would have behind it:
one caller's burst is spent over both together, other callers have budgets of their own, a
refill follows Redis's clock (moved on by rewriting a bucket's time, not by waiting), Redis
stopped or stalled leaves requests served under each replica's own limits (log and metric say
so), and Redis started again is used again.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.cluster.buckets import PREFIX, bucket_key, waits_from
from gateway.config import ConfigInvalid, describe, parse
from gateway.core.ratelimit import IDENTITY, TOOL, Want
from gateway.protocol import codes
from tests.support import BOUND, DEMO_STDIO, START_BOUND, Proc, call, mirrored_headers
from tests.support.redis_server import free_port, launch, need_redis, redis_server

pytestmark = pytest.mark.anyio

SECRET = "shared-limits-secret-Qm4Tz8Lw2Hc6Rv"
# Slow enough that no token comes back during a test (refills are tested by moving Redis's
# record of a bucket's time back).
SLOW = {"rate": 0.001, "burst": 3}
# A caller is its address without authentication; 127.0.0.2 is another one (127/8 is loopback).
OTHER_ADDRESS = "127.0.0.2"
PASSWORD = "redis-password-Zk3Wq9"


def config_text(
    port: int, rate_limits: dict[str, Any], password: str | None = None, **cluster: Any
) -> str:
    userinfo = f":{password}@" if password else ""
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0}},
            "backends": {"demo": DEMO_STDIO},
            "rate_limits": rate_limits,
            "cluster": {
                "secrets": [SECRET],
                "redis": f"redis://{userinfo}127.0.0.1:{port}/0",
                **cluster,
            },
        }
    )


@asynccontextmanager
async def replicas(text: str) -> AsyncIterator[tuple[Gateway, Gateway]]:
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as first, Gateway(parse(text)) as second:
            await first.catalogs_loaded.wait()
            await second.catalogs_loaded.wait()
            yield first, second


@asynccontextmanager
async def sessions() -> AsyncIterator[tuple[aiohttp.ClientSession, aiohttp.ClientSession]]:
    """One caller, and another (another address)."""
    other = aiohttp.TCPConnector(local_addr=(OTHER_ADDRESS, 0))
    async with aiohttp.ClientSession() as one, aiohttp.ClientSession(connector=other) as two:
        yield one, two


async def post(
    session: aiohttp.ClientSession, gateway: Gateway, msg: dict[str, Any]
) -> tuple[int, dict[str, str], dict[str, Any]]:
    assert gateway.http_url is not None
    with anyio.fail_after(BOUND):
        async with session.post(
            gateway.http_url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
        ) as resp:
            reply: dict[str, Any] = orjson.loads(await resp.read())
            return resp.status, dict(resp.headers), reply


async def served(session: aiohttp.ClientSession, gateway: Gateway, rid: int) -> bool:
    status, headers, reply = await post(session, gateway, call(rid, "echo", text="hi"))
    if status == 200:
        assert "result" in reply, reply
        return True
    assert status == 429, reply
    assert reply["error"]["code"] == codes.RATE_LIMITED
    delay = reply["error"]["data"]["retryAfter"]
    assert headers["Retry-After"] == str(max(1, math.ceil(delay)))
    return False


def metric(gateway: Gateway, name: str) -> float | None:
    families = {m.name: m for m in gateway.registry.collect()}
    samples = families[name].samples
    return samples[0].value if samples else None


async def start(port: int, password: str | None = None) -> Proc:
    """redis-server started (and ready) without holding up the event loop."""
    return await anyio.to_thread.run_sync(launch, port, password)


# --- config -----------------------------------------------------------------------------------


def test_the_redis_url_is_read_with_its_timeouts_and_shown_without_its_password() -> None:
    text = config_text(6379, {"per_identity": SLOW}, redis_timeout=0.05)
    text = text.replace("redis://127.0.0.1", "redis://:hunter2-password@127.0.0.1")
    config = parse(text)
    assert config.cluster is not None
    assert config.cluster.redis == "redis://:hunter2-password@127.0.0.1:6379/0"
    assert config.cluster.redis_timeout == 0.05 and config.cluster.redis_retry_interval == 1.0
    shown = describe(config) + repr(config)
    assert "hunter2" not in shown
    assert "redis://***@127.0.0.1:6379/0" in describe(config)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379",
        "redis://:hunter2-password@127.0.0.1:notaport/0",
        "redis://:hunter2-password@127.0.0.1:6379/cache",
        "rediss://",
    ],
)
def test_a_bad_redis_url_is_refused_without_showing_it(url: str) -> None:
    text = config_text(6379, {"per_identity": SLOW}).replace("redis://127.0.0.1:6379/0", url)
    with pytest.raises(ConfigInvalid) as caught:
        parse(text)
    assert caught.value.problems and all("cluster.redis" in p for p in caught.value.problems)
    assert not any("hunter2" in p for p in caught.value.problems)


def test_keys_are_prefixed_per_limit_and_hide_the_caller() -> None:
    key = bucket_key(Want(IDENTITY, "http:10.0.0.7", 1.0, 3.0))
    assert key.startswith(f"{PREFIX}identity:") and "10.0.0.7" not in key
    assert key != bucket_key(Want(TOOL, "http:10.0.0.7", 1.0, 3.0))


@pytest.mark.parametrize(
    "reply", [None, b"0", [0], [0, "1"], [0, -1], [0, 1.5], {"a": 0}, [0, 0, 0]]
)
def test_a_hostile_reply_is_a_failure_and_no_wait_is_longer_than_a_refill(reply: object) -> None:
    wants = [Want(IDENTITY, "a", 2.0, 3.0), Want(TOOL, "a\0echo", 0.5, 1.0)]
    with pytest.raises(ValueError):
        waits_from(reply, wants)
    assert waits_from([0, 0], wants) == [0.0, 0.0]
    # A week asked for: no more than an empty bucket's refill (1 / rate) is passed on.
    assert waits_from([7 * 86400 * 10**6, 1_500_000], wants) == [0.5, 1.5]


# --- against a real Redis ---------------------------------------------------------------------


@pytest.mark.slow
async def test_one_callers_burst_is_shared_by_the_replicas_and_others_are_apart() -> None:
    port = free_port()
    with redis_server(port):
        async with (
            replicas(config_text(port, {"per_identity": SLOW})) as (a, b),
            sessions() as (caller, other),
        ):
            # Three tokens over both replicas together, then refused on either.
            assert [await served(caller, g, i) for i, g in enumerate((a, b, a))] == [True] * 3
            assert not await served(caller, b, 3)
            assert not await served(caller, a, 4)
            # Another caller has a budget of its own, on both replicas.
            assert [await served(other, g, 5 + i) for i, g in enumerate((b, a, b))] == [True] * 3
            assert not await served(other, a, 8)
            assert a.telemetry.stats.redis_up is True and metric(a, "mcp_gateway_redis_up") == 1
            assert a.telemetry.stats.rate_limit_fallbacks == 0
            assert a.telemetry.stats.rate_limited["identity"] == 2
            async with Redis(port=port, decode_responses=True) as r:
                keys = sorted(str(k) for k in await r.keys("*"))
                assert len(keys) == 2 and all(k.startswith(f"{PREFIX}identity:") for k in keys)
                # Idle keys vanish once their bucket would be full again (3 / 0.001 s).
                assert 0 < await r.pttl(keys[0]) <= 3000 * 1000 + 1000


@pytest.mark.slow
async def test_a_refill_follows_redis_time_and_a_refused_request_takes_nothing() -> None:
    port = free_port()
    limits = {"per_identity": {"rate": 1, "burst": 5}, "tools": {"echo": {"rate": 1, "burst": 1}}}
    with redis_server(port):
        async with (
            replicas(config_text(port, limits)) as (a, b),
            sessions() as (caller, _),
            Redis(port=port, decode_responses=True) as r,
        ):
            assert await served(caller, a, 1)
            status, _, reply = await post(caller, b, call(2, "echo", text="hi"))
            assert status == 429 and 0.9 < reply["error"]["data"]["retryAfter"] <= 1.0
            # The refusal took no token from the caller's own bucket: 5 - 1 left.
            (identity,) = await r.keys(f"{PREFIX}identity:*")
            tokens = await r.hget(identity, "tokens")
            assert isinstance(tokens, str) and float(tokens) == pytest.approx(4, abs=0.1)
            # A second of Redis time passes for the tool's bucket: one token is back.
            (tool,) = await r.keys(f"{PREFIX}tool:*")
            await r.hincrby(tool, "s", -1)
            assert await served(caller, b, 3)
            assert not await served(caller, a, 4)


@pytest.mark.slow
async def test_without_redis_each_replica_limits_alone_and_shares_again_when_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway")
    port = free_port()
    # Redis is tried again by the first request after a failure (the interval is shorter than
    # a redis-server start), so the test needs no waiting.
    limits = {"per_identity": {"rate": 0.001, "burst": 2}}
    text = config_text(port, limits, PASSWORD, redis_retry_interval=0.001)
    need_redis()
    redis = await start(port, PASSWORD)
    try:
        async with replicas(text) as (a, b), sessions() as (caller, _):
            assert [await served(caller, g, i) for i, g in enumerate((a, b))] == [True, True]
            assert not await served(caller, a, 2)

            await anyio.to_thread.run_sync(redis.stop)
            # Served under each replica's own limits (its buckets are full: they were not used
            # while Redis decided), never failing because Redis is gone.
            assert [await served(caller, a, 10 + i) for i in range(3)] == [True, True, False]
            assert [await served(caller, b, 20 + i) for i in range(3)] == [True, True, False]
            for g in (a, b):
                assert g.telemetry.stats.redis_up is False
                assert metric(g, "mcp_gateway_redis_up") == 0
                assert metric(g, "mcp_gateway_rate_limit_fallbacks") == 3
            failed = [r for r in caplog.records if "rate-limit check failed" in r.getMessage()]
            assert len(failed) == 2  # once per replica, not per request
            assert "per replica" in failed[0].getMessage()

            redis = await start(port, PASSWORD)  # empty: a fresh shared budget of 2
            assert [await served(caller, g, 30 + i) for i, g in enumerate((b, a))] == [True, True]
            assert not await served(caller, b, 32)
            for g in (a, b):
                assert g.telemetry.stats.redis_up is True
                assert metric(g, "mcp_gateway_redis_up") == 1
            back = [r for r in caplog.records if "reachable again" in r.getMessage()]
            assert len(back) == 2
            assert not any(PASSWORD in r.getMessage() for r in caplog.records)
    finally:
        await anyio.to_thread.run_sync(redis.stop)


@pytest.mark.slow
async def test_a_stalled_redis_costs_a_request_at_most_the_timeout() -> None:
    port = free_port()
    timeout = 0.2
    text = config_text(port, {"per_identity": SLOW}, redis_timeout=timeout)
    with redis_server(port) as redis:
        async with replicas(text) as (a, _), sessions() as (caller, _):
            assert await served(caller, a, 1)
            os.kill(redis.popen.pid, signal.SIGSTOP)  # accepts nothing, answers nothing
            try:
                began = anyio.current_time()
                assert await served(caller, a, 2)
                assert anyio.current_time() - began < timeout + 0.5
                assert a.telemetry.stats.redis_up is False
                # Within the retry interval Redis is not asked: no wait at all.
                began = anyio.current_time()
                assert await served(caller, a, 3)
                assert anyio.current_time() - began < timeout
            finally:
                os.kill(redis.popen.pid, signal.SIGCONT)
