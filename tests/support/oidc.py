"""A real authorization server for the authorization tests: `oidc-provider` (OpenID Certified,
from tests/npm, installed by `make npm-deps`) run by tests/servers/oidc_provider.mjs.

The test hands it its signing keys, so it can rotate them (a restart on the same port with a
new key: same issuer, new `kid`) and can mint crafted tokens with the very key the server
signs with (expired, another issuer, ...), whose only defect is the one under test. Tokens
come from the server's token endpoint by the client_credentials grant with `resource`
(RFC 8707), as a machine client gets them.

For the authorization-code flow the server also has native clients (`CodeClient`, any loopback
port), open dynamic registration, refresh tokens and its own login and consent pages, which a
headless chromium walks through (tests/servers/browser_login.mjs, the `BROWSER` of Python's
webbrowser: `browser_command`). `protected_gateway` is a resource server to get tokens for:
the gateway itself with an `auth:` section naming this server, in front of the bundled demo.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import shlex
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlencode, urlsplit

import aiohttp
import anyio
import jwt
import orjson
import yaml
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from gateway.app import Gateway
from gateway.config import parse
from tests.support import BOUND, DEMO_STDIO, ROOT, Proc, gateway_command, missing
from tests.support.conformance import MODULES, NODE

SCRIPT = ROOT / "tests" / "servers" / "oidc_provider.mjs"
PACKAGE = MODULES / "oidc-provider" / "package.json"
BROWSER_SCRIPT = ROOT / "tests" / "servers" / "browser_login.mjs"
PLAYWRIGHT = MODULES / "playwright-core" / "package.json"
CHROMIUM = Path("/usr/bin/chromium")
# browser_login.mjs gives up after 20 s (a login takes about 2 s); this bounds its process.
LOGIN_BOUND = 25.0
# What oidc-provider's defaults allow a native client: an http loopback redirect URI, whose
# port it ignores (RFC 8252 7.3), so one registration serves every ephemeral port.
LOOPBACK_REDIRECT = "http://127.0.0.1/callback"


def require() -> None:
    """Skip (fail under CI=true) when node 24 or oidc-provider is not installed."""
    if not NODE.exists() or not PACKAGE.exists():
        missing("oidc-provider", "make npm-deps installs it into tests/npm")


def require_browser() -> None:
    """Skip (fail under CI=true) unless a browser login can run: chromium (`make ci-deps`) and
    playwright-core with node 24 (`make npm-deps`)."""
    require()
    if not CHROMIUM.exists():
        missing("chromium", "make ci-deps installs Debian's chromium")
    if not PLAYWRIGHT.exists():
        missing("playwright-core", "make npm-deps installs it into tests/npm")


def browser_args(*, login: str = "user", cancel: bool = False) -> list[str]:
    """The driver's command without the URL: log in as `login` (the token's `sub`) and consent,
    or, with `cancel`, leave at the login page (the client gets error=access_denied)."""
    return [str(NODE), str(BROWSER_SCRIPT), "--login", login, *(["--cancel"] if cancel else [])]


def browser_command(*, login: str = "user", cancel: bool = False) -> str:
    """The `BROWSER` value that makes Python's webbrowser log in headlessly: a command line
    (shlex-quoted) whose `%s` webbrowser replaces by the URL. webbrowser waits for it to exit,
    and it exits only once the redirect URI has answered, so whoever calls webbrowser.open must
    keep serving the callback meanwhile (call it from a worker thread)."""
    return f"{shlex.join(browser_args(login=login, cancel=cancel))} %s"


async def browser_login(url: str, *, login: str = "user", cancel: bool = False) -> None:
    """Open `url` (an authorization request) in the headless browser and walk through login and
    consent until the redirect URI has answered."""
    with anyio.fail_after(LOGIN_BOUND):
        done = await anyio.run_process(
            [*browser_args(login=login, cancel=cancel), url],
            check=False,
            stdin=subprocess.DEVNULL,
        )
    assert done.returncode == 0, done.stderr.decode(errors="replace")


def free_ports(count: int) -> list[int]:
    """Distinct loopback ports nothing listens on (bound together, then released): a gateway's
    canonical URI (its `resource`) must be known before it and the authorization server start."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


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
class CodeClient:
    """An authorization-code client registered at the authorization server: native
    (`application_type`), PKCE required. Without a secret a public client
    (`token_endpoint_auth_method: none`); with one, client_secret_basic unless `auth_method`
    says otherwise (`client_secret_post`)."""

    client_id: str
    client_secret: str | None = field(default=None, repr=False)
    redirect_uris: tuple[str, ...] = (LOOPBACK_REDIRECT,)
    auth_method: str | None = None

    @property
    def method(self) -> str:
        if self.auth_method is not None:
            return self.auth_method
        return "none" if self.client_secret is None else "client_secret_basic"

    def config(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "redirect_uris": list(self.redirect_uris),
            "token_endpoint_auth_method": self.method,
        }
        if self.client_secret is not None:
            out["client_secret"] = self.client_secret
        return out


