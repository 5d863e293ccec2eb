"""Tool-definition pinning in a cluster (`pins:` with `cluster.redis`; gateway/cluster/pins.py).

Two `Gateway`s in this process, each with a config and a pin file of its own (as two hosts
have), share a real `redis-server` and one rug-pull server state (tests/servers/rugpull_server.py:
each replica's own stdio child reads it). Proved: a fresh cluster's pins are seeded from a
replica's file; a changed description is blocked on both; `pins approve` with one replica's
config reaches the other at once through Redis (its own file never changes, and it is not
looking at it); a replica restarted later takes the cluster's pins over its stale file; and an
approval written to one host's file by a CLI that knows no Redis is shared by the replica there.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import pytest
import yaml
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.cluster.pins import KEY
from gateway.config import load
from gateway.core import pins as p
from tests.support import BOUND, START_BOUND
from tests.support.redis_server import redis_url
from tests.system.test_pins import PULLED, Client, Listening, cli, write

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "cluster-pins-secret-Q4nT8vW2zL7kR3xM"


def host(tmp_path: Path, name: str, port: int, poll_interval: float = 1.0) -> Path:
    """A replica's config in a folder of its own, over the shared server state, its pin file
    looked at every `poll_interval`."""
    folder = tmp_path / name
    folder.mkdir()
    config = write(folder)
    doc = yaml.safe_load(config.read_text())
    doc["backends"]["rug"]["stdio"]["args"][-1] = str(tmp_path / "state")
    doc["pins"]["poll_interval"] = poll_interval
    doc["cluster"] = {"secrets": [SECRET], "redis": redis_url(port), "redis_retry_interval": 0.1}
    config.write_text(yaml.safe_dump(doc))
    return config


def alone(config: Path) -> Path:
    """The same config without the cluster: `pins record` writes only the file."""
    doc = yaml.safe_load(config.read_text())
    del doc["cluster"]
    lone = config.with_name("alone.yaml")
    lone.write_text(yaml.safe_dump(doc))
    return lone


@asynccontextmanager
async def replica(
    config: Path, session: Any, tg: anyio.abc.TaskGroup
) -> AsyncIterator[tuple[Gateway, Client, Listening]]:
    async with Gateway(load(config)) as gw:
        await gw.catalogs_loaded.wait()
        assert gw.bus is not None and gw.pins is not None and gw.http_url is not None
        await gw.bus.ready.wait()
        await gw.pins.joined.wait()
        client = Client(session, gw.http_url)
        yield gw, client, await client.listen(tg)


async def test_an_approval_through_one_replica_reaches_the_other_at_once(
    tmp_path: Path, redis_port: int
) -> None:
    (tmp_path / "state").mkdir()
    # (files not looked at again)
    a, b = host(tmp_path, "a", redis_port, 3600), host(tmp_path, "b", redis_port, 3600)
    status, out = cli("record", "--config", str(alone(a)))
    assert status == 0, out
    shutil.copy(a.with_name("pins.json"), b.with_name("pins.json"))
    b_file = b.with_name("pins.json").read_bytes()
    store = Redis.from_url(redis_url(redis_port))
    try:
        assert await store.get(KEY) is None  # (a fresh cluster)
        with anyio.fail_after(START_BOUND * 2):
            async with (
                aiohttp.ClientSession() as session,
                anyio.create_task_group() as tg,
                replica(a, session, tg) as (_, on_a, heard_a),
                replica(b, session, tg) as (gw_b, on_b, heard_b),
            ):
                # Seeded from a replica's file: the same pins.
                seeded = await store.get(KEY)
                assert isinstance(seeded, bytes) and p.parse(seeded) == p.parse(b_file)
                told = heard_a.changed
                await on_a.call("pull", text=PULLED)
                with anyio.fail_after(BOUND):
                    await told.wait()
                assert "fetch" not in await on_a.tools()
                assert "fetch" not in await on_b.tools()  # (B's child changed too)
                told_b = heard_b.changed
                status, out = await anyio.to_thread.run_sync(
                    cli, "approve", "--config", str(a), "rug", "fetch"
                )
                assert status == 0, out
                with anyio.fail_after(BOUND):
                    await told_b.wait()
                assert (await on_b.tools())["fetch"]["description"] == PULLED
                assert gw_b.telemetry.stats.pin_changes[("rug", "approved")] == 1
                assert b.with_name("pins.json").read_bytes() == b_file
                tg.cancel_scope.cancel()
            # A replica started later, its file still the old one: the cluster's pins.
            async with (
                aiohttp.ClientSession() as session,
                anyio.create_task_group() as tg,
                replica(b, session, tg) as (_, on_b, _),
            ):
                assert (await on_b.tools())["fetch"]["description"] == PULLED
                tg.cancel_scope.cancel()
    finally:
        await store.aclose()


async def test_a_replica_whose_file_changes_shares_the_change(
    tmp_path: Path, redis_port: int
) -> None:
    """An approval written to one host's file by a CLI that knows no Redis: the replica there
    takes it up from its file and tells the others."""
    (tmp_path / "state").mkdir()
    a, b = host(tmp_path, "a", redis_port, 0.05), host(tmp_path, "b", redis_port, 0.05)
    assert cli("record", "--config", str(alone(a)))[0] == 0
    shutil.copy(a.with_name("pins.json"), b.with_name("pins.json"))
    with anyio.fail_after(START_BOUND * 2):
        async with (
            aiohttp.ClientSession() as session,
            anyio.create_task_group() as tg,
            replica(a, session, tg) as (_, on_a, _),
            replica(b, session, tg) as (gw_b, on_b, heard_b),
        ):
            (tmp_path / "state" / "extra").write_text("")
            assert "new" not in await on_a.tools()
            assert "new" not in await on_b.tools()
            told_b = heard_b.changed
            status, out = await anyio.to_thread.run_sync(
                cli, "approve", "--config", str(alone(a)), "rug", "new"
            )
            assert status == 0, out
            with anyio.fail_after(BOUND):
                await told_b.wait()
            assert "new" in await on_b.tools()
            assert gw_b.pins is not None and "new" in gw_b.pins.pinning.pinned["rug"]["tools"]
            tg.cancel_scope.cancel()
