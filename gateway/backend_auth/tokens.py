"""Tokens as the token endpoint issues them, and as the store keeps them (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class TokenResponseInvalid(Exception):
    """A token endpoint's success answer that is not a usable bearer token."""


@dataclass(frozen=True)
class Token:
    access_token: str = field(repr=False)
    expires_at: float | None = None  # epoch seconds; None: the server did not say
    refresh_token: str | None = field(default=None, repr=False)
    scope: tuple[str, ...] | None = None  # granted; None: as asked (RFC 6749 5.1)

    def usable(self, now: float, margin: float) -> bool:
        """Still good for `margin` seconds more (a token about to expire is refreshed first)."""
        return self.expires_at is None or self.expires_at - margin > now

    def as_record(self) -> dict[str, Any]:
        return {
            "access_token": self.access_token,
            "expires_at": self.expires_at,
            "refresh_token": self.refresh_token,
            "scope": list(self.scope) if self.scope is not None else None,
        }

    @classmethod
    def from_record(cls, record: Any) -> Token | None:
        if not isinstance(record, dict) or not isinstance(record.get("access_token"), str):
            return None
        expires = record.get("expires_at")
        refresh = record.get("refresh_token")
        scope = record.get("scope")
        return cls(
            access_token=record["access_token"],
            expires_at=float(expires) if isinstance(expires, int | float) else None,
            refresh_token=refresh if isinstance(refresh, str) else None,
            scope=tuple(str(s) for s in scope) if isinstance(scope, list) else None,
        )


def from_response(
    body: Any, now: float, asked: tuple[str, ...] | None, previous: Token | None = None
) -> Token:
    """The token in a token endpoint's 200 answer (RFC 6749 5.1). A refresh answer without a
    new refresh token keeps the old one (6.: the server may leave it unchanged)."""
    if not isinstance(body, dict):
        raise TokenResponseInvalid("not a JSON object")
    access = body.get("access_token")
    if not isinstance(access, str) or not access:
        raise TokenResponseInvalid("no access_token")
    kind = body.get("token_type")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise TokenResponseInvalid("not a bearer token")
    expires_in = body.get("expires_in")
    expires_at = None
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
        expires_at = now + float(expires_in)
    refresh = body.get("refresh_token")
    if not isinstance(refresh, str):
        refresh = previous.refresh_token if previous is not None else None
    scope = body.get("scope")
    granted = tuple(scope.split()) if isinstance(scope, str) else asked
    return Token(access, expires_at, refresh, granted)
