"""Legacy HTTP sessions (2025-11-25 transports, Session Management): minted at `initialize`,
named by an unguessable `Mcp-Session-Id`, bound to the caller that opened them, ended by
DELETE or after a while without requests; an unknown or ended id gets 404.

`Sessions` is what the session endpoint (endpoint.py) asks of a store, whichever it has:
`SessionStore` keeps them in this process (its async methods never wait). With
`cluster.redis`, `SharedSessionStore` keeps
each session's record in Redis (records.py) and, on every replica that serves it, a
runtime copy made from the record on demand: what only that replica can hold (requests in
flight, questions asked on their streams, the GET stream and its watch). What reaches another
replica than the one holding it (an answer, `notifications/cancelled`, the session's end, a
changed subscription) is passed on over the cluster bus.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from typing import Any, Protocol

from gateway.caller_auth.identity import Identity
from gateway.core.bus import Bus
from gateway.frontends.legacy.front import LegacyFront, Session
from gateway.frontends.legacy.records import (
    SessionRecords,
    SessionsUnavailable,
    apply,
    owner_digest,
    record_key,
    record_of,
)
from gateway.origin import STDIO_ORIGIN, Origin, credentials_digest
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.http")

# Messages the gateway starts (list changes, resource updates) kept for a session until its GET
# stream takes them; beyond this, newer ones are dropped (a client that never listens).
OUTBOX = 256
# Open sessions at most: each holds a listen on the backends, so an endless stream of
# `initialize` must not open endless backend streams.
MAX_SESSIONS = 1000


class HttpSession(Session):
    def __init__(self, session_id: str, owner: str, *, shared: bool = False) -> None:
        super().__init__()
        self.id = session_id
        self.owner = owner
        self.streaming = False  # a GET stream is open
        # None marks the end of the session for the GET stream.
        self.outbox: asyncio.Queue[Message | None] = asyncio.Queue(OUTBOX)
        # Alone, the session's watch runs from its `initialize` on and its notifications wait
        # in the outbox for a GET stream; shared, it runs only where a GET stream is open
        # (`SharedSessionStore.stream_opened`): the next GET may reach any replica.
        self.deliver = None if shared else self._enqueue
        self.watch_origin: Origin = STDIO_ORIGIN  # (shared: the GET stream's request's)

    async def _enqueue(self, msg: Message) -> None:
        try:
            self.outbox.put_nowait(msg)
        except asyncio.QueueFull:
            log.debug("session %s: its GET stream is not taking messages; one dropped", self.id)

    def end_stream(self) -> None:
        """End the GET stream (now if open, else the next one); the session stays."""
        if self.outbox.full():
            self.outbox.get_nowait()
        self.outbox.put_nowait(None)

    def close(self) -> None:
        super().close()
        self.end_stream()


def owner_of(identity: Identity | None, authorization: str | None) -> str:
    """Who may use a session: the caller's identity when the listener authenticates (so a
    refreshed token of the same subject and client keeps the session), else a digest of the
    credentials that opened it."""
    if identity is not None:
        return "identity:" + identity.key()
    return credentials_digest(authorization)


class Sessions(Protocol):
    """Where an HTTP listener keeps its legacy sessions: in this process (`SessionStore`) or
    shared by the replicas (`SharedSessionStore`). The endpoint calls these and never asks
    which store it has; what a store alone needs not do (tell other replicas, renew a record)
    it does as nothing. The async methods raise `SessionsUnavailable` when a shared store
    cannot be asked."""

    # How often an open GET stream renews its session (`touch`): an open stream is use.
    touch_interval: float

    def open(self, owner: str) -> HttpSession | None:
        """A new session, or None when there is no room for one (raises `SessionsUnavailable`
        at once while a shared store is known to be down, before the handshake runs)."""

    async def opened(self, session: HttpSession) -> None:
        """The handshake is done: the session is every replica's from now on."""

    async def lookup(self, session_id: str, owner: str) -> HttpSession | None:
        """The live session of that id if `owner` opened it, its use noted; None for an
        unknown, ended or expired id and for another owner's session alike. Raises
        `SessionsFull` when a shared store has no room for this replica's copy."""

    async def save(self, session: HttpSession) -> bool:
        """What the session's request changed (log level, subscriptions), for every replica;
        False when the session is gone meanwhile (then ended here too)."""

    async def subscriptions_changed(self, session: HttpSession) -> None:
        """Saved; the replica that holds the session's GET stream watches anew."""

    async def delete(self, session: HttpSession) -> None:
        """The session ends (DELETE), on every replica."""

    def end(self, session: HttpSession) -> None:
        """This process's copy of the session ends (what still runs in it is cancelled)."""

    async def answer_elsewhere(self, session: HttpSession, response: Message) -> None:
        """An answer to no question of this process: to the replica that asked it, if any."""

    async def cancel_elsewhere(self, session: HttpSession, request_id: object) -> None:
        """`notifications/cancelled` for no request in flight here: to the replica running it."""

    def stream_opened(self, session: HttpSession, origin: Origin) -> None:
        """The session's GET stream is open here."""

    def stream_closed(self, session: HttpSession) -> None:
        """The session's GET stream here has ended."""

    async def touch(self, session: HttpSession) -> bool:
        """The session's use renewed while its GET stream is open; False once it is gone."""

    def end_streams(self) -> None:
        """End every session's GET stream (the listener is closing: no new one can start)."""

    def close_all(self) -> None:
        """End every session."""


