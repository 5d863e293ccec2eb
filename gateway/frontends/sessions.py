"""Legacy HTTP sessions (2025-11-25 transports, Session Management): minted at `initialize`,
named by an unguessable `Mcp-Session-Id`, bound to the caller that opened them, ended by
DELETE or after a while without requests; an unknown or ended id gets 404."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from gateway.auth.identity import Identity
from gateway.core.legacy import Session
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import credentials_digest

log = logging.getLogger("gateway.http")

# Messages the gateway starts (list changes, resource updates) kept for a session until its GET
# stream takes them; beyond this, newer ones are dropped (a client that never listens).
OUTBOX = 256
# Open sessions at most: each holds a listen on the backends, so an endless stream of
# `initialize` must not open endless backend streams.
MAX_SESSIONS = 1000


class HttpSession(Session):
    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__()
        self.id = session_id
        self.owner = owner
        self.streaming = False  # a GET stream is open
        # None marks the end of the session for the GET stream.
        self.outbox: asyncio.Queue[Message | None] = asyncio.Queue(OUTBOX)
        self.deliver = self._enqueue

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


class SessionStore:
    def __init__(self, idle_timeout: float, limit: int | None = None) -> None:
        self._idle_timeout = idle_timeout
        self._limit = MAX_SESSIONS if limit is None else limit
        self._sessions: dict[str, HttpSession] = {}
        self._swept = time.monotonic()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, owner: str) -> HttpSession | None:
        """A new session, or None when MAX_SESSIONS are open (and none has expired)."""
        self._sweep(force=len(self._sessions) >= self._limit)
        if len(self._sessions) >= self._limit:
            return None
        # 32 random bytes, URL-safe base64: visible ASCII only, as the header requires.
        session = HttpSession(secrets.token_urlsafe(32), owner)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, owner: str) -> HttpSession | None:
        """The live session of that id if `owner` opened it; a stranger learns nothing more than
        from an id that never existed."""
        self._sweep()
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.owner, owner):
            return None
        session.last_used = time.monotonic()
        return session

    def end(self, session: HttpSession) -> None:
        if self._sessions.pop(session.id, None) is not None:
            session.close()

    def end_streams(self) -> None:
        """End every session's GET stream (the listener is closing: no new one can start)."""
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