@dataclass(frozen=True)
class Pkce:
    """A PKCE pair (RFC 7636, S256)."""

    verifier: str
    challenge: str

    @classmethod
    def generate(cls) -> Pkce:
        verifier = secrets.token_urlsafe(48)
        digest = hashlib.sha256(verifier.encode()).digest()
        return cls(verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode())


@dataclass(frozen=True)
class Resource:
    """A resource server the authorization server binds tokens to (RFC 8707)."""

    scope: str
    format: str = "jwt"  # or "opaque": a handle only introspection (RFC 7662) resolves
    ttl: int = 300


class AuthServer:
    """oidc-provider on 127.0.0.1; `start` runs it, `restart` rotates its keys, `stop` ends it."""

    def __init__(
        self,
        directory: Path,
        clients: list[OAuthClient],
        resources: dict[str, Resource],
        *,
        code_clients: Sequence[CodeClient] = (),
        registration: bool = False,
        refresh_tokens: Literal["offline_access", "always"] = "offline_access",
        refresh_ttl: int = 86400,
    ):
        """`code_clients` and `registration` (RFC 7591, open) turn the login and consent pages
        on. `refresh_tokens`: "always" gives every authorization-code grant a refresh token
        (its client must be allowed the refresh_token grant: pre-registered ones are; a
        registered one must ask for it); "offline_access" is oidc-provider's own rule, which
        also needs `prompt=consent` in the authorization request."""
        require()
        self.directory = directory
        self.clients = clients
        self.resources = resources
        self.code_clients = list(code_clients)
        self.registration = registration
        self.refresh_tokens = refresh_tokens
        self.refresh_ttl = refresh_ttl
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

    @property
    def authorization_endpoint(self) -> str:
        return f"{self.issuer}/auth"

    @property
    def registration_endpoint(self) -> str:
        return f"{self.issuer}/reg"

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
                    "code_clients": [c.config() for c in self.code_clients],
                    "registration": self.registration,
                    "refresh_tokens": self.refresh_tokens,
                    "refresh_ttl": self.refresh_ttl,
                    "login": bool(self.code_clients) or self.registration,
                }
            )
        )
        self.proc = Proc([str(NODE), str(SCRIPT), str(config)])
        self.port = int(self.proc.wait_for(r"^READY (\d+)$", stream="stdout").group(1))

    def events(self, name: str, at_least: int = 0, **match: str) -> list[dict[str, Any]]:
        """The fields of every `name` event the server printed since it (re)started
        (oidc_provider.mjs: registration, authorization, grant) whose fields include `match`,
        waiting, bounded, until there are `at_least` (the server prints one before its answer
        leaves, and a thread reads it)."""
        assert self.proc is not None
        prefix = f"EVENT {name} "

        def found(lines: list[str]) -> list[dict[str, Any]]:
            events = [orjson.loads(x[len(prefix) :]) for x in lines if x.startswith(prefix)]
            return [e for e in events if all(e.get(k) == v for k, v in match.items())]

        return found(self.proc.wait_lines(lambda seen: len(found(seen)) >= at_least, "stdout"))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    @contextmanager
    def running(self) -> Iterator[AuthServer]:
        """Started with a fresh signing key, stopped at the end (a module fixture's life)."""
        self.start([SigningKey.generate("key-1")])
        try:
            yield self
        finally:
            self.stop()

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
        return await self._post_token(form, client.client_id, client.client_secret, "basic")

    def authorization_url(
        self,
        client: CodeClient,
        redirect_uri: str,
        pkce: Pkce,
        *,
        scope: str,
        resource: str | None,
        state: str,
    ) -> str:
        """An authorization request (code, PKCE S256, RFC 8707 `resource`) as a client makes it."""
        params = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": redirect_uri,
            "scope": scope,
            "state": state,
            "code_challenge": pkce.challenge,
            "code_challenge_method": "S256",
        }
        if resource is not None:
            params["resource"] = resource
        return f"{self.authorization_endpoint}?{urlencode(params)}"

    async def code_token_response(
        self,
        client: CodeClient,
        code: str,
        redirect_uri: str,
        verifier: str,
        resource: str | None,
    ) -> tuple[int, dict[str, Any]]:
        """The token endpoint's answer to an authorization code (RFC 6749 4.1.3, PKCE)."""
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        if resource is not None:
            form["resource"] = resource
        return await self._post_code_client(form, client)

    async def refresh_response(
        self, client: CodeClient, refresh_token: str, resource: str | None
    ) -> tuple[int, dict[str, Any]]:
        """The token endpoint's answer to a refresh token (RFC 6749 6). A public client's
        refresh token is rotated: the answer has a new one and the old one is spent."""
        form = {"grant_type": "refresh_token", "refresh_token": refresh_token}
        if resource is not None:
            form["resource"] = resource
        return await self._post_code_client(form, client)

    async def register(self, redirect_uris: Sequence[str] = (LOOPBACK_REDIRECT,)) -> CodeClient:
        """A public native client registered dynamically (RFC 7591), allowed refresh tokens."""
        metadata = {
            "application_type": "native",
            "redirect_uris": list(redirect_uris),
            "token_endpoint_auth_method": "none",
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        }
        with anyio.fail_after(BOUND):
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    self.registration_endpoint,
                    data=orjson.dumps(metadata),
                    headers={"Content-Type": "application/json"},
                ) as resp,
            ):
                body: dict[str, Any] = orjson.loads(await resp.read())
        assert resp.status == 201, body
        return CodeClient(body["client_id"], redirect_uris=tuple(body["redirect_uris"]))

    async def _post_code_client(
        self, form: dict[str, str], client: CodeClient
    ) -> tuple[int, dict[str, Any]]:
        if client.method == "none":
            return await self._post_token(form, client.client_id, None, "none")
        assert client.client_secret is not None
        if client.method == "client_secret_post":
            return await self._post_token(form, client.client_id, client.client_secret, "post")
        return await self._post_token(form, client.client_id, client.client_secret, "basic")

    async def _post_token(
        self,
        form: dict[str, str],
        client_id: str,
        secret: str | None,
        how: Literal["basic", "post", "none"],
    ) -> tuple[int, dict[str, Any]]:
        headers: dict[str, str] = {}
        if how == "basic":
            # client_secret_basic (RFC 6749 2.3.1); our ids and secrets need no form-encoding.
            assert secret is not None
            headers["Authorization"] = aiohttp.encode_basic_auth(client_id, secret)
        elif how == "post":
            assert secret is not None
            form = {**form, "client_id": client_id, "client_secret": secret}
        else:
            form = {**form, "client_id": client_id}
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


