"""`subscriptions/listen` across backends (basic/patterns/subscriptions).

A client's listen becomes one listen per backend that can honour part of its filter. The gateway
waits for their acknowledgements, acknowledges the subset honoured under the client's own
subscription id, then relays notifications with that id and namespaced URIs. A backend stream that
ends (restart, dropped connection) is opened again without the client noticing.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway import errors
from gateway.backends.base import Backend, NotificationSink
from gateway.core.catalog import Catalogs
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming
from gateway.routing.table import Exposure

log = logging.getLogger("gateway.listen")

ACKNOWLEDGED = meta.ACKNOWLEDGED
UPDATED = meta.RESOURCE_UPDATED
LIST_FLAGS = meta.LIST_FLAGS
# How long the client's acknowledgement waits for the backends' own.
ACK_TIMEOUT = 10.0
# Re-subscribing to a backend whose stream ended: quick first, doubling to a ceiling, reset once a
# stream has lasted a while.
FIRST_RETRY = 0.1
MAX_RETRY = 10.0
STABLE_AFTER = 30.0
Readable = Callable[[str, str], bool]
Hidden = Callable[[str], frozenset[str]]


@dataclass
class _Plan:
    """What one backend is asked for, and its URIs mapped back to the client's."""

    flags: dict[str, bool] = field(default_factory=dict)
    uris: dict[str, str] = field(default_factory=dict)  # backend URI -> client URI

    def filter(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.flags)
        if self.uris:
            out["resourceSubscriptions"] = list(self.uris)
        return out


class Subscriptions:
    def __init__(
        self,
        backends: Mapping[str, Backend],
        catalogs: Catalogs,
        exposures: Mapping[str, Exposure],
        naming: Naming,
    ) -> None:
        self._backends = backends
        self._catalogs = catalogs
        self._exposures = exposures
        self._naming = naming
        self._ids = itertools.count(1)
        self._closing = anyio.Event()
        self.active = 0

    def reconfigure(
        self, backends: Mapping[str, Backend], exposures: Mapping[str, Exposure], naming: Naming
    ) -> None:
        """A reloaded config: listens opened from now on plan over these backends."""
        self._backends = backends
        self._exposures = exposures
        self._naming = naming

    def close_all(self) -> None:
        """End every listen with its graceful completion result (gateway shutdown)."""
        self._closing.set()

    def _plan(
        self,
        wanted: Mapping[str, Any],
        readable: Readable | None = None,
        hidden: Hidden | None = None,
    ) -> dict[str, _Plan]:
        plans: dict[str, _Plan] = {}
        for backend in self._backends:
            caps = self._catalogs.capabilities(backend)
            unseen = hidden(backend) if hidden is not None else frozenset()
            plan = _Plan()
            for flag, (capability, _) in LIST_FLAGS.items():
                if capability in unseen:
                    continue  # changes to a list the caller sees nothing of are not its business
                if wanted.get(flag) is True and _announces_changes(caps, capability):
                    plan.flags[flag] = True
            plans[backend] = plan
        for uri in wanted.get("resourceSubscriptions") or ():
            route = self._catalogs.table.resource(uri) if isinstance(uri, str) else None
            if route is None or (readable is not None and not readable(route.backend, route.name)):
                continue  # a URI the caller may not read is left out like an unknown one
            if _can_subscribe(self._catalogs.capabilities(route.backend)):
                plans[route.backend].uris[route.name] = uri
        return {b: p for b, p in plans.items() if p.flags or p.uris}

    async def listen(
        self,
        msg: Message,
        sink: NotificationSink,
        readable: Readable | None = None,
        hidden: Hidden | None = None,
    ) -> Message:
        """The policy's say, when there is one: `readable(backend, uri)`, whether the caller
        may read a resource, so be told of its updates; `hidden(backend)`, the capabilities
        whose lists it sees nothing of, so is not told of their changes."""
        client_id = msg["id"]
        wanted = jsonrpc.params(msg).get("notifications")
        plans = self._plan(wanted if isinstance(wanted, dict) else {}, readable, hidden)
        stream = _Stream(client_id, plans, sink, self._catalogs.invalidate)
        self.active += 1
        try:
            async with anyio.create_task_group() as tg:
                for backend, plan in plans.items():
                    tg.start_soon(self._keep_listening, backend, plan, msg, stream.relay)
                with anyio.move_on_after(ACK_TIMEOUT):
                    await stream.all_acked.wait()
                await stream.acknowledge()
                await self._closing.wait()
                tg.cancel_scope.cancel()
        finally:
            self.active -= 1
        return jsonrpc.result(
            client_id, {"resultType": "complete", "_meta": {meta.SUBSCRIPTION_ID: client_id}}
        )

    async def _keep_listening(
        self,
        backend: str,
        plan: _Plan,
        client_msg: Message,
        relay: Callable[[str, Message], Awaitable[None]],
    ) -> None:
        delay = FIRST_RETRY
        client_meta = jsonrpc.meta(client_msg)
        own_meta = {k: v for k, v in client_meta.items() if k != meta.PROGRESS_TOKEN}

        async def sink(note: Message) -> None:
            await relay(backend, note)

        # Until a reload removes or replaces the backend: its part of the stream then ends
        # (the client's other backends go on), since its name may now be another's.
        target = self._backends[backend]
        while self._backends.get(backend) is target:
            started = anyio.current_time()
            request = {
                "jsonrpc": "2.0",
                "id": f"gateway-listen-{next(self._ids)}",
                "method": "subscriptions/listen",
                "params": {"_meta": own_meta, "notifications": plan.filter()},
            }
            try:
                await target.request(request, sink, long_lived=True)
                log.info("backend %s closed a listen stream; listening again", backend)
            except errors.BackendError as exc:
                # A backend that is down was logged as such once, not at every attempt.
                level = logging.DEBUG if isinstance(exc, errors.BackendDown) else logging.WARNING
                log.log(
                    level, "listen on %s lost (%s); listening again in %.1fs", backend, exc, delay
                )
            if anyio.current_time() - started > STABLE_AFTER:
                delay = FIRST_RETRY
            await anyio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY)


