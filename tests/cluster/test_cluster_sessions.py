"""Legacy sessions shared by replicas (`cluster.redis`): two `Gateway`s in this process with
one config, as a load balancer has them behind it, and a real `redis-server` on a free loopback
port; raw HTTP, so statuses and headers are read exactly. Each gateway runs its own copy of the
SDK test server (stdio), as replicas do.

Proved: a session opened on one replica is served by the other (lists, calls, its log level and
subscriptions whichever replica set them); a question asked on one replica's request stream is
answered by a POST to the other, and the call completes; `notifications/cancelled` sent to one
cancels a request running on the other; DELETE on one ends the other's GET stream and the
session everywhere; another owner's session is 404 on every replica; the record expires in
Redis after the idle timeout, renewed by use, and holds no credential or session id; with
Redis stopped legacy requests are refused at once (503, -31009, Retry-After) while modern ones
are served, and sessions work again once it is back.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
import anyio.abc
import orjson
import pytest
import yaml
from redis.asyncio import Redis

from gateway.app import Gateway
from gateway.cluster.sessions import PREFIX
from gateway.config import parse
from gateway.protocol import codes
from tests.frontends.test_http_transport_rules import Reply, echo, post, send
from tests.support import BOUND, START_BOUND, Proc, sdk_stdio_command, stdio_backend
from tests.support.redis_server import free_port, launch, need_redis, redis_server, redis_url

pytestmark = pytest.mark.anyio

SECRET = "cluster-sessions-secret-Wd3Kp8Zq1Rm6Tx"
SESSION = "Mcp-Session-Id"
TOKEN = "Bearer session-owner-token-7Hc2Vq9L"
MINE = [("Authorization", TOKEN)]
IDLE = 1800.0
RETRY = 0.2
ACCEPT = "application/json, text/event-stream"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def config(port: int) -> str:
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0, "session_idle_timeout": IDLE}},
            "backends": {"sdk": stdio_backend(sdk_stdio_command())},
            "cluster": {
                "secrets": [SECRET],
                "redis": redis_url(port),
                "redis_retry_interval": RETRY,
            },
        }
    )


@asynccontextmanager
async def replicas(port: int) -> AsyncIterator[tuple[Gateway, Gateway]]:
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(config(port))) as a, Gateway(parse(config(port))) as b:
            for gw in (a, b):
                await gw.catalogs_loaded.wait()
                assert gw.bus is not None
                await gw.bus.ready.wait()
            yield a, b


@asynccontextmanager
async def redis_client(port: int) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url(port))
    try:
        yield client
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()


class Cluster:
    def __init__(self, a: Gateway, b: Gateway, redis: Redis) -> None:
        assert a.http_url is not None and b.http_url is not None
        self.a, self.b = a.http_url, b.http_url
        self.gateways = (a, b)
        self.redis = redis


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[Cluster]:
    need_redis()
    port = free_port()
    with redis_server(port):
        async with replicas(port) as (a, b), redis_client(port) as redis:
            yield Cluster(a, b, redis)


# --- helpers ----------------------------------------------------------------------------------


def legacy(method: str, params: dict[str, Any] | None = None, id_: int = 1) -> dict[str, Any]:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def initialize() -> dict[str, Any]:
    return legacy(
        "initialize",
        {
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {}},
            "clientInfo": {"name": "cluster-sessions-test", "version": "1"},
        },
        id_=0,
    )


def tool(name: str, id_: int = 1, progress: bool = False, **arguments: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if progress:
        params["_meta"] = {"progressToken": id_}
    return legacy("tools/call", params, id_)


async def open_session(url: str, extra: Sequence[tuple[str, str]] = MINE) -> str:
    reply = await post(url, initialize(), mirror=False, extra=extra)
    assert reply.status == 200, reply.body
    session_id: str = reply.headers[SESSION]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await in_session(url, session_id, note, extra)).status == 202
    return session_id


async def in_session(
    url: str, session_id: str, msg: dict[str, Any], extra: Sequence[tuple[str, str]] = MINE
) -> Reply:
    return await post(url, msg, mirror=False, extra=[(SESSION, session_id), *extra])


def messages(reply: Reply) -> list[dict[str, Any]]:
    assert reply.status == 200, (reply.status, reply.body)
    return [reply.json()] if reply.content_type == "application/json" else reply.events()


def result_of(reply: Reply, id_: int = 1) -> dict[str, Any]:
    msg = messages(reply)[-1]
    assert msg.get("id") == id_ and "error" not in msg, msg
    result: dict[str, Any] = msg["result"]
    return result


def text(reply: Reply, id_: int = 1) -> str:
    content: str = result_of(reply, id_)["content"][0]["text"]
    return content


def headers_of(session_id: str, accept: str = "text/event-stream") -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Accept": accept,
        SESSION: session_id,
        "Authorization": TOKEN,
    }


async def events(stream: aiohttp.ClientResponse, out: anyio.abc.ObjectSendStream[Any]) -> None:
    """Each `data:` event of an SSE response, decoded, to `out`; then the stream's end (None)."""
    async for line in stream.content:
        if line.startswith(b"data:"):
            await out.send(orjson.loads(line[5:]))
    await out.send(None)


