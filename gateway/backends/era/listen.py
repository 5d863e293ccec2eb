"""`subscriptions/listen` for a legacy backend, served from the session's own change
notifications and `resources/subscribe` (basic/versioning, Backward Compatibility)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.backends.base import Call, NotificationSink
from gateway.backends.era.link import Link
from gateway.backends.era.probe import ignore
from gateway.backends.era.translate import LegacySession, capability
from gateway.errors import BackendError, BackendUnavailable
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message

LIST_FLAGS = meta.LIST_FLAGS
ACKNOWLEDGED = meta.ACKNOWLEDGED
UPDATED = meta.RESOURCE_UPDATED
# Change notifications queued for one listen whose client reads slowly; beyond, they are dropped.
LISTEN_QUEUE = 256


class _Listener:
    def __init__(self, flags: dict[str, bool], uris: set[str]) -> None:
        self.flags = flags
        self.uris = uris
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue(LISTEN_QUEUE)

    def offer(self, note: Message | None) -> None:
        """A notification (dropped when the client is too far behind), or None: the end, which
        must arrive, so it takes the place of the oldest queued notification if need be."""
        if note is None and self.queue.full():
            self.queue.get_nowait()
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(note)


class Listens:
    """The listens open on one legacy session, and the subscriptions they hold on it."""

    def __init__(self, link: Link, name: str, unattended: NotificationSink = ignore) -> None:
        self._link = link
        self._name = name
        # The sink of its own (un)subscribe requests: a question asked meanwhile is answered
        # as one asked outside any request.
        self._unattended = unattended
        self._listeners: set[_Listener] = set()
        self._subscribed: dict[str, int] = {}

    def offer(self, note: Message) -> None:
        """A notification outside any request: to the listens that want it."""
        method = note.get("method")
        params = jsonrpc.params(note)
        for listener in self._listeners:
            if method == UPDATED:
                if params.get("uri") in listener.uris:
                    listener.offer(note)
            elif any(listener.flags.get(f) and m == method for f, (_, m) in LIST_FLAGS.items()):
                listener.offer(note)

    def end(self) -> None:
        """The session ended: its subscriptions are gone, and every listen ends."""
        self._subscribed.clear()
        for listener in self._listeners:
            listener.offer(None)

    async def listen(
        self, msg: Message, sink: NotificationSink, session: LegacySession, call: Call
    ) -> Message:
        """The listen `call` asked for; the subscriptions it adds are made for it too."""
        wanted = jsonrpc.params(msg).get("notifications")
        wanted = wanted if isinstance(wanted, dict) else {}
        caps = session.capabilities
        flags = {
            flag: True
            for flag, (cap, _) in LIST_FLAGS.items()
            if wanted.get(flag) is True and capability(caps, cap, "listChanged")
        }
        uris: set[str] = set()
        if capability(caps, "resources", "subscribe"):
            for uri in wanted.get("resourceSubscriptions") or ():
                if isinstance(uri, str) and await self._subscribe(uri, call):
                    uris.add(uri)
        listener = _Listener(flags, uris)
        self._listeners.add(listener)
        try:
            honoured: dict[str, Any] = dict(flags)
            if uris:
                honoured["resourceSubscriptions"] = sorted(uris)
            ack_meta = {meta.SUBSCRIPTION_ID: msg["id"]}
            await sink(
                {
                    "jsonrpc": "2.0",
                    "method": ACKNOWLEDGED,
                    "params": {"_meta": ack_meta, "notifications": honoured},
                }
            )
            while True:
                note = await listener.queue.get()
                if note is None:
                    raise BackendUnavailable(self._name, "the legacy session ended")
                await sink(note)
        finally:
            self._listeners.discard(listener)
            for uri in uris:
                await self._unsubscribe(uri, call)

    async def _subscribe(self, uri: str, call: Call) -> bool:
        count = self._subscribed.get(uri, 0)
        if count == 0:
            subscribe = _subscription("resources/subscribe", uri)
            reply = await self._link.request(subscribe, self._unattended, call)
            if "error" in reply:
                return False
        self._subscribed[uri] = count + 1
        return True

    async def _unsubscribe(self, uri: str, call: Call) -> None:
        count = self._subscribed.get(uri, 0)
        if count > 1:
            self._subscribed[uri] = count - 1
            return
        if count == 0:
            return  # the session ended meanwhile: nothing is subscribed any more
        del self._subscribed[uri]
        with contextlib.suppress(BackendError):
            await asyncio.shield(
                self._link.request(
                    _subscription("resources/unsubscribe", uri), self._unattended, call
                )
            )


def _subscription(method: str, uri: str) -> Message:
    return {
        "jsonrpc": "2.0",
        "id": f"gateway-{method.split('/')[1]}",
        "method": method,
        "params": {"uri": uri},
    }
