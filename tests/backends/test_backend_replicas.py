"""Replicas of one HTTP backend (`urls:`): balancing, failover, sticky legacy sessions.

Each replica is a raw HTTP server on 127.0.0.1 (tests/support/backend.py) speaking enough of the
modern era (streamable-http) for a whole gateway, counting the tool calls it gets; the legacy
case runs two SDK servers of the 2025-11-25 era (transports, Session Management). What may be
sent again is judged by the tools' annotations (schema, ToolAnnotations).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import socket
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from gateway import config as gateway_config
from gateway.app import Gateway
from gateway.backends import health, safety
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.replicas import Replicas
from gateway.config import ConfigInvalid, HttpTarget
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from tests.backends.test_legacy_backends import post, text_of
from tests.config.test_config_schema import BASE, loader_accepts, schema_errors
from tests.support import (
    BOUND,
    START_BOUND,
    call,
    dead_url,
    request,
    start_sdk_http,
)
from tests.support.backend import (
    DISCOVERED,
    Peer,
    Server,
    chunk,
    head,
    json_reply,
    result_for,
    running,
    sse_event,
    sse_head,
)

pytestmark = pytest.mark.anyio

SAFE = {"readOnlyHint": True, "idempotentHint": True}
TOOLS: dict[str, Any] = {
    "resultType": "complete",
    "tools": [
        {"name": "read", "inputSchema": {"type": "object"}, "annotations": SAFE},
        {"name": "write", "inputSchema": {"type": "object"}},
        {"name": "slow", "inputSchema": {"type": "object"}, "annotations": SAFE},
    ],
}


class Replica:
    """A modern MCP server that counts the calls of each tool it receives. `fail`: None
    (serves), "drop" (closes the connection after reading a tools/call) or "503" (answers a
    tools/call with a bare 503, as a proxy in front of a failing server does)."""

    def __init__(self, name: str, fail: str | None = None) -> None:
        self.name = name
        self.fail = fail
        self.calls: Counter[str] = Counter()
        self.busy = asyncio.Event()  # a `slow` call has arrived
        self.release = asyncio.Event()  # ... and may be answered

    async def serve(self, peer: Peer) -> None:
        while (got := await peer.read_request()) is not None:
            msg = got.message
            if "id" not in msg:
                await peer.send(head("Content-Length: 0", status="202 Accepted"))
                continue
            result: dict[str, Any] = {"resultType": "complete"}
            if msg["method"] == "subscriptions/listen":
                note = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
                await peer.send(sse_head(), chunk(sse_event(note)))
                await peer.wait_closed_by_client()
                return
            if msg["method"] == "server/discover":
                result = DISCOVERED
            elif msg["method"] == "tools/list":
                result = TOOLS
            elif msg["method"] == "tools/call":
                tool = msg["params"]["name"]
                self.calls[tool] += 1
                if self.fail == "drop":
                    return  # (the connection closes: the call may have run)
                if self.fail == "503":
                    await peer.send(head("Content-Length: 0", status="503 Service Unavailable"))
                    continue
                if tool == "slow":
                    self.busy.set()
                    await self.release.wait()
                result = {**result, "content": [{"type": "text", "text": self.name}]}
            await peer.send(json_reply(result_for(got, result)))


@asynccontextmanager
async def gateway(urls: list[str], **http: Any) -> AsyncIterator[str]:
    async with gateway_with_admin(urls, **http) as (url, _):
        yield url


@asynccontextmanager
async def gateway_with_admin(urls: list[str], **http: Any) -> AsyncIterator[tuple[str, str]]:
    async with running_gateway(urls, **http) as gw:
        assert gw.http_url is not None and gw.admin_url is not None
        yield gw.http_url, gw.admin_url


@asynccontextmanager
async def running_gateway(urls: list[str], **http: Any) -> AsyncIterator[Gateway]:
    backend = {"http": {"urls": urls, **http}, "era": "modern"}
    listen = {"http": {"host": "127.0.0.1", "port": 0}, "admin": {"port": 0}}
    text = yaml.safe_dump({"listen": listen, "backends": {"b": backend}})
    async with Gateway(gateway_config.parse(text)) as gw:
        yield gw


async def metrics(admin: str) -> dict[tuple[str, str], float]:
    """(name, replica) -> value of the replica metrics of backend `b`."""
    async with aiohttp.ClientSession() as session, session.get(f"{admin}/metrics") as resp:
        text = await resp.text()
    return {
        (s.name, s.labels["replica"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "replica" in s.labels and s.labels.get("backend") == "b"
    }


@asynccontextmanager
async def replicas(*made: Replica) -> AsyncIterator[list[str]]:
    async with AsyncExitStack() as stack:
        servers = [await stack.enter_async_context(Server(r.serve)) for r in made]
        yield [s.url() for s in servers]


async def test_round_robin_spreads_calls_over_the_replicas() -> None:
    a, b, c = Replica("a"), Replica("b"), Replica("c")
    async with replicas(a, b, c) as urls, gateway(urls) as url:
        with anyio.fail_after(BOUND):
            answered = [text_of(await post(url, call(i, "write"))) for i in range(9)]
    assert (a.calls["write"], b.calls["write"], c.calls["write"]) == (3, 3, 3)
    assert Counter(answered) == {"a": 3, "b": 3, "c": 3}


async def test_least_in_flight_sends_to_the_idle_replica_while_one_is_busy() -> None:
    a, b = Replica("a"), Replica("b")
    async with (
        replicas(a, b) as urls,
        gateway(urls, balance="least_in_flight") as url,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(post, url, call(1, "slow"))
        with anyio.fail_after(BOUND):
            busy, idle = await _first_busy(a, b)
            answered = [text_of(await post(url, call(i, "write"))) for i in range(2, 6)]
        busy.release.set()
    assert answered == [idle.name] * 4
    assert busy.calls["write"] == 0 and idle.calls["write"] == 4


async def test_a_listen_stream_does_not_count_as_in_flight_on_its_replica() -> None:
    """A listen stream lasts as long as its client: least_in_flight does not shun the replica
    holding one (basic/utilities, subscriptions/listen: a long-lived request)."""
    a, b = Replica("a"), Replica("b")
    async with replicas(a, b) as urls:
        text = _config({"urls": urls, "balance": "least_in_flight"})
        config = dataclasses.replace(gateway_config.parse(text).backends[0], era="modern")
        async with running(config) as backend, anyio.create_task_group() as tg:
            listen = request("listen-1", "subscriptions/listen", {"filter": {}})
            heard = anyio.Event()

            async def hear(_: Message) -> None:
                heard.set()

            tg.start_soon(
                functools.partial(backend.request, listen, hear, GATEWAY_CALL, long_lived=True)
            )
            with anyio.fail_after(BOUND):
                await heard.wait()  # (the stream is open, its head read)
            stats = backend.replica_stats()
            assert stats is not None and [busy for _, busy, _ in stats] == [0, 0]
            tg.cancel_scope.cancel()


async def _first_busy(a: Replica, b: Replica) -> tuple[Replica, Replica]:
    async with anyio.create_task_group() as tg:
        done = anyio.Event()

        async def wait(r: Replica) -> None:
            await r.busy.wait()
            done.set()

        tg.start_soon(wait, a)
        tg.start_soon(wait, b)
        await done.wait()
        tg.cancel_scope.cancel()
    return (a, b) if a.busy.is_set() else (b, a)


async def test_a_replica_that_is_down_is_skipped_and_its_requests_go_to_another() -> None:
    """Nothing reaches a replica that refuses the connection, so every request, a call of a
    tool with effects too, goes to another; lists and annotated reads as well."""
    live = Replica("live")
    async with replicas(live) as urls, gateway([dead_url(), *urls]) as url:
        with anyio.fail_after(BOUND):
            for i in range(4):
                assert text_of(await post(url, call(i, "read"))) == "live"
                assert text_of(await post(url, call(10 + i, "write"))) == "live"
            listed = await post(url, request(20, "tools/list"))
    assert {t["name"] for t in listed["result"]["tools"]} == {"read", "write", "slow"}
    assert live.calls == {"read": 4, "write": 4}


async def test_the_backend_is_down_only_once_every_replica_has_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One replica down leaves the backend up (above); all of them down makes it down (-31001
    at once, as for one URL), and the background retry finds the first replica that is back."""
    monkeypatch.setattr(health, "FIRST_RETRY", 0.02)
    monkeypatch.setattr(health, "MAX_RETRY", 0.1)
    urls = [dead_url(), dead_url()]
    back = Replica("back")
    async with running_gateway(urls) as gw:
        assert gw.http_url is not None
        with anyio.fail_after(BOUND):
            await gw.health[0].wait(down=True)
            reply = await post(gw.http_url, call(1, "write"))
            assert reply["error"]["code"] == codes.BACKEND_UNAVAILABLE
            port = int(urls[1].rsplit(":", 1)[1].split("/")[0])
            with socket.create_server(("127.0.0.1", port)) as sock:
                async with Server(back.serve, sock=sock):
                    await gw.health[0].wait(down=False)
                    assert text_of(await post(gw.http_url, call(2, "write"))) == "back"
    assert back.calls == {"write": 1}