def key_of(session_id: str) -> str:
    return PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


# --- one session, two replicas ----------------------------------------------------------------


async def test_a_session_opened_on_one_replica_is_served_by_the_other(cluster: Cluster) -> None:
    session_id = await open_session(cluster.a)
    tools = result_of(await in_session(cluster.b, session_id, legacy("tools/list", {})))
    assert "echo" in {t["name"] for t in tools["tools"]}
    assert text(await in_session(cluster.b, session_id, tool("echo", text="on b"))) == "on b"
    assert result_of(await in_session(cluster.a, session_id, legacy("ping"))) == {}
    # Replicas copy the session from its record: its era's rules hold on each.
    again = await in_session(cluster.b, session_id, initialize())
    assert again.status == 400 and again.json()["error"]["code"] == codes.INVALID_REQUEST
    bad = await in_session(
        cluster.b, session_id, legacy("ping"), [*MINE, ("MCP-Protocol-Version", "1999-01-01")]
    )
    assert bad.status == 400


async def test_a_session_is_its_owners_on_every_replica(cluster: Cluster) -> None:
    session_id = await open_session(cluster.a)
    for url in (cluster.a, cluster.b):
        ping = legacy("ping")
        other = await in_session(url, session_id, ping, [("Authorization", "Bearer other")])
        assert other.status == 404
        assert (await in_session(url, session_id, ping, [])).status == 404
        assert (await in_session(url, "no-such-session", ping)).status == 404
    assert text(await in_session(cluster.b, session_id, tool("echo", text="mine"))) == "mine"


async def test_the_record_holds_no_credential_and_expires_unless_used(cluster: Cluster) -> None:
    session_id = await open_session(cluster.a)
    key = key_of(session_id)
    keys = [k if isinstance(k, str) else k.decode() for k in await cluster.redis.keys("*")]
    assert key in keys and not any(session_id in k for k in keys)
    stored = await cluster.redis.get(key)
    assert stored is not None
    for secret in (session_id, TOKEN, TOKEN.split()[1], "Bearer"):
        assert secret.encode() not in stored
    record = orjson.loads(stored)
    assert record["version"] == "2025-11-25" and record["initialized"] is True
    assert record["client_info"] == {"name": "cluster-sessions-test", "version": "1"}
    # The idle timeout is the record's expiry, renewed by each use (on either replica).
    assert 0 < await cluster.redis.pttl(key) <= IDLE * 1000
    await cluster.redis.pexpire(key, 60_000)
    assert result_of(await in_session(cluster.b, session_id, legacy("ping"))) == {}
    assert await cluster.redis.pttl(key) > 60_000
    # Expired in Redis: gone on both replicas (no waiting for the timeout itself).
    await cluster.redis.pexpire(key, 1)
    with anyio.fail_after(BOUND):
        while await cluster.redis.exists(key):
            await anyio.lowlevel.checkpoint()
    assert (await in_session(cluster.a, session_id, legacy("ping"))).status == 404
    assert (await in_session(cluster.b, session_id, legacy("ping"))).status == 404


