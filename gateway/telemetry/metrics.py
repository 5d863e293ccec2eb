"""Prometheus metrics: duration histograms observed per request, and a collector that reads the
gateway's counters and backend states when scraped (nothing extra on the hot path)."""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from gateway.telemetry import procfs
from gateway.telemetry.api import Stats

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
# A circuit breaker's states (backends/breaker.py), each a series of the state gauge.
BREAKER_STATES = ("closed", "open", "half_open")
# How late the event loop ran a wake-up: 1 ms is a busy loop, 100 ms a stall clients notice.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _Series:
    """One label set of a histogram: per-bucket counts (not cumulative), sum, last exemplars."""

    __slots__ = ("counts", "exemplars", "sum")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        # (trace id, value, time) of each bucket's last exemplar: made an Exemplar when scraped.
        self.exemplars: list[tuple[str, float, float] | None] = [None] * buckets
        self.sum = 0.0


class DurationHistogram(Collector):
    """A Prometheus histogram observed from the event loop only.

    prometheus_client's Histogram takes a lock per bucket, sum and exemplar on every
    observation; observations here all happen on the one event-loop thread and scrapes on the
    same thread, so a list index and an add are enough. The exposition is built at scrape time.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._doc = documentation
        self._labelnames = labelnames
        self._bounds = buckets
        self._le = [floatToGoString(b) for b in buckets] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._series: dict[tuple[str, ...], _Series] = {}
        registry.register(self)

    def series(self, labels: tuple[str, ...]) -> _Series:
        found = self._series.get(labels)
        if found is None:
            found = self._series[labels] = _Series(len(self._le))
        return found

    def observe(self, series: _Series, seconds: float, trace_id: str) -> None:
        index = bisect_left(self._bounds, seconds)
        series.counts[index] += 1
        series.sum += seconds
        if trace_id:
            series.exemplars[index] = (trace_id, seconds, time.time())

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for labels, series in sorted(self._series.items()):
            total = 0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for le, count, exemplar in zip(self._le, series.counts, series.exemplars, strict=True):
                total += count
                if exemplar is None:
                    buckets.append((le, total))
                else:
                    trace_id, value, at = exemplar
                    buckets.append((le, total, Exemplar({"trace_id": trace_id}, value, at)))
            family.add_metric(labels, buckets, series.sum)
        yield family


class Recorder:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.server_duration = DurationHistogram(
            "mcp_server_operation_duration_seconds",
            "Time the gateway took to answer a client request.",
            ("mcp_method_name", "target", "error_type"),
            DURATION_BUCKETS,
            registry,
        )
        self.client_duration = DurationHistogram(
            "mcp_client_operation_duration_seconds",
            "Time a backend took to answer a request from the gateway.",
            ("mcp_method_name", "target", "backend", "error_type"),
            DURATION_BUCKETS,
            registry,
        )
        self._targets: dict[str, set[str]] = {"server": set(), "client": set()}
        # Series by the label values as given (before bounding), so a lookup is one dict get.
        self._children: dict[tuple[str, ...], _Series] = {}

    def _bounded(self, kind: str, target: str) -> str:
        seen = self._targets[kind]
        if target in seen or not target:
            return target
        if len(seen) >= MAX_TARGETS:
            return OTHER
        seen.add(target)
        return target

    def _remember(self, key: tuple[str, ...], child: _Series) -> None:
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
        self.server_duration.observe(child, seconds, trace_id)

    def client(
        self, method: str, target: str, backend: str, error: str, seconds: float, trace_id: str
    ) -> None:
        key = ("client", method, target, backend, error)
        child = self._children.get(key)
        if child is None:
            bounded = self._bounded("client", target)
            child = self.client_duration.series((method, bounded, backend, error))
            self._remember(key, child)
        self.client_duration.observe(child, seconds, trace_id)


def process_metrics(registry: CollectorRegistry) -> Callable[[float], None]:
    """The process's own metrics on the gateway's registry, all read when scraped: CPU, memory,
    open fds, start time (`process_*`, from /proc; Linux only), the interpreter (`python_info`),
    garbage collections (`python_gc_*`). And the event loop's lag histogram: the function
    returned observes one measurement (telemetry/loop.py)."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    lag = DurationHistogram(
        "mcp_gateway_event_loop_lag_seconds",
        "How late the event loop woke a task that asked to wake every 0.5 s (measured).",
        (),
        LAG_BUCKETS,
        registry,
    )
    series = lag.series(())

    def observe(seconds: float) -> None:
        lag.observe(series, seconds, "")

    return observe


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


