"""Checking one bearer token, pure where no key is fetched: a JWT access token's header and
claims (PyJWT's part, the signature and the registered claims, is signed.py's), an API key's
digest, an introspection answer. Each failure has a reason (a bounded label for metrics and the
debug log); the client sees only `invalid_token`."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gateway.caller_auth.identity import API_KEY, INTROSPECTION, Identity
from gateway.config import ApiKey, AuthConfig

# RFC 6750 2.1 b64token: what may follow `Bearer `.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
# RFC 9068 2.1 and RFC 8725 3.11: an access token's `typ`, if present (a bare "JWT" too, which
# many servers still write). An ID token or a logout token has none of these.
ACCESS_TOKEN_TYPES = frozenset({"at+jwt", "application/at+jwt", "jwt"})


class Rejected(Exception):
    """The token does not grant access: 401 invalid_token (the reason is ours, not sent)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def well_formed(token: str) -> bool:
    return _B64TOKEN.fullmatch(token) is not None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def api_key_identity(keys: tuple[ApiKey, ...], token_digest: str) -> Identity | None:
    """The identity of the configured key whose digest this is; every key is compared (in
    constant time), so the time taken says nothing about which came close."""
    found: ApiKey | None = None
    for key in keys:
        if hmac.compare_digest(key.sha256, token_digest):
            found = key
    if found is None:
        return None
    return Identity(
        subject=found.subject,
        client_id=found.name,
        scopes=frozenset(found.scopes),
        method=API_KEY,
    )


def check_header(header: dict[str, Any], auth: AuthConfig) -> tuple[str, str | None]:
    """(alg, kid) of a header the gateway may verify; Rejected otherwise: an algorithm not
    allowed (`none`, HMAC, anything unlisted), a `typ` that is no access token's, `crit`."""
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in auth.algorithms:
        raise Rejected("algorithm")
    typ = header.get("typ")
    if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
        raise Rejected("invalid_token")
    if "crit" in header:  # (no extension is understood, RFC 7515 4.1.11)
        raise Rejected("invalid_token")
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise Rejected("invalid_token")
    return alg, kid


def dates_are_numbers(claims: Mapping[str, Any]) -> bool:
    """Whether `exp`, `nbf` and `iat`, where present, are NumericDates (RFC 7519 2: a JSON
    number). PyJWT reads a string of digits as one; a token that writes them so is refused."""
    return all(
        type(claims[name]) in (int, float) for name in ("exp", "nbf", "iat") if name in claims
    )


def scopes_of(claims: Mapping[str, Any]) -> frozenset[str]:
    """`scope` (space-separated, RFC 9068 2.2.3 and RFC 7662), else `scp` (a list, or a string
    as some servers write it)."""
    scope = claims.get("scope")
    if isinstance(scope, str):
        return frozenset(scope.split())
    scp = claims.get("scp")
    if isinstance(scp, str):
        return frozenset(scp.split())
    if isinstance(scp, list):
        return frozenset(s for s in scp if isinstance(s, str))
    return frozenset()


def claims_identity(claims: Mapping[str, Any], method: str) -> Identity:
    """Who the claims say is calling: `sub`, of client `client_id` (or `azp`); a token of a
    client acting for itself may name only the client (no `sub` at all). A `sub` that is
    present must name someone: an empty one is refused, not taken for the client."""
    client = claims.get("client_id", claims.get("azp"))
    client_id = client if isinstance(client, str) and client else None
    subject = claims.get("sub")
    if subject is None:
        if client_id is None:
            raise Rejected("invalid_token")
        subject = client_id
    elif not isinstance(subject, str) or not subject:
        raise Rejected("invalid_token")
    issuer = claims.get("iss")
    return Identity(
        subject=subject,
        client_id=client_id,
        issuer=issuer if isinstance(issuer, str) else None,
        scopes=scopes_of(claims),
        claims=MappingProxyType(dict(claims)),
        method=method,
    )


@dataclass(frozen=True)
class Introspected:
    identity: Identity
    expires: float | None  # the token's exp (epoch seconds), when the answer names one


def introspected(answer: Any, auth: AuthConfig, now: float) -> Introspected:
    """An RFC 7662 answer checked as a JWT's claims are: active, for our audience (an answer
    without `aud` cannot show the token is ours, so it is refused), from our issuer when it
    says, unexpired. Raises Rejected."""
    if not isinstance(answer, dict) or answer.get("active") is not True:
        raise Rejected("inactive")
    aud = answer.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if auth.expected_audience not in audiences:
        raise Rejected("wrong_audience")
    iss = answer.get("iss")
    if iss is not None and iss != auth.issuer:
        raise Rejected("wrong_issuer")
    exp = answer.get("exp")
    if exp is not None and (not isinstance(exp, int | float) or exp <= now - auth.leeway):
        raise Rejected("expired")
    nbf = answer.get("nbf")
    if isinstance(nbf, int | float) and nbf > now + auth.leeway:
        raise Rejected("not_yet_valid")
    identity = claims_identity({"iss": auth.issuer, **answer}, INTROSPECTION)
    return Introspected(identity, float(exp) if exp is not None else None)
