"""The HTTP front end as an OAuth 2.1 resource server (basic/authorization: Access Token Usage,
Token Handling, Error Handling, Scope Challenge Handling; authorization-server-discovery;
security-considerations, Token Audience Binding and Access Token Privilege Restriction).

Real sockets on 127.0.0.1: the gateway in-process, a small authorization server of the test
(tests/support/auth.py: metadata, JWKS, introspection, keys made per run) and a recording MCP
backend, so each test sees what the client got and what reached the backend. Challenges are
parsed and asserted by field; bodies by JSON-RPC code.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric import ec
from multidict import CIMultiDictProxy
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import Gateway
from gateway.config import parse
from tests.support import BOUND
from tests.support.auth import (
    CLIENT_ID,
    CLIENT_SECRET,
    PRM_URL,
    RESOURCE,
    SCOPE,
    VERSION,
    AuthServer,
    Seen,
    auth_server,
    recording_backend,
    rsa_key,
    serving,
)

pytestmark = pytest.mark.anyio

API_KEY = "ci-key-0123456789"
INVALID_REQUEST = -32600
UNAVAILABLE = -31001
INSUFFICIENT_SCOPE = -31007
# A tool the recording backend refuses with -31007, as a policy would (the reply hook's test).
STEP_UP_TOOL = "needs_admin"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Module scope: one authorization server, backend and gateway serve the module."""
    return "asyncio"


@dataclass
class World:
    auth: AuthServer
    url: str  # the gateway's MCP endpoint
    origin: str  # the gateway's origin
    seen: list[Seen]
    gateway: Gateway


def gateway_yaml(backend: str, issuer: str, **auth: Any) -> str:
    section: dict[str, Any] = {
        "issuer": issuer,
        "resource": RESOURCE,
        "scopes_supported": [SCOPE, "mcp:admin"],
        "required_scopes": [SCOPE],
        "introspection": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
        "api_keys": [
            {
                "name": "ci",
                "sha256": hashlib.sha256(API_KEY.encode()).hexdigest(),
                "scopes": [SCOPE],
                "subject": "ci-bot",
            }
        ],
        # Any unknown key id refetches the JWKS at once here, so rotation is seen without
        # waiting; the bound itself is tested on the cache (test_auth_keys.py).
        "jwks_refresh_interval": 0.001,
        **auth,
    }
    return yaml.safe_dump(
        {
            "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
            "backends": {"rec": {"http": {"url": backend}}},
            "auth": section,
        }
    )


@pytest.fixture(scope="module")
async def world() -> AsyncIterator[World]:
    error = {"code": INSUFFICIENT_SCOPE, "message": "needs admin", "data": {"scope": "mcp:admin"}}
    async with (
        auth_server() as auth,
        recording_backend({STEP_UP_TOOL: error}) as (backend, seen),
        Gateway(parse(gateway_yaml(backend, auth.issuer))) as gw,
    ):
        assert gw.http_url is not None
        origin = gw.http_url.removesuffix("/mcp")
        yield World(auth, gw.http_url, origin, seen, gw)


# --- requests ---------------------------------------------------------------------------------


def call(tool: str = "echo", id_: int = 1) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    params = {"name": tool, "arguments": {}, "_meta": meta}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


def mirrored(body: dict[str, Any]) -> list[tuple[str, str]]:
    headers = [("MCP-Protocol-Version", VERSION), ("Mcp-Method", body["method"])]
    if body["method"] == "tools/call":
        headers.append(("Mcp-Name", body["params"]["name"]))
    return headers


@dataclass(frozen=True)
class Reply:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> dict[str, Any]:
        value = orjson.loads(self.body)
        assert isinstance(value, dict)
        return value

    def challenge(self) -> dict[str, str]:
        return parse_challenge(self.headers.get("WWW-Authenticate", ""))


def parse_challenge(value: str) -> dict[str, str]:
    """A Bearer challenge's parameters (RFC 6750 3: auth-params, quoted-string values)."""
    scheme, _, rest = value.partition(" ")
    assert scheme == "Bearer", value
    params = {
        k: re.sub(r"\\(.)", r"\1", v) for k, v in re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest)
    }
    assert params, value
    return params


async def send(
    method: str,
    url: str,
    body: dict[str, Any] | None = None,
    token: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> Reply:
    fields = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ]
    if body is not None:
        fields += mirrored(body) if "method" in body else []
    if token is not None:
        fields.append(("Authorization", f"Bearer {token}"))
    fields += headers
    data = orjson.dumps(body) if body is not None else None
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, data=data, headers=fields) as resp,
        ):
            return Reply(resp.status, resp.headers, await resp.read())