async def test_a_log_level_set_on_one_replica_applies_on_the_other(cluster: Cluster) -> None:
    session_id = await open_session(cluster.a)
    quiet = messages(await in_session(cluster.a, session_id, tool("log", text="unheard")))
    assert [m.get("method") for m in quiet] == [None]  # no level set: no log messages
    set_level = legacy("logging/setLevel", {"level": "info"}, 2)
    assert result_of(await in_session(cluster.b, session_id, set_level), 2) == {}
    heard = messages(await in_session(cluster.a, session_id, tool("log", 3, text="heard")))
    assert heard[0]["method"] == "notifications/message"
    assert heard[0]["params"]["data"] == "heard"
    assert heard[-1]["id"] == 3


async def test_a_question_asked_on_one_replica_is_answered_through_the_other(
    cluster: Cluster,
) -> None:
    """The backend's input request reaches the client on the stream of the POST that A serves;
    the client's answer is a POST that lands on B, which passes it to A over the bus."""
    session_id = await open_session(cluster.a)
    a, b = cluster.gateways
    assert a.bus is not None and b.bus is not None
    send_events, received = anyio.create_memory_object_stream[Any](16)
    ask = tool("ask", 5, question="across?")
    with anyio.fail_after(BOUND * 2):
        async with (
            send_events,
            received,
            aiohttp.ClientSession() as http,
            http.post(
                cluster.a, data=orjson.dumps(ask), headers=headers_of(session_id, ACCEPT)
            ) as resp,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(events, resp, send_events)
            question = await received.receive()
            assert question["method"] == "elicitation/create", question
            # Named by the replica that asked it.
            assert question["id"].startswith(f"mcp-gateway-{a.bus.replica}-")
            answer = {
                "jsonrpc": "2.0",
                "id": question["id"],
                "result": {"action": "accept", "content": {"answer": "yes"}},
            }
            assert (await in_session(cluster.b, session_id, answer)).status == 202
            final = await received.receive()
            assert final["id"] == 5, final
            assert final["result"]["content"][0]["text"] == "answer: yes"
    assert b.telemetry.stats.cluster_messages["session.answer", "sent"] >= 1


async def test_a_cancellation_sent_to_one_replica_stops_the_request_on_the_other(
    cluster: Cluster,
) -> None:
    session_id = await open_session(cluster.a)
    hold = tool("hold", 7, progress=True, key="across")
    cancel = {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "test"},
    }
    send_events, received = anyio.create_memory_object_stream[Any](16)
    with anyio.fail_after(BOUND):
        async with (
            send_events,
            received,
            aiohttp.ClientSession() as http,
            http.post(
                cluster.a, data=orjson.dumps(hold), headers=headers_of(session_id, ACCEPT)
            ) as resp,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(events, resp, send_events)
            progress = await received.receive()
            assert progress["method"] == "notifications/progress"  # it runs on A
            assert (await in_session(cluster.b, session_id, cancel)).status == 202
            ended = await received.receive()
            assert ended["id"] == 7 and "error" in ended, ended
    # The backend's call was cancelled too (the same child on A took both calls).
    probe = tool("was_cancelled", 8, key="across")
    reply = await post(cluster.a, probe, mirror=False, extra=[(SESSION, session_id), *MINE])
    assert text(reply, 8) == "cancelled"


async def test_delete_on_one_replica_ends_the_stream_on_the_other(cluster: Cluster) -> None:
    session_id = await open_session(cluster.a)
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as http,
            http.get(cluster.a, headers=headers_of(session_id)) as stream,
        ):
            assert stream.status == 200
            assert (await stream.content.readline()).startswith(b":")  # open on A
            deleted = await send("DELETE", cluster.b, None, [(SESSION, session_id), *MINE])
            assert deleted.status == 204
            assert b"data:" not in await stream.content.read()  # ended, without a cut
    for url in (cluster.a, cluster.b):
        assert (await in_session(url, session_id, legacy("ping"))).status == 404
    assert await cluster.redis.exists(key_of(session_id)) == 0


