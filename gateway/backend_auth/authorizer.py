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
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from gateway.backend_auth import grants, store, wire
from gateway.backend_auth.desk import LoginDesk, LoginRequired
from gateway.backend_auth.discovery import DiscoveryFailed, ServerInfo, discover
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.fetch import FetchFailed, OAuthHttp
from gateway.backend_auth.grants import Client, GrantFailed
from gateway.backend_auth.redirect import RedirectListener, open_browser
from gateway.backend_auth.shared import Record, SharedStore, StoreUnavailable
from gateway.backend_auth.tokens import Token
from gateway.config import BackendAuth

log = logging.getLogger("gateway.backend_auth")

Opener = Callable[[str], Awaitable[None]]
# After a login refused in the browser (error=access_denied, say), no other is started for this
# long: the requests that arrive meanwhile fail at once instead of opening the browser again.
LOGIN_PAUSE = 30.0
# How a dynamically registered client is named in the store's key.
REGISTERED = "registered"
# A refresh in a cluster holds the store's lock of its token at most this long: one token
# request (10 s at most, backend_auth/setup.py) and a discovery before it, with room to spare. A
# replica that dies holding it costs the others this much at most.
REFRESH_LOCK = 30.0
# While another replica holds that lock, this one looks at the store this often for the token
# it is getting (a Redis GET; the bus is at most once, so the store is what is waited on).
LOCK_POLL = 0.05


@dataclass(frozen=True)
class Caller:
    """Whose token: "" for the gateway's own; for token exchange, the caller's identity key and
    the token it presented."""

    user: str = ""
    subject_token: str | None = field(default=None, repr=False)
    who: tuple[str | None, str] | None = None  # (issuer, subject), for a per-user login link


GATEWAY = Caller()


