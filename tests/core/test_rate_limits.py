"""Rate limits (`rate_limits:`): token buckets per caller, per caller and tool, and overall.

Fast tests drive `RateLimiter` with a clock of their own (no sleeps) and the dispatcher over an
in-memory backend; the end-to-end ones go through the HTTP front end as a real listener (429,
Retry-After and the JSON-RPC error -31008, while other callers are still served) and the stdio
front end of a gateway process (the JSON-RPC error carrying the delay in `data.retryAfter`).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway import errors
from gateway.app import Gateway
from gateway.caller_auth.identity import Identity
from gateway.config import ConfigInvalid, Rate, RateLimits, parse
from gateway.core.ratelimit import RateLimiter, caller_key, retry_after_header
from gateway.errors import RateLimited
from gateway.origin import STDIO_ORIGIN, Origin
from gateway.protocol import codes
from tests.support import (
    BOUND,
    DEMO_STDIO,
    PYTHON,
    START_BOUND,
    Proc,
    call,
    gateway_command,
    mirrored_headers,
    stdio_backend,
)
from tests.support.memory_backend import MemoryBackend, dispatcher_over, ignore, modern, tool_call

pytestmark = pytest.mark.anyio

DEMO = DEMO_STDIO
ALICE = Identity("alice", "cli", "https://as.example")
BOB = Identity("bob", "cli", "https://as.example")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(clock: Clock, counts: Counter[str] | None = None, **limits: Any) -> RateLimiter:
    return RateLimiter(RateLimits(**limits), Counter() if counts is None else counts, clock)


def origin(identity: Identity | None = None, peer: str | None = "127.0.0.1") -> Origin:
    return Origin("http", peer, {}, identity=identity)


def refused(limits: RateLimiter, msg: dict[str, Any], where: Origin) -> RateLimited | None:
    try:
        limits.admit(msg, where)
    except RateLimited as exc:
        return exc
    return None


# --- the config -------------------------------------------------------------------------------


def config_with(rate_limits: Any) -> str:
    return yaml.safe_dump(
        {"listen": {"stdio": True}, "backends": {"demo": DEMO}, "rate_limits": rate_limits}
    )


def test_the_config_reads_each_limit_and_defaults_burst_to_the_rate() -> None:
    limits = parse(
        config_with(
            {
                "per_identity": {"rate": 2.5},
                "per_tool": {"rate": 0.1},
                "tools": {"add": {"rate": 1, "burst": 4}},
            }
        )
    ).rate_limits
    assert limits is not None
    assert limits.per_identity == Rate(rate=2.5, burst=3)
    assert limits.per_tool == Rate(rate=0.1, burst=1)  # a bucket holds one request at least
    assert limits.overall is None and limits.tools == {"add": Rate(rate=1.0, burst=4)}
    assert limits.max_keys == 10_000
    assert parse(config_with(None)).rate_limits is None


@pytest.mark.parametrize(
    "bad",
    [
        {"per_identity": {"burst": 3}},  # no rate
        {"per_identity": {"rate": 0}},
        {"overall": {"rate": 1, "burst": 0}},
        {"tools": {"add": {"rate": -1}}},
        {"max_keys": 0},
        {"per_caller": {"rate": 1}},
    ],
)
def test_the_config_refuses_a_bad_limit(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(config_with(bad))
    assert len(caught.value.problems) == 1 and "rate_limits." in caught.value.problems[0]


# --- the buckets ------------------------------------------------------------------------------


def test_a_burst_is_served_then_refused_until_a_token_is_back() -> None:
    clock = Clock()
    limits = limiter(clock, per_identity=Rate(rate=2.0, burst=3))
    msg = tool_call(1, "echo")
    for _ in range(3):
        assert refused(limits, msg, origin(ALICE)) is None
    over = refused(limits, msg, origin(ALICE))
    assert over is not None and over.code == codes.RATE_LIMITED
    assert over.retry_after == pytest.approx(0.5)  # one token at 2 a second
    clock.now += 0.499
    assert refused(limits, msg, origin(ALICE)) is not None
    clock.now += 0.001
    assert refused(limits, msg, origin(ALICE)) is None
    assert refused(limits, msg, origin(ALICE)) is not None  # that token is spent


def test_a_reload_keeps_the_buckets_of_every_limit_it_did_not_change() -> None:
    # README "Reloading the config": re-reading `rate_limits:` refills nobody's budget.
    clock = Clock()
    kept: dict[str, Any] = {
        "per_identity": Rate(rate=0.001, burst=2),
        "overall": Rate(rate=0.001, burst=50),
    }
    before = limiter(clock, **kept, tools={"echo": Rate(rate=0.001, burst=2)})
    msg = tool_call(1, "echo")
    for _ in range(2):
        assert refused(before, msg, origin(ALICE)) is None
    assert refused(before, msg, origin(ALICE)) is not None
    counts: Counter[str] = Counter()
    after = limiter(clock, counts=counts, **kept, tools={"echo": Rate(rate=0.001, burst=5)})
    after.carry_over(before)
    assert refused(after, msg, origin(ALICE)) is not None
    assert counts == Counter({"identity": 1})  # still spent
    # A changed limit starts full: the per-identity one raised, Alice is served again, and the
    # overall bucket (unchanged) still counts her two calls before.
    raised = limiter(clock, per_identity=Rate(rate=0.001, burst=3), overall=kept["overall"])
    raised.carry_over(after)
    assert refused(raised, msg, origin(ALICE)) is None
    assert raised.overall is after.overall and raised.identity is not after.identity
    assert after.tools["echo"] is not before.tools["echo"]


def test_a_bucket_refills_to_its_burst_and_no_more() -> None:
    clock = Clock()
    limits = limiter(clock, per_identity=Rate(rate=10.0, burst=2))
    msg = tool_call(1, "echo")
    clock.now += 3600
    served = 0
    while refused(limits, msg, origin(ALICE)) is None:
        served += 1
    assert served == 2


def test_callers_have_buckets_of_their_own() -> None:
    clock = Clock()
    limits = limiter(clock, per_identity=Rate(rate=1.0, burst=1))
    msg = tool_call(1, "echo")
    assert refused(limits, msg, origin(ALICE)) is None
    assert refused(limits, msg, origin(ALICE)) is not None
    assert refused(limits, msg, origin(BOB)) is None
    # Without an identity the caller is the front end and the peer's address, whatever
    # credentials it sends (a new header must not be a new bucket).
    assert refused(limits, msg, origin(peer="127.0.0.2")) is None
    again = Origin("http", "127.0.0.2", {"Authorization": "Bearer other"})
    assert refused(limits, msg, again) is not None
    assert refused(limits, msg, STDIO_ORIGIN) is None
    assert caller_key(origin(ALICE)) == ALICE.key()
    assert caller_key(STDIO_ORIGIN) != caller_key(origin(peer=None))


def test_per_tool_is_per_caller_and_tool_with_overrides() -> None:
    clock = Clock()
    limits = limiter(
        clock,
        per_tool=Rate(rate=1.0, burst=2),
        tools={"add": Rate(rate=1.0, burst=1)},
    )
    for _ in range(2):
        assert refused(limits, tool_call(1, "echo"), origin(ALICE)) is None
    over = refused(limits, tool_call(1, "echo"), origin(ALICE))
    assert over is not None
    assert refused(limits, tool_call(1, "echo"), origin(BOB)) is None
    assert refused(limits, tool_call(1, "add"), origin(ALICE)) is None
    assert refused(limits, tool_call(1, "add"), origin(ALICE)) is not None  # its own burst: 1
    # per_tool counts calls only; other requests pass.
    assert refused(limits, modern(2, "tools/list"), origin(ALICE)) is None


def test_overall_is_shared_by_every_caller() -> None:
    clock = Clock()
    counts: Counter[str] = Counter()
    limits = limiter(clock, counts, overall=Rate(rate=1.0, burst=2))
    assert refused(limits, tool_call(1, "echo"), origin(ALICE)) is None
    assert refused(limits, modern(2, "server/discover"), origin(BOB)) is None
    assert refused(limits, tool_call(3, "echo"), STDIO_ORIGIN) is not None
    assert counts == Counter({"overall": 1})


def test_a_refused_request_takes_no_token_from_the_other_buckets() -> None:
    clock = Clock()
    counts: Counter[str] = Counter()
    limits = limiter(
        clock, counts, per_identity=Rate(rate=1.0, burst=2), per_tool=Rate(rate=1.0, burst=1)
    )
    assert refused(limits, tool_call(1, "echo"), origin(ALICE)) is None
    over = refused(limits, tool_call(2, "echo"), origin(ALICE))
    assert over is not None and counts == Counter({"tool": 1})
    # The caller's own bucket still holds the token the refused call did not take.
    assert refused(limits, tool_call(3, "add"), origin(ALICE)) is None
    assert refused(limits, tool_call(4, "other"), origin(ALICE)) is not None
    assert counts == Counter({"tool": 1, "identity": 1})


def test_the_longest_wait_names_the_limit() -> None:
    clock = Clock()
    counts: Counter[str] = Counter()
    limits = limiter(
        clock, counts, per_identity=Rate(rate=10.0, burst=1), overall=Rate(rate=0.5, burst=1)
    )
    assert refused(limits, tool_call(1, "echo"), origin(ALICE)) is None
    over = refused(limits, tool_call(2, "echo"), origin(ALICE))
    assert over is not None and over.retry_after == pytest.approx(2.0)
    assert counts == Counter({"overall": 1})


def test_listen_streams_are_not_limited() -> None:
    clock = Clock()
    limits = limiter(clock, per_identity=Rate(rate=1.0, burst=1), overall=Rate(rate=1, burst=1))
    listen = modern(1, "subscriptions/listen", notifications={})
    for _ in range(5):
        assert refused(limits, listen, origin(ALICE)) is None
    assert refused(limits, tool_call(2, "echo"), origin(ALICE)) is None


def test_tracked_callers_are_bounded_by_max_keys(caplog: pytest.LogCaptureFixture) -> None:
    """rate_limits.max_keys: past it the least recently used bucket goes (its caller starts
    again full, logged once); buckets idle long enough to be full are forgotten anyway."""
    clock = Clock()
    limits = limiter(clock, per_identity=Rate(rate=0.001, burst=1), max_keys=3)
    assert limits.identity is not None
    msg = tool_call(1, "echo")
    callers = [origin(peer=f"10.0.0.{i}") for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="gateway"):
        for caller in callers:
            assert refused(limits, msg, caller) is None
        assert len(limits.identity) == 3
        # The two oldest were dropped: they are served again; the newest are not.
        assert refused(limits, msg, callers[4]) is not None
        assert refused(limits, msg, callers[0]) is None
    warned = [r for r in caplog.records if "max_keys" in r.getMessage()]
    assert len(warned) == 1
    # An idle bucket that is full again is the same as none: it goes before any other.
    clock.now += 1000.0  # all full again at 0.001 a second, burst 1
    assert refused(limits, msg, origin(peer="10.0.1.1")) is None
    assert len(limits.identity) <= 3


def test_retry_after_is_whole_seconds_rounded_up_at_least_one() -> None:
    assert [retry_after_header(s) for s in (0.001, 0.5, 1.0, 1.001, 59.2)] == [
        "1",
        "1",
        "1",
        "2",
        "60",
    ]


def test_the_wire_error_carries_the_delay_and_maps_to_429() -> None:
    wire = errors.to_wire(RateLimited(1.5, "slow down"), 7)
    assert wire["error"]["code"] == codes.RATE_LIMITED
    assert wire["error"]["data"] == {"retryAfter": 1.5}
    assert errors.http_status(wire) == 429


# --- the dispatcher ---------------------------------------------------------------------------


async def test_the_dispatcher_refuses_past_the_burst_without_asking_the_backend() -> None:
    clock = Clock()
    backend = MemoryBackend()
    counts: Counter[str] = Counter()
    limits = limiter(clock, counts, per_identity=Rate(rate=1.0, burst=2))
    dispatcher = await dispatcher_over(backend, limiter=limits)
    replies = [await dispatcher.handle(tool_call(i, "echo"), ignore, origin(ALICE)) for i in (1, 2)]
    assert all("result" in r for r in replies)
    over = await dispatcher.handle(tool_call(3, "echo"), ignore, origin(ALICE))
    assert over["id"] == 3 and over["error"]["code"] == codes.RATE_LIMITED
    assert over["error"]["data"]["retryAfter"] == pytest.approx(1.0)
    assert len(backend.calls()) == 2
    assert dispatcher.telemetry.stats.rejections["rate_limited"] == 1
    assert counts["identity"] == 1
    # Another caller is served; notifications are never limited.
    assert "result" in await dispatcher.handle(tool_call(4, "echo"), ignore, origin(BOB))
    await dispatcher.notify({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}})
    assert len(backend.notified) == 1
    clock.now += 1.0
    assert "result" in await dispatcher.handle(tool_call(5, "echo"), ignore, origin(ALICE))


async def test_the_stats_counter_is_what_the_gateway_exports() -> None:
    text = yaml.safe_dump(
        {
            "listen": {"stdio": True},
            "backends": {"demo": stdio_backend([PYTHON, "-m", "gateway.demo.server"])},
            "rate_limits": {"overall": {"rate": 1, "burst": 1}},
        }
    )
    gateway = Gateway(parse(text))
    assert gateway.dispatcher.limiter is not None
    with pytest.raises(RateLimited):
        for i in range(2):
            gateway.dispatcher.limiter.admit(tool_call(i, "echo"), STDIO_ORIGIN)
    assert gateway.telemetry.stats.rate_limited == Counter({"overall": 1})
    families = {m.name: m for m in gateway.registry.collect()}
    samples = families["mcp_gateway_rate_limited"].samples
    assert [(s.name, s.labels, s.value) for s in samples] == [
        ("mcp_gateway_rate_limited_total", {"limit": "overall"}, 1.0)
    ]


# --- end to end -------------------------------------------------------------------------------

# Slow enough that no token comes back during a test.
SLOW = {"rate": 0.001, "burst": 2}


@asynccontextmanager
async def http_gateway(**top: Any) -> AsyncIterator[str]:
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    text = yaml.safe_dump({"listen": listen, "backends": {"demo": DEMO}, **top})
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            yield gw.http_url


async def post(
    session: aiohttp.ClientSession, url: str, msg: dict[str, Any]
) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
    with anyio.fail_after(BOUND):
        async with session.post(url, data=orjson.dumps(msg), headers=mirrored_headers(msg)) as resp:
            reply: dict[str, Any] = orjson.loads(await resp.read())
    return resp, reply


@pytest.mark.slow
async def test_http_past_the_burst_gets_429_with_retry_after_and_others_are_served() -> None:
    async with (
        http_gateway(
            rate_limits={"per_identity": SLOW, "per_tool": {"rate": 0.001, "burst": 5}}
        ) as url,
        aiohttp.ClientSession() as first,
        # Another caller: without authentication a caller is its address (127/8 is loopback).
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))) as other,
    ):
        for i in range(2):
            resp, reply = await post(first, url, call(i, "echo", text="hi"))
            assert resp.status == 200 and "result" in reply
        resp, reply = await post(first, url, call(9, "echo", text="hi"))
        assert resp.status == 429
        assert reply["id"] == 9 and reply["error"]["code"] == codes.RATE_LIMITED
        delay = reply["error"]["data"]["retryAfter"]
        assert delay > 0
        assert resp.headers["Retry-After"] == str(max(1, math.ceil(delay)))
        resp, reply = await post(other, url, call(10, "echo", text="still served"))
        assert resp.status == 200 and reply["result"]["content"][0]["text"] == "still served"


async def test_a_reload_of_the_running_gateway_refills_no_bucket() -> None:
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    limits = {"per_identity": SLOW}
    text = yaml.safe_dump({"listen": listen, "backends": {"demo": DEMO}, "rate_limits": limits})
    # The same limits beside a changed backend section: a reload that re-reads `rate_limits`.
    again = yaml.safe_dump(
        {"listen": listen, "backends": {"demo": DEMO, "more": DEMO}, "rate_limits": limits}
    )
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw, aiohttp.ClientSession() as session:
            assert gw.http_url is not None
            await gw.catalogs_loaded.wait()
            for i in range(2):
                resp, _ = await post(session, gw.http_url, call(i, "echo", text="hi"))
                assert resp.status == 200
            done = await gw.reload(lambda: parse(again))
            assert done is not None and done.added == ("more",)
            resp, reply = await post(session, gw.http_url, call(3, "echo", text="hi"))
            assert resp.status == 429 and reply["error"]["code"] == codes.RATE_LIMITED


@pytest.mark.slow
async def test_per_tool_refuses_one_tool_and_serves_the_next() -> None:
    async with (
        http_gateway(rate_limits={"per_tool": {"rate": 0.001, "burst": 1}}) as url,
        aiohttp.ClientSession() as session,
    ):
        resp, _ = await post(session, url, call(1, "echo", text="a"))
        assert resp.status == 200
        resp, reply = await post(session, url, call(2, "echo", text="b"))
        assert resp.status == 429 and reply["error"]["code"] == codes.RATE_LIMITED
        resp, reply = await post(session, url, call(3, "add", a=1, b=2))
        assert resp.status == 200 and "result" in reply


@pytest.mark.slow
async def test_a_legacy_session_is_limited_as_its_caller() -> None:
    """A legacy client's requests go through the same engine (frontends/legacy/front.py ->
    serve): its `initialize` (the discovery it asks for) and its calls take tokens, and past the
    burst a request in its session gets 429 with Retry-After too."""
    accept = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    opening = {
        "jsonrpc": "2.0",
        "id": "open",
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "legacy", "version": "1"},
        },
    }
    async with (
        http_gateway(rate_limits={"per_identity": SLOW}) as url,
        aiohttp.ClientSession() as session,
    ):
        with anyio.fail_after(BOUND):
            async with session.post(url, data=orjson.dumps(opening), headers=accept) as resp:
                assert resp.status == 200
                headers = {
                    **accept,
                    "Mcp-Session-Id": resp.headers["Mcp-Session-Id"],
                    "MCP-Protocol-Version": "2025-11-25",
                }
            replies = []
            for rid in ("l1", "l2"):
                msg = {
                    "jsonrpc": "2.0",
                    "id": rid,
                    "method": "tools/call",
                    "params": {"name": "echo", "arguments": {"text": rid}},
                }
                async with session.post(url, data=orjson.dumps(msg), headers=headers) as resp:
                    replies.append(
                        (resp.status, resp.headers.get("Retry-After"), await resp.json())
                    )
    (ok, _, first), (status, retry_after, second) = replies
    assert ok == 200 and "result" in first
    assert status == 429 and second["error"]["code"] == codes.RATE_LIMITED
    assert retry_after == str(max(1, math.ceil(second["error"]["data"]["retryAfter"])))


@pytest.mark.slow
def test_stdio_past_the_burst_gets_the_error_with_its_delay(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"stdio": True},
                "backends": {"demo": DEMO},
                "rate_limits": {"per_identity": SLOW},
            }
        )
    )
    proc = Proc(gateway_command(config), stdin=True)
    try:
        stdin = proc.popen.stdin
        assert stdin is not None
        replies = {}
        for i in ("a", "b", "c"):
            stdin.write(orjson.dumps(call(i, "echo", text=i)) + b"\n")
            stdin.flush()
            line = proc.wait_for(f'"id":"{i}"', stream="stdout", timeout=START_BOUND).string
            replies[i] = orjson.loads(line)
    finally:
        proc.stop()
    assert "result" in replies["a"] and "result" in replies["b"]
    error = replies["c"]["error"]
    assert error["code"] == codes.RATE_LIMITED and error["data"]["retryAfter"] > 0