async def test_a_subscription_made_on_one_replica_reaches_the_stream_on_the_other(
    cluster: Cluster,
) -> None:
    """The GET stream is open on A, so A watches the session's changes; the client subscribes
    through B, and A's watch follows (the record, and a message on the bus)."""
    session_id = await open_session(cluster.a)
    send_events, received = anyio.create_memory_object_stream[Any](16)
    touch = tool("touch", uri="mem://greeting")
    with anyio.fail_after(BOUND * 2):
        async with (
            send_events,
            received,
            aiohttp.ClientSession() as http,
            http.get(cluster.a, headers=headers_of(session_id)) as stream,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(events, stream, send_events)
            subscribe = legacy("resources/subscribe", {"uri": "mem://greeting"}, 2)
            assert result_of(await in_session(cluster.b, session_id, subscribe), 2) == {}
            # A's watch restarts with the new subscription; the resource changes where A's
            # watch hears it (A's backend): touch until an update comes.
            event: dict[str, Any] | None = None
            while event is None:
                assert text(await in_session(cluster.a, session_id, touch))
                with anyio.move_on_after(0.2):
                    event = await received.receive()
            assert event == {
                "jsonrpc": "2.0",
                "method": "notifications/resources/updated",
                "params": {"uri": "mem://greeting"},
            }
            tg.cancel_scope.cancel()
    record = orjson.loads(await cluster.redis.get(key_of(session_id)) or b"{}")
    assert record["subscribed"] == ["mem://greeting"]


# --- Redis away -------------------------------------------------------------------------------


async def test_without_redis_legacy_sessions_are_refused_and_modern_requests_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    need_redis()
    port = free_port()
    redis: Proc = await anyio.to_thread.run_sync(launch, port)
    try:
        async with replicas(port) as (a, b):
            assert a.http_url is not None and b.http_url is not None
            before = await open_session(a.http_url)
            await anyio.to_thread.run_sync(redis.stop)
            caplog.set_level(logging.WARNING, logger="gateway")
            for url in (a.http_url, b.http_url, a.http_url):
                started = time.monotonic()
                refused = await in_session(url, before, legacy("ping", id_=4))
                assert time.monotonic() - started < 1.0  # at once, not after retries
                assert refused.status == 503, refused.body
                assert refused.headers["Retry-After"] == "1"
                error = refused.json()["error"]
                assert error["code"] == codes.SHARED_STATE_UNAVAILABLE and refused.json()["id"] == 4
                assert error["data"]["retryAfter"] == RETRY
                # Modern traffic needs no Redis.
                modern = await post(url, echo("modern"))
                assert modern.status == 200 and "result" in modern.json(), modern.body
            opening = await post(b.http_url, initialize(), mirror=False, extra=MINE)
            assert opening.status == 503 and SESSION not in opening.headers
            assert opening.json()["error"]["code"] == codes.SHARED_STATE_UNAVAILABLE
            for verb in ("GET", "DELETE"):
                headers = [(SESSION, before), ("Accept", "text/event-stream"), *MINE]
                assert (await send(verb, a.http_url, None, headers)).status == 503
            down = [r for r in caplog.records if "legacy session record" in r.getMessage()]
            assert len(down) == 2  # one line per replica, however many requests
            assert not any("redis://" in r.getMessage() for r in caplog.records)
            assert metric(a, "mcp_gateway_redis_sessions_up") == 0
            assert a.telemetry.stats.rejections["sessions_unavailable"] >= 2

            redis = await anyio.to_thread.run_sync(launch, port)
            # Each replica tries Redis again after RETRY: a new session opens there and
            # is served by the other. (The old one was in the Redis that stopped.)
            with anyio.fail_after(BOUND):
                while (reply := await post(b.http_url, initialize(), mirror=False)).status != 200:
                    assert reply.status == 503
            session_id = reply.headers[SESSION]
            with anyio.fail_after(BOUND):
                while (
                    again := await in_session(a.http_url, session_id, legacy("ping"), [])
                ).status == 503:
                    pass
            assert result_of(again) == {}
            assert (await in_session(a.http_url, before, legacy("ping"))).status == 404
            back = [
                r for r in caplog.records if "legacy sessions are served again" in r.getMessage()
            ]
            assert len(back) == 2
            assert metric(a, "mcp_gateway_redis_sessions_up") == 1
    finally:
        redis.stop()


def metric(gateway: Gateway, name: str) -> float | None:
    families = {m.name: m for m in gateway.registry.collect()}
    samples = families[name].samples
    return samples[0].value if samples else None
