"""The authorization code flow of one backend: in the browser of whoever runs the gateway, with
the redirect to a loopback listener of its own; or, under per_user, through the login desk (a
link each caller opens, the callback served by the gateway's HTTP listener), where any replica
of a cluster may redeem what another began.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Awaitable
from typing import Any

import anyio

from gateway.backend_auth import grants, wire
from gateway.backend_auth.at_server import AtServer, required_endpoint
from gateway.backend_auth.desk import LoginDesk
from gateway.backend_auth.discovery import DiscoveryFailed, ServerInfo
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.fetch import FetchFailed
from gateway.backend_auth.grants import Client, GrantFailed
from gateway.backend_auth.redirect import RedirectListener
from gateway.backend_auth.seam import Caller, LoginRequired
from gateway.backend_auth.shared import Record, StoreUnavailable
from gateway.backend_auth.tokens import Token

log = logging.getLogger("gateway.backend_auth")

# After a login refused in the browser (error=access_denied, say), no other is started for this
# long: the requests that arrive meanwhile fail at once instead of opening the browser again.
LOGIN_PAUSE = 30.0


class CodeFlows(AtServer):
    """The logins by authorization code: the operator's, in a browser with a loopback redirect;
    the callers' (per_user), through the login desk."""

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
        authorize = required_endpoint(info, "authorization_endpoint")
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
        endpoint = required_endpoint(info, "token_endpoint")
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
