"""What the era layer needs of a transport (stdio, HTTP, HTTP+SSE), and of one that keeps a
legacy session itself (HTTP).

A channel (stdio, HTTP+SSE) is one connection: its legacy session is that connection's and
ends with it. An HTTP backend has no connection to hang a session on, so the session is state
kept across requests (2025-11-25 transports, Session Management: the `Mcp-Session-Id` and
agreed version sent on every request, the standing GET stream, a DELETE at the end), kept by
http_session.py's `HttpSession`, a `SessionLink` over the transport; the era layer asks
`isinstance` once instead of probing for each method by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gateway.backends.base import Call, NotificationSink
from gateway.protocol.jsonrpc import Message


class Link(Protocol):
    name: str
    transport: str
    on_notification: Callable[[str, Message], None] | None
    takes_requests: bool

    @property
    def up(self) -> bool: ...

    async def run(self) -> None: ...

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,
    ) -> Message: ...

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message: ...

    async def notify(self, msg: Message) -> None: ...

    async def send(self, msg: Message, call: Call) -> None:
        """An answer to the server's own request (for `call`'s caller, whose token HTTP sends),
        or a notification of the handshake."""
        ...


@runtime_checkable
class SessionLink(Link, Protocol):
    """A link that holds a legacy session of its own, across requests rather than connections."""

    # Set once the session's standing GET stream has its answer's head (or none): the
    # session's first requests wait for it, up to a bound (era/layer.py).
    stream_ready: asyncio.Event

    def begin_session(self) -> None:
        """Legacy from now on, with no session yet (before `initialize`)."""
        ...

    def agreed(self, version: str) -> None:
        """The version `initialize` agreed on, sent with every request from now on."""
        ...

    def forget_session(self) -> None:
        """Modern after all (a modern error to `initialize`): no session."""
        ...

    async def end_session(self) -> None:
        """The session is no longer needed (a dual-era lane's client has gone)."""
        ...

    async def watch(self, deliver: Callable[[str, Message], None]) -> bool:
        """The session's GET stream until it ends, its notifications to `deliver`; False when
        the server offers none."""
        ...
