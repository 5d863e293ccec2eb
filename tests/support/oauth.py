"""A small authorization server and a protected MCP backend for the OAuth client's tests, on
127.0.0.1 with real sockets (the real authorization servers are the conformance suite's mock
and oidc-provider; this one lets a test count and steer what the gateway asks).

The authorization server signs JWT access tokens (RS256, PyJWT) and offers: authorization code
with PKCE (its /authorize approves at once and redirects), refresh tokens, client credentials,
token exchange (RFC 8693, of its own tokens) and dynamic registration. The backend accepts only
its tokens for its own URL as audience, answers 401 with a `resource_metadata` challenge
otherwise, and 403 `insufficient_scope` to a call that needs a scope the token lacks."""

from __future__ import annotations

import base64
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
import orjson
from aiohttp import web

from tests.support.auth import VERSION, public_jwk, rsa_key, serving

EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
CLIENT_ID = "gateway-client"
CLIENT_SECRET = "gateway-secret"


@dataclass
class TokenServer:
    url: str = ""
    expires_in: int = 3600
    issue_refresh: bool = True
    login_as: str = "alice"  # who logs in at /authorize (the user behind the browser)
    deny: bool = False  # the user refuses at /authorize
    asked: Counter[str] = field(default_factory=Counter)
    grants: list[dict[str, str]] = field(default_factory=list)  # every token request's form
    registrations: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[dict[str, str]] = field(default_factory=list)
    issued: list[dict[str, Any]] = field(default_factory=list)  # claims of every token
    _codes: dict[str, dict[str, str]] = field(default_factory=dict)
    _serial: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def issuer(self) -> str:
        return self.url

    def metadata(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": self.url + "/authorize",
            "token_endpoint": self.url + "/token",
            "registration_endpoint": self.url + "/register",
            "jwks_uri": self.url + "/jwks",
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "none"],
            "grant_types_supported": [
                "authorization_code",
                "refresh_token",
                "client_credentials",
                EXCHANGE,
            ],
            "authorization_response_iss_parameter_supported": True,
        }

    def mint(self, sub: str, aud: str, scope: str = "", client_id: str = "app") -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": sub,
            "aud": aud,
            "scope": scope,
            "client_id": client_id,
            "iat": now,
            "exp": now + self.expires_in,
            "jti": str(next(self._serial)),
        }
        self.issued.append(claims)
        return jwt.encode(claims, rsa_key(0), algorithm="RS256", headers={"kid": "k1"})

    def verify(self, token: str, audience: str) -> dict[str, Any] | None:
        try:
            claims: dict[str, Any] = jwt.decode(
                token, rsa_key(0).public_key(), algorithms=["RS256"], audience=audience
            )
        except jwt.InvalidTokenError:
            return None
        return claims if claims.get("iss") == self.issuer else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.asked[path] += 1
        if path == "/.well-known/oauth-authorization-server":
            return web.json_response(self.metadata())
        if path == "/jwks":
            return web.json_response({"keys": [public_jwk(rsa_key(0), "k1")]})
        if path == "/authorize":
            return self._authorize(request)
        if path == "/register" and request.method == "POST":
            body = orjson.loads(await request.read())
            self.registrations.append(body)
            answer = {**body, "client_id": f"registered-{len(self.registrations)}"}
            return web.json_response(answer, status=201)
        if path == "/token" and request.method == "POST":
            form = {k: str(v) for k, v in (await request.post()).items()}
            self.grants.append(form)
            return self._token(form, request.headers.get("Authorization"))
        return web.Response(status=404)

    def _authorize(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.authorizations.append(query)
        code = f"code-{len(self.authorizations)}"
        self._codes[code] = {**query, "user": self.login_as}
        back = {"code": code, "state": query.get("state", ""), "iss": self.issuer}
        if self.deny:
            back = {"error": "access_denied", "state": query.get("state", ""), "iss": self.issuer}
        raise web.HTTPFound(f"{query['redirect_uri']}?{urlencode(back)}")

    def _token(self, form: dict[str, str], authorization: str | None) -> web.Response:
        grant = form.get("grant_type")
        user, scope, resource = "", form.get("scope", ""), form.get("resource", "")
        if grant == "authorization_code":
            asked = self._codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "").encode()
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=")
            if asked is None or asked.get("code_challenge") != challenge.decode():
                return web.json_response({"error": "invalid_grant"}, status=400)
            user, scope = asked["user"], asked.get("scope", "")
        elif grant == "refresh_token":
            refresh = form.get("refresh_token", "")
            if not refresh.startswith("refresh:"):
                return web.json_response({"error": "invalid_grant"}, status=400)
            _, user, scope = refresh.split(":", 2)
        elif grant == "client_credentials":
            if authorization != basic(CLIENT_ID, CLIENT_SECRET):
                return web.json_response({"error": "invalid_client"}, status=401)
            user = CLIENT_ID
        elif grant == EXCHANGE:
            if authorization != basic(CLIENT_ID, CLIENT_SECRET):
                return web.json_response({"error": "invalid_client"}, status=401)
            subject = self.verify(form.get("subject_token", ""), form.get("audience") or "")
            if subject is None:
                subject = self._any_audience(form.get("subject_token", ""))
            if subject is None:
                return web.json_response({"error": "invalid_grant"}, status=400)
            user = str(subject["sub"])
        else:
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        answer: dict[str, Any] = {
            "access_token": self.mint(user, resource, scope),
            "token_type": "Bearer",
            "expires_in": self.expires_in,
            "scope": scope,
        }
        if self.issue_refresh and grant != "client_credentials":
            answer["refresh_token"] = f"refresh:{user}:{scope}"
        return web.json_response(answer)

    def _any_audience(self, token: str) -> dict[str, Any] | None:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                rsa_key(0).public_key(),
                algorithms=["RS256"],
                options={"verify_aud": False},
            )
        except jwt.InvalidTokenError:
            return None
        return claims if claims.get("iss") == self.issuer else None


