"""Who opens a per-user login link: before the backend's login, the browser's user signs in at
the listener's own authorization server (the one the gateway's callers' tokens come from), and
the token that gives is checked by the gateway's own verifier. A link is honoured only for the
caller it was made for (client/elicitation, Phishing: the user who completes a login must be
the one who started it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.backend_auth import grants, wire
from gateway.backend_auth.discovery import DiscoveryFailed, server_metadata
from gateway.backend_auth.fetch import OAuthHttp
from gateway.backend_auth.grants import Client

# A token of the listener's issuer -> (issuer, subject) of its caller; raises ValueError when
# the token is not good.
Identify = Callable[[str], Awaitable[tuple[str | None, str]]]


class CheckFailed(Exception):
    """The browser's user could not be shown to be anyone (one line for the page and log)."""


class CallerCheck:
    def __init__(
        self,
        http: OAuthHttp,
        issuer: str,
        client_id: str,
        client_secret: str | None,
        resource: str,
        identify: Identify,
    ) -> None:
        self._http = http
        self._issuer = issuer
        self._client = Client(
            client_id=client_id,
            issuer=issuer,
            method="client_secret_basic" if client_secret else "none",
            client_secret=client_secret,
        )
        self._resource = resource
        self._identify = identify
        self._metadata: dict[str, Any] | None = None

    async def _server(self) -> dict[str, Any]:
        if self._metadata is None:
            try:
                self._metadata = await server_metadata(self._http, self._issuer)
            except DiscoveryFailed as exc:
                raise CheckFailed(str(exc)) from None
        return self._metadata

    async def authorization_url(self, state: str, proof: wire.Pkce, redirect_uri: str) -> str:
        metadata = await self._server()
        authorize = metadata.get("authorization_endpoint")
        if not isinstance(authorize, str):
            raise CheckFailed(f"the metadata of {self._issuer} has no authorization_endpoint")
        params = {
            "response_type": "code",
            "client_id": self._client.client_id,
            "redirect_uri": redirect_uri,
            "state": state,
            "code_challenge": proof.challenge,
            "code_challenge_method": "S256",
            "resource": self._resource,
        }
        return wire.with_query(authorize, params)

    async def who(
        self, answer: dict[str, str], proof: wire.Pkce, redirect_uri: str
    ) -> tuple[str | None, str]:
        """The (issuer, subject) of the browser's user, from the sign-in's redirect."""
        metadata = await self._server()
        advertised = metadata.get("authorization_response_iss_parameter_supported") is True
        if (why := wire.iss_problem(advertised, answer.get("iss"), self._issuer)) is not None:
            raise CheckFailed(why)
        code = answer.get("code")
        endpoint = metadata.get("token_endpoint")
        if "error" in answer or not code or not isinstance(endpoint, str):
            raise CheckFailed("the sign-in did not succeed")
        form = grants.authorization_code(code, proof.verifier, redirect_uri, self._resource)
        try:
            token = await grants.request_token(self._http, endpoint, self._client, form, None)
            return await self._identify(token.access_token)
        except (grants.GrantFailed, ValueError) as exc:
            raise CheckFailed(f"the sign-in gave no usable token: {exc}") from None

    async def close(self) -> None:
        await self._http.close()
