"""The gateway as an OAuth 2.1 resource server, against a real authorization server nobody here
wrote (`oidc-provider`, OpenID Certified, run on 127.0.0.1 by tests/support/oidc.py) and the
official Python SDK client's OAuth flow.

basic/authorization (Access Token Usage, Token Handling; Error Handling; Scope Challenge
Handling) and basic/authorization/authorization-server-discovery: tokens come from the
server's token endpoint by the client_credentials grant with `resource` (RFC 8707) naming the
gateway, as JWT access tokens (RFC 9068) signed with keys the test gives the server; crafted
tokens are signed with those same keys, so each is wrong in exactly one way. The backend is the
SDK test server over Streamable HTTP; the traffic tap shows what the gateway sent it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
import httpx2
import orjson
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from mcp import Client
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp_types import TextContent

from gateway.app import Gateway
from gateway.config import parse
from tests.support import (
    BOUND,
    Message,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture: asyncio, uvloop)
    call,
    mirrored_headers,
    start_sdk_http,
)
from tests.support.oidc import (
    AuthServer,
    OAuthClient,
    Resource,
    SigningKey,
    challenge,
    claims,
    free_ports,
    unsigned,
)

pytestmark = pytest.mark.anyio

SCOPE = "mcp:tools"
OTHER_SCOPE = "mcp:other"
# The gateway introspects opaque tokens as this client; the app and the SDK are callers.
GATEWAY_CLIENT = OAuthClient("mcp-gateway", "gateway-secret")
APP = OAuthClient("app", "app-secret")
SDK = OAuthClient("sdk-client", "sdk-secret")
# Other resource servers of the same authorization server: their tokens are not for us.
ELSEWHERE = "http://127.0.0.1:9/elsewhere/mcp"
ELSEWHERE_OPAQUE = "http://127.0.0.1:9/elsewhere-opaque/mcp"


@dataclass(frozen=True)
class Endpoints:
    url: str  # the MCP endpoint, also the canonical URI (`resource`)
    opaque_url: str  # a second gateway whose tokens are opaque (introspection)


@pytest.fixture(scope="module")
def endpoints() -> Endpoints:
    first, second = free_ports(2)
    return Endpoints(f"http://127.0.0.1:{first}/mcp", f"http://127.0.0.1:{second}/mcp")


@pytest.fixture(scope="module")
def auth_server(
    tmp_path_factory: pytest.TempPathFactory, endpoints: Endpoints
) -> Iterator[AuthServer]:
    server = AuthServer(
        tmp_path_factory.mktemp("oidc"),
        clients=[GATEWAY_CLIENT, APP, SDK],
        resources={
            endpoints.url: Resource(f"{SCOPE} {OTHER_SCOPE}"),
            endpoints.opaque_url: Resource(SCOPE, format="opaque"),
            ELSEWHERE: Resource(f"{SCOPE} {OTHER_SCOPE}"),
            ELSEWHERE_OPAQUE: Resource(SCOPE, format="opaque"),
        },
    )
    with server.running():
        yield server


@pytest.fixture(scope="module")
def backend() -> Iterator[str]:
    proc, url = start_sdk_http()
    try:
        yield url
    finally:
        proc.stop()


def auth_section(server: AuthServer, resource: str, **extra: object) -> dict[str, object]:
    return {
        "issuer": server.issuer,
        "resource": resource,
        "scopes_supported": [SCOPE, OTHER_SCOPE],
        "required_scopes": [SCOPE],
        # A new key id refetches the JWKS at once here (the default waits 30 s between
        # fetches), so the rotation test needs no waiting.
        "jwks_refresh_interval": 0.001,
        **extra,
    }


def gateway_config(url: str, backend: str, auth: dict[str, object], tap: Path | None) -> str:
    config: dict[str, object] = {
        "listen": {"http": {"host": "127.0.0.1", "port": urlsplit(url).port, "path": "/mcp"}},
        "auth": auth,
        "backends": {"sdk": {"http": {"url": backend}}},
    }
    if tap is not None:
        config["tap"] = {"path": str(tap)}
    return yaml.safe_dump(config)


@dataclass
class Running:
    gw: Gateway
    url: str
    tap: Path


@pytest.fixture(scope="module")
async def gateway(
    tmp_path_factory: pytest.TempPathFactory,
    auth_server: AuthServer,
    backend: str,
    endpoints: Endpoints,
    anyio_backend: object,
) -> AsyncIterator[Running]:
    """One gateway per event loop (named, so it is made again for each)."""
    tap = tmp_path_factory.mktemp("tap") / "tap.jsonl"
    text = gateway_config(endpoints.url, backend, auth_section(auth_server, endpoints.url), tap)
    # (Start-up is bounded by the backend's connect_timeout.)
    async with Gateway(parse(text)) as gw:
        assert gw.http_url == endpoints.url
        yield Running(gw, endpoints.url, tap)


# --- sending ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    messages: list[Message]

    @property
    def challenge(self) -> dict[str, str]:
        return challenge(self.headers.get("www-authenticate"))


async def post(url: str, msg: Message, bearer: str | None) -> Reply:
    headers = mirrored_headers(msg)
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=orjson.dumps(msg), headers=headers) as resp,
        ):
            body = await resp.read()
            found: list[Message] = []
            if resp.content_type == "application/json" and body:
                found.append(orjson.loads(body))
            elif resp.content_type == "text/event-stream":
                for line in body.decode().splitlines():
                    if line.startswith("data:"):
                        found.append(orjson.loads(line[5:]))
            return Reply(resp.status, {k.lower(): v for k, v in resp.headers.items()}, found)


async def get_json(url: str) -> tuple[int, Any]:
    with anyio.fail_after(BOUND):
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            return resp.status, orjson.loads(await resp.read())


def echoed(reply: Reply, rid: int) -> str:
    assert reply.status == 200, reply
    (answer,) = [m for m in reply.messages if m.get("id") == rid]
    assert "result" in answer, answer
    text: str = answer["result"]["content"][0]["text"]
    return text


def metadata_url(url: str) -> str:
    """RFC 9728 3.1: the well-known path inserted between the host and the endpoint's path."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/.well-known/oauth-protected-resource{parts.path}"


