"""A backend's circuit breaker, as a state machine over a clock it is given (pure: no I/O, no
timers; tests drive it with a clock of their own).

Closed: requests go through; each failure (the backend unreachable mid-call, a timeout, a reply
that is not MCP: never a JSON-RPC error, which is an answer) is remembered for `window` seconds,
and `failures` of them within the window open it. Open: requests are refused at once, for
`cooldown` seconds. Then half-open: one request, the probe, goes through while the others are
still refused; its success closes the breaker, its failure opens it again for another cooldown.
A probe that ends neither way (cancelled by its client, refused for its credentials) lets the
next request probe instead.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final, Literal

from gateway.config.model import BreakerSettings

State = Literal["closed", "open", "half_open"]
CLOSED: Final = "closed"
OPEN: Final = "open"
HALF_OPEN: Final = "half_open"
STATES: Final[tuple[State, ...]] = (CLOSED, OPEN, HALF_OPEN)


class Breaker:
    def __init__(
        self, settings: BreakerSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self.state: State = CLOSED
        self.opens = 0  # times it opened (a counter for /metrics)
        self._failures: deque[float] = deque()  # when the failures within the window happened
        self._opened = 0.0
        self._probing = False
        # Told each change of state (the layer logs it; the composition root shows it).
        self.on_change: Callable[[State], None] | None = None

    def admit(self) -> bool:
        """Whether a request may go to the backend now. In half-open, the one that may is the
        probe: `probing` is then true until `done` is called for it."""
        if self.state == CLOSED:
            return True
        if self.state == OPEN:
            if self._clock() - self._opened < self._settings.cooldown:
                return False
            self._set(HALF_OPEN)
        if self._probing:
            return False
        self._probing = True
        return True

    @property
    def probing(self) -> bool:
        return self._probing

    def retry_in(self) -> float:
        """Seconds until a probe may go (0 once it may, or while one is under way)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._settings.cooldown - (self._clock() - self._opened))

    def done(self, outcome: bool | None, *, probe: bool = False) -> None:
        """A request admitted earlier ended: True succeeded (any reply), False failed, None
        neither (cancelled, or an error that says nothing of the backend's health). `probe`:
        it was the half-open probe."""
        if probe:
            self._probing = False
        if outcome is None:
            return
        if outcome:
            if probe and self.state == HALF_OPEN:
                self._failures.clear()
                self._set(CLOSED)
            return
        now = self._clock()
        if self.state == HALF_OPEN:
            if probe:
                self._open(now)
            return
        if self.state == OPEN:
            return  # (a request sent before it opened: already counted against it)
        failures = self._failures
        failures.append(now)
        while failures and now - failures[0] > self._settings.window:
            failures.popleft()
        if len(failures) >= self._settings.failures:
            self._open(now)

    def _open(self, now: float) -> None:
        self._opened = now
        self._failures.clear()
        self.opens += 1
        self._set(OPEN)

    def _set(self, state: State) -> None:
        self.state = state
        if self.on_change is not None:
            self.on_change(state)