def basic(user: str, secret: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


@asynccontextmanager
async def token_server(**options: Any) -> AsyncIterator[TokenServer]:
    server = TokenServer(**options)
    async with serving(server.handle) as url:
        server.url = url
        yield server


@dataclass
class Backend:
    """What the protected backend saw: each accepted request's token claims."""

    url: str = ""
    accepted: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)  # every token presented
    methods: list[str] = field(default_factory=list)  # every accepted request's method
    servers: list[str] | None = None  # the PRM's authorization_servers (default: the one)
    refused: Counter[int] = field(default_factory=Counter)
    call_scope: str | None = None  # a tools/call needs this scope (403 insufficient_scope)
    refuse_all: bool = False  # every token is refused (401)
    revoked: set[str] = field(default_factory=set)  # these tokens are refused (401)

    @property
    def prm_url(self) -> str:
        return self.url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource/mcp"

    def challenge(self, extra: str = "") -> str:
        """Its WWW-Authenticate value (RFC 9728 5.1: where its metadata is)."""
        return f'Bearer resource_metadata="{self.prm_url}"{extra}'


@asynccontextmanager
async def protected_backend(auth: TokenServer, **options: Any) -> AsyncIterator[Backend]:
    state = Backend(**options)
    challenge = state.challenge

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/.well-known/oauth-protected-resource/mcp":
            servers = state.servers if state.servers is not None else [auth.url]
            return web.json_response({"resource": state.url, "authorization_servers": servers})
        if request.path != "/mcp":
            return web.Response(status=404)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if token:
            state.tokens.append(token)
        claims = auth.verify(token, state.url) if scheme == "Bearer" else None
        if claims is None or state.refuse_all or token in state.revoked:
            state.refused[401] += 1
            return web.Response(status=401, headers={"WWW-Authenticate": challenge()})
        body = orjson.loads(await request.read())
        if "id" not in body:
            return web.Response(status=202)
        granted = str(claims.get("scope", "")).split()
        if body["method"] == "tools/call" and state.call_scope and state.call_scope not in granted:
            state.refused[403] += 1
            extra = f', error="insufficient_scope", scope="{state.call_scope}"'
            return web.Response(status=403, headers={"WWW-Authenticate": challenge(extra)})
        state.accepted.append(claims)
        state.methods.append(body["method"])
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result(body)})

    async with serving(handle) as origin:
        state.url = origin + "/mcp"
        yield state


def result(body: dict[str, Any]) -> dict[str, Any]:
    method = body["method"]
    if method == "server/discover":
        return {
            "resultType": "complete",
            "supportedVersions": [VERSION],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "protected", "version": "1"},
        }
    if method == "tools/list":
        tool = {"name": "whoami", "inputSchema": {"type": "object"}}
        return {"resultType": "complete", "tools": [tool], "ttlMs": 0}
    text = "ok"
    return {"resultType": "complete", "content": [{"type": "text", "text": text}]}
