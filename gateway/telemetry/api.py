"""What the rest of the gateway sees of telemetry: plain counters and per-request observations.

The hot path only bumps integers in `Stats` and opens an `Observation` per request; exporters
(Prometheus, OpenTelemetry) live in the sibling modules and are wired by `gateway/app/`. The no-op
implementation here costs next to nothing, so tests and telemetry-less runs pay nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.caller_auth.identity import Identity

Message = dict[str, Any]
Sink = Callable[[Message], Awaitable[None]]
TRACE_HEADERS = ("traceparent", "tracestate")
# Header fields as received: a mapping, or (name, value) pairs in arrival order with repeats.
HeaderFields = Mapping[str, str] | Iterable[tuple[str, str]]


class ClientSession(Protocol):
    """A legacy client's session as the backends that keep state per client see it: a random
    key (not the session's id, which is a credential) and the event of its end."""

    key: str
    ended: asyncio.Event


class LegacyClient:
    """A legacy (initialize-based) client session, as the backends see it: who to keep a
    backend session for, and when it ends. A backend that speaks both eras serves a legacy
    client's requests in the legacy era, on a session of its own (backends/era/dual.py), so that
    the server's requests during a call reach that client."""

    __slots__ = ("_closers", "closed")

    def __init__(self) -> None:
        self._closers: list[Callable[[], None]] = []
        self.closed = False

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run `closer` when the session ends (at once if it has)."""
        if self.closed:
            closer()
        else:
            self._closers.append(closer)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        closers, self._closers = self._closers, []
        for closer in closers:
            closer()


class Origin:
    """Where a client request came from. A plain class: one is made per request."""

    __slots__ = ("frontend", "headers", "identity", "legacy", "peer", "session")

    def __init__(
        self,
        frontend: str,
        peer: str | None = None,
        headers: HeaderFields | None = None,
        session: ClientSession | None = None,
        legacy: LegacyClient | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.frontend = frontend  # "http" | "stdio" | "gateway" (its own requests)
        self.peer = peer
        # All request headers (HTTP), for the traffic tap (which redacts them) and trace context.
        self.headers = headers
        # The legacy session the request belongs to, for backends that keep a child per
        # client (None: a modern, stateless request).
        self.session = session
        # The same session as a backend speaking both eras sees it (frontends/legacy/front.py
        # marks the requests it forwards); None: a modern client, or the gateway's own request.
        self.legacy = legacy
        # Who is calling, when the front end established it (auth on HTTP, a configured
        # identity on stdio); None: no authentication configured.
        self.identity = identity

    def within(self, session: ClientSession) -> Origin:
        """The same origin, as a request of a legacy client's session."""
        return Origin(self.frontend, self.peer, self.headers, session, self.legacy, self.identity)

    def for_legacy(self, client: LegacyClient) -> Origin:
        """The same origin, marked as a request of the legacy session `client`."""
        return Origin(self.frontend, self.peer, self.headers, self.session, client, self.identity)

    def caller(self) -> str:
        """Who is asking, for binding state to them: the front end and the caller's identity
        when one was established, else a digest of the request's credentials (stdio has one
        caller, its parent process)."""
        if self.identity is not None:
            return f"{self.frontend}:{self.identity.key()}"
        return f"{self.frontend}:{credentials_digest(self.authorization())}"

    def authorization(self) -> str | None:
        """The request's Authorization header (HTTP), if it had one."""
        if self.headers is None:
            return None
        fields = self.headers.items() if isinstance(self.headers, Mapping) else self.headers
        for name, value in fields:
            if name.lower() == "authorization":
                return value
        return None

    def trace_headers(self) -> dict[str, str]:
        """W3C trace context from transport headers, used when `_meta` carries none. A mapping
        is looked up, not scanned: the HTTP front end's (aiohttp's) ignores case."""
        if self.headers is None:
            return {}
        if isinstance(self.headers, Mapping):
            return {k: v for k in TRACE_HEADERS if (v := self.headers.get(k)) is not None}
        fields = self.headers
        out: dict[str, str] = {}
        for name, value in fields:
            key = name.lower()
            if key in TRACE_HEADERS:
                out.setdefault(key, value)
        return out


def credentials_digest(authorization: str | None) -> str:
    """Whose a piece of state is: a digest of the credentials (none is an owner too), so the
    credentials themselves are never kept."""
    return hashlib.sha256((authorization or "").encode("utf-8", "surrogateescape")).hexdigest()


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
        self, msg: Message, backend: str, transport: str, address: tuple[str, int] | None
    ) -> Observation:
        """Begin observing a request to a backend."""
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


NO_OBSERVATION: Observation = _NoObservation()
STDIO_ORIGIN = Origin("stdio")
# The gateway's own requests (catalog loads), whichever client's request made them necessary.
GATEWAY_ORIGIN = Origin("gateway")
# The client request the current task is handling: its observation (for annotating where it
# went, and for labelling the backend requests made for it) and its origin (for the few backends
# that bind state to the caller, such as a legacy backend's held call). Set by the dispatcher;
# one variable, since setting one costs as much as its contents.
SERVING: ContextVar[tuple[Observation, Origin]] = ContextVar(
    "serving", default=(NO_OBSERVATION, STDIO_ORIGIN)
)


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
        self, msg: Message, backend: str, transport: str, address: tuple[str, int] | None
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
