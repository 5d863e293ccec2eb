"""Legacy sessions the replicas share (`cluster.redis`), as the data path sees them.

A legacy HTTP session is a record any replica can read: what the handshake established (the
version, client info and capabilities), what the client set since (its log level, the resources
it subscribed to), and who owns it (a digest: never a token). `SessionRecords` keeps records
under a digest of the session id, each expiring after the session's idle timeout, which every
use renews; `gateway/cluster/sessions.py` implements it in Redis and `gateway/app/` wires it. Each
replica keeps its own runtime copy of a session it serves (requests in flight, questions asked
of the client, the GET stream), made from the record on demand (stores.py).

What cannot be read is refused, never guessed: a store that does not answer raises
`SessionsUnavailable` (HTTP 503 with Retry-After), and a record of the wrong shape is as good
as none (404).
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Protocol

from gateway.errors import Refused
from gateway.frontends.legacy.front import LEGACY_VERSIONS, LOG_LEVELS, Session
from gateway.protocol import codes

log = logging.getLogger("gateway.http")

Record = dict[str, Any]


class SessionsUnavailable(Refused):
    """The shared session store did not answer: the session may well exist, so the client is
    told to come back (`data.retryAfter`; HTTP 503 with Retry-After), not that it is unknown."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(
            codes.SHARED_STATE_UNAVAILABLE,
            "Legacy sessions are unavailable: the replicas' shared store does not answer;"
            " try again later",
            "sessions_unavailable",
        )
        self.retry_after = retry_after

    def data(self) -> dict[str, Any]:
        return {"retryAfter": self.retry_after}


class SessionRecords(Protocol):
    """Session records shared by the replicas, each under `key` (a digest of the session id)
    and expiring after the idle timeout. Every method raises `SessionsUnavailable` when the
    store cannot be asked."""

    def check(self) -> None:
        """Raise at once while the store is known to be down (no request waits on it then)."""

    async def create(self, key: str, record: Record) -> None: ...

    async def load(self, key: str) -> Record | None:
        """The record, its expiry renewed; None when there is none (ended or expired)."""

    async def save(self, key: str, record: Record) -> bool:
        """Replace an existing record (expiry renewed); False when there is none any more."""

    async def touch(self, key: str) -> bool:
        """Renew the expiry; False when there is no record any more."""

    async def delete(self, key: str) -> None: ...


def record_key(session_id: str) -> str:
    """Where a session's record is kept: a digest, so whoever reads the store learns no id it
    could present (an id is a bearer secret, if only together with its owner's credentials)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).hexdigest()


def owner_digest(owner: str) -> str:
    """The owner as a record holds it. An owner is a digest of credentials or an identity's key
    (issuer, subject and client in clear): the store gets a digest of either."""
    return hashlib.sha256(
        b"mcp-gateway session owner\0" + owner.encode("utf-8", "surrogateescape")
    ).hexdigest()


def record_of(session: Session, owner: str) -> Record:
    return {
        "owner": owner_digest(owner),
        "version": session.version,
        "client_info": session.client_info,
        "client_capabilities": session.client_capabilities,
        "log_level": session.log_level,
        "subscribed": sorted(session.subscribed),
        "initialized": session.initialized,
    }


def valid(record: object) -> Record | None:
    """A record as read from the store, or None when it is not one (what the store holds is
    input: anyone who can write to it can write anything)."""
    if not isinstance(record, dict):
        return None
    level = record.get("log_level")
    subscribed = record.get("subscribed")
    if (
        not isinstance(record.get("owner"), str)
        or record.get("version") not in LEGACY_VERSIONS
        or not isinstance(record.get("client_info"), dict)
        or not isinstance(record.get("client_capabilities"), dict)
        or not (level is None or level in LOG_LEVELS)
        or not isinstance(subscribed, list)
        or not all(isinstance(uri, str) for uri in subscribed)
        or not isinstance(record.get("initialized"), bool)
    ):
        log.debug("a session record of the wrong shape was taken for none")
        return None
    return record


def apply(session: Session, record: Record) -> bool:
    """The record's state into a replica's copy of the session (what another replica may have
    changed since); True when the subscriptions changed (a watch must follow)."""
    session.version = record["version"]
    session.client_info = record["client_info"]
    session.client_capabilities = record["client_capabilities"]
    session.log_level = record["log_level"]
    session.initialized = record["initialized"]
    subscribed = set(record["subscribed"])
    if subscribed == session.subscribed:
        return False
    session.subscribed = subscribed
    return True