# --- a good token -----------------------------------------------------------------------------


async def test_a_token_from_the_authorization_server_calls_a_tool(
    gateway: Running, auth_server: AuthServer
) -> None:
    """Access Token Usage: a JWT access token bound to the gateway (`resource`) by the
    authorization server opens tools/call."""
    token = await auth_server.token(APP, gateway.url, SCOPE)
    reply = await post(gateway.url, call(1, "echo", text="through"), token)
    assert echoed(reply, 1) == "through"


async def test_no_token_is_challenged_towards_the_authorization_server(
    gateway: Running, auth_server: AuthServer
) -> None:
    """Authorization Server Discovery: a request without a token gets 401 whose challenge names
    the protected resource metadata and the scope; that metadata names this resource and the
    authorization server, whose own metadata leads to its keys. No `error` is given when no
    credentials were sent (RFC 6750 3.1)."""
    reply = await post(gateway.url, call(1, "echo", text="x"), None)
    assert reply.status == 401
    params = reply.challenge
    assert "error" not in params
    assert params["scope"].split() == [SCOPE]
    assert params["resource_metadata"] == metadata_url(gateway.url)
    status, prm = await get_json(params["resource_metadata"])
    assert status == 200
    assert prm["resource"] == gateway.url
    assert prm["authorization_servers"] == [auth_server.issuer]
    assert SCOPE in prm["scopes_supported"]
    assert prm["bearer_methods_supported"] == ["header"]
    status, asm = await get_json(f"{auth_server.issuer}/.well-known/openid-configuration")
    assert status == 200 and asm["issuer"] == auth_server.issuer
    status, jwks = await get_json(asm["jwks_uri"])
    assert status == 200
    assert [key["kid"] for key in jwks["keys"]] == [auth_server.keys[0].kid]


# --- bad tokens: 401 invalid_token ------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _hmac_with_public_key(server: AuthServer, body: dict[str, Any]) -> str:
    """HS256 keyed with the server's public key (PEM), the classic algorithm confusion."""
    key = server.keys[0]
    pem = key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = _b64(orjson.dumps({"alg": "HS256", "typ": "at+jwt", "kid": key.kid}))
    payload = _b64(orjson.dumps(body))
    mac = hmac.new(pem, f"{head}.{payload}".encode(), hashlib.sha256).digest()
    return f"{head}.{payload}.{_b64(mac)}"


