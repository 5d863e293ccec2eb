"""List changes and resource updates across replicas (`cluster.redis`; core/changes.py).

Two `Gateway`s in this process share a real `redis-server` started by each test on a free
loopback port; each runs its own stdio child of the SDK test server, so a change made through
one replica happens in that replica's child only, and the other can learn of it only through
the bus. Proved: a listen on A hears a list change made through B, and A's catalog is loaded
again without a request asking; a resource update caused on B reaches A's subscriber; a client
of A that did not ask for a flag hears nothing of it; B's own listen hears B's change once;
a legacy session on A (its GET stream) hears it too; with Redis stopped each replica still
serves its own listens; malformed bus messages are ignored; without `cluster.redis` there is no
bus and nothing is published. And a reload: an open listen gets the list changes of a backend
the reload added.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import orjson
import pytest
import yaml
from mcp import Client, MCPError
from mcp.client.subscriptions import ResourceUpdated, ToolsListChanged
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.config import parse
from gateway.core.changes import TOPIC
from gateway.shared.bus import PREFIX
from tests.redis_support import free_port, launch, need_redis, redis_url
from tests.support import BOUND, START_BOUND, Proc, sdk_stdio_command, stdio_backend
from tests.test_legacy_clients import Changes

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "cluster-changes-secret-R7v2Kx9Qm4Lt8Wz"
MOTD = "mem://motd"
LIST_CHANGED = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


def config_text(redis_port: int | None, **backends: dict[str, object]) -> str:
    settings: dict[str, Any] = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0}},
        "backends": backends or {"sdk": stdio_backend(sdk_stdio_command("--page-size", "0"))},
    }
    if redis_port is not None:
        settings["cluster"] = {
            "secrets": [SECRET],
            "redis": redis_url(redis_port),
            "redis_retry_interval": 0.1,
        }
    return yaml.safe_dump(settings)


@pytest.fixture
async def redis() -> AsyncIterator[tuple[int, list[Proc]]]:
    """A Redis of the test's own; the list holds the one running now (a test stops it)."""
    need_redis()
    port = free_port()
    running = [await anyio.to_thread.run_sync(launch, port)]
    try:
        yield port, running
    finally:
        for proc in running:
            proc.stop()


@asynccontextmanager
async def replicas(port: int) -> AsyncIterator[tuple[Gateway, Gateway]]:
    text = config_text(port)
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as a, Gateway(parse(text)) as b:
            for gateway in (a, b):
                await gateway.catalogs_loaded.wait()
                assert gateway.bus is not None
                await gateway.bus.ready.wait()
            yield a, b


@asynccontextmanager
async def client(gateway: Gateway, **options: Any) -> AsyncIterator[Client]:
    assert gateway.http_url is not None
    async with Client(gateway.http_url, **options) as connected:
        yield connected


async def next_event(events: Any) -> Any:
    with anyio.fail_after(BOUND):
        return await events.__anext__()