class Authorizer:
    def __init__(
        self,
        name: str,
        url: str,
        config: BackendAuth,
        http: OAuthHttp,
        token_store: store.TokenStore | None,
        wait_bound: float,
        opener: Opener = open_browser,
    ) -> None:
        self.name = name
        self._url = url
        self._config = config
        self._http = http
        self._store = token_store if config.store else None
        # The replicas' shared store (cluster.redis), which then keeps the tokens instead.
        self._shared: SharedStore | None = None
        self._wait_bound = wait_bound
        self._opener = opener
        self._private_key = _read_key(config.private_key_file)
        self._tokens: dict[str, Token] = {}
        self._asked: dict[str, tuple[str, ...]] = {}
        self._loaded: set[str] = set()
        self._info: ServerInfo | None = None
        self._registered: Client | None = None
        self._renewals: dict[str, asyncio.Task[Token]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._paused_until = 0.0  # no browser login before this (one was refused)
        # The issuer a configured client was first used with (from the store across restarts).
        self._bound_issuer: str | None = config.authorization_server
        # Told of each token request (grant, outcome) for the metrics; set by the transport.
        self.on_token: Callable[[str, str], None] | None = None
        # Where callers log in (per_user): the gateway's HTTP listener, set by the app.
        self._desk_: LoginDesk | None = None

    @property
    def desk(self) -> LoginDesk | None:
        return self._desk_

    @desk.setter
    def desk(self, desk: LoginDesk | None) -> None:
        # The desk finishes this backend's logins by its name, on whichever replica a link is
        # opened or called back.
        self._desk_ = desk
        if desk is not None:
            desk.add(self)

    def share(self, shared: SharedStore) -> None:
        """Keep this backend's logins in the cluster's shared store instead of the file store
        (`store: false` still keeps nothing)."""
        if self._config.store:
            self._shared = shared

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
        endpoint = _required(info, "token_endpoint")
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
            endpoint = _required(info, "token_endpoint")
            return await self._request(endpoint, client, form, old.scope, old)
        except (DiscoveryFailed, GrantFailed, FetchFailed, AuthFailed) as exc:
            log.info("backend %s: refresh failed (%s); a new grant follows", self.name, exc)
            return None

    async def _server(self, challenge: wire.Challenge | None) -> ServerInfo:
        """The authorization server: discovered again when a challenge arrives (the backend may
        have moved to another), else the one known."""
        if self._info is not None and challenge is None:
            return self._info
        info = await discover(self._http, self._url, challenge, self._config.authorization_server)
        bound = self._bound_issuer
        if self._config.client_id is not None and bound is not None and info.issuer != bound:
            # client-registration, Authorization Server Binding: configured credentials belong
            # to the server they were first used with, and are never sent to another.
            raise AuthFailed(
                f"its authorization server is now {info.issuer}, not {bound}, which the "
                "configured client belongs to; set auth.authorization_server and the client of "
                "the new server (or `auth logout` this backend)"
            )
        if self._info is not None and self._info.issuer != info.issuer:
            log.warning(
                "backend %s: authorization server changed from %s to %s",
                self.name,
                self._info.issuer,
                info.issuer,
            )
        self._info = info
        return info

    async def _request(
        self,
        endpoint: str,
        client: Client,
        form: dict[str, str],
        asked: tuple[str, ...] | None,
        previous: Token | None = None,
    ) -> Token:
        """A token request, counted by grant and outcome."""
        outcome = "unreachable"
        try:
            token = await grants.request_token(self._http, endpoint, client, form, asked, previous)
            outcome = "ok"
            return token
        except GrantFailed:
            outcome = "refused"
            raise
        finally:
            if self.on_token is not None:
                self.on_token(form["grant_type"].rsplit(":", 1)[-1], outcome)

    # --- who the gateway is at the authorization server ------------------------------------

    def _configured_client(self, info: ServerInfo) -> Client:
        config = self._config
        assert config.client_id is not None
        method = config.token_endpoint_auth_method or _method(
            info.strings("token_endpoint_auth_methods_supported"),
            config.client_secret is not None,
            self._private_key is not None,
        )
        return Client(
            client_id=config.client_id,
            issuer=info.issuer,
            method=method,
            client_secret=config.client_secret,
            private_key=self._private_key,
            algorithm=config.signing_algorithm,
            key_id=config.key_id,
        )

    async def _client(self, info: ServerInfo, redirect_uri: str | None) -> Client:
        """client-registration's order: pre-registered, a Client ID Metadata Document where the
        server supports one, else dynamic registration (again for a new issuer, or a new
        redirect URI)."""
        config = self._config
        if config.client_id is not None:
            return self._configured_client(info)
        if config.client_metadata_url and info.supports_cimd:
            return Client(client_id=config.client_metadata_url, issuer=info.issuer)
        known = self._registered
        if (
            known is not None
            and known.issuer == info.issuer
            and (redirect_uri is None or known.redirect_uri == redirect_uri)
        ):
            return known
        endpoint = info.endpoint("registration_endpoint")
        if endpoint is None:
            raise AuthFailed(
                f"its authorization server {info.issuer} offers no "
                "registration; configure auth.client_id (or client_metadata_url)"
            )
        if redirect_uri is None:
            raise AuthFailed(f"no registration for {info.issuer}")
        shared = self._shared
        name = f"{info.issuer}\0{redirect_uri}"
        if shared is not None:
            # One registration for the cluster (per issuer and redirect URI): a flow started
            # by one replica is redeemed, and its token refreshed, by others, as this client.
            found = Client.from_record(await shared.load_registration(self._url, name))
            if found is not None:
                self._registered = found
                return found
        registered = await grants.register(
            self._http,
            endpoint,
            info.issuer,
            config.client_name,
            redirect_uri,
            info.strings("token_endpoint_auth_methods_supported"),
            config.scopes,
        )
        if shared is not None and not await shared.save_registration(
            self._url, name, registered.as_record()
        ):
            # Another replica registered at the same moment: its registration is the one kept.
            winner = Client.from_record(await shared.load_registration(self._url, name))
            registered = winner or registered
        self._registered = registered
        return registered

    # --- the authorization code flow ------------------------------------------------------

    async def _login(self, info: ServerInfo, scopes: tuple[str, ...]) -> Token:
        """The authorization code flow in the browser of whoever runs the gateway, with the
        redirect to a loopback listener of its own (RFC 8252 7.3)."""
        if time.time() < self._paused_until:
            raise AuthFailed(
                f"the last login was refused in the browser; another is "
                f"offered {LOGIN_PAUSE:g}s after it (or log in again with `connect`/a restart)"
            )
        state = secrets.token_urlsafe(32)
        proof = wire.pkce()
        listener = RedirectListener(state)
        await self._listen(listener)
        try:
            url, context = await self.begin_login("", listener.redirect_uri, state, proof, scopes)
            log.warning("backend %s needs a login: open %s", self.name, url)
            if self._config.open_browser:
                self._spawn(self._opener(url))
            with anyio.fail_after(self._config.login_timeout):
                answer = await listener.wait()
        finally:
            await listener.close()
        if "error" in answer:
            # A person said no: every request would open the browser again at once otherwise.
            self._paused_until = time.time() + LOGIN_PAUSE
        return await self._redeem(context, proof, answer)

    async def _operator_login(self, scopes: tuple[str, ...]) -> Token:
        """Under per_user, the gateway's own login (its requests: discovery, the catalog) goes
        through the same link and callback as the callers', logged for the operator."""
        desk = self._desk()
        login = await desk.open(self, "", scopes, self._config.login_timeout)
        log.warning(
            "backend %s needs the operator's login (for the gateway's own requests: discovery "
            "and the catalog): open %s",
            self.name,
            desk.link(login),
        )
        with anyio.fail_after(self._config.login_timeout):
            await login.done.wait()
        if login.failure is None and self._shared is not None:
            # (finished by another replica, maybe: its token is in the store)
            await self._load("")
        token = self._tokens.get("")
        if login.failure is not None or token is None:
            raise AuthFailed(f"the login failed ({login.failure})")
        return token

    def _desk(self) -> LoginDesk:
        if self.desk is None:
            raise AuthFailed("per-user logins need the HTTP listener")
        return self.desk

    async def _login_required(
        self, caller: Caller, challenged: tuple[str, ...] | None
    ) -> LoginRequired:
        desk = self._desk()
        scopes = tuple(challenged or ())
        if challenged is not None:
            previous = self._asked.get(caller.user, ())
            scopes = previous + tuple(s for s in challenged if s not in previous)
        lifetime = self._config.login_timeout
        who = caller.who or ("", caller.user)
        login = await desk.open(self, caller.user, scopes, lifetime, who)
        return LoginRequired(self.name, desk.link(login), login.id)

    async def begin_login(
        self, user: str, redirect_uri: str, state: str, proof: wire.Pkce, scopes: tuple[str, ...]
    ) -> tuple[str, Record]:
        """The authorization URL of one flow, and what its redemption needs (a JSON-able
        record: in a cluster, another replica may redeem it)."""
        info = await self._server(None)
        methods = info.strings("code_challenge_methods_supported") or []
        if "S256" not in methods:
            # basic/authorization/security-considerations: no advertised PKCE, no login.
            raise AuthFailed(
                f"authorization server {info.issuer} does not advertise "
                "PKCE (S256); refusing to log in"
            )
        if user:
            # A caller's login (the desk's): its scopes are chosen here, where the server's
            # metadata is known; the gateway's own were chosen by `_obtain`.
            scopes = wire.select_scopes(
                scopes or None,
                info.scopes_supported,
                self._config.scopes,
                info.strings("scopes_supported"),
                self._asked.get(user, ()) if scopes else (),
            )
        authorize = _required(info, "authorization_endpoint")
        client = await self._client(info, redirect_uri)
        params = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": redirect_uri,
            "state": state,
            "code_challenge": proof.challenge,
            "code_challenge_method": "S256",
            "resource": info.resource,
            **grants.scope_param(scopes),
        }
        context = {
            "user": user,
            "info": _info_record(info),
            "client": client.as_record(),
            "redirect_uri": redirect_uri,
            "scopes": list(scopes),
        }
        return wire.with_query(authorize, params), context

    async def finish_login(self, user: str, context: Any, answer: dict[str, str]) -> None:
        """A per-user flow's redirect: the caller's token, kept for them."""
        flow, proof = context
        if not isinstance(flow, dict):
            raise AuthFailed("the login's record is incomplete")
        try:
            token = await self._redeem(flow, proof, answer)
        except (GrantFailed, FetchFailed, DiscoveryFailed, StoreUnavailable) as exc:
            raise AuthFailed(f"{exc}") from None
        self._tokens[user] = token
        if not await self._save(user, token):
            # The caller's next request may reach any replica: a login only this one knows of
            # is not one.
            raise AuthFailed("the login could not be kept for the other replicas")

    async def _redeem(self, context: Record, proof: wire.Pkce, answer: dict[str, str]) -> Token:
        user = str(context.get("user") or "")
        info = _info_from(context.get("info"))
        redirect_uri = str(context.get("redirect_uri"))
        scopes = tuple(str(s) for s in context.get("scopes") or ())
        # A configured client from the config (its key is never in a record); any other from
        # the record the flow began with.
        found = Client.from_record(context.get("client"))
        client = self._configured_client(info) if self._config.client_id else found
        if client is None:
            raise AuthFailed("the login's client is unknown")
        if not self._config.client_id and client.client_id != self._config.client_metadata_url:
            # A registration, maybe made by another replica: the token is this client's, and
            # so is its refresh.
            self._registered = client
        # RFC 9207 before anything else in the answer is acted on, errors included.
        if (why := wire.iss_problem(info.sends_iss, answer.get("iss"), info.issuer)) is not None:
            raise AuthFailed(f"{why}; login refused")
        if "error" in answer:
            raise AuthFailed(f"the login was refused: {answer['error']}")
        code = answer.get("code")
        if not code:
            raise AuthFailed("the login answer carries no code")
        form = grants.authorization_code(code, proof.verifier, redirect_uri, info.resource)
        endpoint = _required(info, "token_endpoint")
        token = await self._request(endpoint, client, form, scopes or None)
        self._asked[user] = scopes
        return token

    async def _listen(self, listener: RedirectListener) -> None:
        """The configured port, else the port of the registered redirect URI (so a registration
        stays usable), else any free one."""
        port = self._config.redirect_port
        if not port and self._registered is not None and self._registered.redirect_uri:
            port = wire.port_of(self._registered.redirect_uri)
        try:
            await listener.start(port)
        except OSError as exc:
            if self._config.redirect_port:
                raise AuthFailed(
                    f"cannot listen on 127.0.0.1:{port} for the login redirect: {exc.strerror}"
                ) from None
            await listener.start(0)

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- the store ------------------------------------------------------------------------

    def _key(self, user: str) -> store.Key:
        config = self._config
        client = config.client_id or config.client_metadata_url or REGISTERED
        return store.Key(self._url, f"{config.type}:{client}", user)

    async def _load(self, user: str) -> None:
        """The stored login of `user`: from the file store once; in a cluster, from the shared
        store whenever this replica holds no usable token (another may have one)."""
        if self._shared is not None:
            held = self._tokens.get(user)
            if held is None or not held.usable(time.time(), self._config.refresh_margin):
                try:
                    self._adopt(user, await self._shared.load(self._key(user)))
                except StoreUnavailable as exc:
                    raise AuthFailed(f"{exc}") from None
            return
        if user in self._loaded:
            return
        self._loaded.add(user)
        if self._store is None:
            return
        self._adopt(user, self._store.load(self._key(user)))

    async def _newer_stored(self, user: str, old: Token | None) -> Token | None:
        """In a cluster: the shared store's token of `user` when it is usable and not `old`
        (another replica logged in or renewed meanwhile), else None."""
        if self._shared is None:
            return None
        return self._newer(user, await self._shared.load(self._key(user)), old)

    def _newer(self, user: str, record: Record | None, old: Token | None) -> Token | None:
        token = Token.from_record(record.get("token")) if record is not None else None
        if token is None or not token.usable(time.time(), self._config.refresh_margin):
            return None
        if old is not None and token.access_token == old.access_token:
            return None
        self._adopt(user, record)
        return token

    def _adopt(self, user: str, record: Record | None) -> None:
        if record is None:
            return
        token = Token.from_record(record.get("token"))
        if token is not None:
            if self._shared is not None:
                # (the store's is the newest: this replica's copy was missing or spent)
                self._tokens[user] = token
                if token.scope is not None:
                    self._asked.setdefault(user, token.scope)
            else:
                self._tokens.setdefault(user, token)
        issuer = record.get("issuer")
        if self._bound_issuer is None and self._config.client_id and isinstance(issuer, str):
            self._bound_issuer = issuer
        registered = Client.from_record(record.get("registration"))
        if registered is not None and (self._registered is None or self._shared is not None):
            # (in a cluster, the client this token was issued to: its refresh needs that one)
            self._registered = registered

    async def _save(self, user: str, token: Token) -> bool:
        """Keep the token (False: the shared store could not, which is logged)."""
        if self._bound_issuer is None and self._config.client_id and self._info is not None:
            self._bound_issuer = self._info.issuer
        if self._store is None and self._shared is None:
            return True
        record: dict[str, Any] = {
            "backend": self.name,
            "issuer": self._info.issuer if self._info is not None else None,
            "token": token.as_record(),
            "registration": self._registered.as_record() if self._registered else None,
            "saved_at": time.time(),
        }
        if self._shared is not None:
            try:
                await self._shared.save(self._key(user), record)
            except StoreUnavailable as exc:
                log.warning("backend %s: token not kept for the other replicas: %s", self.name, exc)
                return False
            return True
        assert self._store is not None
        try:
            await anyio.to_thread.run_sync(self._store.save, self._key(user), record)
        except OSError as exc:
            log.warning("backend %s: token not stored: %s", self.name, exc.strerror)
        return True

    async def close(self) -> None:
        for task in [*self._renewals.values(), *self._background]:
            task.cancel()
        await self._http.close()


