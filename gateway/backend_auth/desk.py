"""Logins of individual callers (`per_user: true`), served by the gateway's HTTP listener.

A caller without a token for a per-user backend is sent (by URL-mode elicitation) to
`{base}/oauth/login?id=...`, a link bound to that caller and that backend, good for one
login within `login_timeout`. Opening it starts the authorization-code flow with PKCE, whose
redirect comes back to `{base}/oauth/callback`; the token is then the caller's, and their
next request goes through. A link names no user and carries nothing secret; the `state` of each
flow is used once (client/elicitation, Safe URL Handling; basic/authorization).

The logins in progress are records in a `LoginBook`: the desk's memory (`MemoryLogins`), or,
in a cluster (`cluster.redis`), the replicas' shared store, so that a link made by one replica,
opened at another and called back at a third completes. Everything a flow needs to finish (its
PKCE verifier, the authorization server's metadata, the client) is in its record; the replica
that finishes a login tells the others (`announce`), so one that waits for it (the operator's
login) stops waiting."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

from gateway.backend_auth import wire
from gateway.backend_auth.caller_check import CallerCheck, CheckFailed
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.seam import CALLBACK_PATH, LOGIN_PATH, DeskError
from gateway.backend_auth.shared import LoginBook, Record, StoreUnavailable

log = logging.getLogger("gateway.backend_auth")

# The page's word when the logins in progress cannot be read (the cluster's Redis is away).
UNAVAILABLE = "Logins are unavailable right now; try the link again in a moment."

# Told when a login ends (its id's digest, and why it failed or None), for the other replicas.
Announce = Callable[[str, str | None], Awaitable[None]]


class Party(Protocol):
    """The authorizer of one backend, as the desk uses it. Its login context is a JSON-able
    record (it may be finished by another replica)."""

    name: str

    async def begin_login(
        self, user: str, redirect_uri: str, state: str, proof: wire.Pkce, scopes: tuple[str, ...]
    ) -> tuple[str, Record]: ...

    async def finish_login(self, user: str, context: Any, answer: dict[str, str]) -> None: ...


@dataclass
class Pending:
    """A login as the replica that opened (or waits for) it sees it."""

    id: str
    party: Party
    user: str
    expires_at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None


class MemoryLogins:
    """`LoginBook` in this process's memory (one replica): entries expire on the desk's
    clock, swept whenever one is looked up or added."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._logins: dict[str, tuple[float, Record]] = {}
        self._callers: dict[str, tuple[float, str]] = {}
        self._flows: dict[str, tuple[float, Record]] = {}

    def _sweep(self) -> None:
        now = self._clock()
        for table in (self._logins, self._callers, self._flows):
            for name in [n for n, (until, _) in table.items() if until <= now]:
                del table[name]

    async def open_login(
        self, caller: str, login_id: str, record: Record, ttl: float
    ) -> tuple[str, Record]:
        self._sweep()
        held = self._callers.get(caller)
        if held is not None and held[1] in self._logins:
            return held[1], self._logins[held[1]][1]
        until = self._clock() + ttl
        self._logins[login_id] = (until, record)
        self._callers[caller] = (until, login_id)
        return login_id, record

    async def get_login(self, login_id: str) -> Record | None:
        self._sweep()
        found = self._logins.get(login_id)
        return found[1] if found is not None else None

    async def put_login(self, login_id: str, record: Record) -> None:
        found = self._logins.get(login_id)
        if found is not None:
            self._logins[login_id] = (found[0], record)

    async def end_login(self, login_id: str, caller: str) -> None:
        self._logins.pop(login_id, None)
        held = self._callers.get(caller)
        if held is not None and held[1] == login_id:
            del self._callers[caller]

    async def put_flow(self, flow: str, record: Record, ttl: float) -> None:
        self._sweep()
        self._flows[flow] = (self._clock() + ttl, record)

    async def take_flow(self, flow: str) -> Record | None:
        self._sweep()
        found = self._flows.pop(flow, None)
        return found[1] if found is not None else None

    async def drop_flow(self, flow: str) -> None:
        self._flows.pop(flow, None)


