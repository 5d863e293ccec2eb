"""An in-memory MCP server behind the `Backend` seam, and a dispatcher over it: for fast tests of
what the engine does with a request before and after a backend (rate limits, the audit log).
`FakeBackend(handler)` is the same server with its answers given by one function, as httpx's
`MockTransport` hands each request to a handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from gateway.backends.base import Call, NotificationSink
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.ratelimit import RateLimiter
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.telemetry.api import Telemetry
from tests.support import META

TOOLS = [
    {"name": name, "inputSchema": {"type": "object"}} for name in ("echo", "add", "fail", "hold")
]
RESOURCES = [{"uri": "mem://note", "name": "note"}]


class MemoryBackend:
    """Answers discovery, lists, calls and reads at once, and remembers what it was asked."""

    transport = "memory"

    def __init__(self, name: str = "mem") -> None:
        self.name = name
        self.asked: list[Message] = []
        self.notified: list[Message] = []
        self.holding = anyio.Event()  # set when a call to `hold` arrives (it never answers)

    @property
    def up(self) -> bool:
        return True

    async def run(self) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.asked.append(msg)
        return await self.answer(msg)

    async def answer(self, msg: Message) -> Message:
        """This server's own reply to `msg`."""
        method = msg["method"]
        params: dict[str, Any] = msg.get("params") or {}
        result: dict[str, Any]
        if method == "server/discover":
            result = {"capabilities": {"tools": {}, "resources": {}}, "supportedVersions": []}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "resources/list":
            result = {"resources": RESOURCES}
        elif method == "resources/templates/list":
            result = {"resourceTemplates": []}
        elif method == "tools/call" and params.get("name") == "hold":
            self.holding.set()
            await anyio.sleep_forever()
        elif method == "tools/call" and params.get("name") == "fail":
            return {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32000, "message": "no"}}
        elif method == "tools/call":
            text = str(params.get("arguments"))
            result = {"content": [{"type": "text", "text": text}]}
        elif method == "resources/read":
            result = {"contents": [{"uri": params.get("uri"), "text": "a note"}]}
        else:
            result = {}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}

    async def notify(self, msg: Message) -> None:
        self.notified.append(msg)

    def calls(self) -> list[Message]:
        return [m for m in self.asked if m["method"] == "tools/call"]


# Gets each request and the sink for its notifications; returns the reply, or None to have
# MemoryBackend answer (so a handler states only what differs); what it raises, the backend
# raises (an `errors.BackendError` is the backend failing the request).
Handler = Callable[[Message, NotificationSink], Awaitable[Message | None]]


class FakeBackend(MemoryBackend):
    """A backend whose `request` is `handler`: a test's own server in a few lines."""

    def __init__(self, handler: Handler, name: str = "fake") -> None:
        super().__init__(name)
        self.handler = handler

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        self.asked.append(msg)
        reply = await self.handler(msg, sink)
        return reply if reply is not None else await self.answer(msg)


async def dispatcher_over(
    backend: MemoryBackend,
    telemetry: Telemetry | None = None,
    limiter: RateLimiter | None = None,
) -> Dispatcher:
    """A dispatcher in front of `backend` alone, its catalog loaded."""
    dispatcher = Dispatcher(
        [backend],
        [Exposure(backend=backend.name, namespace=backend.name)],
        Naming(),
        GatewayInfo("mcp-gateway", "test"),
        telemetry=telemetry,
        limiter=limiter,
    )
    await dispatcher.catalogs.load_all()
    return dispatcher


def modern(rid: int | str, method: str, **params: Any) -> Message:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": {**params, "_meta": META}}


def tool_call(rid: int | str, name: str, **arguments: Any) -> Message:
    return modern(rid, "tools/call", name=name, arguments=arguments)


async def ignore(_: Message) -> None:
    return None
