"""The OAuth client's parts on their own (basic/authorization, the client's half): challenge
parsing, discovery URLs in the spec's order (Authorization Server Metadata Discovery), the
resource check (Resource Parameter Implementation), RFC 9207 `iss` (Authorization Response
Validation), scope selection (Scope Selection Strategy), PKCE, token answers, client
authentication, the token store's files and the `auth:` config of a backend."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gateway.backend_auth import grants, store, tokens, wire
from gateway.backend_auth.grants import Client
from gateway.backend_auth.tokens import Token
from gateway.backends.era import probe
from gateway.config import BackendAuth, ConfigInvalid, parse
from gateway.errors import BackendLoginNeeded
from gateway.protocol.jsonrpc import Message

# --- challenges -------------------------------------------------------------------------------


def test_a_bearer_challenge_gives_its_scope_metadata_and_error() -> None:
    found = wire.parse_challenge(
        [
            'Basic realm="x", Bearer error="insufficient_scope", scope="files:read files:write", '
            'resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource"'
        ]
    )
    assert found == wire.Challenge(
        error="insufficient_scope",
        scope=("files:read", "files:write"),
        resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource",
    )


def test_a_challenge_without_scope_says_none_rather_than_empty() -> None:
    found = wire.parse_challenge(['Bearer realm="mcp"'])
    assert found is not None and found.scope is None and found.resource_metadata is None


def test_quoted_values_keep_escaped_quotes_and_commas() -> None:
    found = wire.parse_challenge(['Bearer error_description="a \\"b\\", c", scope=read'])
    assert found is not None and found.scope == ("read",)


def test_no_bearer_challenge_is_none() -> None:
    assert wire.parse_challenge(['Basic realm="x"']) is None
    assert wire.parse_challenge([]) is None


# --- discovery URLs ---------------------------------------------------------------------------


def test_protected_resource_metadata_is_looked_for_at_the_path_then_the_root() -> None:
    assert wire.prm_urls("https://mcp.example.com/public/mcp") == [
        "https://mcp.example.com/.well-known/oauth-protected-resource/public/mcp",
        "https://mcp.example.com/.well-known/oauth-protected-resource",
    ]
    assert wire.prm_urls("https://mcp.example.com") == [
        "https://mcp.example.com/.well-known/oauth-protected-resource"
    ]


def test_an_issuer_with_a_path_never_asks_the_root_metadata() -> None:
    assert wire.metadata_urls("https://auth.example.com/tenant1") == [
        "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
        "https://auth.example.com/.well-known/openid-configuration/tenant1",
        "https://auth.example.com/tenant1/.well-known/openid-configuration",
    ]
    assert wire.metadata_urls("https://auth.example.com") == [
        "https://auth.example.com/.well-known/oauth-authorization-server",
        "https://auth.example.com/.well-known/openid-configuration",
    ]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://auth.example.com/token", True),
        ("http://127.0.0.1:9000/token", True),
        ("http://localhost/token", True),
        ("http://[::1]:80/token", True),
        ("http://auth.example.com/token", False),
        ("http://10.0.0.1/token", False),
        ("file:///etc/passwd", False),
        ("gopher://127.0.0.1/", False),
        ("https:///no-host", False),
    ],
)
def test_only_https_or_loopback_http_is_fetched(url: str, allowed: bool) -> None:
    assert (wire.outbound_problem(url) is None) is allowed


@pytest.mark.parametrize(
    ("advertised", "backend", "covers"),
    [
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp", True),
        ("https://mcp.example.com", "https://mcp.example.com/mcp", True),
        ("https://MCP.example.com/", "https://mcp.example.com/mcp", True),
        ("https://mcp.example.com/mcp", "https://mcp.example.com/mcp/", True),
        ("https://mcp.example.com/m", "https://mcp.example.com/mcp", False),
        ("https://evil.example.com/mcp", "https://mcp.example.com/mcp", False),
        ("http://mcp.example.com/mcp", "https://mcp.example.com/mcp", False),
        ("https://mcp.example.com:8443/mcp", "https://mcp.example.com/mcp", False),
    ],
)
def test_the_resource_must_be_the_backend_or_a_parent(
    advertised: str, backend: str, covers: bool
) -> None:
    assert wire.resource_covers(advertised, backend) is covers


def test_the_canonical_resource_drops_a_fragment_and_an_empty_path() -> None:
    assert wire.canonical_resource("HTTPS://Mcp.Example.com/#x") == "https://mcp.example.com"
    assert wire.canonical_resource("https://mcp.example.com/mcp") == "https://mcp.example.com/mcp"


# --- the authorization response ---------------------------------------------------------------

ISSUER = "https://auth.example.com"


@pytest.mark.parametrize(
    ("advertised", "iss", "refused"),
    [
        (True, ISSUER, False),
        (True, None, True),
        (False, ISSUER, False),
        (False, None, False),
        (True, "https://evil.example.com", True),
        (False, "https://evil.example.com", True),
        (True, ISSUER + "/", True),  # never normalised
        (True, "HTTPS://auth.example.com", True),
    ],
)
def test_iss_follows_rfc9207_as_the_spec_tables_it(
    advertised: bool, iss: str | None, refused: bool
) -> None:
    assert (wire.iss_problem(advertised, iss, ISSUER) is not None) is refused


# --- scopes -----------------------------------------------------------------------------------


def test_the_challenge_scope_comes_first() -> None:
    assert wire.select_scopes(("a",), ["b", "c"], ("d",), None) == ("a",)


def test_scopes_supported_when_the_challenge_names_none() -> None:
    assert wire.select_scopes(None, ["b", "c"], ("d",), None) == ("b", "c")


def test_no_scope_when_nothing_names_one() -> None:
    assert wire.select_scopes(None, None, (), None) == ()


def test_the_configured_scopes_when_the_server_names_none() -> None:
    assert wire.select_scopes(None, None, ("d",), None) == ("d",)


def test_a_step_up_keeps_what_was_asked_before() -> None:
    assert wire.select_scopes(("write",), None, (), None, ("basic",)) == ("basic", "write")


def test_offline_access_only_where_the_authorization_server_offers_it() -> None:
    offered = ["basic", "offline_access"]
    assert wire.select_scopes(None, ["basic"], (), offered) == ("basic", "offline_access")
    assert wire.select_scopes(None, ["basic"], (), ["basic", "read"]) == ("basic",)


# --- PKCE and the authorization URL -----------------------------------------------------------


def test_pkce_is_s256_of_a_fresh_verifier() -> None:
    first, second = wire.pkce(), wire.pkce()
    assert first.verifier != second.verifier
    assert 43 <= len(first.verifier) <= 128
    digest = hashlib.sha256(first.verifier.encode()).digest()
    assert first.challenge == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_an_endpoint_keeps_its_own_query() -> None:
    url = wire.with_query("https://a.example.com/authorize?tenant=x", {"state": "s t"})
    assert url == "https://a.example.com/authorize?tenant=x&state=s+t"


# --- token answers ----------------------------------------------------------------------------


def test_a_token_answer_becomes_a_token_expiring_from_when_it_was_asked() -> None:
    body = {"access_token": "at", "token_type": "bearer", "expires_in": 60, "refresh_token": "rt"}
    token = tokens.from_response(body, 1000.0, ("a",))
    assert token == Token("at", 1060.0, "rt", ("a",))
    assert token.usable(1000.0, 30.0) and not token.usable(1031.0, 30.0)


def test_a_refresh_answer_without_a_refresh_token_keeps_the_old_one() -> None:
    old = Token("old", 0.0, "rt", ("a",))
    new = tokens.from_response({"access_token": "n", "token_type": "Bearer"}, 5.0, None, old)
    assert new.refresh_token == "rt" and new.expires_at is None


@pytest.mark.parametrize(
    "body",
    [
        {"token_type": "Bearer"},
        {"access_token": "", "token_type": "Bearer"},
        {"access_token": "a", "token_type": "DPoP"},
        {"access_token": "a"},
        ["not", "an", "object"],
    ],
)
def test_an_unusable_token_answer_is_refused(body: object) -> None:
    with pytest.raises(tokens.TokenResponseInvalid):
        tokens.from_response(body, 0.0, None)


def test_a_token_is_never_in_its_repr() -> None:
    token = Token("secret-at", None, "secret-rt")
    assert "secret" not in repr(token)
    assert "secret" not in repr(Client("c", ISSUER, client_secret="secret-cs"))


def test_a_record_round_trips_and_a_bad_one_is_none() -> None:
    token = Token("at", 5.0, "rt", ("a", "b"))
    assert Token.from_record(token.as_record()) == token
    assert Token.from_record({"access_token": 5}) is None
    assert Token.from_record("x") is None


# --- client authentication --------------------------------------------------------------------


def test_basic_authentication_form_encodes_both_parts() -> None:
    client = Client("id:1", ISSUER, "client_secret_basic", "s&cret")
    form, headers = grants.authenticate(client, ISSUER, {"grant_type": "x"})
    assert form == {"grant_type": "x"}
    pair = base64.b64decode(headers["Authorization"].removeprefix("Basic ")).decode()
    assert pair == "id%3A1:s%26cret"


def test_post_authentication_puts_the_secret_in_the_form() -> None:
    client = Client("id", ISSUER, "client_secret_post", "s")
    form, headers = grants.authenticate(client, ISSUER, {})
    assert form == {"client_id": "id", "client_secret": "s"} and headers == {}


def test_a_public_client_sends_only_its_id() -> None:
    form, headers = grants.authenticate(Client("id", ISSUER), ISSUER, {})
    assert form == {"client_id": "id"} and headers == {}


def test_private_key_jwt_signs_an_assertion_for_the_issuer() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    client = Client("svc", ISSUER, "private_key_jwt", private_key=pem, algorithm="ES256")
    client = Client(**{**client.__dict__, "key_id": "k1"})
    form, headers = grants.authenticate(client, ISSUER, {"grant_type": "client_credentials"})
    assert headers == {} and form["client_assertion_type"] == grants.ASSERTION_TYPE
    claims = jwt.decode(
        form["client_assertion"], key.public_key(), algorithms=["ES256"], audience=ISSUER
    )
    assert claims["iss"] == claims["sub"] == "svc" and claims["exp"] > claims["iat"]
    assert jwt.get_unverified_header(form["client_assertion"])["kid"] == "k1"


def test_token_exchange_asks_for_an_access_token_for_the_resource() -> None:
    form = grants.token_exchange("subj", grants.ACCESS_TOKEN_TYPE, "https://b/mcp", "b", ("x",))
    assert form["grant_type"] == grants.TOKEN_EXCHANGE
    assert form["subject_token"] == "subj" and form["resource"] == "https://b/mcp"
    assert form["audience"] == "b" and form["scope"] == "x"


# --- the store --------------------------------------------------------------------------------


def test_the_store_lives_under_xdg_state_home(tmp_path: Path) -> None:
    assert store.state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "mcp-gateway"
    relative = store.state_dir({"XDG_STATE_HOME": "relative/dir"})
    assert relative == Path.home() / ".local" / "state" / "mcp-gateway"


def test_stored_files_are_private_and_one_per_backend_client_and_user(tmp_path: Path) -> None:
    kept = store.TokenStore(tmp_path / "state")
    alice = store.Key("https://b/mcp", "oauth:registered", "alice")
    bob = store.Key("https://b/mcp", "oauth:registered", "bob")
    kept.save(alice, {"backend": "b", "token": {"access_token": "a"}})
    kept.save(bob, {"backend": "b", "token": {"access_token": "b"}})
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    files = sorted((tmp_path / "state").iterdir())
    assert len(files) == 2
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    loaded = kept.load(alice)
    assert loaded is not None and loaded["token"] == {"access_token": "a"}
    assert loaded["user"] == "alice"
    assert kept.forget("https://b/mcp") == 2 and kept.load(bob) is None


def test_an_unreadable_record_is_ignored(tmp_path: Path) -> None:
    kept = store.TokenStore(tmp_path)
    key = store.Key("https://b/mcp", "c")
    (tmp_path / key.filename()).write_text("{not json")
    assert kept.load(key) is None


def test_a_save_replaces_a_file_that_others_could_read(tmp_path: Path) -> None:
    kept = store.TokenStore(tmp_path)
    key = store.Key("https://b/mcp", "c")
    path = tmp_path / key.filename()
    path.write_text("{}")
    os.chmod(path, 0o644)
    kept.save(key, {"token": None})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


# --- config -----------------------------------------------------------------------------------


def backend(auth: str, transport: str = 'http: {url: "https://b.example.com/mcp"}') -> str:
    return f"listen: {{http: {{port: 0}}}}\nbackends:\n  b:\n    {transport}\n    auth: {auth}\n"


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigInvalid) as refused:
        parse(text)
    return refused.value.problems


def test_an_oauth_backend_takes_the_defaults() -> None:
    auth = parse(backend("{type: oauth}")).backends[0].auth
    assert auth == BackendAuth(type="oauth")
    assert auth.max_attempts == 3 and auth.store and auth.open_browser


@pytest.mark.parametrize(
    ("auth", "where"),
    [
        ("{type: password}", "auth.type"),
        ("{}", "auth.type"),
        ("{type: client_credentials}", "auth.client_id"),
        ("{type: client_credentials, client_id: c}", "auth"),
        ("{type: token_exchange, client_id: c}", "auth"),
        ("{type: oauth, client_secret: s}", "auth.client_id"),
        ("{type: oauth, token_endpoint_auth_method: client_secret_post}", "auth.client_secret"),
        (
            "{type: oauth, client_id: c, token_endpoint_auth_method: private_key_jwt}",
            "auth.private",
        ),
        ("{type: oauth, client_metadata_url: 'http://c.example.com/m.json'}", "client_metadata"),
        ("{type: oauth, authorization_server: 'http://a.example.com'}", "authorization_server"),
        ("{type: oauth, scopes: ['a b']}", "auth.scopes.0"),
        ("{type: client_credentials, client_id: c, client_secret: s, per_user: true}", "per_user"),
        ("{type: oauth, audience: x}", "auth.audience"),
        ("{type: oauth, private_key_file: nowhere.pem, client_id: c}", "private_key_file"),
        ("{type: oauth, max_attempts: 0}", "auth.max_attempts"),
        ("{type: oauth, signing_algorithm: HS256}", "auth.signing_algorithm"),
    ],
)
def test_a_bad_backend_auth_section_is_refused_with_its_path(auth: str, where: str) -> None:
    assert any(where in p for p in problems(backend(auth)))


def test_a_stdio_backend_takes_no_auth() -> None:
    assert any("b.auth" in p for p in problems(backend("{type: oauth}", "stdio: {command: x}")))


def test_a_client_secret_comes_from_the_environment() -> None:
    text = backend("{type: client_credentials, client_id: c, client_secret: '${SECRET}'}")
    auth = parse(text, env={"SECRET": "s3"}).backends[0].auth
    assert auth is not None and auth.client_secret == "s3"
    assert "s3" not in repr(auth)


# --- the era probe ----------------------------------------------------------------------------


class _Refusing:
    """A link whose server answered 401 and got no login in time (web.send_with_token)."""

    up = True

    async def exchange(self, msg: Message, sink: object, within: float | None) -> Message:
        raise BackendLoginNeeded("p", "needs a login")


@pytest.mark.anyio
async def test_a_login_still_needed_teaches_the_era_probe_nothing() -> None:
    # Reached, but refused for want of a login: not a legacy server (basic/versioning).
    with pytest.raises(BackendLoginNeeded):
        await probe.probe(_Refusing(), channel=False, within=1.0)  # type: ignore[arg-type]
