"""Requests to an authorization server's token and registration endpoints: the grants the
gateway uses (authorization code, refresh, client credentials, token exchange) and how it
authenticates as a client (none, client_secret_basic/post, private_key_jwt with PyJWT)."""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from gateway.backend_auth import tokens
from gateway.backend_auth.fetch import OAuthHttp
from gateway.backend_auth.tokens import Token

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
# A client assertion is good this long: one request's worth (RFC 7523 3).
ASSERTION_LIFETIME = 60


class GrantFailed(Exception):
    """The authorization server refused (its `error` code kept) or answered nonsense."""

    def __init__(self, message: str, error: str | None = None) -> None:
        super().__init__(message)
        self.error = error


@dataclass(frozen=True)
class Client:
    """The gateway's identity at one authorization server (client-registration, Authorization
    Server Binding: a registration belongs to the issuer that made it)."""

    client_id: str
    issuer: str
    method: str = "none"  # token_endpoint_auth_method
    client_secret: str | None = field(default=None, repr=False)
    private_key: str | None = field(default=None, repr=False)  # PEM, for private_key_jwt
    algorithm: str = "RS256"
    key_id: str | None = None
    redirect_uri: str | None = None  # the one registered, for a dynamically registered client

    def as_record(self) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "issuer": self.issuer,
            "method": self.method,
            "client_secret": self.client_secret,
            "redirect_uri": self.redirect_uri,
        }

    @classmethod
    def from_record(cls, record: Any) -> Client | None:
        if not isinstance(record, dict):
            return None
        values = {k: record.get(k) for k in ("client_id", "issuer", "method")}
        if not all(isinstance(v, str) for v in values.values()):
            return None
        secret, redirect = record.get("client_secret"), record.get("redirect_uri")
        return cls(
            client_id=str(values["client_id"]),
            issuer=str(values["issuer"]),
            method=str(values["method"]),
            client_secret=secret if isinstance(secret, str) else None,
            redirect_uri=redirect if isinstance(redirect, str) else None,
        )


def authenticate(
    client: Client, audience: str, form: dict[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """`form` and headers with the client's authentication added."""
    form = dict(form)
    headers: dict[str, str] = {}
    if client.method == "client_secret_basic":
        # RFC 6749 2.3.1: both parts form-encoded before Basic encoding.
        pair = f"{quote(client.client_id, safe='')}:{quote(client.client_secret or '', safe='')}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    elif client.method == "client_secret_post":
        form["client_id"] = client.client_id
        form["client_secret"] = client.client_secret or ""
    elif client.method == "private_key_jwt":
        form["client_id"] = client.client_id
        form["client_assertion_type"] = ASSERTION_TYPE
        form["client_assertion"] = assertion(client, audience)
    else:
        form["client_id"] = client.client_id
    return form, headers


def assertion(client: Client, audience: str) -> str:
    """An RFC 7523 client assertion signed with the client's private key."""
    # Only a backend with `private_key_jwt` signs: PyJWT (and cryptography under it, ~8 MB) is
    # loaded then, not by every gateway (docs/decisions/0064-lazy-imports.md).
    import jwt

    now = int(time.time())
    claims = {
        "iss": client.client_id,
        "sub": client.client_id,
        "aud": audience,
        "jti": uuid.uuid4().hex,
        "iat": now,
        "exp": now + ASSERTION_LIFETIME,
    }
    headers = {"kid": client.key_id} if client.key_id else None
    return jwt.encode(claims, client.private_key or "", algorithm=client.algorithm, headers=headers)


async def request_token(
    http: OAuthHttp,
    endpoint: str,
    client: Client,
    form: dict[str, str],
    asked: tuple[str, ...] | None,
    previous: Token | None = None,
) -> Token:
    body, headers = authenticate(client, client.issuer, form)
    sent_at = time.time()
    reply = await http.post_form(endpoint, body, headers)
    if reply.status != 200:
        error = reply.body.get("error") if isinstance(reply.body, dict) else None
        code = error if isinstance(error, str) else None
        raise GrantFailed(f"the token endpoint refused: {code or f'HTTP {reply.status}'}", code)
    try:
        return tokens.from_response(reply.body, sent_at, asked, previous)
    except tokens.TokenResponseInvalid as exc:
        raise GrantFailed(f"the token endpoint's answer is not usable: {exc}") from None


def scope_param(scopes: tuple[str, ...]) -> dict[str, str]:
    return {"scope": " ".join(scopes)} if scopes else {}


def authorization_code(
    code: str, verifier: str, redirect_uri: str, resource: str
) -> dict[str, str]:
    return {
        "grant_type": "authorization_code",
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": redirect_uri,
        "resource": resource,
    }


def refresh(refresh_token: str, resource: str) -> dict[str, str]:
    return {"grant_type": "refresh_token", "refresh_token": refresh_token, "resource": resource}


def client_credentials(resource: str, scopes: tuple[str, ...]) -> dict[str, str]:
    return {"grant_type": "client_credentials", "resource": resource, **scope_param(scopes)}


def token_exchange(
    subject_token: str,
    subject_token_type: str,
    resource: str,
    audience: str | None,
    scopes: tuple[str, ...],
) -> dict[str, str]:
    """RFC 8693 2.1: the caller's token for one that this backend accepts."""
    form = {
        "grant_type": TOKEN_EXCHANGE,
        "subject_token": subject_token,
        "subject_token_type": subject_token_type,
        "requested_token_type": ACCESS_TOKEN_TYPE,
        "resource": resource,
        **scope_param(scopes),
    }
    if audience:
        form["audience"] = audience
    return form


async def register(
    http: OAuthHttp,
    endpoint: str,
    issuer: str,
    name: str,
    redirect_uri: str,
    offered: list[str] | None,
    scopes: tuple[str, ...],
) -> Client:
    """Dynamic client registration (RFC 7591) as a native public client where the server
    allows one (client-registration: application_type native for a loopback redirect)."""
    method = "none"
    if offered and "none" not in offered:
        method = next(
            (m for m in ("client_secret_basic", "client_secret_post") if m in offered), offered[0]
        )
    request: dict[str, Any] = {
        "client_name": name,
        "redirect_uris": [redirect_uri],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": method,
        "application_type": "native",
    }
    if scopes:
        request["scope"] = " ".join(scopes)
    reply = await http.post_json(endpoint, request)
    body = reply.body
    if reply.status not in (200, 201) or not isinstance(body, dict):
        error = body.get("error") if isinstance(body, dict) else None
        raise GrantFailed(f"registration refused: {error or f'HTTP {reply.status}'}")
    client_id = body.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        raise GrantFailed("registration answered without a client_id")
    secret = body.get("client_secret")
    granted = body.get("token_endpoint_auth_method")
    if not isinstance(granted, str):
        granted = method if method == "none" or isinstance(secret, str) else "none"
    if granted != "none" and not isinstance(secret, str):
        granted = "none"
    return Client(
        client_id=client_id,
        issuer=issuer,
        method=granted,
        client_secret=secret if isinstance(secret, str) else None,
        redirect_uri=redirect_uri,
    )