def assert_unauthorized(reply: Reply, error: str | None = "invalid_token") -> dict[str, str]:
    """401, the challenge names the metadata and the scope to ask for (basic/authorization,
    Scope Selection Strategy), `error` when a token was sent; the body a JSON-RPC error."""
    assert reply.status == 401, (reply.status, reply.body)
    params = reply.challenge()
    assert params["resource_metadata"] == PRM_URL
    assert params["scope"] == SCOPE
    assert params.get("error") == error
    assert isinstance(reply.json()["error"]["code"], int)
    return params


def failures(world: World) -> dict[str, int]:
    return dict(world.gateway.telemetry.stats.auth_failures)


# --- the token is required, checked, and never passed on --------------------------------------


@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_every_method_on_the_endpoint_needs_a_token(world: World, method: str) -> None:
    """Access Token Usage: authorization is included in every HTTP request; without it, 401
    and the challenge, before anything MCP is read (no error code: no token was sent)."""
    body = call() if method == "POST" else None
    reply = await send(method, world.url, body, headers=[("Mcp-Session-Id", "x")])
    assert_unauthorized(reply, error=None)


async def test_a_good_jwt_reaches_the_backend_without_the_token(world: World) -> None:
    """Access Token Privilege Restriction: the token is validated, then never passed through;
    the backend sees neither it nor any Authorization header."""
    token = world.auth.mint()
    before = len(world.seen)
    reply = await send("POST", world.url, call(id_=7), token)
    assert reply.status == 200, reply.body
    assert reply.json()["id"] == 7
    reached = world.seen[before:]
    assert [s.body["method"] for s in reached] == ["tools/call"]
    for request in world.seen:
        assert "Authorization" not in request.headers
        assert not any(token in value for value in request.headers.values())
        assert token not in orjson.dumps(request.body).decode()


