"""A real authorization server for the authorization tests: `oidc-provider` (OpenID Certified,
from tests/npm, installed by `make npm-deps`) run by tests/servers/oidc_provider.mjs.

The test hands it its signing keys, so it can rotate them (a restart on the same port with a
new key: same issuer, new `kid`) and can mint crafted tokens with the very key the server
signs with (expired, another issuer, ...), whose only defect is the one under test. Tokens
come from the server's token endpoint by the client_credentials grant with `resource`
(RFC 8707), as a machine client gets them.
"""

from __future__ import annotations

import base64
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from tests.conformance_support import MODULES, NODE
from tests.support import BOUND, ROOT, Proc, missing

SCRIPT = ROOT / "tests" / "servers" / "oidc_provider.mjs"
PACKAGE = MODULES / "oidc-provider" / "package.json"


def require() -> None:
    """Skip (fail under CI=true) when node 24 or oidc-provider is not installed."""
    if not NODE.exists() or not PACKAGE.exists():
        missing("oidc-provider", "make npm-deps installs it into tests/npm")


@dataclass(frozen=True)
class SigningKey:
    """An RSA key pair with its `kid`, as the authorization server and the JWKS name it."""

    kid: str
    private: rsa.RSAPrivateKey = field(repr=False)

    @classmethod
    def generate(cls, kid: str) -> SigningKey:
        return cls(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048))

    def jwk(self) -> dict[str, Any]:
        """The private JWK the server signs with."""
        out: dict[str, Any] = orjson.loads(RSAAlgorithm.to_jwk(self.private))
        return {**out, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def sign(self, claims: dict[str, Any], **header: Any) -> str:
        """A JWT access token (RFC 9068 `typ: at+jwt`) signed with this key."""
        return jwt.encode(
            claims,
            self.private,
            algorithm="RS256",
            headers={"typ": "at+jwt", "kid": self.kid, **header},
        )


def unsigned(claims: dict[str, Any], kid: str) -> str:
    """A token with `alg: none` and an empty signature (RFC 7519 6.1), claims otherwise sound."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(value)).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'at+jwt', 'kid': kid})}.{part(claims)}."


def claims(
    issuer: str, audience: str, scope: str, *, lifetime: int = 300, **extra: Any
) -> dict[str, Any]:
    """The claims oidc-provider puts in a client_credentials JWT access token."""
    now = int(time.time())
    base = {
        "iss": issuer,
        "aud": audience,
        "sub": "crafted-client",
        "client_id": "crafted-client",
        "scope": scope,
        "iat": now,
        "exp": now + lifetime,
        "jti": f"crafted-{now}",
    }
    return {**base, **extra}


@dataclass(frozen=True)
class OAuthClient:
    """A client registered at the authorization server (client_secret_basic)."""

    client_id: str
    client_secret: str = field(repr=False)


@dataclass(frozen=True)
class Resource:
    """A resource server the authorization server binds tokens to (RFC 8707)."""

    scope: str
    format: str = "jwt"  # or "opaque": a handle only introspection (RFC 7662) resolves
    ttl: int = 300


class AuthServer:
    """oidc-provider on 127.0.0.1; `start` runs it, `restart` rotates its keys, `stop` ends it."""

    def __init__(self, directory: Path, clients: list[OAuthClient], resources: dict[str, Resource]):
        require()
        self.directory = directory
        self.clients = clients
        self.resources = resources
        self.port = 0
        self.proc: Proc | None = None
        self.keys: list[SigningKey] = []
        self.starts = 0

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/token"

    def start(self, keys: list[SigningKey]) -> None:
        assert self.proc is None
        self.starts += 1
        self.keys = list(keys)
        config = self.directory / f"oidc-provider-{self.starts}.json"
        config.write_bytes(
            orjson.dumps(
                {
                    "port": self.port,
                    "keys": [key.jwk() for key in keys],
                    "clients": [
                        {"client_id": c.client_id, "client_secret": c.client_secret}
                        for c in self.clients
                    ],
                    "resources": {
                        uri: {"scope": r.scope, "format": r.format, "ttl": r.ttl}
                        for uri, r in self.resources.items()
                    },
                }
            )
        )
        self.proc = Proc([str(NODE), str(SCRIPT), str(config)])
        self.port = int(self.proc.wait_for(r"^READY (\d+)$", stream="stdout").group(1))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self, keys: list[SigningKey]) -> None:
        """The same issuer (same port) signing with `keys` from now on."""
        self.stop()
        self.start(keys)

    async def token_response(
        self, client: OAuthClient, resource: str | None, scope: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        form = {"grant_type": "client_credentials"}
        if resource is not None:
            form["resource"] = resource
        if scope is not None:
            form["scope"] = scope
        # client_secret_basic (RFC 6749 2.3.1); our ids and secrets need no form-encoding.
        headers = {
            "Authorization": aiohttp.encode_basic_auth(client.client_id, client.client_secret)
        }
        with anyio.fail_after(BOUND):
            async with (
                aiohttp.ClientSession() as session,
                session.post(self.token_endpoint, data=form, headers=headers) as resp,
            ):
                body: dict[str, Any] = orjson.loads(await resp.read())
                return resp.status, body

    async def token(self, client: OAuthClient, resource: str, scope: str | None = None) -> str:
        """An access token from the token endpoint (client_credentials, RFC 8707 `resource`)."""
        status, body = await self.token_response(client, resource, scope)
        assert status == 200, body
        token: str = body["access_token"]
        return token


# RFC 6750 3 / RFC 9110 11.6.1: `Bearer k1="v1", k2=token68-ish`.
_PARAM = re.compile(r'\s*([A-Za-z_][\w-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


def challenge(header: str | None) -> dict[str, str]:
    """The auth-params of a `WWW-Authenticate: Bearer ...` challenge, by name (lower case)."""
    assert header is not None, "no WWW-Authenticate"
    scheme, _, rest = header.strip().partition(" ")
    assert scheme.lower() == "bearer", header
    params: dict[str, str] = {}
    pos = 0
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        assert m is not None and m.end() > pos, header
        quoted, bare = m.group(2), m.group(3)
        params[m.group(1).lower()] = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else bare
        pos = m.end()
    return params
