"""The seam between the engine and the transports that reach MCP servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Final, Generic, Protocol, TypeVar

from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import NO_OBSERVATION, Observation

# Receives the request-scoped notifications (progress, log messages) of one request, in order.
NotificationSink = Callable[[Message], Awaitable[None]]


class Call:
    """What a backend request is made for, handed down the stack with it (as python-sdk's
    transport context): the client request's `origin` (for the layers that bind state to a
    caller: held calls, per-client children, legacy lanes, per-caller tokens), its SERVER
    `observation` (which the CLIENT observations of its backend requests continue), and the
    `deadline` a layer above set for this one request (None: the transport's own
    request_timeout; backends/resilience.py sets it).

    Frozen: a layer that changes it makes another (`within`). A plain class with `Final`
    attributes (mypy refuses an assignment) rather than a frozen dataclass, whose `__init__`
    costs three times as much: one is made per client request."""

    __slots__ = ("deadline", "observation", "origin")

    def __init__(
        self,
        origin: Origin,
        observation: Observation = NO_OBSERVATION,
        deadline: float | None = None,
    ) -> None:
        self.origin: Final = origin
        self.observation: Final = observation
        self.deadline: Final = deadline

    def within(self, deadline: float) -> Call:
        """The same call, for a transport to give `deadline` seconds."""
        return Call(self.origin, self.observation, deadline)

    def as_gateway(self) -> Call:
        """The gateway's own request made while serving this one (a catalog load a client's
        miss started): the gateway's origin, under the same observation."""
        return Call(GATEWAY_ORIGIN, self.observation)


# The gateway's own requests outside any client's (start-up catalog loads, health probes,
# watches): no client to bind state to, no client request's span to continue.
GATEWAY_CALL = Call(GATEWAY_ORIGIN)


class Backend(Protocol):
    """One MCP server as the engine sees it.

    `request` sends a request made for `call` (whose it is, and how long the transport may
    take) and returns the reply carrying the caller's own id; it raises
    `errors.BackendError` when there is no reply to give. A `long_lived` request (a listen
    stream) has no overall timeout. Cancelling the calling task cancels
    the request on the backend (stdio: `notifications/cancelled`; HTTP: the stream is closed).
    Nothing of any transport's wire travels here: what HTTP needs for its headers, the HTTP
    backend derives from the message itself.
    """

    name: str
    transport: str

    @property
    def up(self) -> bool:
        """Whether the backend is reachable now (child running; last HTTP exchange worked)."""
        ...

    async def run(self) -> None:
        """Keep the backend connected until cancelled; the composition root runs this."""

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message: ...

    async def notify(self, msg: Message) -> None: ...


Inner = TypeVar("Inner", bound=Backend)


class Layer(Generic[Inner]):
    """One layer of a backend's stack (gateway/app/wiring.py `build_stack` lists them in order):
    a `Backend` over the one below, which it names and hands whatever it does not change. A
    subclass keeps only what it changes: most only `request`, some `up`, `run` or `notify` too.
    `Inner`: what the layer needs of the one below (the era layer needs a transport's `Link`)."""

    def __init__(self, inner: Inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.transport = inner.transport

    @property
    def up(self) -> bool:
        return self.inner.up

    async def run(self) -> None:
        await self.inner.run()

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        return await self.inner.request(msg, sink, call, long_lived=long_lived)

    async def notify(self, msg: Message) -> None:
        await self.inner.notify(msg)