async def test_the_token_is_not_in_the_log(world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = world.auth.mint(aud="https://elsewhere.example/mcp")
    good = world.auth.mint()
    await send("POST", world.url, call(), token)
    await send("POST", world.url, call(), good)
    assert token not in caplog.text and good not in caplog.text


async def test_the_token_reaches_no_tap_span_or_access_log(tmp_path: Path) -> None:
    """security-considerations, Token Theft: tokens logged on the server are as good as
    stolen. The tap records the request's headers with Authorization redacted; spans and the
    access log carry no header at all."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with auth_server() as auth, recording_backend() as (backend, _):
        doc = yaml.safe_load(gateway_yaml(backend, auth.issuer))
        doc["tap"] = {"path": str(tmp_path / "tap.jsonl")}
        doc["telemetry"] = {"access_log": str(tmp_path / "access.log")}
        token = auth.mint()
        try:
            async with Gateway(parse(yaml.safe_dump(doc)), tracing=provider) as gw:
                assert gw.http_url is not None
                assert (await send("POST", gw.http_url, call(id_=9), token)).status == 200
        finally:
            # (the access log's file handler outlives the gateway; the next one replaces it)
            access = logging.getLogger("gateway.access")
            for handler in access.handlers:
                handler.close()
            access.handlers = []
    tapped = [orjson.loads(line) for line in (tmp_path / "tap.jsonl").read_bytes().splitlines()]
    first = next(e for e in tapped if e["hop"] == "frontend" and e["msg"].get("id") == 9)
    assert first["headers"]["Authorization"] == "[redacted]"
    assert token.encode() not in (tmp_path / "tap.jsonl").read_bytes()
    assert token.encode() not in (tmp_path / "access.log").read_bytes()
    spans = exporter.get_finished_spans()
    assert spans
    for span in spans:
        assert token not in repr(dict(span.attributes or {}))
        assert not any(token in repr(dict(e.attributes or {})) for e in span.events)


def _expired(auth: AuthServer) -> str:
    return auth.mint(exp=1_000_000_000, iat=999_999_000)


BAD_TOKENS = {
    "expired": (_expired, "expired"),
    "wrong_audience": (lambda a: a.mint(aud="https://other.example/mcp"), "wrong_audience"),
    "audience_list_without_ours": (
        lambda a: a.mint(aud=["https://other.example/mcp", "https://mcp.example.test"]),
        "wrong_audience",
    ),
    "wrong_issuer": (lambda a: a.mint(iss=a.url + "/other"), "wrong_issuer"),
    "bad_signature": (lambda a: a.mint(key=rsa_key(1)), "bad_signature"),
    "alg_none": (lambda a: a.mint_unsigned(), "algorithm"),
    "hs256_with_the_public_key": (lambda a: a.mint_hs256_with_public_key(), "algorithm"),
    "unknown_key_id": (lambda a: a.mint(kid="nobody", key=rsa_key(1)), "unknown_key"),
    "not_yet_valid": (lambda a: a.mint(nbf=4_000_000_000), "not_yet_valid"),
    "id_token_type": (lambda a: a.mint(headers={"typ": "JOSE+id"}), "invalid_token"),
    "no_exp": (lambda a: a.mint(exp=None), "invalid_token"),
    # (PyJWT reads a string of digits as a date; RFC 7519 2 says a NumericDate is a number)
    "exp_a_string": (lambda a: a.mint(exp=str(int(time.time()) + 300)), "invalid_token"),
    "empty_sub": (lambda a: a.mint(sub=""), "invalid_token"),
    "unknown_crit": (lambda a: a.forge(crit=["x-later"], **{"x-later": 1}), "invalid_token"),
    "crit_not_a_list": (lambda a: a.forge(crit="exp"), "invalid_token"),
    "kid_an_object": (lambda a: a.forge(kid={"id": "k1"}), "invalid_token"),
    "opaque_unknown": (lambda a: "opaque-nobody-issued", "inactive"),
    "not_a_token": (lambda a: "not a b64token!", "invalid_token"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
async def test_a_bad_token_is_401_invalid_token(world: World, case: str) -> None:
    """Token Handling: invalid or expired tokens receive 401 (OAuth 2.1 5.3), with the
    invalid_token challenge; a token for another resource or issuer is one (no confused deputy),
    and neither `none` nor HMAC keyed with the public key passes the algorithm allow-list."""
    make, reason = BAD_TOKENS[case]
    before = failures(world).get(reason, 0)
    reply = await send("POST", world.url, call(), make(world.auth))
    assert_unauthorized(reply)
    assert failures(world).get(reason, 0) == before + 1


async def test_a_header_pyjwt_refuses_is_one_log_line_not_a_traceback(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    """Error Handling: a token whose header cannot be used (an unknown `crit`, `crit` no list,
    a `kid` that is an object) is an invalid token like any other, 401 before any key is
    looked at; it costs one debug line, never a 500 with a traceback (no signature needed)."""
    caplog.set_level(logging.DEBUG)
    forged = [
        world.auth.forge(crit=["x-later"], **{"x-later": 1}),
        world.auth.forge(crit="exp"),
        world.auth.forge(kid={"id": "k1"}),
    ]
    for token in forged:
        caplog.clear()
        assert_unauthorized(await send("POST", world.url, call(), token))
        ours = [r for r in caplog.records if r.name.startswith(("gateway", "aiohttp"))]
        assert len(ours) <= 1, [r.getMessage() for r in ours]
        assert not any(r.exc_info for r in caplog.records)
        assert "Traceback" not in caplog.text


async def test_another_scheme_counts_as_no_token(world: World) -> None:
    reply = await send("POST", world.url, call(), headers=[("Authorization", "Basic YTpi")])
    assert_unauthorized(reply, error=None)


async def test_two_authorization_headers_are_a_bad_request(world: World) -> None:
    token = world.auth.mint()
    twice = [("Authorization", f"Bearer {token}"), ("Authorization", f"Bearer {token}")]
    reply = await send("POST", world.url, call(), headers=twice)
    assert reply.status == 400
    assert reply.challenge()["error"] == "invalid_request"


async def test_a_token_in_the_query_string_is_refused_unread(world: World) -> None:
    """Access Token Usage: access tokens must not be in the URI query string."""
    token = world.auth.mint()
    reply = await send("POST", world.url + "?access_token=" + token, call())
    assert reply.status == 400
    assert reply.challenge()["error"] == "invalid_request"
    assert reply.json()["error"]["code"] == INVALID_REQUEST


async def test_a_token_without_the_required_scope_is_403_insufficient_scope(world: World) -> None:
    """Scope Challenge Handling: 403 with error="insufficient_scope" naming the scopes needed,
    and resource_metadata as in a 401; the body is the -31007 error carrying the same scope."""
    before = failures(world).get("insufficient_scope", 0)
    reply = await send("POST", world.url, call(), world.auth.mint(scope="other"))
    assert reply.status == 403
    params = reply.challenge()
    assert params["error"] == "insufficient_scope"
    assert params["scope"] == SCOPE
    assert params["resource_metadata"] == PRM_URL
    error = reply.json()["error"]
    assert error["code"] == INSUFFICIENT_SCOPE and error["data"] == {"scope": SCOPE}
    assert failures(world).get("insufficient_scope", 0) == before + 1


async def test_scopes_may_come_as_an_scp_list(world: World) -> None:
    reply = await send("POST", world.url, call(), world.auth.mint(scope=None, scp=[SCOPE]))
    assert reply.status == 200, reply.body


async def test_a_minus_31007_reply_becomes_a_step_up_challenge(world: World) -> None:
    """A reply refusing the call for want of scopes (-31007, as the policy raises it) is 403 with
    the insufficient_scope challenge naming `error.data.scope`, so a client can step up."""
    reply = await send("POST", world.url, call(STEP_UP_TOOL, id_=3), world.auth.mint())
    assert reply.status == 403
    params = reply.challenge()
    assert params == {
        "error": "insufficient_scope",
        "scope": "mcp:admin",
        "resource_metadata": PRM_URL,
    }
    body = reply.json()
    assert body["id"] == 3 and body["error"]["code"] == INSUFFICIENT_SCOPE


async def test_an_es256_token_verifies_too(world: World) -> None:
    world.auth.add_key("ec1", ec.generate_private_key(ec.SECP256R1()))
    reply = await send("POST", world.url, call(), world.auth.mint(kid="ec1", alg="ES256"))
    assert reply.status == 200, reply.body


async def test_a_rotated_signing_key_is_picked_up(world: World) -> None:
    """A token signed with a key the cached JWKS does not have makes the gateway fetch the JWKS
    again (the old key withdrawn, the new one published)."""
    assert (await send("POST", world.url, call(), world.auth.mint())).status == 200
    fetched = world.auth.asked["/jwks"]
    world.auth.add_key("k2", rsa_key(2))
    reply = await send("POST", world.url, call(), world.auth.mint(kid="k2"))
    assert reply.status == 200, reply.body
    assert world.auth.asked["/jwks"] == fetched + 1


async def test_the_metadata_is_discovered_by_the_openid_path_insertion(world: World) -> None:
    """authorization-server-discovery, Authorization Server Metadata Discovery: for an issuer
    with a path, OAuth with path insertion first, then OpenID with path insertion (which this
    server serves), fetched once."""
    await send("POST", world.url, call(), world.auth.mint())
    assert world.auth.asked["/.well-known/oauth-authorization-server/tenant1"] == 1
    assert world.auth.asked["/.well-known/openid-configuration/tenant1"] == 1


# --- introspection and API keys ------------------------------------------------------------------


async def test_an_opaque_token_is_introspected_and_the_answer_cached(world: World) -> None:
    """RFC 7662: an active answer for our audience admits the token; the gateway authenticates
    as a confidential client (client_secret_basic, both parts form-encoded); a second request
    with the same token is answered from the cache."""
    token = "opaque-good-1"
    world.auth.opaque[token] = {
        "active": True,
        "sub": "carol",
        "client_id": "app",
        "aud": RESOURCE,
        "scope": SCOPE,
        "iss": world.auth.issuer,
    }
    asked = world.auth.asked["/introspect"]
    for _ in range(2):
        reply = await send("POST", world.url, call(), token)
        assert reply.status == 200, reply.body
    assert world.auth.asked["/introspect"] == asked + 1
    pair = b"gateway:s3cret%3Awith%26odd%3Dchars"  # (RFC 6749 2.3.1: form-encoded, then Basic)
    expected = "Basic " + base64.b64encode(pair).decode()
    assert world.auth.introspection_auth[-1] == expected


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"active": False}, "inactive"),
        ({"active": True, "sub": "x", "aud": "https://other.example/mcp"}, "wrong_audience"),
        ({"active": True, "sub": "x"}, "wrong_audience"),  # (no aud: cannot show it is ours)
        ({"active": True, "sub": "x", "aud": RESOURCE, "exp": 1_000_000_000}, "expired"),
        ({"active": True, "sub": "x", "aud": RESOURCE, "iss": "https://evil"}, "wrong_issuer"),
    ],
    ids=["inactive", "other-audience", "no-audience", "expired", "other-issuer"],
)
async def test_an_introspection_answer_that_does_not_admit_is_401(
    world: World, answer: dict[str, Any], reason: str
) -> None:
    token = f"opaque-bad-{reason}-{len(world.auth.opaque)}"
    world.auth.opaque[token] = answer
    before = failures(world).get(reason, 0)
    assert_unauthorized(await send("POST", world.url, call(), token))
    assert failures(world).get(reason, 0) == before + 1


async def test_an_api_key_is_accepted_by_its_digest(world: World) -> None:
    reply = await send("POST", world.url, call(), API_KEY)
    assert reply.status == 200, reply.body
    before = failures(world).get("inactive", 0)
    # Not a configured key, not a JWT: an opaque token, which the server does not know.
    assert_unauthorized(await send("POST", world.url, call(), API_KEY + "x"))
    assert failures(world).get("inactive", 0) == before + 1


# --- protected resource metadata ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["", "/mcp"])
async def test_the_protected_resource_metadata_is_served_without_a_token(
    world: World, path: str
) -> None:
    """RFC 9728 and authorization-server-discovery: at the root form and the path-inserted
    form of the endpoint's path."""
    reply = await send("GET", world.origin + "/.well-known/oauth-protected-resource" + path)
    assert reply.status == 200
    assert reply.json() == {
        "resource": RESOURCE,
        "authorization_servers": [world.auth.issuer],
        "scopes_supported": [SCOPE, "mcp:admin"],
        "bearer_methods_supported": ["header"],
    }


async def test_the_metadata_still_passes_the_origin_guard(world: World) -> None:
    url = world.origin + "/.well-known/oauth-protected-resource/mcp"
    reply = await send("GET", url, headers=[("Origin", "https://evil.example")])
    assert reply.status == 403


async def test_failures_are_exported_as_a_metric(world: World) -> None:
    await send("POST", world.url, call(), _expired(world.auth))
    body, _ = world.gateway._render_metrics("text/plain")
    assert re.search(rb'mcp_gateway_auth_failures_total\{reason="expired"\} [1-9]', body), body


async def test_api_keys_alone_need_no_authorization_server() -> None:
    """For small teams: static keys, no issuer; the metadata names no authorization server."""
    digest = hashlib.sha256(API_KEY.encode()).hexdigest()
    auth = {"resource": RESOURCE, "api_keys": [{"name": "ci", "sha256": digest}]}
    doc = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "auth": auth,
    }
    async with recording_backend() as (backend, seen):
        doc["backends"] = {"rec": {"http": {"url": backend}}}
        async with Gateway(parse(yaml.safe_dump(doc))) as gw:
            assert gw.http_url is not None
            assert (await send("POST", gw.http_url, call(), API_KEY)).status == 200
            wrong = await send("POST", gw.http_url, call(), API_KEY + "x")
            assert wrong.status == 401 and wrong.challenge()["error"] == "invalid_token"
            assert "scope" not in wrong.challenge()  # (no scopes configured)
            assert gw.telemetry.stats.auth_failures["unknown_api_key"] == 1
            prm = gw.http_url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource"
            metadata = (await send("GET", prm)).json()
            assert metadata == {"resource": RESOURCE, "bearer_methods_supported": ["header"]}
        assert all("Authorization" not in s.headers for s in seen)