def _info_record(info: ServerInfo) -> Record:
    return {
        "resource": info.resource,
        "issuer": info.issuer,
        "metadata": info.metadata,
        "scopes_supported": info.scopes_supported,
    }


def _info_from(record: Any) -> ServerInfo:
    """The authorization server a flow began with (a record the replicas sealed themselves)."""
    if not isinstance(record, dict) or not isinstance(record.get("metadata"), dict):
        raise AuthFailed("the login's authorization server is unknown")
    scopes = record.get("scopes_supported")
    return ServerInfo(
        resource=str(record.get("resource")),
        issuer=str(record.get("issuer")),
        metadata=record["metadata"],
        scopes_supported=[str(s) for s in scopes] if isinstance(scopes, list) else None,
    )


def _required(info: ServerInfo, name: str) -> str:
    value = info.endpoint(name)
    if value is None:
        raise DiscoveryFailed(f"the metadata of {info.issuer} has no {name}")
    return value


def _method(offered: list[str] | None, secret: bool, key: bool) -> str:
    """The token endpoint authentication for a configured client, from what it holds and what
    the server offers (RFC 8414: client_secret_basic when the server says nothing)."""
    if key:
        return "private_key_jwt"
    if not secret:
        return "none"
    if offered is None or "client_secret_basic" in offered:
        return "client_secret_basic"
    return "client_secret_post" if "client_secret_post" in offered else "client_secret_basic"


def _read_key(path: str | None) -> str | None:
    return Path(path).read_text() if path else None