class _Stream:
    """One client's listen: collects acknowledgements, then relays what the client asked for."""

    def __init__(
        self,
        client_id: jsonrpc.RequestId,
        plans: dict[str, _Plan],
        sink: NotificationSink,
        invalidate: Callable[[str], None],
    ) -> None:
        self._id = client_id
        self._plans = plans
        self._sink = sink
        self._invalidate = invalidate
        self._acks: dict[str, dict[str, Any]] = {}
        self._held: list[Message] = []
        self._acknowledged = False
        self.all_acked = anyio.Event()
        if not plans:
            self.all_acked.set()

    async def relay(self, backend: str, note: Message) -> None:
        method = note.get("method")
        params = jsonrpc.params(note)
        if method == ACKNOWLEDGED:
            if backend not in self._acks:
                honoured = params.get("notifications")
                self._acks[backend] = honoured if isinstance(honoured, dict) else {}
                if len(self._acks) == len(self._plans):
                    self.all_acked.set()
            return  # later acknowledgements are re-subscriptions the client never sees
        if isinstance(method, str) and method.endswith("/list_changed"):
            self._invalidate(backend)
        shown = self._for_client(backend, note)
        if shown is None:
            return
        if not self._acknowledged:
            self._held.append(shown)  # nothing may precede the acknowledgement
            return
        await self._sink(shown)

    def _for_client(self, backend: str, note: Message) -> Message | None:
        plan = self._plans[backend]
        method = note.get("method")
        params = dict(jsonrpc.params(note))
        if method == UPDATED:
            uri = params.get("uri")
            if not isinstance(uri, str) or uri not in plan.uris:
                return None
            params["uri"] = plan.uris[uri]
        elif not any(plan.flags.get(f) and m == method for f, (_, m) in LIST_FLAGS.items()):
            return None
        note_meta = params.get("_meta")
        params["_meta"] = {
            **(note_meta if isinstance(note_meta, dict) else {}),
            meta.SUBSCRIPTION_ID: self._id,
        }
        return {"jsonrpc": "2.0", "method": method, "params": params}

    async def acknowledge(self) -> None:
        honoured: dict[str, Any] = {}
        uris: list[str] = []
        for backend, ack in self._acks.items():
            plan = self._plans[backend]
            for flag in LIST_FLAGS:
                if ack.get(flag) is True:
                    honoured[flag] = True
            uris += [plan.uris[u] for u in ack.get("resourceSubscriptions") or () if u in plan.uris]
        if uris:
            honoured["resourceSubscriptions"] = uris
        params = {"_meta": {meta.SUBSCRIPTION_ID: self._id}, "notifications": honoured}
        await self._sink({"jsonrpc": "2.0", "method": ACKNOWLEDGED, "params": params})
        while self._held:  # relays arriving meanwhile join the queue, keeping their order
            held, self._held = self._held, []
            for note in held:
                await self._sink(note)
        self._acknowledged = True


def _announces_changes(caps: Mapping[str, Any] | None, capability: str) -> bool:
    """Unknown capabilities (catalog not loaded) count as present: the backend's ack decides."""
    if caps is None:
        return True
    declared = caps.get(capability)
    return isinstance(declared, dict) and bool(declared.get("listChanged"))


def _can_subscribe(caps: Mapping[str, Any] | None) -> bool:
    if caps is None:
        return True
    resources = caps.get("resources")
    return isinstance(resources, dict) and bool(resources.get("subscribe"))
