"""The config's frozen objects for who proves what to whom: `auth:` (callers to the gateway), a
backend's `auth:` (the gateway to that backend) and `cluster:` (replicas to each other)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

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

    client_id: str
    client_secret: str = field(repr=False)  # never in a repr, a log line or an error
    cache_ttl: float = DEFAULT_INTROSPECTION_CACHE_TTL
    cache_size: int = DEFAULT_INTROSPECTION_CACHE_SIZE


@dataclass(frozen=True)
class ApiKey:
    """A static bearer key, stored as the hex SHA-256 digest of the key (never the key)."""

    name: str
    sha256: str = field(repr=False)
    scopes: tuple[str, ...] = ()
    subject: str = ""  # empty: the name


@dataclass(frozen=True)
class AuthConfig:
    """The HTTP listener as an OAuth 2.1 resource server (basic/authorization)."""

    resource: str  # the canonical URI of the MCP endpoint (RFC 8707, RFC 9728 `resource`)
    issuer: str | None = None  # None: API keys only
    audience: str = ""  # empty: `resource`
    scopes_supported: tuple[str, ...] = ()
    required_scopes: tuple[str, ...] = ()
    introspection: Introspection | None = None
    api_keys: tuple[ApiKey, ...] = ()
    algorithms: tuple[str, ...] = DEFAULT_AUTH_ALGORITHMS
    leeway: float = DEFAULT_AUTH_LEEWAY
    jwks_refresh_interval: float = DEFAULT_JWKS_REFRESH_INTERVAL
    jwks_max_age: float = DEFAULT_JWKS_MAX_AGE
    fetch_timeout: float = DEFAULT_AUTH_FETCH_TIMEOUT
    max_response_bytes: int = DEFAULT_AUTH_MAX_RESPONSE_BYTES
    token_cache_size: int = DEFAULT_TOKEN_CACHE_SIZE
    # The gateway's own client at `issuer`, for checking who opens a per-user login link (the
    # browser's user logs in there first, and must be the caller the link was made for).
    login_client_id: str | None = None
    login_client_secret: str | None = field(default=None, repr=False)

    @property
    def expected_audience(self) -> str:
        return self.audience or self.resource


@dataclass(frozen=True)
class BackendAuth:
    """How the gateway logs in to one HTTP backend (the client half of basic/authorization)."""

    type: str  # one of BACKEND_AUTH_TYPES
    client_id: str | None = None  # None: a Client ID Metadata Document, else registration
    client_secret: str | None = field(default=None, repr=False)
    token_endpoint_auth_method: str | None = None  # None: chosen from what the server offers
    client_metadata_url: str | None = None  # a CIMD URL (https) used as the client id
    client_name: str = DEFAULT_OAUTH_CLIENT_NAME
    private_key_file: str | None = None  # private_key_jwt: a PEM private key
    signing_algorithm: str = "RS256"
    key_id: str | None = None  # the assertion's kid
    scopes: tuple[str, ...] = ()  # asked for when no challenge names any
    per_user: bool = False  # each caller logs in for themselves
    open_browser: bool = True
    redirect_port: int = 0  # the loopback redirect listener's port (0: any free one)
    authorization_server: str | None = None  # an issuer, when the backend advertises none
    subject_token_type: str = ACCESS_TOKEN_TYPE
    audience: str | None = None  # token_exchange: the audience asked for (default: none)
    max_attempts: int = DEFAULT_OAUTH_MAX_ATTEMPTS
    refresh_margin: float = DEFAULT_OAUTH_REFRESH_MARGIN
    login_timeout: float = DEFAULT_OAUTH_LOGIN_TIMEOUT
    store: bool = True  # keep tokens on disk (under $XDG_STATE_HOME/mcp-gateway)


@dataclass(frozen=True)
class ClusterConfig:
    """What identical replicas behind a load balancer share (`cluster:`): the secrets that
    replace each process's own random keys, so what one replica signs another accepts."""

    # The first signs, every one is accepted (rotation: add the new one second, then move it
    # first, then drop the old one). Never in a repr, a log line or an error.
    secrets: tuple[str, ...] = field(repr=False)
    secrets_file: str | None = None  # the absolute path they were read from, if a file
    # redis:// or rediss:// URL whose Redis holds the rate-limit buckets and the legacy
    # sessions the replicas share (None: each replica's own). May carry a password: shown only
    # through `redacted_url`.
    redis: str | None = field(default=None, repr=False)
    redis_timeout: float = DEFAULT_REDIS_TIMEOUT
    redis_retry_interval: float = DEFAULT_REDIS_RETRY_INTERVAL

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
