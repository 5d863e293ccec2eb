"""The seam between the engine and the transports that reach MCP servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

from gateway.protocol.jsonrpc import Message

# Receives the request-scoped notifications (progress, log messages) of one request, in order.
NotificationSink = Callable[[Message], Awaitable[None]]


class Backend(Protocol):
    """One MCP server as the engine sees it.

    `request` sends a request and returns the reply carrying the caller's own id; it raises
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
        *,
        long_lived: bool = False,
    ) -> Message:
        return await self.inner.request(msg, sink, long_lived=long_lived)

    async def notify(self, msg: Message) -> None:
        await self.inner.notify(msg)
