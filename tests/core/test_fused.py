"""The fused top of a backend's stack (core/fused.py) against the separate layers it fuses
(overload bound, CLIENT observation, resilience, health guard; app/wiring.py `build_stack`):
each scenario runs through both, assembled alike over an in-memory backend, and both must end
exactly the same way: the same reply or error code, the same requests reaching the backend, the
same observations, the same health and the bound's slots given back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
import yaml

from gateway import errors
from gateway.backends.base import GATEWAY_CALL, Backend
from gateway.backends.health import Guarded, Health
from gateway.backends.resilience import Resilient, needed
from gateway.config import Overload, parse
from gateway.core.fused import FusedBackend
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BACKEND, Bound, BoundedBackend
from gateway.origin import Origin
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import NO_OBSERVATION, Observation, Stats, error_type
from tests.support.memory_backend import FakeBackend, Handler, ignore, modern, tool_call

pytestmark = pytest.mark.anyio

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


@dataclass
class _Observed:
    method: str
    ended: list[str]

    def annotate(self, *, target: str | None = None, backend: str | None = None) -> None:
        return None

    def carrier(self) -> dict[str, str]:
        return dict(TRACE)

    def end(self, reply: Message | None) -> None:
        self.ended.append(f"{self.method} {error_type(reply) or 'ok'}")

    def cancel(self) -> None:
        self.ended.append(f"{self.method} cancelled")

    def route(self, msg: Message, backend: str) -> Observation | None:
        return None


@dataclass
class Recording:
    """The telemetry API, recording how each CLIENT observation ended (a traced one: it has a
    trace context to carry)."""

    stats: Stats = field(default_factory=Stats)
    tapping: bool = False
    ended: list[str] = field(default_factory=list)

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def server(self, msg: Message, origin: Origin) -> Observation:
        return NO_OBSERVATION

    def client(
        self,
        msg: Message,
        backend: str,
        transport: str,
        address: tuple[str, int] | None,
        serving: Observation,
    ) -> Observation:
        return _Observed(msg["method"], self.ended)


class Unreachable(FakeBackend):
    """A backend whose transport says whether it is up (an HTTP one after a refused connect)."""

    reachable = True

    @property
    def up(self) -> bool:
        return self.reachable


@dataclass
class Parts:
    top: Backend
    backend: Unreachable
    health: Health
    bound: Bound
    telemetry: Recording
    refused: Counter[tuple[str, str]]


def assemble(
    fused: bool, handler: Handler, *, attempts: int = 3, limit: int = 1, supervised: bool = False
) -> Parts:
    """One backend's top as build_stack makes it: fused, or the separate chain alone."""
    retries = {"attempts": attempts, "backoff": 0.001, "max_backoff": 0.001}
    backend_config = {"stdio": {"command": "x"}, "retries": retries, "max_in_flight": limit}
    text = yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": backend_config}})
    (config,) = parse(text).backends
    backend = Unreachable(handler, name="b")
    health = Health("b")
    guarded = Guarded(backend, health, supervised=supervised)
    resilient = Resilient(guarded, config) if needed(config) else None
    telemetry = Recording()
    instrumented = InstrumentedBackend(resilient if resilient is not None else guarded, telemetry)
    refused: Counter[tuple[str, str]] = Counter()
    bound = Bound(BACKEND, "b", limit, Overload(max_queued=0), refused)
    top: Backend = BoundedBackend(instrumented, bound)
    if fused:
        top = FusedBackend(top, bound, instrumented, resilient, guarded)
    return Parts(top, backend, health, bound, telemetry, refused)


Scenario = Callable[[Parts], Awaitable[object]]


async def both(scenario: Scenario, handler: Handler, **options: Any) -> Any:
    """The scenario's outcome through the separate layers and through the fused top: equal."""
    separate = await scenario(assemble(False, handler, **options))
    fused = await scenario(assemble(True, handler, **options))
    assert fused == separate
    return fused


async def answer(msg: Message, sink: Any) -> Message | None:
    return None


async def outcome(parts: Parts, msg: Message) -> Any:
    """The reply's result or the error's class and code, then what the backend was asked, the
    observations, the health and the bound's slots in use."""
    try:
        reply = await parts.top.request(msg, ignore, GATEWAY_CALL)
        ended: object = reply.get("result", reply.get("error"))
    except errors.GatewayError as exc:
        ended = (type(exc).__name__, exc.code)
    asked = [
        (m["method"], m["params"].get("_meta", {}).get("traceparent")) for m in parts.backend.asked
    ]
    return ended, asked, parts.telemetry.ended, parts.health.down, parts.bound.busy


async def test_a_reply_passes_with_its_trace_context_and_is_observed() -> None:
    async def scenario(parts: Parts) -> object:
        return await outcome(parts, tool_call(1, "echo", x=1))

    assert await both(scenario, answer) == (
        {"content": [{"type": "text", "text": "{'x': 1}"}]},
        [("tools/call", TRACE["traceparent"])],
        ["tools/call ok"],
        False,
        0,
    )


