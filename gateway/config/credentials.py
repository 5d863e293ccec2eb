"""The config's frozen objects for who proves what to whom: `auth:` (callers to the gateway), a
backend's `auth:` (the gateway to that backend) and `cluster:` (replicas to each other)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from gateway.config.key import NAME_PATTERN, URL_PATTERN, key

# `auth:` (the HTTP listener as an OAuth 2.1 resource server). Asymmetric algorithms only: an
# HMAC key would be a secret shared with the authorization server, and `none` is no signature.
DEFAULT_AUTH_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
# Clock skew tolerated on exp/nbf/iat (seconds): small, since an expired token must fail.
DEFAULT_AUTH_LEEWAY = 30.0
# A JWT with a key id the cached JWKS lacks refetches it, at most once per this many seconds,
# so tokens with invented key ids cannot make the gateway hammer the authorization server.
DEFAULT_JWKS_REFRESH_INTERVAL = 30.0
# The JWKS is fetched again once this old (seconds), so a key the server withdrew stops working.
DEFAULT_JWKS_MAX_AGE = 600.0
# One fetch from the authorization server (metadata, JWKS, introspection), in seconds.
DEFAULT_AUTH_FETCH_TIMEOUT = 5.0
# A metadata document, JWKS or introspection answer larger than this is refused: they are small.
DEFAULT_AUTH_MAX_RESPONSE_BYTES = 256 * 1024
# An introspection answer is reused this long (never past the token's exp), and at most this
# many are kept, so a revoked token stops working soon and invented tokens cannot fill memory.
DEFAULT_INTROSPECTION_CACHE_TTL = 60.0
DEFAULT_INTROSPECTION_CACHE_SIZE = 10_000
# Verified JWTs remembered by digest until their exp, so a client's repeated token skips the
# signature check (most of the cost of one); bounded so that many tokens cannot fill memory.
DEFAULT_TOKEN_CACHE_SIZE = 10_000
# A backend's `auth:` (the gateway as an OAuth 2.1 client of that backend, basic/authorization).
BACKEND_AUTH_TYPES = ("oauth", "client_credentials", "token_exchange")
# How the gateway proves itself at a token endpoint (RFC 8414 names; private_key_jwt: RFC 7523).
CLIENT_AUTH_METHODS = ("none", "client_secret_basic", "client_secret_post", "private_key_jwt")
# Algorithms for a private_key_jwt assertion: asymmetric, as the key is the gateway's own.
CLIENT_ASSERTION_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
DEFAULT_OAUTH_CLIENT_NAME = "mcp-transparent-gateway"
# RFC 8693: what the exchanged token is (the caller's access token, by default).
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
# A request whose token the backend refuses (401, or 403 insufficient_scope) is sent again after
# a new token at most this many times: a server that refuses every token cannot make a loop.
DEFAULT_OAUTH_MAX_ATTEMPTS = 3
# A token is refreshed this many seconds before it expires, so none is sent as it runs out.
DEFAULT_OAUTH_REFRESH_MARGIN = 60.0
# Per-user logins (per_user: true) wait this long for their user at most; the link expires then.
DEFAULT_OAUTH_LOGIN_TIMEOUT = 600.0
# `cluster.secrets`: each at least this many characters. The keys derived from a secret sign
# what replicas hand each other through clients (cursors); a short one could be guessed
# offline from one signed cursor. 32 characters of `openssl rand -base64 32` carry 192 bits.
MIN_CLUSTER_SECRET_LENGTH = 32
# `cluster.redis_timeout`: seconds one Redis call (a rate-limit check, a legacy session's
# record) may wait, connecting included. A Redis on the replicas' network answers in well under
# a millisecond; past this it is stalled, and the replica's own buckets decide instead (a legacy
# session request is refused, 503), so a slow Redis costs a request at most this.
DEFAULT_REDIS_TIMEOUT = 0.1
# `cluster.redis_retry_interval`: after Redis failed, the replica's own buckets decide (and
# legacy session requests are refused) for this many seconds before Redis is tried again, so a
# Redis that is down costs no request a timeout (one request a second pays at most one), and a
# recovered one is used again within a second.
DEFAULT_REDIS_RETRY_INTERVAL = 1.0
REDIS_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True)
class Introspection:
    """RFC 7662 introspection of opaque tokens, as a confidential client (client_secret_basic)."""

    client_id: str = key(
        "string", "The gateway's client id at the authorization server.", required=True
    )
    # Never in a repr, a log line or an error.
    client_secret: str = key("string", "Its secret (use ${VAR}).", required=True, secret=True)
    cache_ttl: float = key(
        "number",
        "Seconds an answer is reused (never past the token's exp).",
        DEFAULT_INTROSPECTION_CACHE_TTL,
    )
    cache_size: int = key(
        "count", "Answers kept at most.", DEFAULT_INTROSPECTION_CACHE_SIZE, minimum=1
    )


@dataclass(frozen=True)
class ApiKey:
    """A static bearer key, stored as the hex SHA-256 digest of the key (never the key)."""

    name: str = key(
        "string", "A label (logs, audit, client id).", pattern=NAME_PATTERN, required=True
    )
    sha256: str = key(
        "string",
        'Hex SHA-256 of the key: printf %s "$KEY" | sha256sum.',
        pattern="^[0-9a-fA-F]{64}$",
        required=True,
        secret=True,
    )
    scopes: tuple[str, ...] = key("strings", "The scopes the key carries.", ())
    # Empty: the name.
    subject: str = key("string", "The subject it stands for (default: its name).", "")


@dataclass(frozen=True)
class AuthConfig:
    """The HTTP listener as an OAuth 2.1 resource server (basic/authorization)."""

    issuer: str | None = key(  # None: API keys only
        "string",
        "The authorization server (https, or http on loopback); its metadata is discovered.",
        None,
        pattern=URL_PATTERN,
    )
    # The canonical URI of the MCP endpoint (RFC 8707, RFC 9728 `resource`).
    resource: str = key(
        "string",
        "The gateway's canonical URI (RFC 8707), e.g. https://mcp.example.com/mcp.",
        pattern=URL_PATTERN,
        required=True,
        kw_only=True,
    )
    audience: str = key("string", "The aud a token must contain (default: resource).", "")
    scopes_supported: tuple[str, ...] = key(
        "strings", "Scopes listed in the protected resource metadata.", ()
    )
    required_scopes: tuple[str, ...] = key(
        "strings", "Scopes every token must carry (else 403).", ()
    )
    introspection: Introspection | None = key(
        "section", "RFC 7662 introspection of opaque tokens.", None, section="introspection"
    )
    api_keys: tuple[ApiKey, ...] = key(
        "section_list", "Static bearer keys, stored as SHA-256 digests.", (), section="api_key"
    )
    algorithms: tuple[str, ...] = key(
        "strings",
        "JWT algorithms accepted (asymmetric only; default RS*, PS256, ES*, EdDSA).",
        DEFAULT_AUTH_ALGORITHMS,
    )
    leeway: float = key(
        "number", "Seconds of clock skew allowed on exp and nbf.", DEFAULT_AUTH_LEEWAY
    )
    jwks_refresh_interval: float = key(
        "number",
        "Least seconds between JWKS fetches for an unknown key id.",
        DEFAULT_JWKS_REFRESH_INTERVAL,
    )
    jwks_max_age: float = key(
        "number", "Seconds before the JWKS is fetched again.", DEFAULT_JWKS_MAX_AGE
    )
    fetch_timeout: float = key(
        "number", "Seconds for one fetch from the authorization server.", DEFAULT_AUTH_FETCH_TIMEOUT
    )
    max_response_bytes: int = key(
        "count",
        "A larger metadata document, JWKS or introspection answer is refused.",
        DEFAULT_AUTH_MAX_RESPONSE_BYTES,
        minimum=1024,
    )
    token_cache_size: int = key(
        "count",
        "Verified JWTs remembered until they expire (a repeated token skips the check).",
        DEFAULT_TOKEN_CACHE_SIZE,
        minimum=1,
    )
    # The gateway's own client at `issuer`, for checking who opens a per-user login link (the
    # browser's user logs in there first, and must be the caller the link was made for).
    login_client_id: str | None = key(
        "string",
        "The gateway's client at the issuer, for per-user backend logins: who opens a login "
        "link signs in here first and must be the caller it was made for.",
        None,
    )
    login_client_secret: str | None = key(
        "string", "Its secret, if it is confidential (use ${VAR}).", None, secret=True
    )

    @property
    def expected_audience(self) -> str:
        return self.audience or self.resource


@dataclass(frozen=True)
class BackendAuth:
    """How the gateway logs in to one HTTP backend (the client half of basic/authorization)."""

    type: str = key(
        "string",
        "oauth: a user's login (authorization code + PKCE); client_credentials: a service "
        "account; token_exchange: the caller's token exchanged (RFC 8693).",
        choices=BACKEND_AUTH_TYPES,
        required=True,
    )
    # None: a Client ID Metadata Document, else registration.
    client_id: str | None = key(
        "string", "A pre-registered client id (default: CIMD, else dynamic registration).", None
    )
    client_secret: str | None = key("string", "Its secret (use ${VAR}).", None, secret=True)
    # None: chosen from what the server offers.
    token_endpoint_auth_method: str | None = key(
        "string",
        "How the gateway authenticates at the token endpoint (default: from the server's "
        "metadata).",
        None,
        choices=CLIENT_AUTH_METHODS,
    )
    client_metadata_url: str | None = key(
        "string",
        "An https URL of the gateway's Client ID Metadata Document, used as its client id "
        "where the authorization server supports it.",
        None,
        pattern="^https://",
    )
    client_name: str = key(
        "string", "The name registered (and shown on consent pages).", DEFAULT_OAUTH_CLIENT_NAME
    )
    private_key_file: str | None = key(
        "string", "private_key_jwt: the PEM private key that signs client assertions.", None
    )
    signing_algorithm: str = key(
        "string",
        "private_key_jwt: the assertion's algorithm.",
        "RS256",
        choices=CLIENT_ASSERTION_ALGORITHMS,
    )
    key_id: str | None = key("string", "private_key_jwt: the assertion's kid.", None)
    scopes: tuple[str, ...] = key(
        "strings", "Scopes asked for when the server's challenge names none.", ()
    )
    per_user: bool = key(
        "boolean",
        "oauth: each caller logs in with their own account (asked by URL elicitation).",
        False,
    )
    open_browser: bool = key(
        "boolean", "oauth: open the browser for a login (the URL is logged either way).", True
    )
    redirect_port: int = key(
        "port", "oauth: port of the loopback redirect listener (0: any free port).", 0
    )
    authorization_server: str | None = key(
        "string",
        "The issuer to use when the backend's metadata names none (https, or http on loopback).",
        None,
        pattern=URL_PATTERN,
    )
    subject_token_type: str = key(
        "string", "token_exchange: the type of the caller's token.", ACCESS_TOKEN_TYPE
    )
    audience: str | None = key("string", "token_exchange: the audience asked for.", None)
    max_attempts: int = key(
        "count",
        "A refused request is retried after a new token at most this many times.",
        DEFAULT_OAUTH_MAX_ATTEMPTS,
        minimum=1,
    )
    refresh_margin: float = key(
        "number",
        "Seconds before expiry at which a token is refreshed.",
        DEFAULT_OAUTH_REFRESH_MARGIN,
    )
    login_timeout: float = key(
        "number", "per_user: seconds a login link stays valid.", DEFAULT_OAUTH_LOGIN_TIMEOUT
    )
    store: bool = key(
        "boolean", "Keep tokens on disk ($XDG_STATE_HOME/mcp-gateway) across restarts.", True
    )


@dataclass(frozen=True)
class ClusterConfig:
    """What identical replicas behind a load balancer share (`cluster:`): the secrets that
    replace each process's own random keys, so what one replica signs another accepts."""

    # The first signs, every one is accepted (rotation: add the new one second, then move it
    # first, then drop the old one). Never in a repr, a log line or an error.
    secrets: tuple[str, ...] = key(
        "strings",
        "Each at least 32 characters (use ${VAR}); the first signs, all are accepted.",
        secret=True,
    )
    # The absolute path they were read from, if a file.
    secrets_file: str | None = key(
        "string",
        "A file with one secret per line, relative to the config file (instead of secrets).",
        None,
    )
    # redis:// or rediss:// URL whose Redis holds the rate-limit buckets and the legacy
    # sessions the replicas share (None: each replica's own). May carry a password: shown only
    # through `redacted_url`.
    redis: str | None = key(
        "string",
        "redis://[:PASSWORD@]HOST:PORT/DB (or rediss://): rate limits, legacy sessions and "
        "backend logins shared by the replicas.",
        None,
        pattern="^rediss?://",
        secret=True,
    )
    redis_timeout: float = key(
        "number",
        "Seconds a Redis call waits; then own rate limits apply, legacy sessions get 503.",
        DEFAULT_REDIS_TIMEOUT,
    )
    redis_retry_interval: float = key(
        "number",
        "Seconds Redis is not asked after a failure (own rate limits, legacy sessions 503).",
        DEFAULT_REDIS_RETRY_INTERVAL,
    )

    def keys(self, purpose: bytes) -> tuple[bytes, ...]:
        """One key per secret, in the secrets' order, for one use (`purpose`, e.g.
        b"mcp-gateway cursor v1"): HMAC-SHA256(secret, purpose), so a key for one use is
        worth nothing for another, and none reveals its secret."""
        return tuple(hmac.new(s.encode(), purpose, hashlib.sha256).digest() for s in self.secrets)


def redacted_url(url: str) -> str:
    """`url` with its password (and a user name, which may be a token) replaced by `***`, for
    `check-config` and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address, bracketed again
    netloc = f"***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))
