"""From a bearer token to an Identity (basic/authorization, Token Handling): an API key by its
digest; a JWT access token verified against the issuer's keys; an opaque token introspected.
What cannot be decided because the authorization server cannot be reached is `Unavailable`
(the request is answered 503 with Retry-After), never a refusal of a token that may be good:
logged once per outage, retried after a short, growing delay, not once per request."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from gateway.auth.discovery import ServerMetadata, discover
from gateway.auth.fetch import Fetcher, FetchFailed
from gateway.auth.identity import Identity
from gateway.auth.introspection import Introspector
from gateway.auth.jwks import Jwks
from gateway.auth.tokens import (
    Rejected,
    api_key_identity,
    check_header,
    digest,
    jwt_header,
    verify_jwt,
    well_formed,
)
from gateway.config import AuthConfig

log = logging.getLogger("gateway.auth")

# After a failed fetch, requests that need the server are answered 503 at once for this long,
# doubling per failure in a row up to the most: a server that is away is asked a few times a
# minute, not once per request (each of which would wait out the fetch timeout).
FIRST_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 30.0


class Unavailable(Exception):
    """The token cannot be checked now: the authorization server is not answering."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry after {retry_after:g} s")
        self.retry_after = retry_after


class Outage:
    """Whether one thing the gateway asks the authorization server for is failing: a warning
    when it starts failing, one line when it answers again, debug lines in between."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._until = 0.0
        self._delay = FIRST_RETRY_DELAY
        self.down = False

    def check(self) -> None:
        left = self._until - self._clock()
        if left > 0:
            raise Unavailable(math.ceil(left))

    def failed(self, exc: FetchFailed) -> Unavailable:
        if self.down:
            log.debug("%s: still failing: %s", self._what, exc)
            self._delay = min(self._delay * 2, MAX_RETRY_DELAY)
        else:
            log.warning("%s failed: %s; tokens are answered 503 until it works", self._what, exc)
            self.down = True
        self._until = self._clock() + self._delay
        return Unavailable(math.ceil(self._delay))

    def ok(self) -> None:
        if self.down:
            log.warning("%s works again", self._what)
            self.down = False
            self._delay = FIRST_RETRY_DELAY
            self._until = 0.0


class Authenticator:
    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self._fetcher = Fetcher(config.fetch_timeout, config.max_response_bytes)
        self.jwks = Jwks(self._fetcher, config.jwks_refresh_interval, config.jwks_max_age)
        settings = config.introspection
        self.introspector = (
            Introspector(self._fetcher, settings, config) if settings is not None else None
        )
        self._metadata: ServerMetadata | None = None
        self._discovering: asyncio.Task[ServerMetadata] | None = None
        self._keys = Outage("fetching the authorization server's metadata or keys")
        self._introspection = Outage("token introspection")

    async def authenticate(self, token: str) -> Identity:
        """The caller a token stands for; raises Rejected (401) or Unavailable (503)."""
        if not well_formed(token):
            raise Rejected("invalid_token")
        if self.config.api_keys:
            found = api_key_identity(self.config.api_keys, digest(token))
            if found is not None:
                return found
        if self.config.issuer is None:
            raise Rejected("unknown_api_key")
        header = jwt_header(token)
        if header is not None:
            alg, kid = check_header(header, self.config)  # (refused before anything is fetched)
            self._keys.check()
            try:
                metadata = await self._server_metadata()
                if metadata.jwks_uri is not None:
                    key = await self.jwks.key(metadata.jwks_uri, kid, alg)
                    if key is None:
                        raise Rejected("unknown_key")
                    identity = verify_jwt(token, key, alg, self.config)
                    self._keys.ok()
                    return identity
            except FetchFailed as exc:
                raise self._keys.failed(exc) from None
        return await self._introspect(token)

    async def _introspect(self, token: str) -> Identity:
        if self.introspector is None:
            raise Rejected("invalid_token")  # an opaque token nobody here can check
        self._introspection.check()
        try:
            metadata = await self._server_metadata()
            endpoint = metadata.introspection_endpoint
            if endpoint is None:
                raise Rejected("introspection_failed")
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
            assert self.config.issuer is not None
            task = asyncio.get_running_loop().create_task(
                discover(self._fetcher, self.config.issuer)
            )
            self._discovering = task
            task.add_done_callback(self._discovered)
        return await asyncio.shield(task)

    def _discovered(self, task: asyncio.Task[ServerMetadata]) -> None:
        self._discovering = None
        if not task.cancelled() and task.exception() is None:
            self._metadata = task.result()

    async def close(self) -> None:
        await self._fetcher.close()
