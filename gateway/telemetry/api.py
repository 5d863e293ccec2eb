"""What the rest of the gateway sees of telemetry: plain counters and per-request observations.

The hot path only bumps integers in `Stats` and opens an `Observation` per request; exporters
(Prometheus, OpenTelemetry) live in the sibling modules and are wired by `gateway/app/`. The no-op
implementation here costs next to nothing, so tests and telemetry-less runs pay nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.origin import HeaderFields, Origin

Message = dict[str, Any]
Sink = Callable[[Message], Awaitable[None]]


@dataclass
class Stats:
    """Counters the hot path bumps; exporters read them when scraped."""

    rejections: Counter[str] = field(default_factory=Counter)
    bytes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (hop, direction)
    in_flight: Counter[str] = field(default_factory=Counter)  # by frontend
    # Requests the HTTP front end refused for their credentials, by reason (missing_token,
    # expired, wrong_audience, ...; `unavailable`: the authorization server did not answer).
    auth_failures: Counter[str] = field(default_factory=Counter)
    policy_denials: Counter[str] = field(default_factory=Counter)  # by reason
    rate_limited: Counter[str] = field(default_factory=Counter)  # by limit
    # cluster.redis: whether the last rate-limit check reached Redis (None: not configured),
    # and the checks this replica's own buckets decided because it did not.
    redis_up: bool | None = None
    rate_limit_fallbacks: int = 0
    # cluster.redis: whether this replica is subscribed to the others' messages (None: no
    # bus), and the messages by (topic, outcome: sent, unsent, received, malformed).
    redis_pubsub_up: bool | None = None
    cluster_messages: Counter[tuple[str, str]] = field(default_factory=Counter)
    # cluster.redis: whether the last read or write of a legacy session record reached Redis
    # (None: not shared, or not tried yet).
    sessions_redis_up: bool | None = None
    # Requests refused past a bound on requests in flight, by (scope: overall or backend, the
    # backend's name or "" overall).
    overloaded: Counter[tuple[str, str]] = field(default_factory=Counter)
    # The gateway's token requests to its backends' authorization servers, by (backend, grant,
    # outcome: ok, refused, unreachable).
    backend_tokens: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # Config reloads (app/ `Gateway.reload`), by outcome (applied, refused), and the backends
    # they touched, by change (added, removed, changed).
    reloads: Counter[str] = field(default_factory=Counter)
    reloaded_backends: Counter[str] = field(default_factory=Counter)
    # pins: definitions that differ from their pins, by (backend, outcome: blocked, warned,
    # allowed), and approvals taken up (approved); each definition once.
    pin_changes: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Hook runs (gateway/hooks/runner.py), by (hook: its `use`, outcome: pass, changed,
    # refused, timeout, error); empty without hooks.
    hook_outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)


class Observation(Protocol):
    """One request being handled (SERVER) or sent to a backend (CLIENT), from its start until
    `end`. Explicit begin/end rather than a context manager: it runs on every request."""

    def annotate(self, *, target: str | None = None, backend: str | None = None) -> None: ...

    def carrier(self) -> dict[str, str]:
        """Trace context to propagate with an outgoing request (`traceparent`, `tracestate`)."""
        ...

    def end(self, reply: Message | None) -> None:
        """Record the outcome, once, in the task that began it; None: no reply (the request
        failed)."""
        ...

    def cancel(self) -> None:
        """Record, instead of `end`, that the request was cancelled: its client went away (a
        closed stream, an ended legacy session) or the gateway stopped waiting. An outcome of
        its own (CANCELLED), not the backend's error."""
        ...

    def route(self, msg: Message, backend: str) -> Observation | None:
        """A client request's (SERVER) observation: the CLIENT observation of the backend
        request `msg` it was routed to, which it keeps and records at its own end (one
        observation a routed request: bench/README, issue 34); None where that request needs
        one of its own from `Telemetry.client` (a fan-out's, the gateway's own)."""
        ...


class Telemetry(Protocol):
    stats: Stats
    # Whether `record` writes anything: callers skip wrapping their sinks when it does not.
    tapping: bool

    def record(
        self,
        hop: str,
        direction: str,
        msg: Message,
        backend: str | None = None,
        headers: HeaderFields | None = None,
    ) -> None:
        """The traffic tap: one JSON-RPC message on one hop (a no-op unless configured)."""

    def server(self, msg: Message, origin: Origin) -> Observation:
        """Begin observing a client request."""
        ...

    def client(
        self,
        msg: Message,
        backend: str,
        transport: str,
        address: tuple[str, int] | None,
        serving: Observation,
    ) -> Observation:
        """Begin observing a request to a backend made while `serving` a client request
        (NO_OBSERVATION: the gateway's own), whose span is its parent."""
        ...


class _NoObservation:
    def annotate(self, *, target: str | None = None, backend: str | None = None) -> None:
        return None

    def carrier(self) -> dict[str, str]:
        return {}

    def end(self, reply: Message | None) -> None:
        return None

    def cancel(self) -> None:
        return None

    def route(self, msg: Message, backend: str) -> Observation | None:
        return None


NO_OBSERVATION: Observation = _NoObservation()


class NoTelemetry:
    def __init__(self) -> None:
        self.stats = Stats()
        self.tapping = False

    def record(
        self,
        hop: str,
        direction: str,
        msg: Message,
        backend: str | None = None,
        headers: HeaderFields | None = None,
    ) -> None:
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
        return NO_OBSERVATION


# How a request ended that was cancelled, and one that got no reply (a backend failed).
CANCELLED = "cancelled"
NO_REPLY = "no_reply"
# Requests that last as long as their client wants (a listen stream, which a legacy session's
# GET stream is fed by): their durations say nothing of how fast anything answers, so they are
# kept out of the duration histograms and the status page's latencies.
LONG_LIVED = frozenset({"subscriptions/listen"})


def error_type(reply: Message | None) -> str:
    """A bounded description of how a request ended: "" when it succeeded."""
    if reply is None:
        return NO_REPLY
    error = reply.get("error")
    if isinstance(error, dict):
        return str(error.get("code", "error"))
    result = reply.get("result")
    if isinstance(result, dict) and result.get("isError") is True:
        return "tool_error"
    return ""


def tapped(telemetry: Telemetry, sink: Sink, hop: str, direction: str, backend: str | None) -> Sink:
    """`sink`, with each notification also handed to the traffic tap."""

    async def record_then_send(note: Message) -> None:
        telemetry.record(hop, direction, note, backend=backend)
        await sink(note)

    return record_then_send
