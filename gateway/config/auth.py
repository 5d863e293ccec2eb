"""The `auth:` section: the HTTP listener as an OAuth 2.1 resource server (basic/authorization),
with API keys for small teams without an authorization server."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

from gateway.config import keys
from gateway.config.credentials import DEFAULT_AUTH_ALGORITHMS, ApiKey, AuthConfig, Introspection
from gateway.config.key import NAME_PATTERN
from gateway.config.listeners import HttpListen
from gateway.config.reader import _Check

Path_ = tuple[str, ...]

# What a JWT may be signed with: the asymmetric JWS algorithms PyJWT knows. HMAC (HS*) would
# need a secret shared with the authorization server, and a public key used as an HMAC secret is
# the classic forgery; `none` is no signature at all. Neither is accepted, even when listed.
ASYMMETRIC = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# RFC 6749 3.3 scope-token: visible ASCII but `"` and `\`, so it can sit in a challenge as is.
_SCOPE = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_LOOPBACK_NAMES = ("localhost",)


def is_loopback_host(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str, *, https: bool) -> str | None:
    """Why `url` is not an absolute http(s) URL without a fragment (and, with `https`, on
    https unless its host is loopback: basic/authorization, Communication Security), or None."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return "must be an absolute http:// or https:// URL"
    if "#" in url:
        return "must not have a fragment"
    if https and parts.scheme.lower() != "https" and not is_loopback_host(parts.hostname):
        return "must be https (http only on a loopback host)"
    return None


def _scopes(c: _Check, body: dict[str, Any], path: Path_, name: str) -> tuple[str, ...]:
    values: tuple[str, ...] = c.field(body, path, name, keys.table("auth")[name])
    for i, scope in enumerate(values):
        if not _SCOPE.fullmatch(scope):
            c.r.problem(path + (name, str(i)), "is not a scope token (visible ASCII, no quotes)")
    return values


def _introspection(c: _Check, raw: Any, path: Path_) -> Introspection | None:
    if raw is None:
        return None
    body = c.mapping(raw, path, keys.names("introspection"))
    t = keys.table("introspection")
    client_id = c.field(body, path, "client_id", t["client_id"])
    secret = c.field(body, path, "client_secret", t["client_secret"])
    for name, value in (("client_id", client_id), ("client_secret", secret)):
        if not value:
            c.r.problem(path + (name,), "is required")
    return Introspection(
        client_id=client_id or "",
        client_secret=secret or "",
        **c.scalars(body, path, Introspection, skip={"client_id", "client_secret"}),
    )


def _api_keys(c: _Check, raw: Any, path: Path_) -> tuple[ApiKey, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        c.r.problem(path, "must be a list of {name, sha256, scopes} mappings")
        return ()
    t = keys.table("api_key")
    out: list[ApiKey] = []
    names: set[str] = set()
    for i, item in enumerate(raw):
        where = path + (str(i),)
        if not isinstance(item, dict):
            c.r.problem(where, "must be a mapping with name and sha256")
            continue
        body = c.mapping(item, where, keys.names("api_key"))
        name = c.field(body, where, "name", t["name"])
        raw_digest = body.get("sha256")
        if isinstance(raw_digest, int | float) and not isinstance(raw_digest, bool):
            # An unquoted digest of digits (and an `e`) reads as a number: its text is meant.
            body = {**body, "sha256": c.r.text.get(where + ("sha256",), "")}
        digest = c.field(body, where, "sha256", t["sha256"])
        if not name or not re.fullmatch(NAME_PATTERN, name):
            c.r.problem(where + ("name",), "is required: letters, digits, '_', '.' and '-'")
            continue
        if name in names:
            c.r.problem(where + ("name",), f"{name!r} is used twice")
        names.add(name)
        if not digest or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            # (the value is not echoed: it might be the key itself, pasted by mistake)
            c.r.problem(where + ("sha256",), "must be 64 hex digits: printf %s KEY | sha256sum")
            continue
        scopes: tuple[str, ...] = c.field(body, where, "scopes", t["scopes"])
        for j, scope in enumerate(scopes):
            if not _SCOPE.fullmatch(scope):
                c.r.problem(where + ("scopes", str(j)), "is not a scope token")
        subject = c.field(body, where, "subject", t["subject"])
        out.append(ApiKey(name, digest.lower(), scopes, subject or name))
    return tuple(out)


def _algorithms(c: _Check, body: dict[str, Any], path: Path_) -> tuple[str, ...]:
    if body.get("algorithms") is None:
        return DEFAULT_AUTH_ALGORITHMS
    values: tuple[str, ...] = c.field(body, path, "algorithms", keys.table("auth")["algorithms"])
    if not values:
        c.r.problem(path + ("algorithms",), "must list at least one algorithm")
    for i, alg in enumerate(values):
        if alg.lower() == "none" or alg.upper().startswith("HS"):
            c.r.problem(path + ("algorithms", str(i)), f"{alg} is refused: asymmetric only")
        elif alg not in ASYMMETRIC:
            c.r.problem(
                path + ("algorithms", str(i)), f"must be one of {', '.join(sorted(ASYMMETRIC))}"
            )
    return values


_OWN_RULES = {"resource", "issuer", "audience", "scopes_supported", "required_scopes", "algorithms"}


def auth(c: _Check, raw: Any, http: HttpListen | None) -> AuthConfig | None:
    """`auth:`, or None when absent (no authentication, as before)."""
    if raw is None:
        return None
    path: Path_ = ("auth",)
    body = c.mapping(raw, path, keys.names("auth"))
    t = keys.table("auth")
    resource = c.field(body, path, "resource", t["resource"])
    if not resource:
        c.r.problem(path + ("resource",), "is required: the gateway's canonical URI")
    elif (why := url_problem(resource, https=False)) is not None:
        c.r.problem(path + ("resource",), why)
    issuer = c.field(body, path, "issuer", t["issuer"])
    if issuer is not None and (why := url_problem(issuer, https=True)) is not None:
        c.r.problem(path + ("issuer",), why)
    api_keys = _api_keys(c, body.get("api_keys"), path + ("api_keys",))
    introspection = _introspection(c, body.get("introspection"), path + ("introspection",))
    if not issuer and not api_keys:
        c.r.problem(path, "needs an issuer, api_keys, or both")
    if introspection is not None and not issuer:
        c.r.problem(path + ("introspection",), "needs an issuer (its metadata names the endpoint)")
    if http is None:
        c.r.problem(path, "applies to listen.http, which is not configured")
    return AuthConfig(
        resource=resource or "",
        issuer=issuer or None,
        audience=c.field(body, path, "audience", t["audience"]) or "",
        scopes_supported=_scopes(c, body, path, "scopes_supported"),
        required_scopes=_scopes(c, body, path, "required_scopes"),
        introspection=introspection,
        api_keys=api_keys,
        algorithms=_algorithms(c, body, path),
        # The plain keys; those above are read with rules of their own.
        **c.scalars(body, path, AuthConfig, skip=_OWN_RULES),
    )