async def bad_token(kind: str, server: AuthServer, resource: str) -> str:
    """A token wrong in exactly one way; the others are as the authorization server makes them."""
    key = server.keys[0]
    good = claims(server.issuer, resource, SCOPE)
    now = int(time.time())
    if kind == "expired":
        return key.sign({**good, "iat": now - 3600, "exp": now - 600})
    if kind == "not_yet_valid":
        return key.sign({**good, "nbf": now + 600})
    if kind == "wrong_audience":  # a real token, for another resource: no confused deputy
        return await server.token(APP, ELSEWHERE, SCOPE)
    if kind == "wrong_issuer":
        return key.sign({**good, "iss": f"{server.issuer}/other"})
    if kind == "bad_signature":  # same kid, another key
        return SigningKey(key.kid, SigningKey.generate("x").private).sign(good)
    if kind == "unknown_key":  # a key id the authorization server's JWKS does not have
        return SigningKey.generate("not-published").sign(good)
    if kind == "tampered":  # a real token whose payload was changed after signing
        head, _, rest = (await server.token(APP, resource, OTHER_SCOPE)).partition(".")
        _, _, signature = rest.partition(".")
        return f"{head}.{_b64(orjson.dumps({**good, 'scope': SCOPE}))}.{signature}"
    if kind == "alg_none":
        return unsigned(good, key.kid)
    if kind == "hmac_with_public_key":
        return _hmac_with_public_key(server, good)
    if kind == "garbage":
        return "not-a-jwt-and-no-introspection"
    raise AssertionError(kind)


# Each kind of bad token and the reason the gateway counts it under
# (mcp_gateway_auth_failures_total{reason}): refused for the right reason, not by accident.
BAD = {
    "expired": "expired",
    "not_yet_valid": "not_yet_valid",
    "wrong_audience": "wrong_audience",
    "wrong_issuer": "wrong_issuer",
    "bad_signature": "bad_signature",
    "unknown_key": "unknown_key",
    "tampered": "bad_signature",
    "alg_none": "algorithm",
    "hmac_with_public_key": "algorithm",
    "garbage": "invalid_token",  # opaque, and this gateway has no introspection
}


@pytest.mark.parametrize("kind", BAD)
async def test_a_bad_token_gets_401_invalid_token(
    gateway: Running, auth_server: AuthServer, kind: str
) -> None:
    """Token Handling: invalid or expired tokens get 401; a token issued for another resource
    is refused (audience, RFC 8707 2); the challenge says `invalid_token` (RFC 6750 3.1) and
    still leads to the metadata; the backend is never called."""
    token = await bad_token(kind, auth_server, gateway.url)
    before = backend_calls(gateway.tap)
    failures = gateway.gw.telemetry.stats.auth_failures
    counted = failures[BAD[kind]]
    reply = await post(gateway.url, call(7, "echo", text=kind), token)
    assert reply.status == 401, (kind, reply)
    params = reply.challenge
    assert params["error"] == "invalid_token"
    assert params["resource_metadata"] == metadata_url(gateway.url)
    assert failures[BAD[kind]] == counted + 1
    assert backend_calls(gateway.tap) == before


# --- scope: 403 insufficient_scope ------------------------------------------------------------


async def test_a_token_without_the_required_scope_gets_403_insufficient_scope(
    gateway: Running, auth_server: AuthServer
) -> None:
    """Scope Challenge Handling, Runtime Insufficient Scope Errors: a valid token lacking a
    required scope gets 403 with `insufficient_scope` and the scope it needs, so a client can
    step up; with that scope the same client gets through."""
    token = await auth_server.token(APP, gateway.url, OTHER_SCOPE)
    failures = gateway.gw.telemetry.stats.auth_failures
    counted = failures["insufficient_scope"]
    reply = await post(gateway.url, call(2, "echo", text="x"), token)
    assert reply.status == 403
    assert failures["insufficient_scope"] == counted + 1
    params = reply.challenge
    assert params["error"] == "insufficient_scope"
    assert SCOPE in params["scope"].split()
    assert params["resource_metadata"] == metadata_url(gateway.url)
    stepped_up = await auth_server.token(APP, gateway.url, f"{OTHER_SCOPE} {SCOPE}")
    assert echoed(await post(gateway.url, call(3, "echo", text="up"), stepped_up), 3) == "up"


