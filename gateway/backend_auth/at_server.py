"""The authorization server of one backend, and who the gateway is there: the server discovered
(again when a challenge names another), the client (configured, a Client ID Metadata Document,
or registered dynamically, once for a cluster) and the token requests, counted.
"""

from __future__ import annotations

import logging

from gateway.backend_auth import grants, wire
from gateway.backend_auth.discovery import DiscoveryFailed, ServerInfo, discover
from gateway.backend_auth.failures import AuthFailed
from gateway.backend_auth.grants import Client, GrantFailed
from gateway.backend_auth.state import LoginState
from gateway.backend_auth.tokens import Token

log = logging.getLogger("gateway.backend_auth")


class AtServer(LoginState):
    """The authorization server and the gateway's client there, on top of the login state."""

    # --- the authorization server ---------------------------------------------------------

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


def required_endpoint(info: ServerInfo, name: str) -> str:
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