@pytest.mark.parametrize(
    ("fail", "code"),
    [("drop", codes.BACKEND_CONNECTION_LOST), ("503", codes.BACKEND_UNAVAILABLE)],
)
async def test_a_call_with_effects_is_never_sent_to_a_second_replica(fail: str, code: int) -> None:
    """A replica that fails after the request went out (the connection closes, or a 503 from
    whatever stands before it) may have run it: a call of a tool not declared read-only and
    idempotent is answered with the backend's error, and the other replica never sees it."""
    bad, good = Replica("bad", fail=fail), Replica("good")
    async with replicas(bad, good) as urls, gateway_with_admin(urls) as (url, admin):
        with anyio.fail_after(BOUND):
            replies = [await post(url, call(i, "write")) for i in range(2)]
            seen = await metrics(admin)
    failures = "mcp_gateway_backend_replica_failures_total"
    busy = "mcp_gateway_backend_replica_requests_in_flight"
    bad_label, good_label = urls  # (a replica is named by its URL without credentials)
    assert seen[failures, bad_label] == 1 and seen[failures, good_label] == 0
    assert seen[busy, bad_label] == 0 and seen[busy, good_label] == 0
    failed = [r for r in replies if "error" in r]
    assert len(failed) == 1 and failed[0]["error"]["code"] == code
    assert "'b'" in failed[0]["error"]["message"]
    assert bad.calls["write"] == 1 and good.calls["write"] == 1  # (the one that succeeded)