# --- legacy sessions bind to the identity ---------------------------------------------------------


def initialize(id_: int = 1) -> dict[str, Any]:
    params = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "legacy", "version": "1"},
    }
    return {"jsonrpc": "2.0", "id": id_, "method": "initialize", "params": params}


def legacy_call(id_: int) -> dict[str, Any]:
    params = {"name": "echo", "arguments": {}}
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


async def in_session(world: World, session: str, id_: int, token: str | None) -> Reply:
    headers = [("Mcp-Session-Id", session), ("MCP-Protocol-Version", "2025-11-25")]
    body = orjson.dumps(legacy_call(id_))
    fields = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ]
    fields += headers
    if token is not None:
        fields.append(("Authorization", f"Bearer {token}"))
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as s,
            s.post(world.url, data=body, headers=fields) as resp,
        ):
            return Reply(resp.status, resp.headers, await resp.read())


async def test_a_legacy_session_belongs_to_the_subject_not_the_token(world: World) -> None:
    """2025-11-25 transports, Session Management, with authorization: a refreshed token of the
    same subject and client keeps the session; another subject's valid token gets 404, as an
    unknown session would; without a token, 401."""
    first = world.auth.mint(sub="dave")
    opened = await send("POST", world.url, initialize(), first)
    assert opened.status == 200, opened.body
    session = opened.headers["Mcp-Session-Id"]
    refreshed = world.auth.mint(sub="dave")
    assert refreshed != first
    assert (await in_session(world, session, 2, refreshed)).status == 200
    assert (await in_session(world, session, 3, world.auth.mint(sub="erin"))).status == 404
    other_client = world.auth.mint(sub="dave", client_id="another-app")
    assert (await in_session(world, session, 4, other_client)).status == 404
    assert_unauthorized(await in_session(world, session, 5, None), error=None)
    headers = [("Mcp-Session-Id", session)]
    stolen = await send("DELETE", world.url, token=world.auth.mint(sub="erin"), headers=headers)
    assert stolen.status == 404
    ended = await send("DELETE", world.url, token=refreshed, headers=headers)
    assert ended.status == 204