class GatewayCollector(Collector):
    """Reads counters and states at scrape time."""

    def __init__(
        self,
        stats: Stats,
        backends: Callable[[], list[BackendState]],
        listen_streams: Callable[[], int],
        queued: Callable[[], list[tuple[str, str, int]]] = list,
        catalogs: Callable[[], list[tuple[str, str, int, int]]] = list,
    ) -> None:
        self._stats = stats
        self._backends = backends
        self._listens = listen_streams
        # (scope, backend, requests waiting) of each overload bound, read when scraped
        self._queued = queued
        # (server, kind, items, tokens) of each server's lists, as last estimated (core/budget.py)
        self._catalogs = catalogs

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            "mcp_gateway_requests_in_flight", "Client requests being handled.", labels=["frontend"]
        )
        for frontend, count in sorted(self._stats.in_flight.items()):
            in_flight.add_metric([frontend], count)
        yield in_flight
        rejections = CounterMetricFamily(
            "mcp_gateway_rejections", "Client requests refused, by reason.", labels=["reason"]
        )
        for reason, count in sorted(self._stats.rejections.items()):
            rejections.add_metric([reason], count)
        yield rejections
        traffic = CounterMetricFamily(
            "mcp_gateway_bytes", "Message bytes by hop and direction.", labels=["hop", "direction"]
        )
        for (hop, direction), count in sorted(self._stats.bytes.items()):
            traffic.add_metric([hop, direction], count)
        yield traffic
        yield from self._access_metrics()
        yield GaugeMetricFamily(
            "mcp_gateway_listen_streams",
            "Open subscriptions/listen streams.",
            value=self._listens(),
        )
        yield from self._backend_metrics()
        yield from self._catalog_metrics()

    def _catalog_metrics(self) -> Iterator[Metric]:
        """What each server's lists hold and cost a model: computed when catalogs change."""
        items = GaugeMetricFamily(
            "mcp_gateway_catalog_items",
            "Entries of a server's list (tools, prompts, resources, templates), of the backends"
            " whose catalog is loaded.",
            labels=["server", "kind"],
        )
        tokens = GaugeMetricFamily(
            "mcp_gateway_catalog_tokens",
            "Estimated tokens a model pays to be shown a server's list (README Context budget).",
            labels=["server", "kind"],
        )
        for server, kind, count, estimate in self._catalogs():
            items.add_metric([server, kind], count)
            tokens.add_metric([server, kind], estimate)
        yield from (items, tokens)

    def _access_metrics(self) -> Iterator[Metric]:
        """Who was turned away: by authentication, by policy, by a rate limit, by overload."""
        for name, doc, label, counts in (
            (
                "mcp_gateway_auth_failures",
                "HTTP requests refused for their credentials, by reason.",
                "reason",
                self._stats.auth_failures,
            ),
            (
                "mcp_gateway_policy_denials",
                "Client requests the policy refused, by reason.",
                "reason",
                self._stats.policy_denials,
            ),
            (
                "mcp_gateway_rate_limited",
                "Client requests refused by a rate limit, by limit (identity, tool, overall).",
                "limit",
                self._stats.rate_limited,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=[label])
            for value, count in sorted(counts.items()):
                family.add_metric([value], count)
            yield family
        tokens = CounterMetricFamily(
            "mcp_gateway_backend_token_requests",
            "The gateway's token requests for its backends, by grant and outcome.",
            labels=["backend", "grant", "outcome"],
        )
        for (backend, grant, outcome), count in sorted(self._stats.backend_tokens.items()):
            tokens.add_metric([backend, grant, outcome], count)
        yield tokens
        overloaded = CounterMetricFamily(
            "mcp_gateway_overloaded",
            "Requests refused past a bound on requests in flight, by scope (overall, backend).",
            labels=["scope", "backend"],
        )
        for (scope, backend), count in sorted(self._stats.overloaded.items()):
            overloaded.add_metric([scope, backend], count)
        yield overloaded
        queued = GaugeMetricFamily(
            "mcp_gateway_overload_queued",
            "Requests waiting for a slot past a bound on requests in flight, by scope "
            "(overall, backend).",
            labels=["scope", "backend"],
        )
        for scope, backend, count in self._queued():
            queued.add_metric([scope, backend], count)
        yield queued
        yield from self._shared_metrics()
        yield from self._reload_metrics()

    def _shared_metrics(self) -> Iterator[Metric]:
        """cluster.redis: whether the shared rate limits are reachable, and how often each
        replica decided alone. Both families are always there (empty, or 0, without Redis)."""
        up = GaugeMetricFamily(
            "mcp_gateway_redis_up",
            "1 if the last rate-limit check reached Redis (cluster.redis), else 0.",
        )
        if self._stats.redis_up is not None:
            up.add_metric([], 1 if self._stats.redis_up else 0)
        yield up
        yield CounterMetricFamily(
            "mcp_gateway_rate_limit_fallbacks",
            "Rate-limit checks decided by this replica's own buckets: Redis did not answer.",
            value=self._stats.rate_limit_fallbacks,
        )
        subscribed = GaugeMetricFamily(
            "mcp_gateway_redis_pubsub_up",
            "1 while this replica hears the other replicas' messages (cluster.redis), else 0.",
        )
        if self._stats.redis_pubsub_up is not None:
            subscribed.add_metric([], 1 if self._stats.redis_pubsub_up else 0)
        yield subscribed
        messages = CounterMetricFamily(
            "mcp_gateway_cluster_messages",
            "Messages between replicas through Redis, by topic and outcome"
            " (sent, unsent, received, malformed).",
            labels=["topic", "outcome"],
        )
        for (topic, outcome), count in sorted(self._stats.cluster_messages.items()):
            messages.add_metric([topic, outcome], count)
        yield messages
        sessions_up = GaugeMetricFamily(
            "mcp_gateway_redis_sessions_up",
            "1 if the last read or write of a legacy session record reached Redis"
            " (cluster.redis), else 0.",
        )
        if self._stats.sessions_redis_up is not None:
            sessions_up.add_metric([], 1 if self._stats.sessions_redis_up else 0)
        yield sessions_up

    def _reload_metrics(self) -> Iterator[Metric]:
        """What the config reloads did: each reload's outcome, and the backends they changed."""
        for name, doc, label, counts in (
            (
                "mcp_gateway_reloads",
                "Config reloads (SIGHUP, `reload`, --watch), by outcome (applied, refused).",
                "outcome",
                self._stats.reloads,
            ),
            (
                "mcp_gateway_reloaded_backends",
                "Backends config reloads added, removed or changed, by change.",
                "change",
                self._stats.reloaded_backends,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=[label])
            for value, count in sorted(counts.items()):
                family.add_metric([value], count)
            yield family

    def _backend_metrics(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "mcp_gateway_backend_up", "1 if the backend is reachable.", labels=["backend"]
        )
        restarts = CounterMetricFamily(
            "mcp_gateway_backend_restarts",
            "Restarts of a stdio backend's child.",
            labels=["backend"],
        )
        refreshes = CounterMetricFamily(
            "mcp_gateway_catalog_refreshes", "Loads of a backend's catalog.", labels=["backend"]
        )
        failures = CounterMetricFamily(
            "mcp_gateway_fanout_failures",
            "Backends skipped or failing in a fan-out.",
            labels=["backend"],
        )
        from_catalog = CounterMetricFamily(
            "mcp_gateway_lists_from_catalog",
            "List requests whose part for the backend came from its catalog, not asked of it"
            " (its ttlMs, public, allowed it).",
            labels=["backend"],
        )
        era = GaugeMetricFamily(
            "mcp_gateway_backend_era",
            "1 under the protocol era spoken with the backend.",
            labels=["backend", "era"],
        )
        children = GaugeMetricFamily(
            "mcp_gateway_backend_children",
            "Running children of a backend with a child per client (isolation: per_session).",
            labels=["backend"],
        )
        cpu = CounterMetricFamily(
            "mcp_gateway_backend_child_cpu_seconds",
            "CPU time (user + system) of a stdio backend's running children, read from /proc"
            " when scraped (Linux). Starts again from 0 when a child is restarted.",
            labels=["backend"],
        )
        rss = GaugeMetricFamily(
            "mcp_gateway_backend_child_resident_memory_bytes",
            "Resident memory of a stdio backend's running children, read from /proc (Linux).",
            labels=["backend"],
        )
        in_flight = GaugeMetricFamily(
            "mcp_gateway_backend_requests_in_flight",
            "Requests the gateway has sent to the backend and not yet had answered.",
            labels=["backend"],
        )
        pool = GaugeMetricFamily(
            "mcp_gateway_backend_pool_connections",
            "Pooled HTTP connections to the backend, by state (in_use, idle).",
            labels=["backend", "state"],
        )
        replica_in_flight = GaugeMetricFamily(
            "mcp_gateway_backend_replica_requests_in_flight",
            "Requests sent to one replica of an HTTP backend with several urls and not yet"
            " answered (listen streams aside).",
            labels=["backend", "replica"],
        )
        replica_failures = CounterMetricFamily(
            "mcp_gateway_backend_replica_failures",
            "Failures of one replica before any reply (cannot connect, lost, 502/503/504).",
            labels=["backend", "replica"],
        )
        for b in self._backends():
            in_flight.add_metric([b.name], b.in_flight)
            for replica, busy, failed in b.replicas or ():
                replica_in_flight.add_metric([b.name, replica], busy)
                replica_failures.add_metric([b.name, replica], failed)
            if b.pool is not None:
                pool.add_metric([b.name, "in_use"], b.pool[0])
                pool.add_metric([b.name, "idle"], b.pool[1])
            used = procfs.usage(b.pids) if b.pids is not None else None
            if used is not None:
                cpu.add_metric([b.name], used.cpu_seconds)
                rss.add_metric([b.name], used.resident_bytes)
            if b.children is not None:
                children.add_metric([b.name], b.children)
            era.add_metric([b.name, b.era], 1)
            up.add_metric([b.name], 1 if b.up else 0)
            restarts.add_metric([b.name], b.restarts)
            refreshes.add_metric([b.name], b.catalog_refreshes)
            failures.add_metric([b.name], b.fanout_failures)
            from_catalog.add_metric([b.name], b.lists_from_catalog)
        yield from (up, era, restarts, refreshes, failures, from_catalog, children)
        yield from (in_flight, pool, cpu, rss, replica_in_flight, replica_failures)
        yield from self._breaker_metrics()

    def _breaker_metrics(self) -> Iterator[Metric]:
        """Each breaker's state as one series per state (1 for the one it is in), and how often
        it opened; backends without a breaker have neither."""
        state = GaugeMetricFamily(
            "mcp_gateway_backend_breaker_state",
            "1 for the state a backend's circuit breaker is in (closed, open, half_open).",
            labels=["backend", "state"],
        )
        opens = CounterMetricFamily(
            "mcp_gateway_backend_breaker_opens",
            "Times a backend's circuit breaker opened.",
            labels=["backend"],
        )
        for b in self._backends():
            if b.breaker is None:
                continue
            for name in BREAKER_STATES:
                state.add_metric([b.name, name], 1 if b.breaker == name else 0)
            opens.add_metric([b.name], b.breaker_opens)
        yield from (state, opens)


class TraceExportCollector(Collector):
    """The span exporter's counts (telemetry/otlp.py), read when scraped: the exporter bumps
    plain ints (from whichever thread ends a span) and knows nothing of Prometheus."""

    def __init__(self, spans: Mapping[str, int], queued: Callable[[], int]) -> None:
        self._spans = spans
        self._queued = queued

    def collect(self) -> Iterator[Metric]:
        spans = CounterMetricFamily(
            "mcp_gateway_trace_spans",
            "Sampled spans by what became of them: exported (the collector took them), dropped"
            " (the buffer was full, or tracing had stopped), failed (their batch was refused or"
            " did not reach the collector).",
            labels=["outcome"],
        )
        for outcome, count in sorted(self._spans.items()):
            spans.add_metric([outcome], count)
        yield spans
        yield GaugeMetricFamily(
            "mcp_gateway_trace_spans_queued",
            "Sampled spans encoded and waiting for their export.",
            value=self._queued(),
        )