# --- the token stays at the gateway -----------------------------------------------------------


def tap_records(tap: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in tap.read_bytes().splitlines() if line]


def backend_calls(tap: Path) -> int:
    return sum(
        1
        for r in tap_records(tap)
        if r["hop"] == "backend" and r["dir"] == "out" and r["msg"].get("method") == "tools/call"
    )


async def test_the_backend_never_sees_the_token(
    gateway: Running, auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Token Handling (no token passthrough): the gateway's request to the backend carries no
    Authorization and the token appears in no record of either hop and in no log line."""
    caplog.set_level(logging.DEBUG)
    token = await auth_server.token(APP, gateway.url, SCOPE)
    reply = await post(gateway.url, call(4, "echo", text="private"), token)
    assert echoed(reply, 4) == "private"
    records = tap_records(gateway.tap)
    sent = [
        r
        for r in records
        if r["hop"] == "backend"
        and r["dir"] == "out"
        and r["msg"].get("params", {}).get("arguments") == {"text": "private"}
    ]
    assert len(sent) == 1
    assert "headers" in sent[0]
    assert all(name.lower() != "authorization" for name in sent[0]["headers"])
    assert token.encode() not in gateway.tap.read_bytes()
    signature = token.rsplit(".", 1)[1]
    assert signature not in caplog.text


# --- key rotation -----------------------------------------------------------------------------


async def test_a_rotated_signing_key_is_picked_up(
    gateway: Running, auth_server: AuthServer
) -> None:
    """Token Handling: the authorization server replaces its signing key (same issuer, a new
    `kid` in its JWKS); a token signed with the new key verifies, the gateway fetching the
    keys again for the unknown `kid`. The old key is gone from the set, so a token it signed,
    though unexpired and accepted before, is refused from then on."""
    first = await auth_server.token(APP, gateway.url, SCOPE)
    assert echoed(await post(gateway.url, call(5, "echo", text="old"), first), 5) == "old"
    # A key id names one key for good: the new key gets a new one.
    auth_server.restart([SigningKey.generate(f"key-{auth_server.starts + 1}")])
    second = await auth_server.token(APP, gateway.url, SCOPE)
    assert echoed(await post(gateway.url, call(6, "echo", text="new"), second), 6) == "new"
    failures = gateway.gw.telemetry.stats.auth_failures
    counted = failures["unknown_key"]
    withdrawn = await post(gateway.url, call(7, "echo", text="old again"), first)
    assert withdrawn.status == 401
    assert withdrawn.challenge["error"] == "invalid_token"
    assert failures["unknown_key"] == counted + 1


# --- opaque tokens: introspection -------------------------------------------------------------


@pytest.fixture(scope="module")
async def opaque_gateway(
    auth_server: AuthServer, backend: str, endpoints: Endpoints, anyio_backend: object
) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway whose authorization server issues opaque tokens for it (RFC 7662), one per
    event loop."""
    introspection = {
        "client_id": GATEWAY_CLIENT.client_id,
        "client_secret": GATEWAY_CLIENT.client_secret,
    }
    auth = auth_section(auth_server, endpoints.opaque_url, introspection=introspection)
    text = gateway_config(endpoints.opaque_url, backend, auth, None)
    async with Gateway(parse(text)) as gw:
        assert gw.http_url == endpoints.opaque_url
        yield gw, endpoints.opaque_url


async def test_an_opaque_token_is_introspected(
    opaque_gateway: tuple[Gateway, str], auth_server: AuthServer
) -> None:
    """Token Handling via introspection (RFC 7662): an opaque token the authorization server
    issued for this resource is active there and opens tools/call; one it never issued gets
    401 invalid_token, and so does one it issued for another resource (no confused deputy on
    this path either)."""
    gw, url = opaque_gateway
    failures = gw.telemetry.stats.auth_failures
    token = await auth_server.token(APP, url, SCOPE)
    assert "." not in token  # a handle, not a JWT
    assert echoed(await post(url, call(8, "echo", text="opaque"), token), 8) == "opaque"
    for rid, bad, reason in [
        (9, token[::-1], "inactive"),
        (10, await auth_server.token(APP, ELSEWHERE_OPAQUE, SCOPE), "wrong_audience"),
    ]:
        counted = failures[reason]
        reply = await post(url, call(rid, "echo", text="x"), bad)
        assert reply.status == 401, (reason, reply)
        assert reply.challenge["error"] == "invalid_token"
        assert failures[reason] == counted + 1


# --- the official SDK client's OAuth flow -----------------------------------------------------


class MemoryStorage(TokenStorage):
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


Seen = list[tuple[str, str, int]]


async def sdk_call(url: str, issuer: str, storage: MemoryStorage, mode: str = "auto") -> Seen:
    """tools/call `echo` with the official SDK client and its client-credentials OAuth
    provider; the (method, URL, status) of every HTTP exchange the client made, in order."""
    seen: Seen = []

    async def note(response: httpx2.Response) -> None:
        seen.append((response.request.method, str(response.request.url), response.status_code))

    provider = ClientCredentialsOAuthProvider(
        server_url=url,
        storage=storage,
        client_id=SDK.client_id,
        client_secret=SDK.client_secret,
        issuer=issuer,
    )
    with anyio.fail_after(BOUND * 2):
        async with (
            httpx2.AsyncClient(auth=provider, event_hooks={"response": [note]}) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as client,
        ):
            result = await client.call_tool("echo", {"text": f"sdk {mode}"})
    assert isinstance(result.content[0], TextContent)
    assert result.content[0].text == f"sdk {mode}"
    return seen


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_sdk_client_discovers_the_authorization_server_from_a_401(
    gateway: Running, auth_server: AuthServer, mode: str
) -> None:
    """Authorization Flow Steps, for a client_credentials client: the official SDK client with
    its OAuth client provider and no token sends its first request, reads the 401 challenge,
    fetches the protected resource metadata and the authorization server's metadata, gets a
    token for the gateway (`resource`, the challenged scope) and completes tools/call; as a
    modern client and as a legacy one (initialize, a session, its DELETE at the end), every
    request after the token carrying it."""
    storage = MemoryStorage()
    seen = await sdk_call(gateway.url, auth_server.issuer, storage, mode)
    # The flow the client took, in order: challenged, metadata, token, then through.
    assert seen[0][1:] == (gateway.url, 401)
    urls = [url for _, url, _ in seen]
    prm = urls.index(metadata_url(gateway.url))
    token = urls.index(auth_server.token_endpoint)
    assert 0 < prm < token
    assert seen[token][2] == 200
    assert any(url.startswith(f"{auth_server.issuer}/.well-known/") for url in urls[prm:token])
    after = seen[token + 1 :]
    assert after and all(status < 400 for _, _, status in after), seen
    if mode == "legacy":  # the session's stream and its end went through with the token too
        assert {"GET", "DELETE"} <= {method for method, url, _ in after if url == gateway.url}
    assert storage.tokens is not None and SCOPE in (storage.tokens.scope or "").split()


async def test_the_sdk_client_steps_up_on_insufficient_scope(
    gateway: Running, auth_server: AuthServer
) -> None:
    """Step-Up Authorization Flow: an SDK client holding a token without the required scope
    gets 403 `insufficient_scope`, follows that challenge's `resource_metadata` to the
    authorization server, asks for the union of what it had and what the challenge names, and
    completes the call with the new token."""
    storage = MemoryStorage()
    status, body = await auth_server.token_response(SDK, gateway.url, OTHER_SCOPE)
    assert status == 200
    storage.tokens = OAuthToken.model_validate(body)
    seen = await sdk_call(gateway.url, auth_server.issuer, storage)
    assert seen[0][1:] == (gateway.url, 403)
    token = [url for _, url, _ in seen].index(auth_server.token_endpoint)
    assert all(status < 400 for _, _, status in seen[token + 1 :]), seen
    assert storage.tokens is not None
    assert {SCOPE, OTHER_SCOPE} <= set((storage.tokens.scope or "").split())