class LoginDesk:
    def __init__(
        self,
        base: str,
        check: CallerCheck | None = None,
        clock: Callable[[], float] = time.time,
        book: LoginBook | None = None,
    ) -> None:
        self.base = base.rstrip("/")
        self._check = check
        self._clock = clock
        self._book: LoginBook = book if book is not None else MemoryLogins(clock)
        self._parties: dict[str, Party] = {}
        self._waiting: dict[str, Pending] = {}  # by login id: the logins this replica awaits
        # Tells the other replicas that a login ended (set by the app with cluster.redis).
        self.announce: Announce | None = None

    @property
    def redirect_uri(self) -> str:
        return self.base + CALLBACK_PATH

    def link(self, login: Pending) -> str:
        return f"{self.base}{LOGIN_PATH}?{urlencode({'id': login.id})}"

    def add(self, party: Party) -> None:
        """A backend whose logins this desk serves, by name (a reloaded backend replaces the
        one of its name: a link made for it is finished by the new one)."""
        self._parties[party.name] = party

    async def open(
        self,
        party: Party,
        user: str,
        scopes: tuple[str, ...],
        lifetime: float,
        who: tuple[str | None, str] | None = None,
    ) -> Pending:
        """The caller's login to this backend: the one already open (on any replica of a
        cluster), else a new one. AuthFailed when the logins in progress cannot be read."""
        self._sweep()
        self.add(party)
        record: Record = {
            "backend": party.name,
            "user": user,
            "scopes": list(scopes),
            "expires_at": self._clock() + lifetime,
            "who": list(who) if who is not None else None,  # the caller; None: the operator
            "checked": False,  # the browser's user was shown to be `who`
            "flow": None,  # the digest of the state of its one flow at a time
        }
        try:
            login_id, held = await self._book.open_login(
                _caller(party.name, user), secrets.token_urlsafe(24), record, lifetime
            )
        except StoreUnavailable as exc:
            raise AuthFailed(f"no login link can be made now: {exc}") from None
        found = self._waiting.get(login_id)
        if found is None:
            expires = held.get("expires_at")
            until = float(expires) if isinstance(expires, int | float) else record["expires_at"]
            found = Pending(login_id, party, user, until)
            self._waiting[login_id] = found
        return found

    async def begin(self, login_id: str) -> str:
        """Where the browser goes for a login link: first the sign-in that shows who is at the
        browser (a caller's link), then the backend's authorization server."""
        record = await self._login(login_id)
        party = self._parties.get(str(record.get("backend"))) if record is not None else None
        expires = float(record.get("expires_at") or 0) if record is not None else 0.0
        if record is None or party is None or expires <= self._clock():
            raise DeskError(404, "This login link is unknown, used or expired; ask again.")
        state = secrets.token_urlsafe(32)
        proof = wire.pkce()
        flow: Record = {"login": login_id, "verifier": proof.verifier}
        user = str(record.get("user") or "")
        if record.get("who") is not None and not record.get("checked"):
            if self._check is None:
                raise DeskError(500, "Per-user logins are not set up on this gateway.")
            try:
                url = await self._check.authorization_url(state, proof, self.redirect_uri)
            except CheckFailed as exc:
                raise DeskError(502, f"Sign-in unavailable: {exc}") from None
            flow["checking"] = True
        else:
            scopes = tuple(str(s) for s in record.get("scopes") or ())
            try:
                url, context = await party.begin_login(
                    user, self.redirect_uri, state, proof, scopes
                )
            except AuthFailed as exc:
                log.warning("backend %s: a login could not start: %s", party.name, exc)
                raise DeskError(
                    502, "The backend's authorization server cannot be used now."
                ) from None
            except StoreUnavailable as exc:  # (the cluster's registration)
                log.warning("backend %s: a login could not start: %s", party.name, exc)
                raise DeskError(503, UNAVAILABLE) from None
            flow["context"] = context
        # One flow per link at a time (reloads do not pile up): the older one is dropped, and
        # a redirect of it would find its state no longer the login's anyway.
        previous, record["flow"] = record.get("flow"), _digest(state)
        left = expires - self._clock()
        try:
            await self._book.put_login(login_id, record)
            await self._book.put_flow(_digest(state), flow, max(left, 1.0))
            if isinstance(previous, str):
                await self._book.drop_flow(previous)
        except StoreUnavailable as exc:
            log.warning("a login could not start: %s", exc)
            raise DeskError(503, UNAVAILABLE) from None
        return url

    async def complete(self, answer: dict[str, str]) -> tuple[str | None, str]:
        """The redirect back from a sign-in or a login: where the browser goes next (None: it
        is done) and what to tell it. A `state` is taken once (on whichever replica it comes
        back to), so a replayed or forged redirect changes nothing."""
        state = answer.get("state") or ""
        try:
            flow = await self._book.take_flow(_digest(state)) if state else None
        except StoreUnavailable as exc:
            log.warning("a login redirect could not be served: %s", exc)
            raise DeskError(503, UNAVAILABLE) from None
        if flow is None:
            raise DeskError(400, "This login is unknown or already finished.")
        login_id = str(flow.get("login"))
        record = await self._login(login_id)
        if record is None or float(record.get("expires_at") or 0) <= self._clock():
            raise DeskError(400, "This login has expired; ask again.")
        party = self._parties.get(str(record.get("backend")))
        if record.get("flow") != _digest(state) or party is None:
            raise DeskError(400, "This login is unknown or already finished.")
        proof = wire.Pkce(str(flow.get("verifier")), "")
        if flow.get("checking"):
            assert self._check is not None
            try:
                who = await self._check.who(answer, proof, self.redirect_uri)
            except CheckFailed as exc:
                raise DeskError(400, f"Sign-in failed: {exc}") from None
            expected = record.get("who")
            if not isinstance(expected, list) or who != tuple(expected):
                await self._finish(login_id, record, "opened by another user")
                raise DeskError(403, "This link was made for another user; it is no longer valid.")
            record["checked"] = True
            try:
                await self._book.put_login(login_id, record)
            except StoreUnavailable as exc:
                log.warning("a sign-in could not be kept: %s", exc)
                raise DeskError(503, UNAVAILABLE) from None
            return await self.begin(login_id), "Signed in."
        user = str(record.get("user") or "")
        try:
            await party.finish_login(user, (flow.get("context"), proof), answer)
        except AuthFailed as exc:
            log.warning("backend %s: a login failed: %s", party.name, exc)
            raise DeskError(400, "The login did not succeed; ask for a new link.") from None
        await self._finish(login_id, record, None)
        return None, f"You are logged in to {party.name}. You can close this window."

    async def heard(self, digest: str, failure: str | None) -> None:
        """Another replica ended a login (`digest` of its id): whoever waits for it here stops."""
        for login_id in [i for i in self._waiting if _digest(i) == digest]:
            self._done(login_id, failure)

    async def close(self) -> None:
        if self._check is not None:
            await self._check.close()

    async def _login(self, login_id: str) -> Record | None:
        try:
            return await self._book.get_login(login_id) if login_id else None
        except StoreUnavailable as exc:
            log.warning("a login link could not be served: %s", exc)
            raise DeskError(503, UNAVAILABLE) from None

    async def _finish(self, login_id: str, record: Record, failure: str | None) -> None:
        caller = _caller(str(record.get("backend")), str(record.get("user") or ""))
        try:
            await self._book.end_login(login_id, caller)
        except StoreUnavailable as exc:
            # (It expires by itself; its flow was taken already.)
            log.warning("a finished login could not be closed: %s", exc)
        self._done(login_id, failure)
        if self.announce is not None:
            await self.announce(_digest(login_id), failure)

    def _done(self, login_id: str, failure: str | None) -> None:
        login = self._waiting.pop(login_id, None)
        if login is not None:
            login.failure = failure
            login.done.set()

    def _sweep(self) -> None:
        now = self._clock()
        for login_id in [i for i, p in self._waiting.items() if p.expires_at <= now]:
            self._done(login_id, "expired")


def _caller(backend: str, user: str) -> str:
    return f"{backend}\0{user}"


def _digest(value: str) -> str:
    """What is said of a state or login id outside the store (the bus, a record): a digest."""
    return hashlib.sha256(value.encode()).hexdigest()[:32]