# --- an authorization server that cannot be reached -----------------------------------------------


async def test_an_unreachable_authorization_server_is_503_with_retry_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Tokens cannot be checked: 503 with Retry-After and a -31001 error (not 401: the token may
    be good), one warning for the outage, and the server is not asked again at once."""
    async with auth_server() as auth:
        issuer = auth.issuer
        signer = auth.mint()
    # (the server is gone now: its port refuses connections)
    async with (
        recording_backend() as (backend, _),
        Gateway(parse(gateway_yaml(backend, issuer))) as gw,
    ):
        assert gw.http_url is not None
        caplog.set_level(logging.DEBUG, logger="gateway.caller_auth")
        for _ in range(3):
            reply = await send("POST", gw.http_url, call(), signer)
            assert reply.status == 503
            assert int(reply.headers["Retry-After"]) >= 1
            assert reply.json()["error"]["code"] == UNAVAILABLE
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)
        # An API key needs no authorization server.
        assert (await send("POST", gw.http_url, call(), API_KEY)).status == 200


async def test_a_slow_authorization_server_is_503_after_the_fetch_timeout() -> None:
    """auth.fetch_timeout: a server that does not answer delays a request by that long at most,
    and the next requests are answered at once until the retry delay has run."""
    stalled = anyio.Event()
    asked: list[str] = []

    async def never(request: web.Request) -> web.Response:
        asked.append(request.path)
        await stalled.wait()
        return web.Response(status=500)

    async with (
        serving(never) as slow,
        recording_backend() as (backend, _),
        Gateway(parse(gateway_yaml(backend, slow + "/tenant1", fetch_timeout=0.2))) as gw,
    ):
        assert gw.http_url is not None
        try:
            with anyio.fail_after(BOUND):
                first = await send("POST", gw.http_url, call(), "opaque-token")
                assert first.status == 503 and first.json()["error"]["code"] == UNAVAILABLE
                again = await send("POST", gw.http_url, call(), "opaque-token")
                assert again.status == 503
                assert len(asked) == 1  # (within the retry delay: not asked again)
        finally:
            stalled.set()


async def test_metadata_for_another_issuer_is_not_used() -> None:
    """authorization-server-discovery: a document whose issuer differs from the one the URL
    was built from must not be used."""
    async with auth_server() as auth, recording_backend() as (backend, _):
        auth.metadata_issuer = "https://honest.example"
        async with Gateway(parse(gateway_yaml(backend, auth.issuer))) as gw:
            assert gw.http_url is not None
            reply = await send("POST", gw.http_url, call(), auth.mint())
            assert reply.status == 503
            assert auth.asked["/jwks"] == 0


async def test_a_malformed_jwks_refetch_keeps_the_cached_keys(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refetch of the JWKS (for a key id the cache lacks) that returns a document that is no
    JWK set fails as an unreachable server does (503 for the token that needed it, one
    warning); the keys fetched before stay, so a good token is still accepted."""
    async with (
        auth_server() as auth,
        recording_backend() as (backend, _),
        Gateway(parse(gateway_yaml(backend, auth.issuer))) as gw,
    ):
        assert gw.http_url is not None
        assert (await send("POST", gw.http_url, call(), auth.mint())).status == 200
        caplog.set_level(logging.DEBUG, logger="gateway.caller_auth")
        auth.jwks_document = {"keys": "nope"}
        unknown = auth.mint(kid="rotated", key=rsa_key(1))
        refused = await send("POST", gw.http_url, call(), unknown)
        assert auth.asked["/jwks"] == 2  # (the refetch was made and its answer refused)
        assert refused.status == 503
        assert refused.json()["error"]["code"] == UNAVAILABLE
        good = await send("POST", gw.http_url, call(id_=2), auth.mint())
        assert good.status == 200, good.body
        assert good.json()["id"] == 2
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and not any(r.exc_info for r in caplog.records)
