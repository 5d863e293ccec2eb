"""List changes and resource updates across replicas (`cluster.redis`,
docs/operations/replicas.md).

What one replica's backends tell it reaches every replica's listen streams: each notice a backend
stream of this replica delivers (a client's listen, the replica's own watch, or a notification
outside any request) is published once on the bus (topic `changes`: the backend's name, the
method and, for an update, the backend's own URI); a notice from another replica is handed to
every local listen whose plan covers it, as if the local backend stream had delivered it, and a
list change makes the backend's catalog stale and loads it again in the background.

So that a replica hears its backends' list changes even when none of its own clients listens,
it holds one listen of its own on each backend for the list changes it announces (the watch).
The watch also asks for the backend URIs the other replicas' listens are subscribed to
(core/interest.py), so an update caused through this replica is heard here and published even
when no client of this replica is subscribed to it; when their union changes, the watch is
planned again (`REPLAN_DELAY` after the first change, so a burst is one re-plan): a new listen
with the new filter is opened, and the old one ended once the new one is acknowledged.

Duplicates: notices heard by several local streams while one of them waits to be published
are published once (coalesced while queued, never suppressed after: a change made after a
notice left is always followed by one). A notice from the bus is not relayed when this replica
heard the same one (backend, method, URI) from its own backend within `ECHO_WINDOW`: a backend
the replicas share tells each of them, and the local copy has already gone out. The other way
round (the bus's copy first) the local one is relayed too; a second notice costs a client one
more refetch, a lost one a stale view. Delivery is at most once (core/bus.py): while Redis is
away, each replica serves its own listens alone.

Core sees the bus only through `core.bus.Bus`; publishing happens in a task of its own from a
bounded queue, so a listen's relay never waits for Redis.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectSendStream

from gateway.core.bus import Bus
from gateway.core.catalog import Catalogs
from gateway.core.interest import MAX_URI, Interests
from gateway.core.listen import ACK_TIMEOUT, ACKNOWLEDGED, LIST_FLAGS, UPDATED, Subscriptions
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.changes")

TOPIC = "changes"
LIST_CHANGED = frozenset(method for _, method in LIST_FLAGS.values())
METHODS = LIST_CHANGED | {UPDATED}
# A notice from the bus that this replica heard from its own backend this recently is the
# same change (a shared backend tells every replica): not relayed twice.
ECHO_WINDOW = 1.0
# Notices waiting to be published; past this (Redis slow, a flood) new ones are dropped.
PUBLISH_QUEUE = 256
# Backends' notices remembered for the echo check; older ones are forgotten past this many.
REMEMBERED = 1024
# A watch is planned again this long after the other replicas' interests in its backend first
# changed (a burst of subscriptions and unsubscriptions is one new backend listen).
REPLAN_DELAY = 0.5

Key = tuple[str, str, str]  # backend, method, backend's URI ("" for a list change)


class ClusterChanges:
    def __init__(
        self,
        bus: Bus,
        subscriptions: Subscriptions,
        catalogs: Catalogs,
        ready: anyio.Event | None = None,
    ) -> None:
        """`ready`: set once the bus hears the others (the interests' hello waits for it)."""
        self._bus = bus
        self._subscriptions = subscriptions
        self._catalogs = catalogs
        self._outbox: MemoryObjectSendStream[Key] | None = None  # while running
        self._queued: set[Key] = set()
        self._heard_at: dict[Key, float] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self.published = 0
        self.dropped = 0
        # Each watch's wake-up for a re-plan, and the URIs its newest backend listen asks for.
        self._replans: dict[str, anyio.Event] = {}
        self.watching: dict[str, frozenset[str]] = {}
        bus.on(TOPIC, self._received)
        subscriptions.on_heard = self.heard
        subscriptions.on_reconfigure = self._watch_added
        self.interests = Interests(bus, subscriptions, self._replan, ready)

    async def run(self) -> None:
        """Publish what is heard, and watch every backend (those a reload adds too)."""
        send, receive = anyio.create_memory_object_stream[Key](PUBLISH_QUEUE)
        with send, receive:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._outbox = send
                try:
                    tg.start_soon(self.interests.run)
                    for backend in self._subscriptions.backends:
                        tg.start_soon(self._watch, backend)
                    async for key in receive:
                        self._queued.discard(key)
                        backend, method, uri = key
                        body = {"backend": backend, "method": method}
                        if uri:
                            body["uri"] = uri
                        if await self._bus.publish(TOPIC, body):
                            self.published += 1
                finally:
                    self._outbox = None
                    self._tg = None

    def heard(self, backend: str, note: Message) -> None:
        """A notification one of this replica's backends delivered (synchronous: from a relay)."""
        method = note.get("method")
        if method not in METHODS:
            return
        uri = jsonrpc.params(note).get("uri") if method == UPDATED else ""
        if not isinstance(uri, str) or (method == UPDATED and not uri):
            return
        key: Key = (backend, str(method), uri)
        now = anyio.current_time()
        if len(self._heard_at) >= REMEMBERED:
            self._heard_at = {k: t for k, t in self._heard_at.items() if now - t < ECHO_WINDOW}
        self._heard_at[key] = now
        outbox = self._outbox
        if outbox is None or key in self._queued:
            return  # (not running; or queued already: one message says it)
        try:
            outbox.send_nowait(key)
        except anyio.WouldBlock:
            self.dropped += 1
            log.debug("cluster: a notice of %s not published (queue full)", backend)
            return
        self._queued.add(key)

    async def _received(self, sender: str, body: dict[str, Any]) -> None:
        backend, method, uri = body.get("backend"), body.get("method"), body.get("uri", "")
        if (
            not isinstance(backend, str)
            or method not in METHODS
            or not isinstance(uri, str)
            or len(uri) > MAX_URI
            or (method == UPDATED) != bool(uri)
        ):
            log.debug("cluster: a malformed change notice from %s ignored", sender)
            return
        if backend not in self._subscriptions.backends:
            # Configs differ during a rollout: a backend this replica does not have.
            log.debug("cluster: a change notice of unknown backend %s ignored", backend)
            return
        if method in LIST_CHANGED:
            self._catalogs.list_changed(backend)
        heard = self._heard_at.get((backend, method, uri), -math.inf)
        if anyio.current_time() - heard < ECHO_WINDOW:
            return  # heard from its own backend: already relayed
        params = {"uri": uri} if uri else {}
        self._subscriptions.deliver(backend, {"jsonrpc": "2.0", "method": method, "params": params})

    async def _watch(self, backend: str) -> None:
        """The watch of one backend, until a reload removes or replaces it: planned again
        whenever the other replicas' interests in it change."""
        target = self._subscriptions.backends.get(backend)
        if target is None:
            return
        running: anyio.CancelScope | None = None
        asked: frozenset[str] | None = None
        replan: anyio.Event | None = None
        try:
            async with anyio.create_task_group() as tg:
                while self._subscriptions.backends.get(backend) is target:
                    replan = self._replans[backend] = anyio.Event()
                    wanted = self.interests.wanted(backend)
                    if wanted != asked:
                        # The new listen first, the old one ended once it is acknowledged,
                        # so no update falls between them.
                        scope, acked = anyio.CancelScope(), anyio.Event()
                        self.watching[backend] = wanted
                        tg.start_soon(self._listen, backend, wanted, scope, acked)
                        with anyio.move_on_after(ACK_TIMEOUT):
                            await acked.wait()
                        if running is not None:
                            running.cancel()
                        running, asked = scope, wanted
                    await replan.wait()
                    await anyio.sleep(REPLAN_DELAY)
                tg.cancel_scope.cancel()
        finally:
            if replan is not None and self._replans.get(backend) is replan:
                del self._replans[backend]
                self.watching.pop(backend, None)

    async def _listen(
        self, backend: str, uris: frozenset[str], scope: anyio.CancelScope, acked: anyio.Event
    ) -> None:
        async def relay(name: str, note: Message) -> None:
            method = note.get("method")
            if method == ACKNOWLEDGED:
                acked.set()
                return
            if method in LIST_CHANGED:
                self._catalogs.list_changed(name)
            self.heard(name, note)

        with scope:
            await self._subscriptions.watch(backend, relay, uris)
        acked.set()  # (nothing to ask of it, or it is gone: the next plan need not wait)

    def _replan(self, backends: Collection[str]) -> None:
        """The other replicas' interests in these backends changed."""
        for backend in backends:
            replan = self._replans.get(backend)
            if replan is not None:
                replan.set()

    def _watch_added(self, added: list[str]) -> None:
        # Every watch looks again: those of removed or replaced backends end.
        self._replan(list(self._replans))
        if self._tg is not None:
            for backend in added:
                self._tg.start_soon(self._watch, backend)
