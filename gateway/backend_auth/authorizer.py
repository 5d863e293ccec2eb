"""One backend's credentials: the token to send, and what to do when the backend refuses it.

The HTTP backend asks `authorization(caller)` before each request and calls `refused(...)` on
a 401 (or a 403 `insufficient_scope`); both run the renewal of a caller's token at most once at
a time (a second request joins the first's), as a task of its own, so a login that outlasts the
request that started it goes on, and the request fails after `wait_bound` with an error that
names the backend and what to do. Renewal tries the cheapest thing that can work: the refresh
token, then the grant of the configured type (a login in the browser, client credentials, or a
token exchange), discovering the authorization server again when a challenge came with it.

In a cluster (`cluster.redis`, `share`), the stored logins are the replicas' shared store: a
replica without a usable token for a caller looks there before anything else (another replica
may have logged the caller in, or renewed the token), a renewal takes the store's token when it
is another than the one refused, and a refresh runs under a short lock in the store, so two
replicas never both spend a refresh token the server rotates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import anyio

from gateway.backend_auth import grants, wire
from gateway.backend_auth.at_server import required_endpoint
from gateway.backend_auth.codeflow import CodeFlows
from gateway.backend_auth.discovery import DiscoveryFailed
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.fetch import FetchFailed
from gateway.backend_auth.grants import GrantFailed
from gateway.backend_auth.seam import GATEWAY, Caller
from gateway.backend_auth.shared import StoreUnavailable
from gateway.backend_auth.state import Opener
from gateway.backend_auth.tokens import Token

log = logging.getLogger("gateway.backend_auth")

# A refresh in a cluster holds the store's lock of its token at most this long: one token
# request (10 s at most, backend_auth/setup.py) and a discovery before it, with room to spare. A
# replica that dies holding it costs the others this much at most.
REFRESH_LOCK = 30.0
# While another replica holds that lock, this one looks at the store this often for the token
# it is getting (a Redis GET; the bus is at most once, so the store is what is waited on).
LOCK_POLL = 0.05


class Authorizer(CodeFlows):
    """One backend's credentials (this module's docstring), built up from what is held and
    kept (backend_auth/state.py), the authorization server and the gateway's client there
    (at_server.py) and the logins (codeflow.py): this class adds the token loop."""

    @property
    def max_attempts(self) -> int:
        return self._config.max_attempts

    @property
    def per_caller(self) -> bool:
        """Whether each caller has a token of their own (token exchange, per-user logins)."""
        return self._config.type == "token_exchange" or self._config.per_user

    @property
    def per_user(self) -> bool:
        return self._config.per_user

    # --- what the HTTP backend asks -------------------------------------------------------

    async def authorization(self, caller: Caller) -> str | None:
        """The Authorization header to send: the current token, renewed first when it is about
        to expire; None for a login type before any login (the server's 401 starts one)."""
        await self._load(caller.user)
        token = self._tokens.get(caller.user)
        if token is not None and token.usable(time.time(), self._config.refresh_margin):
            return f"Bearer {token.access_token}"
        if token is None and self._config.type == "oauth":
            if self._config.per_user and caller.user:
                raise await self._login_required(caller, None)
            return None
        token = await self._join(caller, None, step_up=False)
        return f"Bearer {token.access_token}"

    async def refused(
        self, caller: Caller, status: int, challenges: list[str], sent: str | None
    ) -> None:
        """The backend refused `sent` (401, or 403 with `insufficient_scope`): a new token for
        the caller, or AuthFailed."""
        challenge = wire.parse_challenge(challenges)
        current = self._tokens.get(caller.user)
        if current is not None and sent != f"Bearer {current.access_token}":
            return  # another request has renewed it meanwhile: try that one
        if status == 403:
            if challenge is None or challenge.error != "insufficient_scope":
                raise AuthFailed("refused the gateway's token (HTTP 403)")
            held = set(self._asked.get(caller.user, ()))
            if current is not None and set(challenge.scope or ()) <= held:
                # The token already carries what is asked for: another login cannot help.
                raise AuthFailed(
                    f"refuses the gateway's token although it carries the "
                    f"scopes it asks for ({' '.join(challenge.scope or ()) or 'none named'})"
                )
            await self._join(caller, challenge, step_up=True)
            return
        self._tokens.pop(caller.user, None)
        await self._join(caller, challenge, step_up=False, refresh_from=current)

    # --- one renewal at a time per caller --------------------------------------------------

    async def _join(
        self,
        caller: Caller,
        challenge: wire.Challenge | None,
        *,
        step_up: bool,
        refresh_from: Token | None = None,
    ) -> Token:
        task = self._renewals.get(caller.user)
        if task is None or task.done():
            old = refresh_from or self._tokens.get(caller.user)
            task = asyncio.get_running_loop().create_task(
                self._renew(caller, challenge, step_up, old)
            )
            self._renewals[caller.user] = task
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            return await asyncio.wait_for(asyncio.shield(task), self._wait_bound)
        except TimeoutError:
            if self._config.type == "oauth":
                why = "needs a login: open the login URL in the gateway's log, then retry"
            else:
                why = "its authorization server has not issued a token yet"
            raise AuthFailed(f"{why} (waited {self._wait_bound:g}s; it goes on)") from None

    async def _renew(
        self,
        caller: Caller,
        challenge: wire.Challenge | None,
        step_up: bool,
        old: Token | None,
    ) -> Token:
        try:
            stored = None if step_up else await self._newer_stored(caller.user, old)
            token = stored or await self._obtain(caller, challenge, step_up, old)
        except (DiscoveryFailed, GrantFailed, FetchFailed, StoreUnavailable) as exc:
            raise AuthFailed(f"{exc}") from None
        except TimeoutError:
            raise AuthFailed("the login was not completed in time") from None
        self._tokens[caller.user] = token
        await self._save(caller.user, token)
        return token

    async def _obtain(
        self,
        caller: Caller,
        challenge: wire.Challenge | None,
        step_up: bool,
        old: Token | None,
    ) -> Token:
        config = self._config
        moved = False
        if challenge is not None:
            # A refusal with a challenge: the backend may have moved to another authorization
            # server (client-registration, Authorization Server Binding), so look again first.
            before = self._info.issuer if self._info is not None else None
            info = await self._server(challenge)
            moved = before is not None and before != info.issuer
        if old is not None and old.refresh_token and not step_up and not moved:
            refreshed = await self._refresh_once(caller.user, old)
            if refreshed is not None:
                return refreshed
        if config.per_user and caller.user:
            # A caller's own login happens in their browser, through a link they are given.
            raise await self._login_required(caller, challenge.scope if challenge else None)
        info = await self._server(None)
        previous = self._asked.get(caller.user, ()) if step_up else ()
        scopes = wire.select_scopes(
            challenge.scope if challenge is not None else None,
            info.scopes_supported,
            config.scopes,
            info.strings("scopes_supported"),
            previous,
        )
        self._asked[caller.user] = scopes
        endpoint = required_endpoint(info, "token_endpoint")
        exchanging = config.type == "token_exchange" and caller.user != ""
        if exchanging and not caller.subject_token:
            raise AuthFailed(
                "takes the caller's token in exchange, and this caller "
                "presented none (an API key or the stdio identity cannot be exchanged)"
            )
        if not exchanging and config.type != "oauth":
            # client_credentials; and under token_exchange the gateway's own requests, which
            # have no caller (discovery, the catalog), go as the gateway's client itself.
            client = self._configured_client(info)
            form = grants.client_credentials(info.resource, scopes)
            return await self._request(endpoint, client, form, scopes or None)
        if exchanging:
            client = self._configured_client(info)
            form = grants.token_exchange(
                caller.subject_token or "",
                config.subject_token_type,
                info.resource,
                config.audience,
                scopes,
            )
            return await self._request(endpoint, client, form, scopes or None)
        if config.per_user:
            return await self._operator_login(scopes)
        return await self._login(info, scopes)

    async def _refresh_once(self, user: str, old: Token) -> Token | None:
        """`_refresh`, by one replica of a cluster at a time: under the store's lock of this
        token, after another look at the store (a replica may have just refreshed it); while
        another replica holds the lock, its result is waited for in the store. None: no
        refresh (then a new grant is tried)."""
        shared = self._shared
        if shared is None:
            return await self._refresh(old)
        key = self._key(user)
        with anyio.move_on_after(REFRESH_LOCK):
            while True:
                held = await shared.lock(key, REFRESH_LOCK)
                if held is not None:
                    try:
                        record = await shared.load(key)
                        if record is None:
                            # Every login of a cluster is stored: none stored is `auth logout`
                            # (or a Redis that lost its data), and this replica's copy of the
                            # refresh token must not bring it back.
                            log.info("backend %s: the login is no longer stored", self.name)
                            return None
                        token = self._newer(user, record, old)
                        if token is None:
                            token = await self._refresh(old)
                            if token is not None:
                                # Stored before the lock goes, so whoever waits finds it.
                                await self._save(user, token)
                        return token
                    finally:
                        with anyio.CancelScope(shield=True), contextlib.suppress(StoreUnavailable):
                            await shared.unlock(key, held)  # (else it expires by itself)
                token = await self._newer_stored(user, old)
                if token is not None:
                    return token
                await anyio.sleep(LOCK_POLL)
        return None

    async def _refresh(self, old: Token) -> Token | None:
        """A new token from the refresh token, or None (then a new grant is tried)."""
        try:
            info = self._info or await self._server(None)
            client = await self._client(info, None)
            form = grants.refresh(old.refresh_token or "", info.resource)
            endpoint = required_endpoint(info, "token_endpoint")
            return await self._request(endpoint, client, form, old.scope, old)
        except (DiscoveryFailed, GrantFailed, FetchFailed, AuthFailed) as exc:
            log.info("backend %s: refresh failed (%s); a new grant follows", self.name, exc)
            return None

    async def close(self) -> None:
        for task in [*self._renewals.values(), *self._background]:
            task.cancel()
        await self._http.close()


__all__ = ["GATEWAY", "Authorizer", "Caller", "Opener"]
