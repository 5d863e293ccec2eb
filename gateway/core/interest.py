"""Which resource updates each replica wants to hear of (`cluster.redis`;
docs/operations/replicas.md).

A backend tells of an update to a resource only the listens subscribed to its URI, and each
replica asks its own backends (a stdio child per replica) for its own listens' URIs: an update
caused through replica B would reach a subscriber on A only if something of B were subscribed
too. So each replica tells the others, on the bus (topic `interest`), the backend URIs its open
listens are subscribed to (modern listens, and legacy sessions' watches, which are modern
listens through the dispatcher): `{"uris": {backend: [backend URI, ...]}}`, its whole set each
time. Every replica's watch of a backend (core/changes.py) adds the union of the others' URIs
for it to its own listen's `resourceSubscriptions`, so the replica where an update happens
hears it and publishes it on `changes`; the subscriber's replica relays it through its own
listens' plans, which filter by its policy as for any notice. Interests carry backend URIs
only, never who asked.

Kept alive against loss (the bus is at most once): a replica tells its set at once when it
changes (after `ANNOUNCE_DELAY`, so a burst of listens opening and closing is one message),
again every `PERIOD` while it is not empty, once more empty when its last interest goes or it
shuts down, and with `hello` when it starts (so the others tell theirs at once rather than at
their next period). A replica's interests not told again within `TTL` (a replica that died
without saying) are forgotten by `expire`, run every period.

Bounded: at most `MAX_URIS` URIs per replica (told and accepted; one log line when this
replica's own exceed it), each at most `MAX_URI` characters, `MAX_REPLICAS` replicas heard,
and a watch asks a backend for at most `MAX_WATCHED` URIs; a backend unknown here is ignored.
Nothing of this is on a request's path: open listens only set an event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import anyio

from gateway.core.bus import Bus
from gateway.core.listen import Subscriptions

log = logging.getLogger("gateway.changes")

TOPIC = "interest"
# A replica tells its interests again this often while it has any; others forget them after
# TTL without a word (a replica gone without saying).
PERIOD = 30.0
TTL = 3 * PERIOD
# A change of this replica's interests is told this long after the first (one message for a
# burst of listens opening and closing).
ANNOUNCE_DELAY = 0.2
# URIs per replica, told or accepted; longer URIs are not ones the gateway would send.
MAX_URIS = 512
MAX_URI = 8192
# Replicas whose interests are kept at once (a forger inventing replica ids is bounded by it).
MAX_REPLICAS = 64
# URIs one watch asks of one backend (the union over the replicas, in order).
MAX_WATCHED = 1024
# How long a replica's last words at shutdown may take.
FAREWELL_TIMEOUT = 1.0

Table = dict[str, frozenset[str]]  # backend -> backend URIs


@dataclass
class _Theirs:
    heard_at: float
    table: Table


class Interests:
    """This replica's interests told to the others, and theirs as heard. `on_change` is called
    with the backends whose union of the others' URIs may have changed."""

    def __init__(
        self,
        bus: Bus,
        subscriptions: Subscriptions,
        on_change: Callable[[Collection[str]], None],
        ready: anyio.Event | None = None,
    ) -> None:
        self._bus = bus
        self._subscriptions = subscriptions
        self._on_change = on_change
        self._ready = ready
        self._theirs: dict[str, _Theirs] = {}
        self._changed = anyio.Event()
        self._asked = False
        self._over: set[str] = set()  # backends whose watch would ask too much (logged once)
        self._mine_over = False
        self.told: dict[str, list[str]] = {}  # what the others were last told
        bus.on(TOPIC, self._received)
        subscriptions.on_listens_changed = self._wake

    def _wake(self) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Tell the others (at start with `hello`, on a change, every period) and forget those
        not heard from within TTL; at the end, tell them this replica wants nothing."""
        if self._ready is not None:
            await self._ready.wait()  # (so the others' answers to the hello are heard)
        hello = True
        ticked = False
        try:
            while True:
                self._changed = anyio.Event()
                self.expire()
                mine = self._mine()
                if hello or mine != self.told or (mine and (ticked or self._asked)):
                    self._asked = False
                    body: dict[str, Any] = {"uris": mine}
                    if hello:
                        body["hello"] = True
                    if await self._bus.publish(TOPIC, body):
                        hello = False
                        self.told = mine
                with anyio.move_on_after(PERIOD) as scope:
                    await self._changed.wait()
                    await anyio.sleep(ANNOUNCE_DELAY)
                ticked = scope.cancelled_caught
        finally:
            if self.told:
                with anyio.CancelScope(shield=True), anyio.move_on_after(FAREWELL_TIMEOUT):
                    await self._bus.publish(TOPIC, {"uris": {}})

    def wanted(self, backend: str) -> frozenset[str]:
        """The URIs of `backend` the other replicas' listens are subscribed to (bounded)."""
        union: set[str] = set()
        for theirs in self._theirs.values():
            union |= theirs.table.get(backend, frozenset())
        if len(union) <= MAX_WATCHED:
            self._over.discard(backend)
            return frozenset(union)
        if backend not in self._over:
            self._over.add(backend)
            log.warning(
                "cluster: the replicas are subscribed to %d URIs of %s; its watch asks for"
                " the first %d only (updates to the others cross no replica)",
                len(union),
                backend,
                MAX_WATCHED,
            )
        return frozenset(sorted(union)[:MAX_WATCHED])

    def expire(self, now: float | None = None) -> None:
        """Forget the interests of replicas not heard from within TTL."""
        at = anyio.current_time() if now is None else now
        gone = [r for r, theirs in self._theirs.items() if at - theirs.heard_at > TTL]
        changed: set[str] = set()
        for replica in gone:
            changed.update(self._theirs.pop(replica).table)
            log.info("cluster: replica %s not heard from; its resource interests dropped", replica)
        if changed:
            self._on_change(changed)

    def _mine(self) -> dict[str, list[str]]:
        mine: dict[str, list[str]] = {}
        count = 0
        over = False
        for backend, uris in sorted(self._subscriptions.interest().items()):
            for uri in sorted(uris):
                if len(uri) > MAX_URI:
                    continue
                if count >= MAX_URIS:
                    over = True
                    break
                mine.setdefault(backend, []).append(uri)
                count += 1
        if over and not self._mine_over:
            log.warning(
                "cluster: this replica's listens are subscribed to more than %d URIs; the other"
                " replicas are told of the first %d only (updates to the others caused through"
                " them may not reach these listens)",
                MAX_URIS,
                MAX_URIS,
            )
        self._mine_over = over
        return mine

    async def _received(self, sender: str, body: dict[str, Any]) -> None:
        listed = body.get("uris")
        if not isinstance(listed, dict):
            log.debug("cluster: a malformed interest from %s ignored", sender)
            return
        table: Table = {}
        count = 0
        known = self._subscriptions.backends
        for backend, uris in listed.items():
            if backend not in known or not isinstance(uris, list):
                continue  # (a backend this replica does not have: configs differ in a rollout)
            kept = {u for u in uris[:MAX_URIS] if isinstance(u, str) and 0 < len(u) <= MAX_URI}
            kept = set(sorted(kept)[: MAX_URIS - count])
            count += len(kept)
            if kept:
                table[backend] = frozenset(kept)
        old = self._theirs.pop(sender, None)
        if table:
            if len(self._theirs) >= MAX_REPLICAS:
                self.expire()
            if len(self._theirs) < MAX_REPLICAS:
                self._theirs[sender] = _Theirs(anyio.current_time(), table)
            else:
                log.warning(
                    "cluster: interests of more than %d replicas; replica %s's ignored",
                    MAX_REPLICAS,
                    sender,
                )
        before = old.table if old is not None else {}
        now = self._theirs[sender].table if sender in self._theirs else {}
        changed = {b for b in before.keys() | now.keys() if before.get(b) != now.get(b)}
        if changed:
            self._on_change(changed)
        if body.get("hello") is True:
            self._asked = True  # a replica started: tell it this one's interests now
            self._wake()
