"""Opaque tokens, asked about at the authorization server's introspection endpoint (RFC 7662)
as a confidential client (client_secret_basic, RFC 6749 2.3.1), with a short, bounded cache
keyed by the token's digest: an answer is reused for `cache_ttl` at most and never past the
token's `exp`; a refusal is reused too, so a repeated bad token does not reach the server each
time."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from urllib.parse import quote_plus

from gateway.caller_auth.fetch import Fetcher
from gateway.caller_auth.identity import Identity
from gateway.caller_auth.tokens import Rejected, digest, introspected
from gateway.config import AuthConfig, Introspection


def basic_credentials(client_id: str, secret: str) -> str:
    """The Authorization value of client_secret_basic: both parts form-encoded first."""
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()
    return "Basic " + base64.b64encode(pair).decode()


class Introspector:
    def __init__(
        self,
        fetcher: Fetcher,
        settings: Introspection,
        auth: AuthConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fetcher = fetcher
        self._auth = auth
        self._ttl = settings.cache_ttl
        self._size = settings.cache_size
        self._clock = clock
        self._authorization = basic_credentials(settings.client_id, settings.client_secret)
        # digest -> (identity or the reason it was refused, until when it may be reused)
        self._cache: dict[str, tuple[Identity | str, float]] = {}
        self.asked = 0  # (for tests: answers fetched, not taken from the cache)

    def __repr__(self) -> str:
        return "Introspector()"  # (its state holds a credential)

    async def identity(self, endpoint: str, token: str) -> Identity:
        """Raises Rejected, or FetchFailed when the endpoint cannot be asked."""
        key = digest(token)
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None:
            found, until = cached
            if now < until:
                if isinstance(found, str):
                    raise Rejected(found)
                return found
            del self._cache[key]
        self.asked += 1
        form = {"token": token, "token_type_hint": "access_token"}
        answer = await self._fetcher.post_form(endpoint, form, self._authorization)
        now = self._clock()
        try:
            result = introspected(answer, self._auth, now)
        except Rejected as exc:
            self._remember(key, exc.reason, now + self._ttl)
            raise
        until = now + self._ttl
        if result.expires is not None:
            until = min(until, result.expires)
        self._remember(key, result.identity, until)
        return result.identity

    def _remember(self, key: str, found: Identity | str, until: float) -> None:
        if len(self._cache) >= self._size:
            # The oldest entry goes (insertion order): a bound, not an LRU.
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (found, until)
