"""What the era layer needs of a transport (stdio, HTTP, HTTP+SSE)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.backends.base import NotificationSink
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

    async def send(self, msg: Message) -> None: ...