# --- the client's side: a loopback redirect URI ----------------------------------------------


class Callback:
    """A loopback redirect URI (RFC 8252 7.3) on an ephemeral port, as a native client opens
    one per flow; `params` waits for the authorization response."""

    def __init__(self) -> None:
        self.redirect_uri = ""  # known once the listener has its port
        self.received: dict[str, str] | None = None
        self._arrived = anyio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.received is None:
            self.received = dict(request.query)
            self._arrived.set()
        return web.Response(text="You may close this window.")

    async def params(self) -> dict[str, str]:
        """The query of the first request to the redirect URI (`code`, `state`, `iss`, or
        `error`), waited for with a bound."""
        with anyio.fail_after(BOUND):
            await self._arrived.wait()
        assert self.received is not None
        return self.received


@asynccontextmanager
async def loopback_callback() -> AsyncIterator[Callback]:
    """A listener on http://127.0.0.1:<ephemeral>/callback for one authorization response."""
    callback = Callback()
    app = web.Application()
    app.router.add_get("/callback", callback.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        callback.redirect_uri = f"http://127.0.0.1:{runner.addresses[0][1]}/callback"
        yield callback
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


# --- a protected MCP server: the gateway as the resource server ------------------------------


def protected_gateway_config(server: AuthServer, url: str, scopes: Sequence[str]) -> str:
    """The YAML of a gateway serving the demo server at `url` (its `resource`, a loopback
    http URL with a fixed port, a resource of `server`) to holders of a token of `server`
    bound to `url` and carrying every one of `scopes`."""
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1" and parts.port, url
    config = {
        "listen": {"http": {"host": "127.0.0.1", "port": parts.port, "path": parts.path}},
        "auth": {
            "issuer": server.issuer,
            "resource": url,
            "scopes_supported": list(scopes),
            "required_scopes": list(scopes),
        },
        "backends": {"demo": DEMO_STDIO},
    }
    return yaml.safe_dump(config)


@asynccontextmanager
async def protected_gateway(
    server: AuthServer, url: str, scopes: Sequence[str]
) -> AsyncIterator[Gateway]:
    """That gateway in this process, on the test's event loop (its stats are at hand)."""
    async with Gateway(parse(protected_gateway_config(server, url, scopes))) as gw:
        assert gw.http_url == url
        yield gw


def start_protected_gateway(
    directory: Path, server: AuthServer, url: str, scopes: Sequence[str]
) -> Proc:
    """That gateway as a process of its own (`run --config`), for a fixture shared by tests on
    any event loop; `stop()` ends it."""
    config = directory / f"protected-{urlsplit(url).port}.yaml"
    config.write_text(protected_gateway_config(server, url, scopes))
    proc = Proc(gateway_command(config))
    proc.wait_for(r"listening on http://")
    return proc
