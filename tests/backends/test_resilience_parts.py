"""The parts of a backend's resilience that need no I/O: the circuit breaker's state machine on a
clock of the test's, the retry policy (what is safe to send again, after which failures, how
long to wait), and the layer itself over an in-memory backend that fails on demand.

Safety follows the spec's tool annotations (2026-07-28 schema, ToolAnnotations: readOnlyHint,
idempotentHint) and the reads of server/tools, server/resources, server/prompts and
server/utilities/completion; cancellation on a timeout is basic/utilities/cancellation's."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anyio
import pytest

from gateway.backends.base import GATEWAY_CALL, Call, NotificationSink
from gateway.backends.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, State
from gateway.backends.resilience import (
    BreakerOpen,
    Resilient,
    backoff,
    counts,
    retryable,
    safe,
    safe_tool,
)
from gateway.config import BackendConfig, ConfigInvalid, StdioTarget, parse
from gateway.config.model import BreakerSettings, RetrySettings
from gateway.errors import (
    BackendConnectionLost,
    BackendDown,
    BackendError,
    BackendLoginNeeded,
    BackendOverloaded,
    BackendProtocolError,
    BackendTimeout,
    BackendUnavailable,
)
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from tests.support import BOUND, call, request

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, failures: int = 3, window: float = 10, cooldown: float = 5) -> Breaker:
    return Breaker(BreakerSettings(failures=failures, window=window, cooldown=cooldown), clock)


def state_of(b: Breaker) -> State:
    """(Read afresh: mypy keeps an attribute narrowed across the awaits that change it.)"""
    return b.state


# --- the breaker ---------------------------------------------------------------------------------


def test_the_breaker_opens_after_enough_failures_within_its_window() -> None:
    clock = Clock()
    b = breaker(clock)
    seen: list[State] = []
    b.on_change = seen.append
    for _ in range(2):
        assert b.admit()
        b.done(False)
    clock.now += 11  # the two fall out of the window
    for _ in range(2):
        assert b.admit()
        b.done(False)
    assert state_of(b) == CLOSED and seen == []
    assert b.admit()
    b.done(False)
    assert state_of(b) == OPEN and b.opens == 1 and seen == [OPEN]
    assert not b.admit()
    assert b.retry_in() == pytest.approx(5)


def test_successes_and_answers_that_say_nothing_do_not_open_it() -> None:
    clock = Clock()
    b = breaker(clock, failures=2)
    for outcome in (True, None, True, None):
        assert b.admit()
        b.done(outcome)
    assert state_of(b) == CLOSED and b.opens == 0


def test_after_the_cooldown_one_probe_goes_and_its_success_closes_it() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.admit()
    b.done(False)
    clock.now += 4.9
    assert not b.admit()
    clock.now += 0.2
    assert b.admit() and state_of(b) == HALF_OPEN and b.probing
    assert not b.admit()  # the others wait for the probe
    b.done(True, probe=True)
    assert state_of(b) == CLOSED and b.admit()


def test_a_failed_probe_opens_it_again_for_another_cooldown() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.admit()
    b.done(False)
    clock.now += 5
    assert b.admit()
    b.done(False, probe=True)
    assert state_of(b) == OPEN and b.opens == 2
    clock.now += 4
    assert not b.admit()
    clock.now += 1
    assert b.admit() and state_of(b) == HALF_OPEN


def test_a_probe_that_ends_neither_way_lets_the_next_request_probe() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    b.admit()
    b.done(False)
    clock.now += 5
    assert b.admit()
    b.done(None, probe=True)  # (cancelled by its client)
    assert state_of(b) == HALF_OPEN and b.admit()


def test_a_late_failure_of_a_request_sent_before_it_opened_is_not_counted_again() -> None:
    clock = Clock()
    b = breaker(clock, failures=1)
    assert b.admit() and b.admit()
    b.done(False)
    b.done(False)
    assert b.opens == 1


# --- the retry policy ----------------------------------------------------------------------------


PEEK = {"name": "peek", "annotations": {"readOnlyHint": True, "idempotentHint": True}}


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        (PEEK, True),
        ({"name": "w", "annotations": {"readOnlyHint": True}}, False),
        ({"name": "w", "annotations": {"idempotentHint": True}}, False),
        ({"name": "w", "annotations": {"readOnlyHint": "true", "idempotentHint": True}}, False),
        ({"name": "w"}, False),
        ({"name": "w", "annotations": []}, False),
    ],
)
def test_a_tool_is_safe_only_when_both_hints_are_true(tool: dict[str, Any], expected: bool) -> None:
    assert safe_tool(tool) is expected


@pytest.mark.parametrize(
    "method",
    ["tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"],
)
def test_lists_and_reads_are_safe(method: str) -> None:
    assert safe(request(1, method), lambda _: False)


@pytest.mark.parametrize(
    "method", ["resources/subscribe", "logging/setLevel", "initialize", "tasks/cancel"]
)
def test_other_requests_are_not(method: str) -> None:
    assert not safe(request(1, method), lambda _: True)


def test_a_call_is_safe_only_for_a_tool_known_safe() -> None:
    assert safe(call(1, "peek"), {"peek"}.__contains__)
    assert not safe(call(1, "write"), {"peek"}.__contains__)


@pytest.mark.parametrize(
    ("exc", "again", "counted"),
    [
        (BackendUnavailable("b", "HTTP 503"), True, False),
        (BackendConnectionLost("b", "reset"), True, False),
        (BackendTimeout("b", "slow"), False, False),
        (BackendProtocolError("b", "not JSON"), False, False),
        (BackendDown("b", "down"), False, None),
        (BackendLoginNeeded("b", "login"), False, None),
        (BackendOverloaded("b", "busy"), False, None),
    ],
)
def test_which_failures_are_retried_and_which_count_against_the_breaker(
    exc: BackendError, again: bool, counted: bool | None
) -> None:
    assert retryable(exc) is again
    assert counts(exc) is counted


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    settings = RetrySettings(attempts=9, backoff=0.1, max_backoff=0.5)
    middle = [backoff(n, settings, lambda: 0.5) for n in range(1, 6)]
    assert middle == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])
    assert backoff(1, settings, lambda: 0.0) == pytest.approx(0.08)
    assert backoff(1, settings, lambda: 1.0) == pytest.approx(0.12)
    assert backoff(5, settings, lambda: 1.0) == pytest.approx(0.5)  # never past the cap


# --- the layer over an in-memory backend ---------------------------------------------------------


class Flaky:
    """Answers discovery, a tools/list naming `peek` (safe) and `write`, and anything else with
    an empty result; raises the errors queued in `failures` first, one per request."""

    name = "flaky"
    transport = "memory"

    def __init__(self) -> None:
        self.failures: list[BackendError] = []
        self.asked: list[str] = []
        self.deadlines: list[float | None] = []

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        await anyio.sleep_forever()

    async def notify(self, msg: Message) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        method = msg["method"]
        self.asked.append(method if method != "tools/call" else msg["params"]["name"])
        self.deadlines.append(call.deadline)
        if self.failures:
            raise self.failures.pop(0)
        result: dict[str, Any] = {}
        if method == "tools/list":
            result = {"tools": [PEEK, {"name": "write"}]}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


CONFIG = BackendConfig(
    name="flaky",
    target=StdioTarget(command="x"),
    request_timeout=5.0,
    retries=RetrySettings(attempts=3, backoff=0.001, max_backoff=0.002),
)


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    yield Flaky()


async def _ignore(_: Message) -> None:
    return None


def _503() -> BackendUnavailable:
    return BackendUnavailable("flaky", "HTTP 503 without a JSON-RPC reply")


async def test_a_list_is_tried_again_after_the_backend_did_not_answer(flaky: Flaky) -> None:
    layer = Resilient(flaky, CONFIG)
    flaky.failures = [_503(), BackendConnectionLost("flaky", "reset")]
    with anyio.fail_after(BOUND):
        reply = await layer.request(request(1, "tools/list"), _ignore, GATEWAY_CALL)
    assert reply["id"] == 1 and flaky.asked == ["tools/list"] * 3
    # The retries are timed by what is left of the request's time, not a fresh request_timeout.
    assert flaky.deadlines[0] is None
    assert all(d is not None and 4.5 < d < 5.0 for d in flaky.deadlines[1:])


async def test_no_more_tries_than_configured(flaky: Flaky) -> None:
    layer = Resilient(flaky, CONFIG)
    flaky.failures = [_503(), _503(), _503()]
    with pytest.raises(BackendUnavailable), anyio.fail_after(BOUND):
        await layer.request(request(1, "tools/list"), _ignore, GATEWAY_CALL)
    assert len(flaky.asked) == 3


async def test_a_call_is_tried_again_only_once_its_tool_is_known_safe(flaky: Flaky) -> None:
    layer = Resilient(flaky, CONFIG)
    flaky.failures = [_503()]
    with pytest.raises(BackendUnavailable), anyio.fail_after(BOUND):
        await layer.request(
            call(1, "peek"), _ignore, GATEWAY_CALL
        )  # (its annotations are not known yet)
    await layer.request(request(2, "tools/list"), _ignore, GATEWAY_CALL)
    flaky.asked.clear()
    flaky.failures = [_503()]
    with anyio.fail_after(BOUND):
        await layer.request(call(3, "peek"), _ignore, GATEWAY_CALL)
    assert flaky.asked == ["peek", "peek"]
    flaky.asked.clear()
    flaky.failures = [_503()]
    with pytest.raises(BackendUnavailable):
        await layer.request(call(4, "write"), _ignore, GATEWAY_CALL)
    assert flaky.asked == ["write"]


async def test_a_timeout_or_a_reply_that_is_not_mcp_is_not_tried_again(flaky: Flaky) -> None:
    layer = Resilient(flaky, CONFIG)
    for failure in (BackendTimeout("flaky", "slow"), BackendProtocolError("flaky", "junk")):
        flaky.asked.clear()
        flaky.failures = [failure]
        with pytest.raises(type(failure)):
            await layer.request(request(1, "tools/list"), _ignore, GATEWAY_CALL)
        assert flaky.asked == ["tools/list"]


async def test_no_retry_past_the_requests_own_time(flaky: Flaky) -> None:
    short = replace(
        CONFIG, request_timeout=0.05, retries=RetrySettings(attempts=3, backoff=1, max_backoff=1)
    )
    layer = Resilient(flaky, short)
    flaky.failures = [_503()]
    with pytest.raises(BackendUnavailable), anyio.fail_after(BOUND):
        await layer.request(request(1, "tools/list"), _ignore, GATEWAY_CALL)
    assert flaky.asked == ["tools/list"]


async def test_an_open_breaker_fails_at_once_without_reaching_the_backend(flaky: Flaky) -> None:
    clock = Clock()
    b = breaker(clock, failures=2)
    layer = Resilient(flaky, replace(CONFIG, retries=RetrySettings(attempts=1)), b)
    flaky.failures = [_503(), BackendTimeout("flaky", "slow")]
    for rid in (1, 2):
        with pytest.raises(BackendError):
            await layer.request(call(rid, "write"), _ignore, GATEWAY_CALL)
    assert state_of(b) == OPEN
    with pytest.raises(BreakerOpen) as refused:
        await layer.request(call(3, "write"), _ignore, GATEWAY_CALL)
    assert refused.value.code == codes.BACKEND_UNAVAILABLE and "flaky" in str(refused.value)
    assert flaky.asked == ["write", "write"]
    clock.now += 5
    reply = await layer.request(call(4, "write"), _ignore, GATEWAY_CALL)  # the probe
    assert "result" in reply and state_of(b) == CLOSED


async def test_retries_stop_when_the_breaker_opens(flaky: Flaky) -> None:
    b = breaker(Clock(), failures=2)
    layer = Resilient(flaky, CONFIG, b)
    flaky.failures = [_503(), _503(), _503()]
    with pytest.raises(BreakerOpen), anyio.fail_after(BOUND):
        await layer.request(request(1, "tools/list"), _ignore, GATEWAY_CALL)
    assert flaky.asked == ["tools/list"] * 2


# --- the config ----------------------------------------------------------------------------------


def _backend(extra: str) -> str:
    return f"listen: {{stdio: true}}\nbackends:\n  b:\n    stdio: {{command: x}}\n    {extra}\n"


def test_the_keys_are_read_with_their_defaults() -> None:
    (plain,) = parse(_backend("era: modern")).backends
    assert plain.tool_timeouts == {} and plain.breaker is None
    assert plain.retries == RetrySettings(attempts=3, backoff=0.1, max_backoff=2.0)
    text = _backend("tools: {allow: [build], build: {timeout: 900}}\n    breaker: true")
    (b,) = parse(text).backends
    assert b.tool_timeouts == {"build": 900.0} and b.allow_tools == ("build",)
    assert b.breaker == BreakerSettings(failures=5, window=30.0, cooldown=10.0)


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("tools: {build: 900}", "backends.b.tools.build"),
        ("tools: {build: {timeout: 0}}", "backends.b.tools.build.timeout"),
        ("tools: {build: {timout: 9}}", "backends.b.tools.build.timout"),
        ("retries: {attempts: 0}", "backends.b.retries.attempts"),
        ("retries: {backoff: -1}", "backends.b.retries.backoff"),
        ("breaker: sometimes", "backends.b.breaker"),
        ("breaker: {failures: 0}", "backends.b.breaker.failures"),
        ("breaker: {cooldown: soon}", "backends.b.breaker.cooldown"),
    ],
)
def test_a_wrong_value_is_refused_naming_its_key(extra: str, where: str) -> None:
    with pytest.raises(ConfigInvalid) as refused:
        parse(_backend(extra))
    assert f"<config>:5: {where}:" in str(refused.value)
