"""From a bearer token to an Identity (basic/authorization, Token Handling): an API key by its
digest; a JWT access token verified against the issuer's keys; an opaque token introspected.
What cannot be decided because the authorization server cannot be reached is `Unavailable`
(the request is answered 503 with Retry-After), never a refusal of a token that may be good:
logged once per outage, retried after a short, growing delay, not once per request (outage.py).

A JWT that verified is remembered by its digest until it expires (at most `token_cache_size`
of them, and only while the JWKS it was checked against is the current one), since a client
sends the same token with every request and the signature check is most of the cost."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.caller_auth.discovery import ServerMetadata, discover
from gateway.caller_auth.fetch import Fetcher, FetchFailed
from gateway.caller_auth.identity import Identity
from gateway.caller_auth.introspection import Introspector
from gateway.caller_auth.jwks import Jwks
from gateway.caller_auth.outage import Outage
from gateway.caller_auth.signed import jwt_header, verify_jwt
from gateway.caller_auth.tokens import (
    Rejected,
    api_key_identity,
    check_header,
    digest,
    well_formed,
)
from gateway.config import AuthConfig

log = logging.getLogger("gateway.caller_auth")


class Authenticator:
    def __init__(self, config: AuthConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._fetcher = Fetcher(config.fetch_timeout, config.max_response_bytes)
        self._keys = Outage("fetching the authorization server's metadata or keys")
        self._introspection = Outage("token introspection")
        self.jwks = Jwks(
            self._fetcher,
            config.jwks_refresh_interval,
            config.jwks_max_age,
            outage=self._keys,
        )
        settings = config.introspection
        self.introspector = (
            Introspector(self._fetcher, settings, config) if settings is not None else None
        )
        self._metadata: ServerMetadata | None = None
        self._discovering: asyncio.Task[ServerMetadata] | None = None
        # digest -> (identity, valid until (epoch s), the JWKS generation it was checked with)
        self._verified: dict[str, tuple[Identity, float, int]] = {}
        self.verifications = 0  # (for tests: signature checks made, not taken from the cache)

    async def authenticate(self, token: str) -> Identity:
        """The caller a token stands for; raises Rejected (401) or Unavailable (503)."""
        if not well_formed(token):
            raise Rejected("invalid_token")
        token_digest = digest(token)
        if self.config.api_keys:
            found = api_key_identity(self.config.api_keys, token_digest)
            if found is not None:
                return found
        if self.config.issuer is None:
            raise Rejected("unknown_api_key")
        cached = self._verified.get(token_digest)
        if cached is not None:
            identity, until, generation = cached
            if self._clock() < until and generation == self.jwks.generation:
                return identity
            del self._verified[token_digest]
        header = jwt_header(token)
        if header is not None:
            alg, kid = check_header(header, self.config)  # (refused before anything is fetched)
            metadata = await self._server_metadata()
            if metadata.jwks_uri is not None:
                key = await self.jwks.key(metadata.jwks_uri, kid, alg)
                if key is None:
                    raise Rejected("unknown_key")
                self.verifications += 1
                identity = verify_jwt(token, key, alg, self.config)
                self._remember(token_digest, identity)
                return identity
        return await self._introspect(token)

    def _remember(self, token_digest: str, identity: Identity) -> None:
        exp = identity.claims.get("exp")
        if not isinstance(exp, int | float):
            return
        if len(self._verified) >= self.config.token_cache_size:
            self._verified.pop(next(iter(self._verified)))  # the oldest: a bound, not an LRU
        # Valid as long as verification would pass: until exp, within the leeway.
        self._verified[token_digest] = (identity, exp + self.config.leeway, self.jwks.generation)

    async def _introspect(self, token: str) -> Identity:
        if self.introspector is None:
            raise Rejected("invalid_token")  # an opaque token nobody here can check
        metadata = await self._server_metadata()
        endpoint = metadata.introspection_endpoint
        if endpoint is None:
            raise Rejected("introspection_failed")
        self._introspection.check()
        try:
            identity = await self.introspector.identity(endpoint, token)
        except FetchFailed as exc:
            raise self._introspection.failed(exc) from None
        self._introspection.ok()
        return identity

    async def _server_metadata(self) -> ServerMetadata:
        """The issuer's metadata, discovered once (concurrent first requests share one try)."""
        if self._metadata is not None:
            return self._metadata
        task = self._discovering
        if task is None:
            self._keys.check()
            task = asyncio.get_running_loop().create_task(self._discover())
            self._discovering = task
            task.add_done_callback(self._discovered)
        return await asyncio.shield(task)

    async def _discover(self) -> ServerMetadata:
        assert self.config.issuer is not None
        try:
            found = await discover(self._fetcher, self.config.issuer)
        except FetchFailed as exc:
            raise self._keys.failed(exc) from None
        self._keys.ok()
        return found

    def _discovered(self, task: asyncio.Task[ServerMetadata]) -> None:
        self._discovering = None
        if not task.cancelled() and task.exception() is None:
            self._metadata = task.result()

    async def close(self) -> None:
        await self._fetcher.close()
