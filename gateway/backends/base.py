"""The seam between the engine and the transports that reach MCP servers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

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
