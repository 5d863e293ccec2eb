"""One backend's login state, and its keeping: the tokens held for each caller, the scopes asked
for, the authorization server and client known; loaded from and saved to the file store, or in
a cluster the replicas' shared store (which a replica then looks at before anything else).

The base of `Authorizer` (backend_auth/authorizer.py), which builds up from here: at_server.py
(the authorization server and the gateway's client there), codeflow.py (the logins), then the
token loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from gateway.backend_auth import store
from gateway.backend_auth.desk import LoginDesk
from gateway.backend_auth.discovery import ServerInfo
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.fetch import OAuthHttp
from gateway.backend_auth.grants import Client
from gateway.backend_auth.redirect import open_browser
from gateway.backend_auth.shared import Record, SharedStore, StoreUnavailable
from gateway.backend_auth.tokens import Token
from gateway.config import BackendAuth

log = logging.getLogger("gateway.backend_auth")

Opener = Callable[[str], Awaitable[None]]
# How a dynamically registered client is named in the store's key.
REGISTERED = "registered"


class LoginState:
    """What one backend's logins hold and where they are kept: the state the authorizer's
    other parts (at_server.py, codeflow.py, authorizer.py) build on."""

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

    def share(self, shared: SharedStore) -> None:
        """Keep this backend's logins in the cluster's shared store instead of the file store
        (`store: false` still keeps nothing)."""
        if self._config.store:
            self._shared = shared

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


def _read_key(path: str | None) -> str | None:
    return Path(path).read_text() if path else None