class SessionStore:
    """Sessions this process alone holds (`Sessions`): no other replica to tell, no record
    to renew, so its async methods return without waiting."""

    def __init__(self, idle_timeout: float, limit: int | None = None) -> None:
        self._idle_timeout = idle_timeout
        self._limit = MAX_SESSIONS if limit is None else limit
        self._sessions: dict[str, HttpSession] = {}
        self._swept = time.monotonic()
        self.touch_interval = math.inf  # (its sessions expire by the sweep, which skips them)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, owner: str) -> HttpSession | None:
        """A new session, or None when MAX_SESSIONS are open (and none has expired)."""
        if not self._room():
            return None
        # 32 random bytes, URL-safe base64: visible ASCII only, as the header requires.
        session = self._make(secrets.token_urlsafe(32), owner)
        self._sessions[session.id] = session
        return session

    def _room(self) -> bool:
        self._sweep(force=len(self._sessions) >= self._limit)
        return len(self._sessions) < self._limit

    def _make(self, session_id: str, owner: str) -> HttpSession:
        return HttpSession(session_id, owner)

    async def opened(self, session: HttpSession) -> None:
        return None

    async def lookup(self, session_id: str, owner: str) -> HttpSession | None:
        """The live session of that id if `owner` opened it; a stranger learns nothing more than
        from an id that never existed."""
        self._sweep()
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.owner, owner):
            return None
        session.last_used = time.monotonic()
        return session

    async def save(self, session: HttpSession) -> bool:
        return True  # (the session itself is the only copy)

    async def subscriptions_changed(self, session: HttpSession) -> None:
        return None  # (its watch runs here, from its `initialize` on, and sees them)

    async def delete(self, session: HttpSession) -> None:
        self.end(session)

    def end(self, session: HttpSession) -> None:
        if self._sessions.pop(session.id, None) is not None:
            session.close()

    async def answer_elsewhere(self, session: HttpSession, response: Message) -> None:
        return None  # (no question of ours: dropped)

    async def cancel_elsewhere(self, session: HttpSession, request_id: object) -> None:
        return None  # (no such request: nothing to cancel)

    def stream_opened(self, session: HttpSession, origin: Origin) -> None:
        return None  # (its watch runs from its `initialize` on, into the outbox)

    def stream_closed(self, session: HttpSession) -> None:
        return None

    async def touch(self, session: HttpSession) -> bool:
        return session.id in self._sessions

    def end_streams(self) -> None:
        for session in self._sessions.values():
            session.end_stream()

    def close_all(self) -> None:
        for session in list(self._sessions.values()):
            self.end(session)

    def _sweep(self, *, force: bool = False) -> None:
        """Ends sessions idle past the timeout; runs at most a few times per timeout, when
        sessions are used (an unused store holds only what expired since its last use)."""
        now = time.monotonic()
        if now - self._swept < self._idle_timeout / 4 and not force:
            return
        self._swept = now
        for session in list(self._sessions.values()):
            busy = session.in_flight or session.streaming
            if not busy and now - session.last_used > self._idle_timeout:
                self.end(session)