@pytest.mark.parametrize("fail", ["drop", "503"])
async def test_a_read_only_idempotent_call_moves_to_another_replica(fail: str) -> None:
    bad, good = Replica("bad", fail=fail), Replica("good")
    async with replicas(bad, good) as urls, gateway(urls) as url:
        with anyio.fail_after(BOUND):
            answered = [text_of(await post(url, call(i, "read"))) for i in range(4)]
    assert answered == ["good"] * 4
    assert good.calls["read"] == 4
    assert bad.calls["read"] == 1  # (then ejected: the others went straight to `good`)


@pytest.mark.slow
async def test_a_legacy_session_stays_on_its_replica_and_moves_when_it_fails() -> None:
    """transports (2025-11-25), Session Management: a session lives on the replica that
    answered its `initialize`; when that replica is gone, a new session opens on another."""
    first, first_url = start_sdk_http("--legacy-only", "--label", "one")
    second, second_url = start_sdk_http("--legacy-only", "--label", "two")
    procs = {"one": first, "two": second}
    try:
        backend = {"http": {"urls": [first_url, second_url]}, "era": "legacy"}
        text = yaml.safe_dump(
            {"listen": {"http": {"host": "127.0.0.1", "port": 0}}, "backends": {"b": backend}}
        )
        async with Gateway(gateway_config.parse(text)) as gw:
            assert gw.http_url is not None
            with anyio.fail_after(START_BOUND):
                labels = {text_of(await post(gw.http_url, call(i, "label"))) for i in range(8)}
            assert len(labels) == 1
            (pinned,) = labels
            procs[pinned].stop()
            with anyio.fail_after(START_BOUND):
                after = {text_of(await post(gw.http_url, call(i, "label"))) for i in range(4)}
            assert after == ({"one", "two"} - {pinned})
    finally:
        first.stop()
        second.stop()


# --- the balancer and the classification, without I/O ------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _labels(r: Replicas) -> list[str]:
    return [each.url.host or "" for each in r.candidates()]


def test_a_failed_replica_is_ejected_for_eject_for_seconds_then_used_again() -> None:
    clock = Clock()
    r = Replicas([URL("http://a/"), URL("http://b/")], eject_for=10.0, clock=clock)
    r.failed(r.all[0], unreachable=True)
    assert [_labels(r) for _ in range(3)] == [["b"]] * 3
    assert r.up
    clock.now += 10.0
    assert sorted(_labels(r)) == ["a", "b"]
    r.failed(r.all[0], unreachable=True)
    r.failed(r.all[1], unreachable=True)
    assert not r.up
    assert _labels(r) == ["a", "b"]  # all ejected: all tried, back soonest first


