"""The running gateway: builds backends, the dispatcher and the front ends from a config, owns
the root task group and shuts everything down in order.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Callable
from dataclasses import fields, replace
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from gateway import __version__, taskkey
from gateway.app.cluster import (
    cluster_bus,
    login_notices,
    session_records,
    shared_buckets,
    shared_logins,
)
from gateway.app.errors import StartupError
from gateway.app.observe import _open_audit, _open_tap, access_logger, tracer_provider
from gateway.app.reload import RELOADED, RETIRE_MARGIN, Reloaded, _carry_over, _names
from gateway.app.wiring import (
    Wired,
    _address,
    legacy_lane,
    login_desk,
    make_backend,
    make_exposure,
    make_naming,
    rate_limiters,
    stdio_origin,
)
from gateway.auth.authenticator import Authenticator
from gateway.backends.base import Backend
from gateway.backends.breaker import Breaker
from gateway.backends.era.layer import EraBackend
from gateway.backends.health import Guarded, Health
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.login_gate import LoginGate
from gateway.backends.resilience import Resilient
from gateway.backends.sse import SseBackend
from gateway.backends.stdio import StdioBackend
from gateway.config import (
    BackendConfig,
    Config,
    ConfigInvalid,
    ListenerLimits,
)
from gateway.core.changes import ClusterChanges
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BACKEND, OVERALL, Bound, BoundedBackend
from gateway.core.policy import Policy
from gateway.frontends import guard
from gateway.frontends import http as http_frontend
from gateway.frontends.listener import BindError, Listener
from gateway.frontends.ops import Operations, admin_handler
from gateway.frontends.stdio import StdioFrontend
from gateway.oauth.authorizer import Authorizer
from gateway.routing import cursor as cursors
from gateway.routing import taskids
from gateway.telemetry.loop import measure_lag
from gateway.telemetry.metrics import (
    BackendState,
    GatewayCollector,
    Recorder,
    TraceExportCollector,
    process_metrics,
)
from gateway.telemetry.otel import GatewayTelemetry
from gateway.telemetry.otlp import OtlpSpanProcessor
from gateway.telemetry.status import BackendFacts, StatusBoard, snapshot

log = logging.getLogger("gateway")


INFO = GatewayInfo(name="mcp-gateway", version=__version__)
# Time given to open HTTP responses to finish when the gateway stops.
HTTP_SHUTDOWN_GRACE = 5.0
# The admin listener serves a scraper or two: the listener defaults bound it (no config keys).
ADMIN_LIMITS = ListenerLimits()


class Gateway:
    """The running gateway: `async with Gateway(config) as gw:` starts backends and the HTTP
    listener (if configured); `serve_stdio` runs the stdio front end on given streams."""

    def __init__(self, config: Config, tracing: trace.TracerProvider | None = None) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        # The spans' exporter, when the gateway makes its own provider (a given one exports
        # however its maker chose): it runs on the gateway's loop and is flushed on the way out.
        self.otlp: OtlpSpanProcessor | None = None
        self._provider = tracing
        if tracing is None and (made := tracer_provider(config)) is not None:
            self._provider, self.otlp = made
        tracer = self._provider.get_tracer("mcp-gateway", __version__) if self._provider else None
        self.tap = _open_tap(config.tap) if config.tap is not None else None
        self.audit = _open_audit(config.audit) if config.audit is not None else None
        self.telemetry = GatewayTelemetry(
            tracer,
            Recorder(self.registry),
            access_logger(config),
            config.telemetry.record_payloads,
            self.tap,
            self.audit,
            backend_spans=config.telemetry.backend_spans,
        )
        stats = self.telemetry.stats
        # The HTTP listener's token checks (`auth:`); None: no authentication.
        self.authenticator = Authenticator(config.auth) if config.auth is not None else None
        # With cluster.redis the backends' logins are the replicas' (tokens, logins under way).
        self.shared_logins = shared_logins(config)
        # Per-user backend logins are served by the HTTP listener (frontends/logins.py); a
        # caller who has none is sent its link by the gate above the era layer.
        self.logins = login_desk(config, self.authenticator, self.shared_logins)
        overload = config.overload
        self.wired = [self._wire(c) for c in config.backends]
        # With cluster.redis the limits are shared; the replica's own decide when Redis does not.
        self.shared_buckets = shared_buckets(config, stats)
        own, shared = rate_limiters(config, stats, self.shared_buckets)
        # With cluster.redis the replicas tell each other what only one of them saw; the
        # parts that listen name their topics before it runs (in __aenter__).
        self.bus = cluster_bus(config, stats)
        # --- legacy sessions shared by the replicas (cluster.redis) ---
        # Their records in Redis; what reaches the wrong replica (answers, cancellations, the
        # session's end, new subscriptions) goes over the bus. Wired into the HTTP endpoint.
        self.session_records = session_records(config, stats)
        login_notices(self.logins, self.bus)  # (shared logins: a login ended elsewhere)
        self.dispatcher = Dispatcher(
            self.backends,
            [make_exposure(b) for b in config.backends],
            make_naming(config),
            INFO,
            config.on_backend_failure,
            self.telemetry,
            policy=Policy(config.policy) if config.policy is not None else None,
            limiter=own,
            shared_limiter=shared,
            cursor_keys=config.cluster.keys(cursors.PURPOSE) if config.cluster else (),
            bound=Bound(OVERALL, "", overload.max_in_flight, overload, stats.overloaded),
            grace=config.fan_out_grace,
            start_wait=config.fan_out_start_wait,
            task_keys=(
                config.cluster.keys(taskids.PURPOSE)
                if config.cluster
                else functools.partial(taskkey.load, config.task_key_file)
            ),
        )
        for wired in self.wired:
            self._attach(wired)
        # --- cluster: list changes and resource updates across replicas (core/changes.py) ---
        # Its topics (changes, and the replicas' resource interests: core/interest.py) are named
        # on the bus here, before the bus runs; it runs in __aenter__.
        self.changes = (
            ClusterChanges(
                self.bus,
                self.dispatcher.subscriptions,
                self.dispatcher.catalogs,
                ready=self.bus.ready,
            )
            if self.bus is not None
            else None
        )
        # --- end cluster changes ---
        # One reload at a time (SIGHUP, `reload`, --watch), its drain of removed backends
        # included: each one starts from the set the one before it left.
        self._reloading = anyio.Lock()
        # Set once every backend's catalog has been asked for (loaded, or failed) at start-up.
        self.catalogs_loaded = anyio.Event()
        self.registry.register(
            GatewayCollector(
                self.telemetry.stats, self._backend_states, self._listens, self._queued
            )
        )
        # The process (CPU, memory, fds, GC) and the event loop's measured lag (run in __aenter__).
        self._loop_lag = process_metrics(self.registry)
        if (otlp := self.otlp) is not None:  # (what became of the sampled spans)
            self.registry.register(TraceExportCollector(otlp.spans, lambda: otlp.queued))
        self._serving = False
        # Set when shutdown begins (a signal, the end of stdin): /readyz answers 503 from then
        # on, so a load balancer stops sending while what runs drains.
        self.draining = False
        # The status page's series and recent errors (/status on the admin listener).
        self.status = StatusBoard()
        self.telemetry.status = self.status
        self.operations = Operations(
            metrics=self._render_metrics,
            backends=self._backends_up,
            serving=lambda: self._serving,
            draining=lambda: self.draining,
            status=self._status,
        )
        self._admin: Listener | None = None
        self.admin_url: str | None = None
        self._http: Listener | None = None
        self._endpoint: http_frontend.Endpoint | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.http_url: str | None = None

    def _wire(self, config: BackendConfig) -> Wired:
        """One backend's layers, from its transport out to its bound."""
        stats = self.telemetry.stats
        transport = make_backend(config, stats)
        if self.telemetry.tapping:
            transport.tap = self.telemetry  # (it records what it writes and reads)
        # Behind its era layer a legacy backend looks modern. (A backend with a child per
        # client has an era layer per child, inside it.)
        layer: EraBackend | IsolatedBackend = (
            transport
            if isinstance(transport, IsolatedBackend)
            else EraBackend(transport, config, legacy_lane(transport, config, stats))
        )
        # Behind its health: one that cannot be reached fails at once and is retried in the
        # background (a stdio child by its own supervisor, which reports to the same one; a
        # backend with a child per client by each child's).
        health = transport.health if isinstance(transport, StdioBackend) else Health(transport.name)
        gated: Backend = layer
        authorizer = getattr(transport, "authorizer", None)
        if isinstance(authorizer, Authorizer) and self.shared_logins is not None:
            authorizer.share(self.shared_logins)  # (shared logins: tokens in Redis)
        if isinstance(authorizer, Authorizer) and authorizer.per_user:
            authorizer.desk = self.logins
            gated = LoginGate(layer)
        guarded = Guarded(
            gated, health, supervised=isinstance(transport, StdioBackend | IsolatedBackend)
        )
        # Outermost, its bound on requests in flight: a request refused there reaches nothing
        # below (no span, no transport).
        bound = Bound(
            BACKEND, config.name, config.max_in_flight, self.config.overload, stats.overloaded
        )
        # Above its health, below what is observed: tools' own timeouts, safe retries (one
        # request to the client, its span and metrics) and the breaker (backends/resilience.py).
        breaker = Breaker(config.breaker) if config.breaker is not None else None
        resilient = Resilient(guarded, config, breaker)
        instrumented = InstrumentedBackend(resilient, self.telemetry, _address(config))
        outer = BoundedBackend(instrumented, bound)
        return Wired(config, transport, layer, health, guarded, bound, outer, breaker=breaker)

    def _attach(self, wired: Wired) -> None:
        wired.layer.on_notification = self.dispatcher.backend_notification
        wired.health.on_change = self._on_health(wired.config.name, wired.health)

    # Views of the backends' layers, in config order (tests and metrics read them).
    @property
    def transports(self) -> list[StdioBackend | HttpBackend | SseBackend | IsolatedBackend]:
        return [w.transport for w in self.wired]

    @property
    def layers(self) -> list[EraBackend | IsolatedBackend]:
        return [w.layer for w in self.wired]

    @property
    def eras(self) -> list[EraBackend]:
        return [w.layer for w in self.wired if isinstance(w.layer, EraBackend)]

    @property
    def health(self) -> list[Health]:
        return [w.health for w in self.wired]

    @property
    def guarded(self) -> list[Guarded]:
        return [w.guarded for w in self.wired]

    @property
    def bounds(self) -> list[Bound]:
        return [w.bound for w in self.wired]

    @property
    def backends(self) -> list[Backend]:
        return [w.outer for w in self.wired]

    async def __aenter__(self) -> Gateway:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self.dispatcher.catalogs.spawn = self._tg.start_soon
        try:
            # The addresses are taken before any backend starts: one that cannot be had stops
            # the start with one line, before a child has been spawned for nothing.
            await self._start_admin()
            if self.config.listen.http is not None:
                await self._start_http()
            self._tg.start_soon(measure_lag, self._loop_lag, name="event-loop lag")
            if self.otlp is not None:
                self._tg.start_soon(self.otlp.run, name="span export")
            if self.bus is not None:
                self._tg.start_soon(self.bus.run, name="cluster bus")
            if self.changes is not None:  # (cluster changes)
                self._tg.start_soon(self.changes.run, name="cluster changes")
            for wired in self.wired:
                self._tg.start_soon(self._run_backend, wired, name=f"backend {wired.config.name}")
            if self.config.namespacing.prefix == "never":
                # Unprefixed names collide only once both lists are known: a collision must
                # stop the start before anyone is served under it, so this mode waits.
                await self._load_catalogs()
            else:
                # Clients are served while slow backends start: a list waits for a starting
                # backend (or skips one that is down), a call to a ready one goes through.
                self._tg.start_soon(self._load_catalogs, name="catalogs")
            self._serving = True
            if self._http is not None:
                self._http.release()
                log.info("listening on %s", self.http_url)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _run_backend(self, wired: Wired) -> None:
        try:
            with wired.scope:
                await wired.outer.run()
        finally:
            wired.stopped.set()

    async def reload(self, load: Callable[[], Config]) -> Reloaded | None:
        """Read the config again (`load`) and apply what can change while running: backends
        added, removed, changed (a changed one is removed and added), namespacing, the failure
        policy, `policy:` and `rate_limits:`. A config that does not validate is refused whole,
        each problem logged, and the running one stays (None). One reload at a time."""
        async with self._reloading:
            stats = self.telemetry.stats
            try:
                # (a thread: the file is read and checked off the loop that serves requests)
                new = await anyio.to_thread.run_sync(load)
                self._check_reload(new)
            except ConfigInvalid as exc:
                for problem in exc.problems:
                    log.error("reload refused: %s", problem)
                log.error(
                    "reload refused (%d problem(s)); still serving the config loaded before",
                    len(exc.problems),
                )
                stats.reloads["refused"] += 1
                return None
            done = await self._apply(new)
            stats.reloads["applied"] += 1
            return done

    def _check_reload(self, new: Config) -> None:
        """What the loader cannot know: whether the running process can serve the new config."""
        if self.logins is None and login_desk(new, self.authenticator) is not None:
            raise ConfigInvalid(
                [
                    f"{new.source}: a per_user backend needs the login desk, which is set up "
                    "at start-up (with the listener's auth:): restart to add the first one"
                ]
            )

    async def _apply(self, new: Config) -> Reloaded:
        assert self._tg is not None
        old = self.config
        restart = tuple(
            f.name
            for f in fields(Config)
            if f.name not in RELOADED | {"source"} and getattr(old, f.name) != getattr(new, f.name)
        )
        current = {w.config.name: w for w in self.wired}
        wired: list[Wired] = []
        added: list[str] = []
        changed: list[str] = []
        for config in new.backends:
            same = current.get(config.name)
            if same is not None and same.config == config:
                wired.append(same)  # its child, connections and listen streams stay
                continue
            (changed if same is not None else added).append(config.name)
            wired.append(self._wire(config))
        fresh = [w for w in wired if w.config.name in added or w.config.name in changed]
        leaving = [w for w in self.wired if w not in wired]
        self.config = replace(old, **{name: getattr(new, name) for name in RELOADED})
        self.wired = wired
        for w in fresh:
            self._attach(w)
        own, shared = rate_limiters(new, self.telemetry.stats, self.shared_buckets)
        _carry_over(self.dispatcher, own or (shared.local if shared is not None else None))
        # From here on lists and calls see the new set: the swap is synchronous.
        loads = self.dispatcher.reconfigure(
            self.backends,
            [make_exposure(b) for b in new.backends],
            make_naming(self.config),
            new.on_backend_failure,
            Policy(new.policy) if new.policy is not None else None,
            own,
            shared,
        )
        for w in fresh:
            self._tg.start_soon(self._run_backend, w, name=f"backend {w.config.name}")
        for name in loads:
            self._tg.start_soon(self.dispatcher.catalogs.refresh, name)
        removed = tuple(w.config.name for w in leaving if w.config.name not in changed)
        done = Reloaded(
            added=tuple(added),
            removed=removed,
            changed=tuple(changed),
            kept=tuple(w.config.name for w in wired if w not in fresh),
            needs_restart=restart,
        )
        stats = self.telemetry.stats
        for change in ("added", "removed", "changed"):
            stats.reloaded_backends[change] += len(getattr(done, change))
        log.info(
            "config reloaded from %s: added %s; removed %s; changed %s; kept %s",
            new.source,
            _names(done.added),
            _names(done.removed),
            _names(done.changed),
            _names(done.kept),
        )
        if restart:
            log.warning(
                "reload: %s changed, which needs a restart; left as it was",
                ", ".join(restart),
            )
        # Removed (and replaced) backends no longer route anything new; what they were sent
        # finishes first, bounded by their request timeout.
        async with anyio.create_task_group() as tg:
            for w in leaving:
                tg.start_soon(self._retire, w)
        return done

    async def _retire(self, wired: Wired) -> None:
        name = wired.config.name
        with anyio.move_on_after(wired.config.request_timeout + RETIRE_MARGIN) as waited:
            await wired.bound.drained()
        if waited.cancelled_caught:
            log.warning("backend %s: requests still in flight after its request timeout", name)
        # Its run ends as at shutdown (a stdio child: stdin closed, SIGTERM, SIGKILL).
        wired.scope.cancel()
        await wired.stopped.wait()
        log.info("backend %s stopped (no longer in the config, or changed)", name)

    def _backend_states(self) -> list[BackendState]:
        catalogs = self.dispatcher.catalogs
        return [
            BackendState(
                name=t.name,
                up=g.up,
                restarts=(
                    t.restarts if isinstance(t, StdioBackend | SseBackend | IsolatedBackend) else 0
                ),
                catalog_refreshes=catalogs.refreshes.get(t.name, 0),
                fanout_failures=self.dispatcher.fan_out_failures.get(t.name, 0),
                era=e.era or "unknown",
                children=t.children if isinstance(t, IsolatedBackend) else None,
                pids=t.running_pids() if isinstance(t, StdioBackend | IsolatedBackend) else None,
                in_flight=b.busy,
                pool=t.pool_connections() if isinstance(t, HttpBackend | SseBackend) else None,
                breaker=w.breaker.state if w.breaker is not None else None,
                breaker_opens=w.breaker.opens if w.breaker is not None else 0,
                replicas=t.replica_stats() if isinstance(t, HttpBackend) else None,
            )
            for t, e, g, b, w in zip(
                self.transports, self.layers, self.guarded, self.bounds, self.wired, strict=True
            )
        ]

    def _on_health(self, name: str, health: Health) -> Callable[[bool], None]:
        def changed(up: bool) -> None:
            if not up:
                self.status.down(name, health.reason)  # (the status page's recent errors)
            # Back up: its catalog is loaded again now, not at the next lookup that misses.
            if up and self._tg is not None:
                self.dispatcher.catalogs.invalidate(name)
                self._tg.start_soon(self.dispatcher.catalogs.refresh, name)

        return changed

    # --- the status page (/status.json) ---
    def _status(self) -> dict[str, Any]:
        catalogs = self.dispatcher.catalogs
        facts = []
        for w in self.wired:
            name, health, data = w.config.name, w.health, catalogs.data(w.config.name)
            t = w.transport
            facts.append(
                BackendFacts(
                    name=name,
                    transport=t.transport,
                    era=w.layer.era or "unknown",
                    health="up" if w.guarded.up else "down" if health.down else "starting",
                    reason=health.reason,
                    in_flight=w.bound.busy,
                    breaker=w.breaker.state if w.breaker is not None else None,
                    restarts=t.restarts if not isinstance(t, HttpBackend) else 0,
                    catalog=None
                    if data is None
                    else {
                        "tools": len(data.tools),
                        "prompts": len(data.prompts),
                        "resources": len(data.resources),
                        "templates": len(data.templates),
                    },
                )
            )
        self.status.forget(f.name for f in facts)
        listen = self.config.listen
        listeners = {
            "mcp_http": self.http_url,
            "mcp_stdio": "stdin/stdout" if listen.stdio else None,
            "admin": self.admin_url,
        }
        return snapshot(
            self.status,
            version=__version__,
            listeners=listeners,
            backends=facts,
            serving=self._serving,
            draining=self.draining,
        )

    # --- end status page ---

    def _queued(self) -> list[tuple[str, str, int]]:
        """Every bound's queue, the empty ones too: a gauge that is there at 0 can be graphed
        and alerted on before the first overload."""
        out = [(OVERALL, "", self.dispatcher.bound.queued)] if self.dispatcher.bound else []
        return out + [(BACKEND, w.config.name, w.bound.queued) for w in self.wired]

    def _listens(self) -> int:
        return self.dispatcher.subscriptions.active

    def _backends_up(self) -> dict[str, bool]:
        """Reachable, and its catalog loaded last time it was tried: a backend that accepts
        connections yet answers nothing usable (HTTP 500 to everything, a redirect, silence)
        is not ready either."""
        problem = self.dispatcher.catalogs.problem
        return {g.name: g.up and problem(g.name) is None for g in self.guarded}

    def _render_metrics(self, accept: str) -> tuple[bytes, str]:
        # OpenMetrics carries exemplars (trace ids); the classic text format does not.
        if "application/openmetrics-text" in accept:
            body: bytes = openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call]
            return body, openmetrics.CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    async def _start_admin(self) -> None:
        admin = self.config.listen.admin
        if admin is None:
            return
        handler = admin_handler(self.operations, loopback=guard.is_loopback(admin.host))
        self._admin = Listener(handler, ADMIN_LIMITS, stats=self.telemetry.stats)
        try:
            port = await self._admin.start(admin.host, admin.port)
        except BindError as exc:
            raise StartupError(f"listen.admin: {exc}") from None
        self.admin_url = f"http://{admin.host}:{port}"
        log.info("admin listener (metrics, health) on %s", self.admin_url)

    async def _load_catalogs(self) -> None:
        """Learn every backend's catalog before serving, so the first requests route and a
        collision under prefix mode `never` stops the start with both backends named."""
        await self.dispatcher.catalogs.load_all()
        self.catalogs_loaded.set()
        collisions = self.dispatcher.catalogs.table.collisions
        if collisions and self.config.namespacing.prefix == "never":
            raise StartupError("; ".join(collisions))

    async def _start_http(self) -> None:
        listen = self.config.listen.http
        assert listen is not None
        shared = None
        if self.session_records is not None and self.bus is not None:
            shared = http_frontend.SharedSessions(self.session_records, self.bus)
        self._endpoint = http_frontend.Endpoint(
            self.dispatcher, listen, self.operations, self.authenticator, self.logins, shared
        )
        # A client that drops its connection cancels its request (listener.py).
        self._http = Listener(
            self._endpoint.handle, listen.limits, tls=listen.tls, stats=self.telemetry.stats
        )
        # Requests wait until the backends are started (and, under prefix `never`, their
        # catalogs known): only the address is taken now.
        self._http.hold()
        try:
            port = await self._http.start(listen.host, listen.port)
        except ssl.SSLError as exc:  # a key that does not match its certificate, say
            raise StartupError(f"listen.http.tls: cannot use the certificate: {exc}") from None
        except BindError as exc:
            raise StartupError(f"listen.http: {exc}") from None
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        self.http_url = f"{listen.scheme}://{host}:{port}{listen.path}"

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drain()
        if self._endpoint is not None:
            self._endpoint.closing()
        with anyio.CancelScope(shield=True):
            for listener in (self._http, self._admin):
                if listener is not None:
                    await listener.close(HTTP_SHUTDOWN_GRACE)
        if self._endpoint is not None:
            self._endpoint.close()
        if self.authenticator is not None:
            await self.authenticator.close()
        if self.logins is not None:
            await self.logins.close()
        if self.shared_buckets is not None:
            await self.shared_buckets.close()
        if self.session_records is not None:
            with anyio.CancelScope(shield=True):
                await self.session_records.close()
        assert self._tg is not None
        if self.otlp is not None:
            self.otlp.stopping()  # (its batch in flight finishes within the export timeout)
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            if self.bus is not None:
                with anyio.CancelScope(shield=True):
                    await self.bus.close()
            if self.shared_logins is not None:  # (after the backends, which use it)
                with anyio.CancelScope(shield=True):
                    await self.shared_logins.close()
            if self.tap is not None:
                self.tap.close()
            if self.audit is not None:
                self.audit.close()
            # The spans of the last requests, sent on this loop before it closes (bounded by
            # the export timeout); a provider given by the caller is flushed its own way.
            if self.otlp is not None:
                with anyio.CancelScope(shield=True):
                    await self.otlp.close()
            elif isinstance(self._provider, TracerProvider):
                self._provider.force_flush()

    def hurry(self) -> None:
        """Shutdown is to end now (a second signal): the listeners' grace ends at once (or is
        none, if their close is still to come); what they still serve is answered with
        GATEWAY_SHUTTING_DOWN."""
        self.drain()
        for listener in (self._http, self._admin):
            if listener is not None:
                listener.hurry()

    def drain(self) -> None:
        """Shutdown begins: unready from now on (/readyz), and open listen streams end with
        their completion result; requests in flight get the front ends' drain or grace."""
        self.draining = True
        self.dispatcher.close_streams()

    async def serve_stdio(
        self, inbound: anyio.abc.ByteReceiveStream, outbound: anyio.abc.ByteSendStream
    ) -> None:
        await StdioFrontend(self.dispatcher, inbound, outbound, stdio_origin(self.config)).serve()
