"""Which replica of an HTTP backend takes a request (pure but for the clock).

A backend configured with several `urls` is one server run several times: each request goes
to one replica, picked in turn (`round_robin`) or as the one with the fewest requests in
flight (`least_in_flight`, ties in turn). A replica that failed (cannot connect, 502/503/504) is
ejected: skipped for `eject_for` seconds while another replica is not (passive health checks;
nothing is sent to probe it). When every replica is ejected, the one back soonest is tried
first, so a request still reaches whichever has recovered. What may be sent again after a
failure is the HTTP backend's decision (http_exchange.py with safety.py), not this module's.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

from yarl import URL

ROUND_ROBIN = "round_robin"
LEAST_IN_FLIGHT = "least_in_flight"


class Replica:
    """One URL of the backend, with what the balancer and /metrics read."""

    __slots__ = ("at", "ejected_until", "failures", "in_flight", "label", "reachable", "url")

    def __init__(self, at: int, url: URL) -> None:
        self.at = at
        self.url = url
        # Its address without credentials: what logs and metrics name it by.
        self.label = f"{url.scheme}://{url.host}:{url.port}{url.path}"
        self.in_flight = 0
        self.failures = 0  # every failure counted (for /metrics), not reset
        self.ejected_until = 0.0
        # Whether the last attempt reached it (a backend of one replica is "up" exactly so).
        self.reachable = True


class Replicas:
    """The replicas of one backend, shared by its legacy sessions' views."""

    def __init__(
        self,
        urls: list[URL],
        balance: str = ROUND_ROBIN,
        eject_for: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert urls
        self.all = [Replica(at, url) for at, url in enumerate(urls)]
        self.several = len(self.all) > 1
        self._least = balance == LEAST_IN_FLIGHT
        self._eject_for = eject_for
        self._clock = clock
        self._turn = itertools.count()

    @property
    def up(self) -> bool:
        """Whether some replica is thought reachable: not ejected, and its last attempt went
        through (one replica: the last attempt alone, as a backend of one URL)."""
        if not self.several:
            return self.all[0].reachable
        now = self._clock()
        return any(r.reachable and r.ejected_until <= now for r in self.all)

    def candidates(self) -> Iterator[Replica]:
        """The replicas in the order a request tries them: the balancer's pick first, then the
        others not ejected; only when all are ejected, all of them, back soonest first."""
        replicas = self.all
        if not self.several:
            yield replicas[0]
            return
        now = self._clock()
        ready = [r for r in replicas if r.ejected_until <= now]
        if not ready:
            yield from sorted(replicas, key=lambda r: r.ejected_until)
            return
        start = next(self._turn) % len(replicas)
        ready.sort(key=lambda r: (r.at - start) % len(replicas))
        if self._least:
            ready.sort(key=lambda r: r.in_flight)  # (stable: ties stay in turn)
        yield from ready

    def failed(self, replica: Replica, *, unreachable: bool) -> None:
        """A failure before any reply: ejected for a while (only with another replica);
        `unreachable` when it could not be connected to at all."""
        replica.failures += 1
        if unreachable:
            replica.reachable = False
        if self.several:
            replica.ejected_until = self._clock() + self._eject_for

    def reached(self, replica: Replica) -> None:
        replica.reachable = True
        replica.ejected_until = 0.0

    def stats(self) -> list[tuple[str, int, int]]:
        """(label, in flight, failures) per replica, for /metrics."""
        return [(r.label, r.in_flight, r.failures) for r in self.all]
