"""Logins of individual callers (`per_user: true`), served by the gateway's HTTP listener.

A caller without a token for a per-user backend is sent (by URL-mode elicitation) to
`{base}/oauth/login?id=...`, a link bound to that caller and that backend, good for one
login within `login_timeout`. Opening it starts the authorization-code flow with PKCE, whose
redirect comes back to `{base}/oauth/callback`; the token is then the caller's, and their
next request goes through. A link names no user and carries nothing secret; the `state` of each
flow is used once (client/elicitation, Safe URL Handling; basic/authorization)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

from gateway.oauth import wire
from gateway.oauth.caller_check import CallerCheck, CheckFailed
from gateway.oauth.failures import AuthFailed

log = logging.getLogger("gateway.oauth")

LOGIN_PATH = "/oauth/login"
CALLBACK_PATH = "/oauth/callback"


class DeskError(Exception):
    """A login link or redirect that cannot be served: a status and one line for the page."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class LoginRequired(Exception):
    """A caller must log in to a backend before their request can go: the link to give them."""

    def __init__(self, backend: str, url: str, login_id: str) -> None:
        super().__init__(
            f"Log in to {backend} to continue: open {url}, then retry (the gateway keeps your "
            "login for this backend)"
        )
        self.backend = backend
        self.url = url
        self.login_id = login_id


class Party(Protocol):
    """The authorizer of one backend, as the desk uses it."""

    name: str

    async def begin_login(
        self, user: str, redirect_uri: str, state: str, proof: wire.Pkce, scopes: tuple[str, ...]
    ) -> tuple[str, Any]: ...

    async def finish_login(self, user: str, context: Any, answer: dict[str, str]) -> None: ...


@dataclass
class Pending:
    id: str
    party: Party
    user: str
    scopes: tuple[str, ...]
    expires_at: float
    who: tuple[str | None, str] | None  # the caller's (issuer, subject); None: the operator
    done: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None
    checked: bool = False  # the browser's user was shown to be `who`


@dataclass
class _Flow:
    login: Pending
    proof: wire.Pkce
    context: Any
    checking: bool = False  # the sign-in that shows who is at the browser


class LoginDesk:
    def __init__(
        self, base: str, check: CallerCheck | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.base = base.rstrip("/")
        self._check = check
        self._clock = clock
        self._pending: dict[str, Pending] = {}
        self._by_caller: dict[tuple[int, str], Pending] = {}
        self._flows: dict[str, _Flow] = {}

    @property
    def redirect_uri(self) -> str:
        return self.base + CALLBACK_PATH

    def link(self, login: Pending) -> str:
        return f"{self.base}{LOGIN_PATH}?{urlencode({'id': login.id})}"

    def open(
        self,
        party: Party,
        user: str,
        scopes: tuple[str, ...],
        lifetime: float,
        who: tuple[str | None, str] | None = None,
    ) -> Pending:
        """The caller's login to this backend: the one already open, else a new one."""
        self._sweep()
        key = (id(party), user)
        found = self._by_caller.get(key)
        if found is not None and not found.done.is_set():
            return found
        expires = self._clock() + lifetime
        login = Pending(secrets.token_urlsafe(24), party, user, scopes, expires, who)
        self._pending[login.id] = login
        self._by_caller[key] = login
        return login

    async def begin(self, login_id: str) -> str:
        """Where the browser goes for a login link: first the sign-in that shows who is at the
        browser (a caller's link), then the backend's authorization server."""
        self._sweep()
        login = self._pending.get(login_id)
        if login is None or login.done.is_set():
            raise DeskError(404, "This login link is unknown, used or expired; ask again.")
        state = secrets.token_urlsafe(32)
        proof = wire.pkce()
        if login.who is not None and not login.checked:
            if self._check is None:
                raise DeskError(500, "Per-user logins are not set up on this gateway.")
            try:
                url = await self._check.authorization_url(state, proof, self.redirect_uri)
            except CheckFailed as exc:
                raise DeskError(502, f"Sign-in unavailable: {exc}") from None
            self._forget_flows(login)
            self._flows[state] = _Flow(login, proof, None, checking=True)
            return url
        try:
            url, context = await login.party.begin_login(
                login.user, self.redirect_uri, state, proof, login.scopes
            )
        except AuthFailed as exc:
            log.warning("backend %s: a login could not start: %s", login.party.name, exc)
            raise DeskError(502, "The backend's authorization server cannot be used now.") from None
        self._forget_flows(login)  # (one flow per link at a time: reloads do not pile up)
        self._flows[state] = _Flow(login, proof, context)
        return url

    async def complete(self, answer: dict[str, str]) -> tuple[str | None, str]:
        """The redirect back from a sign-in or a login: where the browser goes next (None: it
        is done) and what to tell it. A `state` is taken once, so a replayed or forged
        redirect changes nothing."""
        flow = self._flows.pop(answer.get("state") or "", None)
        if flow is None:
            raise DeskError(400, "This login is unknown or already finished.")
        login = flow.login
        if login.done.is_set() or login.expires_at <= self._clock():
            raise DeskError(400, "This login has expired; ask again.")
        if flow.checking:
            assert self._check is not None
            try:
                who = await self._check.who(answer, flow.proof, self.redirect_uri)
            except CheckFailed as exc:
                raise DeskError(400, f"Sign-in failed: {exc}") from None
            if who != login.who:
                self._finish(login, "opened by another user")
                raise DeskError(403, "This link was made for another user; it is no longer valid.")
            login.checked = True
            return await self.begin(login.id), "Signed in."
        try:
            await login.party.finish_login(login.user, (flow.context, flow.proof), answer)
        except AuthFailed as exc:
            log.warning("backend %s: a login failed: %s", login.party.name, exc)
            raise DeskError(400, "The login did not succeed; ask for a new link.") from None
        self._finish(login, None)
        return None, f"You are logged in to {login.party.name}. You can close this window."

    async def close(self) -> None:
        if self._check is not None:
            await self._check.close()

    def fail(self, login: Pending, why: str) -> None:
        self._finish(login, why)

    def _finish(self, login: Pending, failure: str | None) -> None:
        login.failure = failure
        login.done.set()
        self._pending.pop(login.id, None)
        if self._by_caller.get((id(login.party), login.user)) is login:
            del self._by_caller[(id(login.party), login.user)]
        self._forget_flows(login)

    def _forget_flows(self, login: Pending) -> None:
        for state in [s for s, f in self._flows.items() if f.login is login]:
            del self._flows[state]

    def _sweep(self) -> None:
        now = self._clock()
        for login in [p for p in self._pending.values() if p.expires_at <= now]:
            self._finish(login, "expired")
