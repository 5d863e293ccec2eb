"""The parts of token checking on their own: the `auth:` config, the metadata URLs and document
checks (authorization-server-discovery), the challenge and metadata (RFC 6750 3, RFC 9728), the
JWKS cache's refetch bound (against the in-test server, with a clock of the test), and the
binding of held calls to the caller's identity."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest

from gateway.backends.base import Call
from gateway.backends.era.layer import EraBackend
from gateway.caller_auth import challenge
from gateway.caller_auth.authenticator import Authenticator
from gateway.caller_auth.discovery import ServerMetadata, metadata_urls, parse_metadata
from gateway.caller_auth.fetch import Fetcher, FetchFailed
from gateway.caller_auth.identity import Identity
from gateway.caller_auth.introspection import Introspector
from gateway.caller_auth.jwks import Jwks, signing_keys
from gateway.caller_auth.signed import jwt_header
from gateway.caller_auth.tokens import (
    Rejected,
    api_key_identity,
    check_header,
    claims_identity,
    scopes_of,
)
from gateway.config import AuthConfig, ConfigInvalid, Introspection, describe, parse
from gateway.errors import Refused
from gateway.origin import Origin
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from tests.backends.test_era_core import (
    FakeLink,
    eliciting_tool,
    era_over,
    ignore,
    legacy_server,
    modern_request,
)
from tests.support import BOUND
from tests.support.auth import RESOURCE, AuthServer, auth_server, rsa_key

pytestmark = pytest.mark.anyio

DIGEST = hashlib.sha256(b"k").hexdigest()


def config(auth: str) -> str:
    return (
        f"listen: {{http: {{port: 0}}}}\nbackends: {{a: {{stdio: {{command: x}}}}}}\nauth:\n{auth}"
    )


def problems(auth: str) -> list[str]:
    with pytest.raises(ConfigInvalid) as refused:
        parse(config(auth))
    return refused.value.problems


# --- config ---------------------------------------------------------------------------------------


def test_a_minimal_auth_section_takes_the_defaults() -> None:
    auth = parse(config("  issuer: https://as.example\n  resource: https://mcp.example/mcp\n")).auth
    assert auth is not None
    assert auth.expected_audience == "https://mcp.example/mcp"
    assert "none" not in auth.algorithms and not any(a.startswith("HS") for a in auth.algorithms)
    assert auth.leeway == 30 and auth.jwks_refresh_interval == 30


@pytest.mark.parametrize("alg", ["none", "HS256", "hs512"])
def test_the_algorithm_list_refuses_none_and_hmac(alg: str) -> None:
    text = "  issuer: https://as.example\n  resource: https://m.example\n"
    text += f"  algorithms: [RS256, {alg}]\n"
    assert any("auth.algorithms.1" in p for p in problems(text))


@pytest.mark.parametrize(
    ("auth", "where"),
    [
        ("  issuer: https://as.example\n  resource: https://m.example/mcp#x\n", "auth.resource"),
        ("  issuer: https://as.example\n  resource: m.example/mcp\n", "auth.resource"),
        ("  issuer: http://as.example\n  resource: https://m.example\n", "auth.issuer"),
        ("  resource: https://m.example\n", "auth"),
        ("  issuer: https://as.example\n", "auth.resource"),
        (
            "  resource: https://m.example\n  api_keys: [{name: k, sha256: x}]\n",
            "auth.api_keys.0.sha256",
        ),
        (
            "  issuer: https://as.example\n  resource: https://m.example\n"
            "  scopes_supported: ['a\"b']\n",
            "auth.scopes_supported.0",
        ),
        (
            "  resource: https://m.example\n  api_keys: [{name: k, sha256: "
            + DIGEST
            + "}]\n  introspection: {client_id: c, client_secret: s}\n",
            "auth.introspection",
        ),
    ],
    ids=[
        "fragment",
        "not-absolute",
        "plain-http-issuer",
        "neither-issuer-nor-keys",
        "no-resource",
        "bad-digest",
        "bad-scope",
        "introspection-without-issuer",
    ],
)
def test_a_bad_auth_section_names_the_key(auth: str, where: str) -> None:
    assert any(f": {where}: " in p for p in problems(auth)), problems(auth)


def test_the_client_secret_never_appears_in_reprs_errors_or_summaries() -> None:
    text = (
        "  issuer: http://127.0.0.1:1\n  resource: https://m.example\n"
        "  introspection: {client_id: c, client_secret: TOPSECRET}\n"
    )
    loaded = parse(config(text))
    assert loaded.auth is not None
    assert "TOPSECRET" not in repr(loaded) and "TOPSECRET" not in describe(loaded)
    wrong = problems(text + "  leeway: soon\n")
    assert not any("TOPSECRET" in p for p in wrong)


def test_api_keys_only_need_no_issuer() -> None:
    text = f"  resource: https://m.example\n  api_keys: [{{name: ci, sha256: {DIGEST}}}]\n"
    auth = parse(config(text)).auth
    assert auth is not None and auth.issuer is None
    [key] = auth.api_keys
    assert key.subject == "ci" and DIGEST not in repr(key)
    found = api_key_identity(auth.api_keys, DIGEST)
    assert found is not None and found.subject == "ci" and found.client_id == "ci"
    assert api_key_identity(auth.api_keys, "0" * 64) is None
    doc = challenge.metadata_document(auth)
    assert "authorization_servers" not in doc and doc["bearer_methods_supported"] == ["header"]


def test_an_unquoted_digest_of_digits_is_read_as_written() -> None:
    """YAML reads `sha256: 1234...e12` (digits and an e) as a number; the digest is its text."""
    digits = "12" * 31 + "e1"
    text = f"  resource: https://m.example\n  api_keys: [{{name: ci, sha256: {digits}}}]\n"
    auth = parse(config(text)).auth
    assert auth is not None and auth.api_keys[0].sha256 == digits


# --- discovery ------------------------------------------------------------------------------------


def test_metadata_urls_for_an_issuer_with_a_path() -> None:
    """Authorization Server Metadata Discovery: path insertion for OAuth, then OpenID, then
    OpenID appended."""
    assert metadata_urls("https://auth.example.com/tenant1") == (
        "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
        "https://auth.example.com/.well-known/openid-configuration/tenant1",
        "https://auth.example.com/tenant1/.well-known/openid-configuration",
    )


def test_metadata_urls_for_an_issuer_without_a_path() -> None:
    assert metadata_urls("https://auth.example.com") == (
        "https://auth.example.com/.well-known/oauth-authorization-server",
        "https://auth.example.com/.well-known/openid-configuration",
    )


def test_a_document_must_name_the_configured_issuer_exactly() -> None:
    doc: dict[str, Any] = {"issuer": "https://honest.example", "jwks_uri": "https://h/jwks"}
    assert isinstance(parse_metadata("https://attacker.example", doc), str)
    assert isinstance(parse_metadata("https://honest.example/", doc), str)  # no normalising
    found = parse_metadata("https://honest.example", doc)
    assert found == ServerMetadata("https://honest.example", "https://h/jwks", None)
    plain = {**doc, "jwks_uri": "http://keys.example/jwks"}
    assert isinstance(parse_metadata("https://honest.example", plain), str)


# --- challenge and metadata -----------------------------------------------------------------------


def test_the_metadata_paths_and_url_follow_the_resource() -> None:
    assert challenge.metadata_paths("https://m.example/mcp", "/mcp") == (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    )
    assert challenge.metadata_paths("https://m.example", "/api/mcp") == (
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/api/mcp",
    )
    assert challenge.metadata_url("https://m.example:8443/mcp") == (
        "https://m.example:8443/.well-known/oauth-protected-resource/mcp"
    )


def test_a_challenge_is_well_formed_whatever_the_scope_data() -> None:
    header = challenge.bearer(
        "https://m/x", scope=challenge.scope_value('a "b" c\\'), error="insufficient_scope"
    )
    assert header == 'Bearer error="insufficient_scope", scope="a", resource_metadata="https://m/x"'
    assert challenge.scope_value("") is None


# --- tokens ---------------------------------------------------------------------------------------


def _auth() -> AuthConfig:
    return AuthConfig(resource="https://m.example", issuer="https://as.example")


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ({"alg": "none"}, "algorithm"),
        ({"alg": "HS256"}, "algorithm"),
        ({"alg": "RS256", "typ": "JOSE"}, "invalid_token"),
        ({"alg": "RS256", "crit": ["exp"]}, "invalid_token"),
        ({"alg": "RS256", "kid": 5}, "invalid_token"),
    ],
)
def test_a_header_outside_the_rules_is_refused_before_any_key_is_fetched(
    header: dict[str, Any], reason: str
) -> None:
    with pytest.raises(Rejected) as refused:
        check_header(header, _auth())
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    "header",
    [
        {"crit": ["x-later"], "x-later": 1},  # an extension nobody here understands
        {"crit": "exp"},  # not a list
        {"crit": []},  # (RFC 7515 4.1.11: never empty)
        {"kid": {"id": "k1"}},  # not a string
        {"kid": ["k1"]},
    ],
)
def test_a_header_pyjwt_refuses_is_an_invalid_token_not_an_error(header: dict[str, Any]) -> None:
    """RFC 7515 4.1.11 and 4.1.4: PyJWT refuses these headers when reading them; the token is
    Rejected (401) rather than taken for an opaque one or left to raise."""
    token = AuthServer().forge(**header)
    with pytest.raises(Rejected) as refused:
        jwt_header(token)
    assert refused.value.reason == "invalid_token"


def test_a_present_subject_must_name_someone() -> None:
    """A client's own token may leave `sub` out (the client is the subject); an empty or
    non-string `sub` is refused rather than replaced by the client."""
    assert claims_identity({"client_id": "app"}, "jwt").subject == "app"
    for sub in ("", 5, ["alice"]):
        with pytest.raises(Rejected):
            claims_identity({"sub": sub, "client_id": "app"}, "jwt")


def test_an_access_token_type_passes() -> None:
    for typ in ("at+jwt", "application/at+JWT", "JWT"):
        assert check_header({"alg": "RS256", "typ": typ, "kid": "a"}, _auth()) == ("RS256", "a")


def test_scopes_come_from_scope_or_scp() -> None:
    assert scopes_of({"scope": "a b"}) == {"a", "b"}
    assert scopes_of({"scp": ["a", 3, "b"]}) == {"a", "b"}
    assert scopes_of({}) == frozenset()


def test_a_jwks_keeps_public_signing_keys_only() -> None:
    jwks = {
        "keys": [
            {"kty": "oct", "kid": "sym", "k": "c2VjcmV0"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "x", "e": "AQAB"},
            {"kty": "RSA", "kid": "priv", "n": "x", "e": "AQAB", "d": "x"},
            {"kty": "RSA", "kid": "ok", "n": "x", "e": "AQAB"},
        ]
    }
    keys = signing_keys(jwks)
    assert keys is not None and list(keys) == ["ok"]
    assert signing_keys({"keys": []}) == {}


@pytest.mark.parametrize(
    "doc", [{"keys": "nope"}, {"keys": None}, {}, [], "keys", {"keys": [{"kty": "RSA"}, "x"]}]
)
def test_a_document_that_is_no_jwk_set_is_told_apart_from_an_empty_set(doc: Any) -> None:
    """RFC 7517 5: a JWK set is an object whose `keys` is a list of objects."""
    assert signing_keys(doc) is None


# --- the JWKS cache against a real server ---------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_an_unknown_key_id_refetches_the_jwks_at_most_once_per_interval() -> None:
    """A rotated key is found by fetching the set again; tokens with invented key ids do not
    make the gateway fetch more than once per `jwks_refresh_interval`."""
    async with auth_server() as server:
        fetcher = Fetcher(BOUND, 1 << 20)
        clock = Clock()
        jwks = Jwks(fetcher, refresh_interval=30, max_age=600, clock=clock)
        url = server.url + "/jwks"
        try:
            assert await jwks.key(url, "k1", "RS256") is not None
            assert jwks.fetches == 1
            clock.now += 31
            server.add_key("k2", rsa_key(1))
            assert await jwks.key(url, "k2", "RS256") is not None  # rotated: fetched again
            assert jwks.fetches == 2
            for _ in range(5):
                assert await jwks.key(url, "invented", "RS256") is None
            assert jwks.fetches == 2  # within the interval: no fetch at all
            clock.now += 30
            assert await jwks.key(url, "invented", "RS256") is None
            assert jwks.fetches == 3
            clock.now += 600  # past the maximum age: fetched again before use
            assert await jwks.key(url, "k1", "RS256") is not None
            assert jwks.fetches == 4
            # A key that names another algorithm, or does not fit it, is no key for it.
            assert await jwks.key(url, "k1", "ES256") is None
        finally:
            await fetcher.close()


async def test_a_malformed_refetch_keeps_the_cached_keys() -> None:
    """A JWKS refetched past its maximum age, or for an unknown key id, that is no JWK set is a
    failed fetch: the keys cached before are kept (and used), the next good set is taken."""
    async with auth_server() as server:
        fetcher = Fetcher(BOUND, 1 << 20)
        clock = Clock()
        jwks = Jwks(fetcher, refresh_interval=30, max_age=600, clock=clock)
        url = server.url + "/jwks"
        try:
            assert await jwks.key(url, "k1", "RS256") is not None
            server.jwks_document = {"keys": "nope"}
            clock.now += 601  # past the maximum age: refetched, refused, the old set kept
            assert await jwks.key(url, "k1", "RS256") is not None
            assert server.asked["/jwks"] == 2 and jwks.generation == 1
            clock.now += 31  # (past the retry delay: the next need fetches again)
            server.add_key("k2", rsa_key(1))
            assert await jwks.key(url, "k2", "RS256") is None
            assert server.asked["/jwks"] == 3
            assert await jwks.key(url, "k1", "RS256") is not None
            server.jwks_document = None
            clock.now += 31
            assert await jwks.key(url, "k2", "RS256") is not None
            assert jwks.generation == 2
        finally:
            await fetcher.close()


async def test_concurrent_requests_share_one_jwks_fetch() -> None:
    async with auth_server() as server:
        fetcher = Fetcher(BOUND, 1 << 20)
        jwks = Jwks(fetcher, refresh_interval=30, max_age=600)
        try:
            keys = await asyncio.gather(
                *(jwks.key(server.url + "/jwks", "k1", "RS256") for _ in range(10))
            )
            assert all(k is not None for k in keys) and server.asked["/jwks"] == 1
        finally:
            await fetcher.close()


async def test_a_document_past_the_size_limit_is_refused() -> None:
    """auth.max_response_bytes: a JWKS (or metadata, or introspection answer) larger than the
    limit is not read further."""
    async with auth_server() as server:
        for i in range(40):
            server.add_key(f"extra{i}", rsa_key(0))
        fetcher = Fetcher(BOUND, 4096)
        try:
            with pytest.raises(FetchFailed):
                await fetcher.get_json(server.url + "/jwks")
        finally:
            await fetcher.close()


# --- the authenticator's caches -------------------------------------------------------------------


async def test_a_verified_jwt_is_remembered_until_the_cache_bound() -> None:
    """auth.token_cache_size: a repeated token skips the signature check; past the bound the
    oldest is forgotten (and checked again when it comes back)."""
    async with auth_server() as server:
        auth = AuthConfig(resource=RESOURCE, issuer=server.issuer, token_cache_size=2)
        authenticator = Authenticator(auth)
        try:
            first, second, third = (server.mint(sub=s) for s in ("a", "b", "c"))
            for token in (first, first, second, second):
                await authenticator.authenticate(token)
            assert authenticator.verifications == 2
            await authenticator.authenticate(third)  # the bound: `first` is forgotten
            assert (await authenticator.authenticate(second)).subject == "b"
            assert authenticator.verifications == 3
            assert (await authenticator.authenticate(first)).subject == "a"
            assert authenticator.verifications == 4
        finally:
            await authenticator.close()


async def test_a_remembered_jwt_is_checked_again_once_past_its_exp() -> None:
    async with auth_server() as server:
        clock = Clock()
        clock.now = time.time()
        auth = AuthConfig(resource=RESOURCE, issuer=server.issuer, leeway=30)
        authenticator = Authenticator(auth, clock=clock)
        try:
            token = server.mint()
            await authenticator.authenticate(token)
            await authenticator.authenticate(token)
            assert authenticator.verifications == 1
            clock.now = server.claims()["exp"] + 31.0
            await authenticator.authenticate(token)  # (PyJWT's own clock still admits it)
            assert authenticator.verifications == 2
        finally:
            await authenticator.close()


async def test_a_token_expired_within_the_leeway_passes_and_one_past_it_does_not() -> None:
    """auth.leeway: clock skew of a few seconds is tolerated, an expired token is not."""
    async with auth_server() as server:
        auth = AuthConfig(resource=RESOURCE, issuer=server.issuer, leeway=30)
        authenticator = Authenticator(auth)
        now = int(time.time())
        try:
            await authenticator.authenticate(server.mint(exp=now - 10))
            with pytest.raises(Rejected):
                await authenticator.authenticate(server.mint(exp=now - 60))
        finally:
            await authenticator.close()


async def test_introspection_answers_are_cached_within_the_ttl_and_the_size_bound() -> None:
    """auth.introspection.cache_ttl and cache_size."""
    async with auth_server() as server:
        clock = Clock()
        clock.now = time.time()
        settings = Introspection(client_id="c", client_secret="s", cache_ttl=60, cache_size=2)
        auth = AuthConfig(resource=RESOURCE, issuer=server.issuer, introspection=settings)
        fetcher = Fetcher(BOUND, 1 << 20)
        introspector = Introspector(fetcher, settings, auth, clock=clock)
        endpoint = server.url + "/introspect"
        for token in ("t1", "t2", "t3"):
            server.opaque[token] = {"active": True, "sub": token, "aud": RESOURCE}
        try:
            for token in ("t1", "t1", "t2"):
                await introspector.identity(endpoint, token)
            assert introspector.asked == 2
            await introspector.identity(endpoint, "t3")  # past the bound: t1 is forgotten
            await introspector.identity(endpoint, "t1")
            assert introspector.asked == 4
            clock.now += 61  # past the ttl: asked again
            await introspector.identity(endpoint, "t1")
            assert introspector.asked == 5
            # Never past the token's own exp.
            server.opaque["short"] = {
                "active": True,
                "sub": "s",
                "aud": RESOURCE,
                "exp": clock.now + 5,
            }
            await introspector.identity(endpoint, "short")
            clock.now += 40  # past exp and the leeway
            with pytest.raises(Rejected):
                await introspector.identity(endpoint, "short")
            assert introspector.asked == 7
        finally:
            await fetcher.close()


# --- sealed requestState binds to the identity ----------------------------------------------------


def as_identity(subject: str, client: str = "app") -> Call:
    identity = Identity(subject=subject, client_id=client, issuer="https://as.example")
    origin = Origin(
        "http", headers={"Authorization": f"Bearer token-of-{subject}"}, identity=identity
    )
    return Call(origin)


async def test_another_subject_cannot_resume_a_held_call_with_its_own_token() -> None:
    """basic/patterns/mrtr: the sealed requestState names its caller, which is the identity
    (subject, client, issuer), not the raw token: the same subject with a refreshed token may
    resume it, another subject may not."""
    backend, reply = await start_held_call_as(as_identity("alice"))
    state = reply["result"]["requestState"]
    bob = as_identity("bob")
    retry = modern_request(5, "tools/call", {"inputResponses": {}, "requestState": state})
    with pytest.raises(Refused) as refused:
        await backend.request(retry, ignore, bob)
    assert refused.value.code == codes.INVALID_PARAMS
    # Alice again, with another token (a refresh): hers to resume.
    identity = Identity(subject="alice", client_id="app", issuer="https://as.example")
    refreshed = Origin("http", headers={"Authorization": "Bearer refreshed"}, identity=identity)
    [(key, _)] = reply["result"]["inputRequests"].items()
    own = modern_request(
        6, "tools/call", {"inputResponses": {key: {"action": "accept"}}, "requestState": state}
    )
    final = await asyncio.wait_for(backend.request(own, ignore, Call(refreshed)), BOUND)
    assert final["result"]["resultType"] == "complete"


async def start_held_call_as(caller: Call) -> tuple[EraBackend, Message]:
    """test_era_core's held call (a legacy backend asking a question mid-call), started by
    `caller`."""
    backend = era_over(FakeLink(legacy_server(eliciting_tool)), "legacy")
    reply = await asyncio.wait_for(
        backend.request(modern_request(3, "tools/call"), ignore, caller), BOUND
    )
    assert reply["result"]["resultType"] == "input_required"
    return backend, reply
