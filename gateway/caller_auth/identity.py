"""The caller of one request, as the gateway established it: from a verified bearer token (a
JWT, an introspected opaque token or a configured API key) on HTTP, or from configuration on
stdio. Pure: the dispatcher, policy, rate limiter, audit log and telemetry read it from the
request's `Origin`; nothing here knows how it was established.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# How an identity was established; a label for audit lines and metrics.
JWT = "jwt"
INTROSPECTION = "introspection"
API_KEY = "api_key"
CONFIGURED = "configured"


def _no_claims() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Identity:
    subject: str
    client_id: str | None = None
    issuer: str | None = None
    scopes: frozenset[str] = frozenset()
    # The token's claims (or the introspection answer) for policy rules on claims; never logged.
    claims: Mapping[str, Any] = field(default_factory=_no_claims, compare=False, hash=False)
    method: str = JWT

    def key(self) -> str:
        """Whose state is whose (legacy sessions, sealed `requestState`, a child per caller):
        the same subject of the same client at the same issuer, whichever token it presents,
        so a refreshed token keeps its session and another user's token cannot use it."""
        parts = (self.method, self.issuer or "", self.subject, self.client_id or "")
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    def has_scopes(self, needed: frozenset[str]) -> bool:
        return needed <= self.scopes
