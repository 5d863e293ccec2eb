"""List changes and resource updates across replicas (`cluster.redis`; core/changes.py).

Two `Gateway`s in this process share a real `redis-server` started by each test on a free
loopback port; each runs its own stdio child of the SDK test server, so a change made through
one replica happens in that replica's child only, and the other can learn of it only through
the bus. Proved: a listen on A hears a list change made through B, and A's catalog is loaded
again without a request asking; a resource update caused on B reaches A's subscriber with no
client of B subscribed (A's interest makes B's watch ask B's child for the URI; the child,
started with `--record-listens`, says what its listens ask for), the interest goes when A's
listen closes, a replica started later learns it at once, and the interests of a replica gone
without a word expire (a clock of the test); forged interests are bounded; a client of A that
did not ask for a flag hears nothing of it; B's own listen hears B's change once; a legacy
session on A (its GET stream) hears list changes and, subscribed on A, resource updates
caused on B; with Redis stopped each replica still serves its own listens; malformed bus
messages are ignored; without `cluster.redis` there is no bus and nothing is published. And a
reload: an open listen gets the list changes of a backend the reload added.
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
from mcp_types import TextContent
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.cluster.bus import PREFIX
from gateway.config import parse
from gateway.core import interest
from gateway.core.changes import TOPIC
from tests.support import (
    BOUND,
    START_BOUND,
    Proc,
    sdk_stdio_command,
    stdio_backend,
    until,
)
from tests.support.redis_server import free_port, launch, need_redis, redis_url
from tests.system.test_legacy_clients import Changes, legacy_only_method

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "cluster-changes-secret-R7v2Kx9Qm4Lt8Wz"
MOTD = "mem://motd"
LIST_CHANGED = "notifications/tools/list_changed"
UPDATED = "notifications/resources/updated"


def config_text(redis_port: int | None, **backends: dict[str, object]) -> str:
    settings: dict[str, Any] = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0}},
        "backends": backends
        or {"sdk": stdio_backend(sdk_stdio_command("--page-size", "0", "--record-listens"))},
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
    async with replicas_of(config_text(port)) as both:
        yield both


@asynccontextmanager
async def replicas_of(text: str) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Two replicas of `text`, each with its catalogs loaded and its bus ready."""
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


# Counters of other tasks offer no event: looked at every 10 ms.
POLL = 0.01


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
        await until(lambda: a.dispatcher.catalogs.refreshes["sdk"] > refreshes, every=POLL)
        changes = b.changes
        assert changes is not None
        await until(lambda: changes.published >= 1, every=POLL)
        tg.cancel_scope.cancel()


async def asked_of_child(connected: Client, uri: str, present: bool = True) -> bool:
    """Whether the replica's stdio child has (`present`) or no longer has a listen stream
    asking for `uri`, once it does or the bound has passed (the child waits: no polling)."""
    with anyio.fail_after(BOUND + 1):
        result = await connected.call_tool(
            "await_listen_uri", {"uri": uri, "present": present, "seconds": BOUND}
        )
    content = result.content[0]
    assert isinstance(content, TextContent)
    return content.text == "present"


async def test_a_resource_update_caused_on_one_replica_reaches_a_subscriber_on_the_other(
    redis: tuple[int, list[Proc]],
) -> None:
    """No client of B is subscribed: A tells B of its listen's URI (its interest), B's watch
    asks B's child for it, hears the update the child sends and publishes it."""
    port, _ = redis
    async with (
        replicas(port) as (a, b),
        client(a) as on_a,
        client(b) as on_b,
        on_a.listen(resource_subscriptions=[MOTD]) as sub_a,
    ):
        assert sub_a.honored.resource_subscriptions == [MOTD]
        events_a = sub_a.__aiter__()
        assert await asked_of_child(on_b, MOTD)
        assert b.changes is not None and b.changes.watching["sdk"] == {MOTD}
        await on_b.call_tool("touch", {"uri": MOTD})
        assert await next_event(events_a) == ResourceUpdated(uri=MOTD)


