"""What the gateway's duration metrics count, with no Prometheus: each histogram's series,
observed from the event loop per request. telemetry/metrics.py turns them into Prometheus
families when the metrics are first asked for (an admin listener, a test), so a gateway without
one never loads prometheus_client (docs/decisions/0064-lazy-imports.md)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

# Fine at the low end: the gateway's own overhead is well under a millisecond, and the
# difference between server and client time is what operators watch.
DURATION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
# Label value for names the gateway does not know: unknown names never become label values.
OTHER = "_other"
# Distinct `target` values kept per histogram; past this, further names count under OTHER, so a
# backend with endless tool names cannot blow up the exposition.
MAX_TARGETS = 500
MAX_CACHED_CHILDREN = 10_000
# How late the event loop ran a wake-up: 1 ms is a busy loop, 100 ms a stall clients notice.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Series:
    """One label set of a histogram: per-bucket counts (not cumulative), sum, last exemplars."""

    __slots__ = ("counts", "exemplars", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        # (trace id, value, time) of each bucket's last exemplar: made an Exemplar when scraped.
        self.exemplars: list[tuple[str, float, float] | None] = [None] * buckets
        self.sum = 0.0


class DurationHistogram:
    """A Prometheus histogram's counts, observed from the event loop only.

    prometheus_client's Histogram takes a lock per bucket, sum and exemplar on every
    observation; observations here all happen on the one event-loop thread and scrapes on the
    same thread, so a list index and an add are enough. The exposition is built at scrape time
    (telemetry/metrics.py).
    """

    def __init__(
        self, name: str, documentation: str, labelnames: tuple[str, ...], bounds: tuple[float, ...]
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = bounds
        self.by_labels: dict[tuple[str, ...], Series] = {}

    def series(self, labels: tuple[str, ...]) -> Series:
        found = self.by_labels.get(labels)
        if found is None:
            found = self.by_labels[labels] = Series(len(self.bounds) + 1)  # (+Inf)
        return found

    def observe(self, series: Series, seconds: float, trace_id: str) -> None:
        index = bisect_left(self.bounds, seconds)
        series.counts[index] += 1
        series.sum += seconds
        if trace_id:
            series.exemplars[index] = (trace_id, seconds, time.time())


class Recorder:
    def __init__(self) -> None:
        self.server_duration = DurationHistogram(
            "mcp_server_operation_duration_seconds",
            "Time the gateway took to answer a client request.",
            ("mcp_method_name", "target", "error_type"),
            DURATION_BUCKETS,
        )
        self.client_duration = DurationHistogram(
            "mcp_client_operation_duration_seconds",
            "Time a backend took to answer a request from the gateway.",
            ("mcp_method_name", "target", "backend", "error_type"),
            DURATION_BUCKETS,
        )
        self._targets: dict[str, set[str]] = {"server": set(), "client": set()}
        # Series by the label values as given (before bounding), so a lookup is one dict get.
        self._children: dict[tuple[str, ...], Series] = {}

    def _bounded(self, kind: str, target: str) -> str:
        seen = self._targets[kind]
        if target in seen or not target:
            return target
        if len(seen) >= MAX_TARGETS:
            return OTHER
        seen.add(target)
        return target

    def _remember(self, key: tuple[str, ...], child: Series) -> None:
        if len(self._children) >= MAX_CACHED_CHILDREN:
            self._children.clear()  # catalogs changed a lot over time; a cache, not the truth
        self._children[key] = child

    def server(self, method: str, target: str, error: str, seconds: float, trace_id: str) -> None:
        key = ("server", method, target, error)
        child = self._children.get(key)
        if child is None:
            bounded = self._bounded("server", target)
            child = self.server_duration.series((method, bounded, error))
            self._remember(key, child)
        # (DurationHistogram.observe's body, in this frame: twice a request)
        index = bisect_left(self.server_duration.bounds, seconds)
        child.counts[index] += 1
        child.sum += seconds
        if trace_id:
            child.exemplars[index] = (trace_id, seconds, time.time())

    def client(
        self, method: str, target: str, backend: str, error: str, seconds: float, trace_id: str
    ) -> None:
        key = ("client", method, target, backend, error)
        child = self._children.get(key)
        if child is None:
            bounded = self._bounded("client", target)
            child = self.client_duration.series((method, bounded, backend, error))
            self._remember(key, child)
        index = bisect_left(self.client_duration.bounds, seconds)  # (as in `server`)
        child.counts[index] += 1
        child.sum += seconds
        if trace_id:
            child.exemplars[index] = (trace_id, seconds, time.time())

    def routed(
        self,
        method: str,
        target: str,
        error: str,
        seconds: float,
        sent_method: str,
        sent_target: str,
        backend: str,
        sent_error: str,
        sent_seconds: float,
        trace_id: str,
    ) -> None:
        """`server` and `client` in one call: a client request and the one backend request it
        was routed to (telemetry/otel.py), both under the same trace."""
        self.server(method, target, error, seconds, trace_id)
        self.client(sent_method, sent_target, backend, sent_error, sent_seconds, trace_id)


def loop_lag() -> tuple[DurationHistogram, Callable[[float], None]]:
    """The event loop's lag histogram, and the function that observes one measurement
    (telemetry/loop.py)."""
    lag = DurationHistogram(
        "mcp_gateway_event_loop_lag_seconds",
        "How late the event loop woke a task that asked to wake every 0.5 s (measured).",
        (),
        LAG_BUCKETS,
    )
    series = lag.series(())

    def observe(seconds: float) -> None:
        lag.observe(series, seconds, "")

    return lag, observe


@dataclass(frozen=True)
class BackendState:
    name: str
    up: bool
    restarts: int
    catalog_refreshes: int
    fanout_failures: int
    era: str = "modern"
    children: int | None = None  # running children of an `isolation: per_session` backend
    pids: tuple[int, ...] | None = None  # its child processes (stdio); None: it has none
    in_flight: int = 0  # requests holding a slot of its bound (core/overload.py)
    pool: tuple[int, int] | None = None  # HTTP connections (in use, idle); None: not HTTP
    # Its circuit breaker (backends/breaker.py): closed, open or half_open; None: it has none.
    breaker: str | None = None
    breaker_opens: int = 0
    # An HTTP backend's replicas (`urls`): (replica, in flight, failures) each; None: one URL.
    replicas: list[tuple[str, int, int]] | None = None
    # List requests whose part for it came from its catalog, without asking it (core/fanout.py).
    lists_from_catalog: int = 0