# The cluster bus's topics for sessions (core/bus.py): each body names the session by its
# record's key (a digest of the id, never the id itself).
ANSWER = "session.answer"  # a client's answer to a question another replica asked
CANCEL = "session.cancel"  # notifications/cancelled, for a request another replica runs
END = "session.end"  # the session was deleted: every copy ends (its GET stream, its work)
CHANGED = "session.changed"  # its subscriptions changed: the replica watching reads them again


class SharedSessionStore(SessionStore):
    """Sessions whose records are in Redis (`cluster.redis`; `Sessions`), so any replica
    serves any request of a session; each replica keeps copies only of the sessions it serves.
    Lookups read the record (renewing its expiry), so what another replica set (log level,
    subscriptions) applies here, and a session ended or expired there is ended here too."""

    def __init__(
        self,
        idle_timeout: float,
        records: SessionRecords,
        bus: Bus,
        legacy: LegacyFront,
        limit: int | None = None,
    ) -> None:
        super().__init__(idle_timeout, limit)
        self._records = records
        self._bus = bus
        self._legacy = legacy
        self._by_key: dict[str, HttpSession] = {}
        # Questions asked of clients carry this replica's id, so an answer that reaches another
        # replica is taken by the one that asked (and by no other copy of the session).
        self._ask_prefix = f"mcp-gateway-{bus.replica}-"
        # How often an open GET stream renews its record: the session is in use while it is.
        self.touch_interval = idle_timeout / 3
        bus.on(ANSWER, self._on_answer)
        bus.on(CANCEL, self._on_cancel)
        bus.on(END, self._on_end)
        bus.on(CHANGED, self._on_changed)

    def open(self, owner: str) -> HttpSession | None:
        self._records.check()  # (Redis known to be down: refused before the handshake runs)
        return super().open(owner)

    def _make(self, session_id: str, owner: str) -> HttpSession:
        session = HttpSession(session_id, owner, shared=True)
        session.ask_prefix = self._ask_prefix
        self._by_key[record_key(session_id)] = session
        return session

    def end(self, session: HttpSession) -> None:
        """End this replica's copy (the record is `delete`'s)."""
        self._by_key.pop(record_key(session.id), None)
        super().end(session)

    async def opened(self, session: HttpSession) -> None:
        """The record, which makes the session every replica's."""
        await self._records.create(record_key(session.id), record_of(session, session.owner))

    async def lookup(self, session_id: str, owner: str) -> HttpSession | None:
        """This replica's copy of the session, made from its record (whose expiry this use
        renews); None for an unknown, ended or expired id, or another owner's session, alike.
        Raises `SessionsUnavailable` when Redis does not answer, and `SessionsFull` when this
        replica holds as many copies as it may, all busy."""
        record = await self._records.load(record_key(session_id))
        local = self._sessions.get(session_id)
        if record is None:
            if local is not None:
                self.end(local)  # ended or expired elsewhere: its work here ends too
            return None
        if not secrets.compare_digest(record["owner"], owner_digest(owner)):
            return None
        if local is None:
            if not self._room() and not self._evict():
                raise SessionsFull
            local = self._make(session_id, owner)
            self._sessions[session_id] = local
        if apply(local, record) and local.watcher is not None:
            self._legacy.watch(local, local.watch_origin)
        local.last_used = time.monotonic()
        return local

    def _evict(self) -> bool:
        """Room for another copy, made by forgetting the least recently used idle one (a copy
        is a cache of its record: nothing is lost)."""
        idle = [s for s in self._sessions.values() if not (s.in_flight or s.streaming or s.asked)]
        if not idle:
            return False
        self.end(min(idle, key=lambda s: s.last_used))
        return True

    async def save(self, session: HttpSession) -> bool:
        """What the session's request changed (log level, subscriptions), for every replica;
        False when the record is gone meanwhile (the copy ends)."""
        if await self._records.save(record_key(session.id), record_of(session, session.owner)):
            return True
        self.end(session)
        return False

    async def subscriptions_changed(self, session: HttpSession) -> None:
        """Saved; the replica that holds the session's GET stream (if another) watches anew."""
        await self._bus.publish(CHANGED, {"session": record_key(session.id)})

    async def delete(self, session: HttpSession) -> None:
        """The session ends everywhere: its record first (raises `SessionsUnavailable`), then
        the copies (a lost message leaves a GET stream elsewhere to find the record gone)."""
        await self._records.delete(record_key(session.id))
        self.end(session)
        await self._bus.publish(END, {"session": record_key(session.id)})

    async def answer_elsewhere(self, session: HttpSession, response: Message) -> None:
        """An answer to no question of this replica: to the replica that asked it."""
        await self._bus.publish(ANSWER, {"session": record_key(session.id), "response": response})

    async def cancel_elsewhere(self, session: HttpSession, request_id: object) -> None:
        await self._bus.publish(
            CANCEL, {"session": record_key(session.id), "requestId": request_id}
        )

    def stream_opened(self, session: HttpSession, origin: Origin) -> None:
        """The session's GET stream is open here: its watch runs here, into the stream."""
        session.watch_origin = origin
        session.deliver = session._enqueue
        self._legacy.watch(session, origin)

    def stream_closed(self, session: HttpSession) -> None:
        """Changes are kept for an open GET stream only (the next may reach another replica)."""
        session.deliver = None
        if session.watcher is not None:
            session.watcher.cancel()
            session.watcher = None

    async def touch(self, session: HttpSession) -> bool:
        """The record's expiry renewed (an open GET stream is use); False once it is gone."""
        return await self._records.touch(record_key(session.id))

    # --- what the other replicas say --------------------------------------------------------

    def _named(self, body: dict[str, Any]) -> HttpSession | None:
        key = body.get("session")
        return self._by_key.get(key) if isinstance(key, str) else None

    async def _on_answer(self, _: str, body: dict[str, Any]) -> None:
        session = self._named(body)
        response = body.get("response")
        if session is not None and isinstance(response, dict):
            session.answer(response)

    async def _on_cancel(self, _: str, body: dict[str, Any]) -> None:
        session = self._named(body)
        if session is not None:
            session.cancel(body.get("requestId"))

    async def _on_end(self, _: str, body: dict[str, Any]) -> None:
        session = self._named(body)
        if session is not None:
            self.end(session)

    async def _on_changed(self, _: str, body: dict[str, Any]) -> None:
        session = self._named(body)
        if session is None or session.watcher is None:
            return  # nothing watched here: the next lookup reads the record anyway
        try:
            record = await self._records.load(record_key(session.id))
        except SessionsUnavailable:
            return  # (logged by the store; the stream's next renewal finds out more)
        if record is None:
            self.end(session)
        elif apply(session, record):
            self._legacy.watch(session, session.watch_origin)


class SessionsFull(Exception):
    """This replica holds MAX_SESSIONS copies of sessions, every one of them busy."""
