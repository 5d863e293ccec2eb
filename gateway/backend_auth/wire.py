"""Pure rules of the OAuth client: challenges, discovery URLs, resource matching, PKCE, the
authorization response's checks and scope selection (basic/authorization)."""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import re
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

PRM_WELL_KNOWN = "/.well-known/oauth-protected-resource"
OAUTH_WELL_KNOWN = "/.well-known/oauth-authorization-server"
OPENID_WELL_KNOWN = "/.well-known/openid-configuration"
OFFLINE_ACCESS = "offline_access"
# One auth-param of a challenge: name=token or name="quoted string" (RFC 9110 11.2).
_PARAM = re.compile(r'\s*([!#$%&\'*+.^_`|~0-9A-Za-z-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)\s*,?')
_SCHEME = re.compile(r"\s*([!#$%&'*+.^_`|~0-9A-Za-z-]+)(?:\s+|$)")


@dataclass(frozen=True)
class Challenge:
    """A Bearer challenge from WWW-Authenticate (RFC 6750 3, RFC 9728 5.1)."""

    error: str | None = None
    scope: tuple[str, ...] | None = None
    resource_metadata: str | None = None


def parse_challenge(values: list[str]) -> Challenge | None:
    """The Bearer challenge among the WWW-Authenticate header values, or None."""
    for value in values:
        rest = value
        while rest.strip():
            m = _SCHEME.match(rest)
            if m is None:
                break
            scheme, rest = m.group(1), rest[m.end() :]
            params: dict[str, str] = {}
            while (p := _PARAM.match(rest)) is not None and p.group(0):
                raw = p.group(2)
                if raw.startswith('"'):
                    raw = re.sub(r"\\(.)", r"\1", raw[1:-1])
                params.setdefault(p.group(1).lower(), raw)
                rest = rest[p.end() :]
            if scheme.lower() == "bearer":
                scope = params.get("scope")
                return Challenge(
                    error=params.get("error"),
                    scope=tuple(scope.split()) if scope is not None else None,
                    resource_metadata=params.get("resource_metadata"),
                )
            rest = rest.lstrip(", ")
    return None


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def outbound_problem(url: str) -> str | None:
    """Why the gateway will not fetch `url`, a URL a server gave it, or None: only https, or
    http to a loopback host (basic/authorization, Communication Security; no SSRF by scheme)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "not a URL"
    if parts.scheme == "https" and parts.hostname:
        return None
    if parts.scheme == "http" and is_loopback(parts.hostname):
        return None
    return "only https URLs (or http on loopback) are fetched"


def canonical_resource(url: str) -> str:
    """The backend URL as a resource indicator (RFC 8707 2): lowercase scheme and host, no
    fragment, and no trailing slash on an empty path."""
    parts = urlsplit(url)
    netloc = parts.netloc.lower()
    path = "" if parts.path == "/" else parts.path
    return urlunsplit((parts.scheme.lower(), netloc, path, parts.query, ""))


def resource_covers(advertised: str, backend: str) -> bool:
    """Whether the PRM's `resource` is the backend's URL or a parent of it (same origin, path a
    prefix on a segment boundary): a server cannot get a token for someone else's resource."""
    a, b = urlsplit(canonical_resource(advertised)), urlsplit(canonical_resource(backend))
    if (a.scheme, a.netloc) != (b.scheme, b.netloc):
        return False
    base, path = a.path.rstrip("/"), b.path
    return path == base or path.startswith(base + "/") or not base


def prm_urls(backend: str) -> list[str]:
    """The well-known PRM locations, in the spec's order: with the MCP endpoint's path, then
    at the root (authorization-server-discovery, Protected Resource Metadata Discovery)."""
    parts = urlsplit(backend)
    root = urlunsplit((parts.scheme, parts.netloc, PRM_WELL_KNOWN, "", ""))
    path = parts.path.rstrip("/")
    if not path:
        return [root]
    return [urlunsplit((parts.scheme, parts.netloc, PRM_WELL_KNOWN + path, "", "")), root]


def metadata_urls(issuer: str) -> list[str]:
    """Authorization server metadata locations, in the spec's order (RFC 8414 3.1 and 5)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")

    def at(p: str) -> str:
        return urlunsplit((parts.scheme, parts.netloc, p, "", ""))

    if not path:
        return [at(OAUTH_WELL_KNOWN), at(OPENID_WELL_KNOWN)]
    return [at(OAUTH_WELL_KNOWN + path), at(OPENID_WELL_KNOWN + path), at(path + OPENID_WELL_KNOWN)]


@dataclass(frozen=True)
class Pkce:
    verifier: str
    challenge: str


def pkce() -> Pkce:
    """RFC 7636 S256: a 43-128 character verifier of unreserved characters, and its SHA-256."""
    verifier = secrets.token_urlsafe(64)[:96]
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return Pkce(verifier, base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii"))


def with_query(url: str, params: dict[str, str]) -> str:
    """`url` with `params` added to its query (an endpoint may carry a query of its own)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True) + list(params.items())
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), ""))


def iss_problem(advertised: bool, iss: str | None, expected: str) -> str | None:
    """RFC 9207 2.4 as basic/authorization's table applies it: a present `iss` must equal the
    recorded issuer exactly (no normalisation), and an absent one is refused only where the
    server advertises that it sends it."""
    if iss is not None:
        return None if iss == expected else "the authorization response names another issuer"
    if advertised:
        return "the authorization response lacks the iss its server advertises"
    return None


def select_scopes(
    challenged: tuple[str, ...] | None,
    supported: list[str] | None,
    configured: tuple[str, ...],
    offered: list[str] | None,
    previous: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """Scope Selection Strategy: the challenge's scopes (with those asked before, for a
    step-up), else the PRM's `scopes_supported`, else the configured ones, else none; plus
    `offline_access` where the authorization server offers it (Refresh Tokens)."""
    if challenged is not None:
        chosen = list(previous) + [s for s in challenged if s not in previous]
    elif supported:
        chosen = list(supported)
    else:
        chosen = list(configured)
    if offered and OFFLINE_ACCESS in offered and OFFLINE_ACCESS not in chosen:
        chosen.append(OFFLINE_ACCESS)
    return tuple(chosen)


def port_of(url: str) -> int:
    try:
        return urlsplit(url).port or 0
    except ValueError:
        return 0