async def test_over_max_in_flight_is_refused_before_anything_below() -> None:
    """`backends.NAME.max_in_flight` 1, no queue: the second request is refused with -31004,
    unobserved and unseen by the backend; the first then completes and frees its slot."""

    async def scenario(parts: Parts) -> object:
        release, holding = anyio.Event(), anyio.Event()

        async def held(msg: Message, sink: Any) -> Message | None:
            if msg["params"].get("name") == "hold":
                holding.set()
                await release.wait()
            return {"jsonrpc": "2.0", "id": msg["id"], "result": {}}

        parts.backend.handler = held
        first: list[object] = []
        async with anyio.create_task_group() as tg:

            async def hold() -> None:
                first.append(await outcome(parts, tool_call(1, "hold")))

            tg.start_soon(hold)
            with anyio.fail_after(5):
                await holding.wait()
            second = await outcome(parts, tool_call(2, "echo"))
            busy_while_held = parts.bound.busy
            release.set()
        return second, busy_while_held, first, dict(parts.refused)

    second, busy, first, refused = await both(scenario, answer)
    assert second[0] == ("BackendOverloaded", codes.GATEWAY_OVERLOADED)
    assert busy == 1 and refused == {(BACKEND, "b"): 1}
    assert first == [({}, [("tools/call", TRACE["traceparent"])], ["tools/call ok"], False, 0)]


async def test_a_backend_known_down_fails_at_once_unasked_and_observed() -> None:
    async def scenario(parts: Parts) -> object:
        parts.health.failed("connection refused")
        return await outcome(parts, tool_call(1, "echo"))

    ended, asked, observed, down, busy = await both(scenario, answer)
    assert ended == ("BackendDown", codes.BACKEND_UNAVAILABLE)
    assert asked == [] and observed == ["tools/call no_reply"] and down and busy == 0


async def unavailable(msg: Message, sink: Any) -> Message | None:
    raise errors.BackendUnavailable("b", "connection refused")


@pytest.mark.parametrize("attempts", [1, 3])
async def test_an_unreachable_backend_is_marked_down_and_refused(attempts: int) -> None:
    """An unsupervised transport that says it is not up: down from this request on, which
    fails with the guard's refusal (not retried: a backend known down is health's to retry)."""

    async def scenario(parts: Parts) -> object:
        parts.backend.reachable = False
        return await outcome(parts, modern(1, "tools/list"))

    assert await both(scenario, unavailable, attempts=attempts) == (
        ("BackendDown", codes.BACKEND_UNAVAILABLE),
        [("tools/list", TRACE["traceparent"])],
        ["tools/list no_reply"],
        True,
        0,
    )


async def test_a_supervised_backend_is_left_to_its_supervisor() -> None:
    async def scenario(parts: Parts) -> object:
        parts.backend.reachable = False
        return await outcome(parts, tool_call(1, "echo"))

    ended, _, _, down, _ = await both(scenario, unavailable, supervised=True)
    assert ended == ("BackendUnavailable", codes.BACKEND_UNAVAILABLE) and not down


def lost_once() -> Handler:
    """The first request's connection breaks; the backend answers the ones after it."""
    lost: list[bool] = []

    async def handler(msg: Message, sink: Any) -> Message | None:
        if not lost:
            lost.append(True)
            raise errors.BackendConnectionLost("b", "connection reset")
        return None

    return handler


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        # A read goes again after the lost connection, within the one observation.
        (modern(1, "tools/list"), (["tools"], 2, ["tools/list ok"])),
        # A call of a tool not known to be safe is never sent twice.
        (
            tool_call(1, "echo"),
            (("BackendConnectionLost", codes.BACKEND_CONNECTION_LOST), 1, ["tools/call no_reply"]),
        ),
    ],
)
async def test_a_safe_request_is_retried_after_a_lost_connection(
    msg: Message, expected: tuple[object, int, list[str]]
) -> None:
    async def scenario(parts: Parts) -> object:
        parts.backend.handler = lost_once()
        ended, asked, observed, down, busy = await outcome(parts, dict(msg))
        if isinstance(ended, dict):
            ended = list(ended)  # (the result's members)
        return ended, len(asked), observed, down, busy

    assert await both(scenario, answer) == (*expected, False, 0)


async def test_a_cancelled_request_is_observed_as_cancelled_and_frees_its_slot() -> None:
    async def forever(msg: Message, sink: Any) -> Message | None:
        await anyio.sleep_forever()
        return None

    async def scenario(parts: Parts) -> object:
        with anyio.move_on_after(0):
            await parts.top.request(tool_call(1, "echo"), ignore, GATEWAY_CALL)
        return parts.telemetry.ended, parts.bound.busy, parts.health.down

    assert await both(scenario, forever) == (["tools/call cancelled"], 0, False)


async def test_a_listen_stream_takes_no_slot_and_is_observed() -> None:
    """`long_lived` (a listen stream) passes the chain as it is: no bound, one observation."""

    async def scenario(parts: Parts) -> object:
        reply = await parts.top.request(
            modern(1, "subscriptions/listen"), ignore, GATEWAY_CALL, long_lived=True
        )
        return reply["result"], parts.telemetry.ended, parts.bound.busy, dict(parts.refused)

    assert await both(scenario, answer, limit=1) == ({}, ["subscriptions/listen ok"], 0, {})
