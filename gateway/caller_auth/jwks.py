"""The authorization server's signing keys (its JWKS), fetched through the gateway's own HTTP
client (PyJWT's PyJWKClient fetches with blocking urllib), cached, and fetched again when a
token names a key id the cache lacks (key rotation), at most once per refresh interval, or
when the cache is older than its maximum age. Concurrent requests share one fetch.

A document that is not a JWK set (`{"keys": "nope"}`) counts as a failed fetch, as a body
that is not JSON does: the keys cached before are kept, not replaced by none."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import jwt

from gateway.caller_auth.fetch import Fetcher, FetchFailed
from gateway.caller_auth.outage import Outage, Unavailable

log = logging.getLogger("gateway.caller_auth")


def signing_keys(doc: Any) -> dict[str | None, dict[str, Any]] | None:
    """The usable keys of a JWKS document by key id (pure): public keys for signatures only.
    Symmetric (`oct`) keys are never used, and a key meant for encryption is skipped. None
    when the document is no JWK set (RFC 7517 5: an object whose `keys` is a list of
    objects)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        return None
    if not all(isinstance(jwk, dict) for jwk in doc["keys"]):
        return None
    out: dict[str | None, dict[str, Any]] = {}
    for jwk in doc["keys"]:
        if jwk.get("kty") not in ("RSA", "EC", "OKP"):
            continue
        if jwk.get("use", "sig") != "sig" or "d" in jwk:  # (a private key published by mistake)
            continue
        kid = jwk.get("kid")
        out.setdefault(kid if isinstance(kid, str) else None, jwk)
    return out


class Jwks:
    def __init__(
        self,
        fetcher: Fetcher,
        refresh_interval: float,
        max_age: float,
        clock: Callable[[], float] = time.monotonic,
        outage: Outage | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._outage = outage if outage is not None else Outage("fetching the JWKS", clock)
        self._refresh_interval = refresh_interval
        self._max_age = max_age
        self._clock = clock
        self._keys: dict[str | None, dict[str, Any]] = {}
        self._fetched: float | None = None  # when the cached set was fetched
        self._attempted: float | None = None  # when a fetch last started
        self._fetching: asyncio.Task[None] | None = None
        self._prepared: dict[tuple[str | None, str], jwt.PyJWK] = {}
        self.fetches = 0  # (for tests and logs: how often the set was fetched)
        # Bumped whenever a set is taken in: what was verified with an older one is stale.
        self.generation = 0

    async def key(self, url: str, kid: str | None, alg: str) -> jwt.PyJWK | None:
        """The key that should have signed a token with this `kid` and `alg`, or None when the
        set has none (after a refetch, if one is allowed now). Raises Unavailable when the set
        cannot be had (an old set is used while a refresh fails)."""
        if self._fetched is None:
            await self._refresh(url)
        elif self._clock() - self._fetched >= self._max_age and self._may_fetch():
            try:
                await self._refresh(url)
            except Unavailable:
                # An old set is better than none while the server is away; retried later.
                log.debug("keeping the cached JWKS while it cannot be fetched")
        jwk = self._find(kid)
        if jwk is None and self._may_fetch():
            await self._refresh(url)
            jwk = self._find(kid)
        return None if jwk is None else self._prepare(kid, jwk, alg)

    def _may_fetch(self) -> bool:
        # Attempts, not successes, are bounded: a server that is away is not asked per request.
        return self._attempted is None or self._clock() - self._attempted >= self._refresh_interval

    def _find(self, kid: str | None) -> dict[str, Any] | None:
        if kid is not None:
            return self._keys.get(kid)
        # A token without a key id: only a set of one key says which key that is.
        return next(iter(self._keys.values())) if len(self._keys) == 1 else None

    def _prepare(self, kid: str | None, jwk: dict[str, Any], alg: str) -> jwt.PyJWK | None:
        """The key bound to the token's algorithm, or None when the two do not fit (a key
        that names another `alg`, an RSA key for an EC algorithm)."""
        if jwk.get("alg") not in (None, alg):
            return None
        found = self._prepared.get((kid, alg))
        if found is None:
            try:
                found = jwt.PyJWK(jwk, algorithm=alg)
            except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
                return None
            self._prepared[kid, alg] = found
        return found

    async def _refresh(self, url: str) -> None:
        task = self._fetching
        if task is None:
            self._outage.check()
            self._attempted = self._clock()
            task = self._fetching = asyncio.get_running_loop().create_task(self._fetch(url))
            task.add_done_callback(self._fetched_or_failed)
        await asyncio.shield(task)

    def _fetched_or_failed(self, task: asyncio.Task[None]) -> None:
        self._fetching = None
        if not task.cancelled():
            task.exception()  # (seen by whoever awaited it; retrieved even if nobody did)

    async def _fetch(self, url: str) -> None:
        self.fetches += 1
        try:
            doc = await self._fetcher.get_json(url)
        except FetchFailed as exc:
            raise self._outage.failed(exc) from None
        keys = signing_keys(doc)
        if keys is None:
            raise self._outage.failed(FetchFailed(url, "not a JWK set"))
        self._outage.ok()
        self._keys = keys
        self._prepared = {}
        self._fetched = self._clock()
        self.generation += 1
