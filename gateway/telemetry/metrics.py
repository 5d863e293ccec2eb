"""The gateway's Prometheus metrics, made when first asked for (an admin listener, a test): the
duration histograms the data path counts (telemetry/recorder.py), a collector that reads the
gateway's counters and backend states when scraped (nothing extra on the hot path), the
process's own. Imported by the one function that wires them (app/gateway.py), so a gateway
nobody can scrape never loads prometheus_client (docs/decisions/0064-lazy-imports.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from gateway.telemetry import procfs
from gateway.telemetry.api import Stats
from gateway.telemetry.recorder import BackendState, DurationHistogram, Recorder

# A circuit breaker's states (backends/breaker.py), each a series of the state gauge.
BREAKER_STATES = ("closed", "open", "half_open")


class HistogramCollector(Collector):
    """A duration histogram's counts as a Prometheus histogram, built when scraped."""

    def __init__(self, histogram: DurationHistogram) -> None:
        self._histogram = histogram
        self._le = [floatToGoString(b) for b in histogram.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        h = self._histogram
        family = HistogramMetricFamily(h.name, h.documentation, labels=h.labelnames)
        for labels, series in sorted(h.by_labels.items()):
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


class Exposition:
    """The gateway's registry, in the order its families are exposed: the request durations, the
    gateway's own counters and states, the process (CPU, memory, fds, start time from /proc;
    `python_info`; `python_gc_*`; all read when scraped), the event loop's lag, and the span
    exporter's counts when the gateway exports spans."""

    def __init__(
        self,
        recorder: Recorder,
        gateway: GatewayCollector,
        loop_lag: DurationHistogram,
        trace_export: TraceExportCollector | None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(HistogramCollector(recorder.server_duration))
        self.registry.register(HistogramCollector(recorder.client_duration))
        self.registry.register(gateway)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(HistogramCollector(loop_lag))
        if trace_export is not None:
            self.registry.register(trace_export)

    def render(self, accept: str) -> tuple[bytes, str]:
        # OpenMetrics carries exemplars (trace ids); the classic text format does not.
        if "application/openmetrics-text" in accept:
            body: bytes = openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return body, openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


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
            "Estimated tokens a model pays to be shown a server's list "
            "(docs/guides/context-budget.md).",
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
        yield from self._hook_metrics()

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

    def _hook_metrics(self) -> Iterator[Metric]:
        """The hooks' runs by outcome; no family at all without hooks (nothing changes for a
        gateway that has none)."""
        if not self._stats.hook_outcomes:
            return
        family = CounterMetricFamily(
            "mcp_gateway_hook_outcomes",
            "Hook runs, by hook and outcome (pass, changed, refused, timeout, error).",
            labels=["hook", "outcome"],
        )
        for (hook, outcome), count in sorted(self._stats.hook_outcomes.items()):
            family.add_metric([hook, outcome], count)
        yield family

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
        if self._stats.pin_changes:  # (pins: only once something differed from its pin)
            pins = CounterMetricFamily(
                "mcp_gateway_pin_changes",
                "Definitions that differ from their pins, each counted once, by backend and "
                "outcome (blocked, warned, allowed; approved: an approval taken up).",
                labels=["backend", "outcome"],
            )
            for (backend, outcome), count in sorted(self._stats.pin_changes.items()):
                pins.add_metric([backend, outcome], count)
            yield pins

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
