"""The engine: checks a request's protocol fields, answers what the gateway owns, sends the rest
to the backend that owns it, and turns every failure into a JSON-RPC error (via `errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway import errors
from gateway.backends.base import Backend, NotificationSink
from gateway.core.catalog import ToolHeaders
from gateway.protocol import jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway")

# Client notifications the gateway consumes itself instead of forwarding.
LOCAL_NOTIFICATIONS = frozenset({"notifications/cancelled"})
# How many tools/list pages the gateway follows when it loads a catalog on its own.
MAX_CATALOG_PAGES = 100


@dataclass(frozen=True)
class GatewayInfo:
    name: str
    version: str

    def as_implementation(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


async def _discard(_: Message) -> None:
    return None


class Dispatcher:
    def __init__(self, backends: Sequence[Backend], info: GatewayInfo) -> None:
        if len(backends) != 1:
            raise ValueError("the gateway serves exactly one backend until namespacing lands")
        self._backend = backends[0]
        self._info = info
        self._tools = ToolHeaders()

    @property
    def backends(self) -> tuple[Backend, ...]:
        return (self._backend,)

    async def handle(self, msg: Message, sink: NotificationSink) -> Message:
        """The reply to one client request; never raises except for cancellation."""
        rejection = meta.check_request(msg)
        if rejection is not None:
            return rejection
        try:
            return await self._dispatch(msg, sink)
        except Exception as exc:
            return errors.to_wire(exc, msg["id"])

    async def notify(self, msg: Message) -> None:
        """Forward a client notification; failures are logged, never raised (nobody awaits it)."""
        if msg["method"] in LOCAL_NOTIFICATIONS:
            return
        try:
            await self._backend.notify(msg)
        except errors.BackendError as exc:
            log.warning("notification %s not delivered: %s", msg["method"], exc)

    async def _dispatch(self, msg: Message, sink: NotificationSink) -> Message:
        method = msg["method"]
        backend = self._backend
        if method == "server/discover":
            return self._own_discover(await backend.request(msg, sink))
        param_headers: tuple[ParamHeader, ...] = ()
        if method == "tools/call" and backend.transport == "http":
            param_headers = await self.param_headers(str(jsonrpc.params(msg).get("name"))) or ()
        reply = await backend.request(msg, sink, param_headers)
        if method == "tools/list":
            self._tools.learn(backend.name, reply, drop_invalid=backend.transport == "http")
        return reply

    def _own_discover(self, reply: Message) -> Message:
        """The backend's discovery result as the gateway's own: our identity, our versions."""
        result = reply.get("result")
        if not isinstance(result, dict):
            return reply
        theirs = result.get("supportedVersions")
        versions = [v for v in meta.SUPPORTED_VERSIONS if isinstance(theirs, list) and v in theirs]
        result["supportedVersions"] = versions
        result_meta = result.get("_meta")
        result["_meta"] = {
            **(result_meta if isinstance(result_meta, dict) else {}),
            meta.SERVER_INFO: self._info.as_implementation(),
        }
        return reply

    async def param_headers(self, tool: str) -> tuple[ParamHeader, ...] | None:
        """The `x-mcp-header` annotations of a tool, loading the catalog once if needed."""
        known = self._tools.get(tool)
        if known is not None or self._tools.loaded:
            return known
        await self._load_tools()
        return self._tools.get(tool)

    async def _load_tools(self) -> None:
        backend = self._backend
        cursor: str | None = None
        for _ in range(MAX_CATALOG_PAGES):
            params: dict[str, Any] = {"_meta": meta.gateway_meta(self._info.as_implementation())}
            if cursor is not None:
                params["cursor"] = cursor
            request = {
                "jsonrpc": "2.0",
                "id": "gateway-catalog",
                "method": "tools/list",
                "params": params,
            }
            try:
                reply = await backend.request(request, _discard)
            except errors.BackendError as exc:
                log.warning("could not load the tool catalog: %s", exc)
                return
            self._tools.learn(backend.name, reply, drop_invalid=backend.transport == "http")
            result = reply.get("result")
            cursor = result.get("nextCursor") if isinstance(result, dict) else None
            if not isinstance(cursor, str):
                break
        self._tools.loaded = True

    def invalidate_tools(self) -> None:
        self._tools = ToolHeaders()
