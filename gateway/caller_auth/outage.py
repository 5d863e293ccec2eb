"""Whether something the gateway asks the authorization server for is failing. While it is,
requests that need it are answered 503 with Retry-After at once, for a delay that grows per
failure in a row: a server that is away is asked a few times a minute, not once per request
(each of which would wait out the fetch timeout). A warning when it starts failing, one line
when it works again, debug lines in between."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from gateway.caller_auth.fetch import FetchFailed

log = logging.getLogger("gateway.caller_auth")

FIRST_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 30.0


class Unavailable(Exception):
    """The token cannot be checked now: the authorization server is not answering."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"retry after {retry_after:g} s")
        self.retry_after = retry_after


class Outage:
    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._what = what
        self._clock = clock
        self._until = 0.0
        self._delay = FIRST_RETRY_DELAY
        self.down = False

    def check(self) -> None:
        """Raises Unavailable while a failure's delay runs: no fetch is attempted."""
        left = self._until - self._clock()
        if left > 0:
            raise Unavailable(math.ceil(left))

    def failed(self, exc: FetchFailed) -> Unavailable:
        if self.down:
            log.debug("%s: still failing: %s", self._what, exc)
            self._delay = min(self._delay * 2, MAX_RETRY_DELAY)
        else:
            log.warning("%s failed: %s; answering 503 until it works", self._what, exc)
            self.down = True
        self._until = self._clock() + self._delay
        return Unavailable(math.ceil(self._delay))

    def ok(self) -> None:
        if self.down:
            log.warning("%s works again", self._what)
            self.down = False
            self._delay = FIRST_RETRY_DELAY
            self._until = 0.0