async def test_an_interest_ends_with_its_listen_and_a_replica_started_later_learns_it(
    redis: tuple[int, list[Proc]],
) -> None:
    port, _ = redis
    text = config_text(port)
    with anyio.fail_after(START_BOUND):
        async with (
            Gateway(parse(text)) as a,
            client(a) as on_a,
            contextlib.AsyncExitStack() as listening,
        ):
            await listening.enter_async_context(on_a.listen(resource_subscriptions=[MOTD]))
            # B starts after A's listen opened: its hello has A tell its interests at once,
            # not at A's next period.
            async with Gateway(parse(text)) as b, client(b) as on_b:
                assert await asked_of_child(on_b, MOTD)
                assert a.changes is not None and b.changes is not None
                assert a.changes.interests.told == {"sdk": [MOTD]}
                # A's listen closes: A tells B it wants nothing, and B's watch of its child
                # stops asking for the URI.
                await listening.aclose()
                assert not await asked_of_child(on_b, MOTD, present=False)
                assert b.changes.watching["sdk"] == frozenset()
                assert a.changes.interests.told == {}


async def test_the_interests_of_a_replica_gone_without_a_word_expire_and_are_bounded(
    redis: tuple[int, list[Proc]],
) -> None:
    """Interests published straight on Redis by replicas that never speak again (forged, or
    dead): only what is well-formed and bounded is watched, and the whole goes after the TTL
    (the expiry run with a clock of the test)."""
    port, _ = redis
    channel = PREFIX + interest.TOPIC
    publisher = Redis.from_url(redis_url(port))
    try:
        async with replicas(port) as (_, b), client(b) as on_b:
            changes = b.changes
            assert changes is not None

            async def send(sender: str, body: object) -> None:
                with anyio.fail_after(BOUND):
                    await publisher.publish(channel, orjson.dumps({"from": sender, "body": body}))

            await send("ghost", {"uris": ["not", "a", "table"]})
            flood = [f"mem://flood/{i}" for i in range(interest.MAX_URIS + 10)]
            await send("flood", {"uris": {"sdk": flood}})
            long = "mem://" + "x" * interest.MAX_URI
            listed = [MOTD, long, 7, "", ["mem://nested"]]
            await send("ghost", {"uris": {"sdk": listed, "nowhere": ["mem://elsewhere"]}})
            assert await asked_of_child(on_b, MOTD)
            watched = changes.watching["sdk"]
            assert MOTD in watched and long not in watched and "mem://elsewhere" not in watched
            assert len(watched) == interest.MAX_URIS + 1  # (the flood's first MAX_URIS)
            # Neither replica is heard from again: after the TTL, nothing is asked for.
            changes.interests.expire(now=anyio.current_time() + interest.TTL + 1)
            assert not await asked_of_child(on_b, MOTD, present=False)
            assert changes.watching["sdk"] == frozenset()
    finally:
        with anyio.CancelScope(shield=True):
            await publisher.aclose()


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
        await until(lambda: changes.published >= 1, every=POLL)  # (published in a task of its own)


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


async def test_a_legacy_sessions_subscription_on_one_replica_hears_an_update_caused_on_the_other(
    redis: tuple[int, list[Proc]],
) -> None:
    """`resources/subscribe` over a session on A: its watch (a modern listen on A) is A's
    interest, so B's watch asks B's child for the URI; no client of B subscribes."""
    port, _ = redis
    changes = Changes()
    async with (
        replicas(port) as (a, b),
        client(a, mode="legacy", message_handler=changes) as legacy,
        client(b) as on_b,
    ):
        with legacy_only_method():
            await legacy.subscribe_resource(MOTD)
        assert await asked_of_child(on_b, MOTD)
        await on_b.call_tool("touch", {"uri": MOTD})
        with anyio.fail_after(BOUND):
            while (UPDATED, MOTD) not in changes.seen:
                await changes.arrival()


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
        await until(lambda: stats.cluster_messages[TOPIC, "unsent"] >= 1, every=POLL)


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
            assert gateway.dispatcher.subscriptions.on_listens_changed is None


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