class Heard:
    """What a listen hears, read by a task of its own (an iterator cut mid-wait is broken)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self._arrived = anyio.Event()

    async def read(self, events: AsyncIterator[Any]) -> None:
        async for event in events:
            self.seen.append(event)
            self._arrived.set()
            self._arrived = anyio.Event()

    async def arrival(self) -> None:
        await self._arrived.wait()


async def until_heard(
    act: Callable[[], Any], arrival: Callable[[], Any], heard: Callable[[], bool]
) -> None:
    """Act until it is heard (bounded): until the replica that sees the change has its own
    listen on its child open and acknowledged, a change is heard by nobody (a notice, at most
    once, is lost, not late), so one act may go unheard."""
    with anyio.fail_after(START_BOUND):
        while not heard():
            await act()
            with anyio.move_on_after(0.5):
                while not heard():
                    await arrival()


async def until(condition: Callable[[], bool]) -> None:
    with anyio.fail_after(BOUND):
        while not condition():  # noqa: ASYNC110 - counters of other tasks offer no event
            await anyio.sleep(0.01)


async def test_a_listen_on_one_replica_hears_a_list_change_made_through_the_other(
    redis: tuple[int, list[Proc]],
) -> None:
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        client(a) as on_a,
        client(b) as on_b,
        on_a.listen(tools_list_changed=True) as sub,
        anyio.create_task_group() as tg,
    ):
        heard = Heard()
        tg.start_soon(heard.read, sub)
        refreshes = a.dispatcher.catalogs.refreshes["sdk"]
        await until_heard(
            lambda: on_b.call_tool("change_tools", {}),
            heard.arrival,
            lambda: any(isinstance(e, ToolsListChanged) for e in heard.seen),
        )
        # A's catalog is loaded again now, not at a lookup that misses after its refresh
        # interval: "every replica refreshes its catalog".
        await until(lambda: a.dispatcher.catalogs.refreshes["sdk"] > refreshes)
        changes = b.changes
        assert changes is not None
        await until(lambda: changes.published >= 1)
        tg.cancel_scope.cancel()


async def test_a_resource_update_caused_on_one_replica_reaches_a_subscriber_on_the_other(
    redis: tuple[int, list[Proc]],
) -> None:
    """B hears an update from its child only where something of B listens for that URI (here
    a client of B): resource subscriptions are not spread over the cluster (README)."""
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        client(a) as on_a,
        client(b) as on_b,
        on_a.listen(resource_subscriptions=[MOTD]) as sub_a,
        on_b.listen(resource_subscriptions=[MOTD]) as sub_b,
    ):
        assert sub_a.honored.resource_subscriptions == [MOTD]
        events_a, events_b = sub_a.__aiter__(), sub_b.__aiter__()
        await on_b.call_tool("touch", {"uri": MOTD})
        assert await next_event(events_b) == ResourceUpdated(uri=MOTD)
        assert await next_event(events_a) == ResourceUpdated(uri=MOTD)


async def test_only_listens_that_asked_hear_and_the_changing_replica_hears_it_once(
    redis: tuple[int, list[Proc]],
) -> None:
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        client(a) as on_a,
        client(b) as on_b,
        on_a.listen(tools_list_changed=True) as asked,
        on_a.listen(resource_subscriptions=[MOTD]) as not_asked,
        on_b.listen(tools_list_changed=True, resource_subscriptions=[MOTD]) as own,
    ):
        heard, quiet, mine = asked.__aiter__(), not_asked.__aiter__(), own.__aiter__()
        await on_b.call_tool("change_tools", {})
        assert isinstance(await next_event(mine), ToolsListChanged)
        assert isinstance(await next_event(heard), ToolsListChanged)
        # What comes next on B's own listen is the next change, not the first one again (from
        # its own watch, or back from the bus).
        await on_b.call_tool("touch", {"uri": MOTD})
        assert await next_event(mine) == ResourceUpdated(uri=MOTD)
        # The listen on A without the flag heard nothing before the update it subscribed to
        # (B's touch, through the bus).
        assert await next_event(quiet) == ResourceUpdated(uri=MOTD)
        # Nor did A's listen with the flag hear the list change twice.
        await on_a.call_tool("change_tools", {})
        assert isinstance(await next_event(heard), ToolsListChanged)
        changes = a.changes
        assert changes is not None
        await until(lambda: changes.published >= 1)  # (published in a task of its own)


async def test_a_legacy_session_on_one_replica_hears_the_other_replicas_change(
    redis: tuple[int, list[Proc]],
) -> None:
    port, _ = redis
    changes = Changes()
    async with (
        replicas(port) as (a, b),
        client(a, mode="legacy", message_handler=changes),
        client(b) as on_b,
    ):
        # (until the session's watch is open on A and B's own listen on its child, a change
        # may go unheard)
        await until_heard(
            lambda: on_b.call_tool("change_tools", {}),
            changes.arrival,
            lambda: (LIST_CHANGED, None) in changes.seen,
        )


async def test_with_redis_stopped_each_replica_serves_its_own_listens(
    redis: tuple[int, list[Proc]],
) -> None:
    port, running = redis
    async with (
        replicas(port) as (a, _),
        client(a) as on_a,
        on_a.listen(tools_list_changed=True) as sub,
    ):
        events = sub.__aiter__()
        await anyio.to_thread.run_sync(running.pop().stop)
        assert a.changes is not None
        await on_a.call_tool("change_tools", {})
        assert isinstance(await next_event(events), ToolsListChanged)
        # Its notice for the others was not sent, and said so (the bus counts it).
        stats = a.telemetry.stats
        await until(lambda: stats.cluster_messages[TOPIC, "unsent"] >= 1)


async def test_malformed_bus_messages_are_ignored(redis: tuple[int, list[Proc]]) -> None:
    port, _ = redis
    channel = PREFIX + TOPIC
    publisher = Redis.from_url(redis_url(port))
    try:
        async with (
            replicas(port) as (a, _),
            client(a) as on_a,
            on_a.listen(tools_list_changed=True, resource_subscriptions=[MOTD]) as sub,
        ):
            events = sub.__aiter__()

            async def send(body: object) -> None:
                with anyio.fail_after(BOUND):
                    await publisher.publish(channel, orjson.dumps({"from": "forger", "body": body}))

            for body in (
                {"backend": "sdk", "method": UPDATED},  # an update without its URI
                {"backend": "sdk", "method": LIST_CHANGED, "uri": MOTD},  # a list with one
                {"backend": "sdk", "method": "notifications/message"},  # not a change
                {"backend": "nowhere", "method": LIST_CHANGED},  # not a backend of A's
                {"backend": 7, "method": LIST_CHANGED},
                {"backend": "sdk", "method": UPDATED, "uri": "mem://" + "x" * 9000},
                {"backend": "sdk", "method": UPDATED, "uri": ["mem://motd"]},
                ["not", "an", "object"],
            ):
                await send(body)
            with anyio.fail_after(BOUND):
                await publisher.publish(channel, b"\xff not json")
            # A well-formed notice after them is the first thing the listen hears.
            await send({"backend": "sdk", "method": LIST_CHANGED})
            assert isinstance(await next_event(events), ToolsListChanged)
            await send({"backend": "sdk", "method": UPDATED, "uri": MOTD})
            assert await next_event(events) == ResourceUpdated(uri=MOTD)
    finally:
        with anyio.CancelScope(shield=True):
            await publisher.aclose()


async def test_without_cluster_redis_there_is_no_bus_and_nothing_is_published() -> None:
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(config_text(None))) as gateway:
            await gateway.catalogs_loaded.wait()  # (its child started: stopped in order)
            assert gateway.bus is None
            assert gateway.changes is None
            assert gateway.dispatcher.subscriptions.on_heard is None


async def test_a_reload_extends_an_open_listen_to_an_added_backend() -> None:
    first = {"a": stdio_backend(sdk_stdio_command("--label", "a", "--page-size", "0"))}
    second = {**first, "b": stdio_backend(sdk_stdio_command("--label", "b", "--page-size", "0"))}

    def text(backends: dict[str, dict[str, object]]) -> str:
        settings = yaml.safe_load(config_text(None, **backends))
        settings["namespacing"] = {"prefix": "always"}
        return yaml.safe_dump(settings)

    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text(first))) as gateway:
            await gateway.catalogs_loaded.wait()
            async with (
                client(gateway) as connected,
                connected.listen(tools_list_changed=True) as sub,
                anyio.create_task_group() as tg,
            ):
                assert sub.honored.tools_list_changed
                heard = Heard()
                tg.start_soon(heard.read, sub)
                done = await gateway.reload(lambda: parse(text(second)))
                assert done is not None and done.added == ("b",)

                async def change() -> None:
                    # (until b's child has started and acknowledged its part of the listen)
                    with contextlib.suppress(MCPError):
                        await connected.call_tool("b_change_tools", {})

                await until_heard(
                    change,
                    heard.arrival,
                    lambda: any(isinstance(e, ToolsListChanged) for e in heard.seen),
                )
                tg.cancel_scope.cancel()
