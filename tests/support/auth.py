"""A small authorization server for the auth tests, on 127.0.0.1: its metadata, its JWKS and an
introspection endpoint, with signing keys made per run (cryptography) and tokens minted with
PyJWT, good and bad. Not an OAuth implementation (H4's tests use a real one, oidc-provider):
it serves exactly the documents a resource server reads, and counts what it was asked.

Also a recording MCP backend, so a test can show what reached the backend."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import jwt
import orjson
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from multidict import CIMultiDict

VERSION = "2026-07-28"
RESOURCE = "https://mcp.example.test/mcp"
PRM_URL = "https://mcp.example.test/.well-known/oauth-protected-resource/mcp"
TENANT = "/tenant1"
CLIENT_ID = "gateway"
CLIENT_SECRET = "s3cret:with&odd=chars"
SCOPE = "mcp:call"

_RSA_KEYS: list[rsa.RSAPrivateKey] = []


def rsa_key(index: int) -> rsa.RSAPrivateKey:
    """RSA keys made once per run (generation is the slow part), by index."""
    while len(_RSA_KEYS) <= index:
        _RSA_KEYS.append(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    return _RSA_KEYS[index]


def public_jwk(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey, kid: str) -> dict[str, Any]:
    if isinstance(key, rsa.RSAPrivateKey):
        jwk: dict[str, Any] = orjson.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    else:
        jwk = orjson.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    return {**jwk, "kid": kid, "use": "sig"}


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass
class AuthServer:
    """Serves `/.well-known/openid-configuration/tenant1` only (the second URL a resource server
    tries for an issuer with a path), `/jwks` and `/introspect`."""

    url: str = ""
    keys: dict[str, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    opaque: dict[str, dict[str, Any]] = field(default_factory=dict)
    asked: Counter[str] = field(default_factory=Counter)
    introspection_auth: list[str | None] = field(default_factory=list)
    metadata_issuer: str | None = None  # None: the real issuer; else a lie
    jwks_document: Any = None  # None: the real JWKS; else this document is served instead

    @property
    def issuer(self) -> str:
        return self.url + TENANT

    def add_key(self, kid: str, key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> None:
        self.keys[kid] = key

    def jwks(self) -> dict[str, Any]:
        return {"keys": [public_jwk(key, kid) for kid, key in self.keys.items()]}

    def claims(self, **overrides: Any) -> dict[str, Any]:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": "alice",
            "aud": RESOURCE,
            "client_id": "app",
            "scope": SCOPE,
            "iat": now,
            "exp": now + 300,
            "jti": b64url(hashlib.sha256(str(time.perf_counter_ns()).encode()).digest()[:8]),
        }
        claims.update(overrides)
        return {k: v for k, v in claims.items() if v is not None}

    def mint(
        self,
        kid: str = "k1",
        alg: str = "RS256",
        headers: Mapping[str, Any] | None = None,
        key: Any = None,
        **claims: Any,
    ) -> str:
        signing = key if key is not None else self.keys[kid]
        extra = {"kid": kid, "typ": "at+jwt", **(headers or {})}
        return jwt.encode(self.claims(**claims), signing, algorithm=alg, headers=extra)

    def mint_hs256_with_public_key(self, kid: str = "k1") -> str:
        """The algorithm-confusion forgery: HMAC keyed with the server's public key (PEM)."""
        public = self.keys[kid].public_key()
        secret = public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        header = b64url(orjson.dumps({"alg": "HS256", "typ": "at+jwt", "kid": kid}))
        payload = b64url(orjson.dumps(self.claims()))
        signing_input = f"{header}.{payload}".encode()
        signature = b64url(hmac.new(secret, signing_input, hashlib.sha256).digest())
        return f"{header}.{payload}.{signature}"

    def forge(self, **header: Any) -> str:
        """A token whose header PyJWT would not write (a `kid` that is an object, a `crit`
        that is no list), over good claims, with a signature of nobody's: refused on its
        header alone."""
        fields = {"alg": "RS256", "typ": "at+jwt", "kid": "k1", **header}
        signed = f"{b64url(orjson.dumps(fields))}.{b64url(orjson.dumps(self.claims()))}"
        return f"{signed}.{b64url(b'nobody signed this')}"

    def mint_unsigned(self) -> str:
        header = b64url(orjson.dumps({"alg": "none", "typ": "at+jwt", "kid": "k1"}))
        return f"{header}.{b64url(orjson.dumps(self.claims()))}."

    # --- the endpoints --------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        path = request.path
        self.asked[path] += 1
        if path == "/.well-known/openid-configuration" + TENANT:
            doc = {
                "issuer": self.metadata_issuer or self.issuer,
                "jwks_uri": self.url + "/jwks",
                "introspection_endpoint": self.url + "/introspect",
            }
            return web.json_response(doc)
        if path == "/jwks":
            doc = self.jwks() if self.jwks_document is None else self.jwks_document
            return web.json_response(doc)
        if path == "/introspect" and request.method == "POST":
            self.introspection_auth.append(request.headers.get("Authorization"))
            form = await request.post()
            answer = self.opaque.get(str(form.get("token")), {"active": False})
            return web.json_response(answer)
        return web.Response(status=404)


@asynccontextmanager
async def auth_server() -> AsyncIterator[AuthServer]:
    server = AuthServer()
    server.add_key("k1", rsa_key(0))
    async with serving(server.handle) as url:
        server.url = url
        yield server


@asynccontextmanager
async def serving(handler: Any) -> AsyncIterator[str]:
    """`handler` for every path on 127.0.0.1 (a free port); yields the origin."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclass(frozen=True)
class Seen:
    headers: CIMultiDict[str]
    body: dict[str, Any]


@asynccontextmanager
async def recording_backend(
    error_for: Mapping[str, dict[str, Any]] | None = None,
) -> AsyncIterator[tuple[str, list[Seen]]]:
    """A minimal modern MCP server on HTTP that records every request; a `tools/call` of a
    tool named in `error_for` is answered with that error, any other request with a result."""
    seen: list[Seen] = []

    async def handle(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append(Seen(CIMultiDict(request.headers), body))
        if "id" not in body:
            return web.Response(status=202)
        result: dict[str, Any] = {"resultType": "complete", "content": [], "ttlMs": 0}
        if body["method"] == "server/discover":  # the era probe
            result = {"resultType": "complete", "supportedVersions": [VERSION], "capabilities": {}}
        name = (body.get("params") or {}).get("name")
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": body["id"], "result": result}
        if error_for and isinstance(name, str) and name in error_for:
            reply = {"jsonrpc": "2.0", "id": body["id"], "error": error_for[name]}
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async with serving(handle) as origin:
        yield origin + "/mcp", seen