def test_least_in_flight_picks_the_idle_replica_and_takes_turns_on_ties() -> None:
    r = Replicas([URL("http://a/"), URL("http://b/")], balance="least_in_flight")
    r.all[0].in_flight = 2
    assert [_labels(r)[0] for _ in range(3)] == ["b"] * 3
    r.all[0].in_flight = 0
    assert {_labels(r)[0] for _ in range(2)} == {"a", "b"}


def test_only_calls_without_effects_may_be_repeated() -> None:
    safe = safety.SafeTools()
    safe.learn({"result": copy.deepcopy(TOOLS)})
    assert set(safe.names) == {"read", "slow"}
    reads = ("tools/list", "resources/read", "server/discover", "ping", "completion/complete")
    for method in reads:
        assert safety.may_repeat({"method": method}, safe.names)
    assert safety.may_repeat(call(1, "read"), safe.names)
    assert not safety.may_repeat(call(1, "write"), safe.names)
    assert not safety.may_repeat(call(1, "unknown"), safe.names)
    assert not safety.may_repeat({"method": "resources/subscribe"}, safe.names)
    # A tool listed again without its hints is no longer repeated.
    safe.learn({"result": {"tools": [{"name": "read", "annotations": {"readOnlyHint": True}}]}})
    assert not safety.may_repeat(call(1, "read"), safe.names)


# --- configuration ------------------------------------------------------------------------


def _config(http: dict[str, Any], kind: str = "http") -> str:
    return yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": {kind: http}}})


def test_urls_configure_replicas_and_url_still_works() -> None:
    text = _config({"urls": ["http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp"]})
    target = gateway_config.parse(text).backends[0].target
    assert isinstance(target, HttpTarget)
    assert target.url == "http://127.0.0.1:1/mcp"
    assert target.replicas == ("http://127.0.0.1:1/mcp", "http://127.0.0.1:2/mcp")
    assert (target.balance, target.eject_for) == ("round_robin", 10.0)
    one = gateway_config.parse(_config({"url": "http://127.0.0.1:1/mcp"})).backends[0].target
    assert isinstance(one, HttpTarget) and one.replicas == ("http://127.0.0.1:1/mcp",)


@pytest.mark.parametrize(
    ("http", "kind"),
    [
        ({"url": "http://127.0.0.1:1/mcp", "urls": ["http://127.0.0.1:2/mcp"]}, "http"),
        ({"urls": []}, "http"),
        ({"urls": ["ftp://127.0.0.1:2/mcp"]}, "http"),
        ({"urls": ["http://127.0.0.1:2/mcp", "http://127.0.0.1:2/mcp"]}, "http"),
        ({"urls": ["http://127.0.0.1:2/mcp"], "balance": "random"}, "http"),
        ({"urls": ["http://127.0.0.1:2/mcp"], "eject_for": 0}, "http"),
        ({"url": "http://127.0.0.1:1/mcp", "balance": "least_in_flight"}, "http"),
        ({"urls": ["http://127.0.0.1:2/mcp"]}, "sse"),
    ],
)
def test_wrong_replica_settings_are_refused(http: dict[str, Any], kind: str) -> None:
    with pytest.raises(ConfigInvalid):
        gateway_config.parse(_config(http, kind))


def test_the_schema_wants_exactly_one_of_url_and_urls() -> None:
    doc = copy.deepcopy(BASE)
    doc["backends"]["r"] = {"http": {"urls": ["http://127.0.0.1:1/mcp"], "balance": "x"}}
    both = copy.deepcopy(BASE)
    both["backends"]["r"] = {
        "http": {"url": "http://127.0.0.1:1/mcp", "urls": ["http://127.0.0.1:2/mcp"]}
    }
    good = copy.deepcopy(BASE)
    good["backends"]["r"] = {
        "http": {"urls": ["http://127.0.0.1:1/mcp"], "balance": "least_in_flight"}
    }
    for bad in (doc, both):
        assert schema_errors(bad) and not loader_accepts(_text(bad))
    assert schema_errors(good) == [] and loader_accepts(_text(good))


def _text(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)
