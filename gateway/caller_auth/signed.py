"""A JWT access token through PyJWT: its unverified header, its signature and registered claims.
Apart from tokens.py so that a gateway without `auth:` never loads PyJWT and cryptography
(about 8 MB): the authenticator, made only under `auth:`, is what imports this."""

from __future__ import annotations

from typing import Any

import jwt

from gateway.caller_auth.identity import JWT, Identity
from gateway.caller_auth.tokens import Rejected, claims_identity, dates_are_numbers
from gateway.config import AuthConfig


def jwt_header(token: str) -> dict[str, Any] | None:
    """The JOSE header of a token that looks like a JWS (three parts, a JSON header), None for
    anything else (an opaque token). Rejected for a JWS header PyJWT itself refuses (a `crit`
    it does not understand or that is no list, a `kid` that is no string): such a token was
    never an opaque one."""
    if token.count(".") != 2:
        return None
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        return None
    except jwt.PyJWTError:
        raise Rejected("invalid_token") from None
    return header if isinstance(header, dict) else None


def verify_jwt(token: str, key: jwt.PyJWK, alg: str, auth: AuthConfig) -> Identity:
    """Signature, iss, aud (must contain ours: a token for another resource is refused, no
    confused deputy), exp/nbf/iat within the leeway. Raises Rejected."""
    try:
        claims = jwt.decode(
            token,
            key,
            algorithms=[alg],
            audience=auth.expected_audience,
            issuer=auth.issuer,
            leeway=auth.leeway,
            options={"require": ["exp", "iss", "aud"], "strict_aud": False},
        )
    except jwt.ExpiredSignatureError:
        raise Rejected("expired") from None
    except (jwt.InvalidAudienceError, jwt.MissingRequiredClaimError) as exc:
        missing = isinstance(exc, jwt.MissingRequiredClaimError)
        raise Rejected("invalid_token" if missing else "wrong_audience") from None
    except jwt.InvalidIssuerError:
        raise Rejected("wrong_issuer") from None
    except jwt.InvalidSignatureError:
        raise Rejected("bad_signature") from None
    except jwt.InvalidAlgorithmError:
        raise Rejected("algorithm") from None
    except jwt.ImmatureSignatureError:
        raise Rejected("not_yet_valid") from None
    except jwt.PyJWTError:
        raise Rejected("invalid_token") from None
    if not dates_are_numbers(claims):
        raise Rejected("invalid_token")
    return claims_identity(claims, JWT)
