"""The running gateway: builds backends, the dispatcher and the front ends from a config, owns
the root task group and shuts everything down in order.
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from gateway import __version__
from gateway.app.cluster import (
    cluster_bus,
    cluster_changes,
    login_notices,
    session_records,
    shared_buckets,
    shared_logins,
)
from gateway.app.errors import StartupError
from gateway.app.observe import access_logger, open_audit, open_tap, tracer_provider
from gateway.app.pins import watch
from gateway.app.reload import (
    RELOADED,
    Reloaded,
    carry_over,
    needs_restart,
    plan,
    record,
    reload_problems,
    report,
    retire_all,
)
from gateway.app.servers import VirtualServers
from gateway.app.views import (
    backend_facts,
    backend_states,
    backends_up,
    catalog_rows,
    queued,
    server_facts,
)
from gateway.app.wiring import (
    Wired,
    build_stack,
    log_prefixing,
    login_desk,
    make_authenticator,
    make_dispatcher,
    make_exposure,
    make_naming,
    rate_limiters,
    stdio_origin,
)
from gateway.backends.base import Backend
from gateway.backends.era.layer import EraBackend
from gateway.backends.health import Guarded, Health
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.sse import SseBackend
from gateway.backends.stdio import StdioBackend
from gateway.config import BackendConfig, Config, ConfigInvalid, ListenerLimits
from gateway.core.budget import DEFAULT_SERVER, Budget
from gateway.core.dispatcher import Dispatcher
from gateway.core.overload import Bound
from gateway.core.policy import Policy
from gateway.frontends import guard
from gateway.frontends import http as http_frontend
from gateway.frontends.listener import BindError, Listener
from gateway.frontends.ops import Operations, admin_handler
from gateway.frontends.stdio import StdioFrontend
from gateway.telemetry.loop import measure_lag
from gateway.telemetry.otel import GatewayTelemetry
from gateway.telemetry.recorder import BackendState, Recorder, loop_lag
from gateway.telemetry.status import StatusBoard, snapshot

if TYPE_CHECKING:
    from opentelemetry import trace
    from prometheus_client import CollectorRegistry

    from gateway.caller_auth.authenticator import Authenticator
    from gateway.telemetry.metrics import Exposition
    from gateway.telemetry.otlp import OtlpSpanProcessor

log = logging.getLogger("gateway")


# Time given to open HTTP responses to finish when the gateway stops.
HTTP_SHUTDOWN_GRACE = 5.0
# The admin listener serves a scraper or two: the listener defaults bound it (no config keys).
ADMIN_LIMITS = ListenerLimits()


class Gateway:
    """The running gateway: `async with Gateway(config) as gw:` starts backends and the HTTP
    listener (if configured); `serve_stdio` runs the stdio front end on given streams."""

    def __init__(
        self,
        config: Config,
        tracing: trace.TracerProvider | None = None,
        stdio_server: str | None = None,
    ) -> None:
        """`stdio_server`: the virtual server the stdio front end serves (None: merged)."""
        self.config = config
        self.stdio_server = stdio_server
        self._observe(tracing)
        # The HTTP listener's token checks (`auth:`); None: no authentication.
        self.authenticator = make_authenticator(config.auth) if config.auth is not None else None
        # With cluster.redis the backends' logins are the replicas' (tokens, logins under way).
        self.shared_logins = shared_logins(config)
        # Per-user backend logins are served by the HTTP listener (frontends/logins.py); a
        # caller who has none is sent its link by the gate above the era layer.
        self.logins = login_desk(config, self.authenticator, self.shared_logins)
        self.wired = [self._wire(c) for c in config.backends]
        self._share()
        limiters = rate_limiters(config, self.telemetry.stats, self.shared_buckets)
        self.dispatcher = make_dispatcher(config, self.backends, self.telemetry, limiters)
        for wired in self.wired:
            self._attach(wired)
        # `pins:` (None: definitions served as sent): judged as each catalog loads.
        self.pins = watch(config, self.dispatcher.catalogs, self.telemetry, self.audit, self.bus)
        # What each server's lists cost a model, kept current as catalogs change (a task each).
        self.budget = Budget()
        # `servers:`: a dispatcher each over the same backends (app/servers.py).
        self.servers = VirtualServers(
            config, self.dispatcher, self._pool(), self.telemetry, self.budget
        )
        # Cluster changes: list changes and resource updates across replicas. Its topics are
        # named on the bus here, before the bus runs; it runs in __aenter__.
        self.changes = cluster_changes(self.bus, self.dispatcher)
        if self.changes is not None:
            self.servers.follow(self.dispatcher.subscriptions)
        # One reload at a time (SIGHUP, `reload`, --watch), its drain of removed backends
        # included: each one starts from the set the one before it left.
        self._reloading = anyio.Lock()
        # Set once every backend's catalog has been asked for (loaded, or failed) at start-up.
        self.catalogs_loaded = anyio.Event()
        self._collect_metrics()
        self._serving = False
        # Set when shutdown begins (a signal, the end of stdin): /readyz answers 503 from then
        # on, so a load balancer stops sending while what runs drains.
        self.draining = False
        self._operate()
        self._admin: Listener | None = None
        self.admin_url: str | None = None
        self._http: Listener | None = None
        self._endpoint: http_frontend.Endpoint | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.http_url: str | None = None

    def _observe(self, tracing: trace.TracerProvider | None) -> None:
        """What the data path reports to: metrics, spans, the tap, the audit and access logs."""
        config = self.config
        # What the metrics count from the start; their Prometheus side is made when first
        # asked for (`exposition`).
        self.recorder = Recorder()
        self._lag, self._loop_lag = loop_lag()
        # The spans' exporter, when the gateway makes its own provider (a given one exports
        # however its maker chose): it runs on the gateway's loop and is flushed on the way out.
        self.otlp: OtlpSpanProcessor | None = None
        self._provider = tracing
        if tracing is None and (made := tracer_provider(config)) is not None:
            self._provider, self.otlp = made
        tracer = self._provider.get_tracer("mcp-gateway", __version__) if self._provider else None
        self.tap = open_tap(config.tap) if config.tap is not None else None
        self.audit = open_audit(config.audit) if config.audit is not None else None
        self.telemetry = GatewayTelemetry(
            tracer,
            self.recorder,
            access_logger(config),
            config.telemetry.record_payloads,
            self.tap,
            self.audit,
            backend_spans=config.telemetry.backend_spans,
        )

    def _share(self) -> None:
        """What the replicas share over cluster.redis (all None for a replica alone)."""
        config, stats = self.config, self.telemetry.stats
        # The limits are shared; the replica's own decide when Redis does not.
        self.shared_buckets = shared_buckets(config, stats)
        # The replicas tell each other what only one of them saw; the parts that listen name
        # their topics before it runs (in __aenter__).
        self.bus = cluster_bus(config, stats)
        # Legacy sessions' records in Redis; what reaches the wrong replica (answers,
        # cancellations, the session's end, new subscriptions) goes over the bus. Wired into
        # the HTTP endpoint.
        self.session_records = session_records(config, stats)
        login_notices(self.logins, self.bus)  # (shared logins: a login ended elsewhere)

    def _collect_metrics(self) -> None:
        # An admin listener serves the metrics: made now, as the rest of its wiring. Without
        # one nothing scrapes them, and prometheus_client loads only if a caller (a test, an
        # embedding program) asks for `registry`.
        if self.config.listen.admin is not None:
            self.exposition  # noqa: B018 (made for its side effect)

    @functools.cached_property
    def exposition(self) -> Exposition:
        """The Prometheus registry over what the gateway counts (0064: imported here, where
        it is wired); what was counted before it was made is in it all the same."""
        from gateway.telemetry.metrics import Exposition, GatewayCollector, TraceExportCollector

        gateway = GatewayCollector(
            self.telemetry.stats,
            self._backend_states,
            self._listens,
            self._queued,
            lambda: catalog_rows(self.budget),
        )
        spans = None
        if (otlp := self.otlp) is not None:  # (what became of the sampled spans)
            spans = TraceExportCollector(otlp.spans, lambda: otlp.queued)
        return Exposition(self.recorder, gateway, self._lag, spans)

    @property
    def registry(self) -> CollectorRegistry:
        return self.exposition.registry

    def _operate(self) -> None:
        """What the admin listener serves: metrics, health, readiness, the status page."""
        # The status page's series and recent errors (/status on the admin listener). Without
        # an admin listener (a restart's to change) nothing reads the series: no request feeds
        # them (the recent errors of health changes are still kept, for an embedding program).
        self.status = StatusBoard()
        if self.config.listen.admin is not None:
            self.telemetry.status = self.status
        self.operations = Operations(
            metrics=self._render_metrics,
            backends=lambda: backends_up(self.wired, self.dispatcher),
            serving=lambda: self._serving,
            draining=lambda: self.draining,
            status=self._status,
        )

    def _wire(self, config: BackendConfig) -> Wired:
        """One backend's layers, from its transport out to its bound."""
        overload = self.config.overload
        return build_stack(
            config, overload, self.telemetry, self.shared_logins, self.logins, self.config.hooks
        )

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

    def _pool(self) -> dict[str, Backend]:
        """The shared backends, by name, as every virtual server routes to them."""
        return {w.config.name: w.outer for w in self.wired}

    @property
    def stdio_dispatcher(self) -> Dispatcher:
        """What the stdio front end serves: the merged server, or `run --server NAME`'s."""
        if self.stdio_server is None:
            return self.dispatcher
        return self.servers.served[self.stdio_server].dispatcher

    async def __aenter__(self) -> Gateway:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self.dispatcher.catalogs.spawn = self._tg.start_soon
        self.servers.start(self._tg.start_soon)
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
            if self.pins is not None:
                self._tg.start_soon(self.pins.run, name="pins")
            for wired in self.wired:
                self._tg.start_soon(self._run_backend, wired, name=f"backend {wired.config.name}")
            catalogs = self.dispatcher.catalogs
            self._tg.start_soon(self.budget.follow, DEFAULT_SERVER, catalogs, name="budget")
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
        desk = self.logins is not None
        if problems := reload_problems(new, self.stdio_server, desk, self.authenticator):
            raise ConfigInvalid(problems)

    async def _apply(self, new: Config) -> Reloaded:
        assert self._tg is not None
        restart = needs_restart(self.config, new)
        steps = plan(self.wired, new.backends, self._wire)
        log_prefixing(new, before=self.config)
        self.config = replace(self.config, **{name: getattr(new, name) for name in RELOADED})
        self.wired = steps.wired
        for w in steps.fresh:
            self._attach(w)
        own, shared = rate_limiters(new, self.telemetry.stats, self.shared_buckets)
        carry_over(self.dispatcher, own or (shared.local if shared is not None else None))
        # From here on lists and calls see the new set: the swap is synchronous.
        loads = self.dispatcher.reconfigure(
            self.backends,
            [make_exposure(b) for b in new.backends],
            make_naming(self.config),
            new.on_backend_failure,
            Policy(new.policy) if new.policy is not None else None,
            own,
            shared,
            new.tool_search,
        )
        # (the running config: its auth, cluster and task key are what the process was built with)
        added, changed, removed = self.servers.apply(self.config, self._pool())
        if added or changed or removed:
            log.info(
                "virtual servers reloaded: added %s; changed %s; removed %s",
                ", ".join(added) or "none",
                ", ".join(changed) or "none",
                ", ".join(removed) or "none",
            )
        if self.pins is not None:  # (the pin file read again: an approval taken up)
            await self.pins.reload(new, self.config)
        for w in steps.fresh:
            self._tg.start_soon(self._run_backend, w, name=f"backend {w.config.name}")
        for name in loads:
            self._tg.start_soon(self.dispatcher.catalogs.refresh, name)
        done = report(steps, restart)
        record(done, new.source, self.telemetry.stats)
        await retire_all(steps.leaving)
        return done

    def _backend_states(self) -> list[BackendState]:
        return backend_states(self.wired, self.dispatcher)

    def _on_health(self, name: str, health: Health) -> Callable[[bool], None]:
        def changed(up: bool) -> None:
            if not up:
                self.status.down(name, health.reason)  # (the status page's recent errors)
            # Back up: its catalog is loaded again now, not at the next lookup that misses.
            if up and self._tg is not None:
                self.dispatcher.catalogs.invalidate(name)
                self._tg.start_soon(self.dispatcher.catalogs.refresh, name)

        return changed

    def _status(self) -> dict[str, Any]:
        """The status page (/status.json)."""
        facts = backend_facts(self.wired, self.dispatcher.catalogs)
        self.status.forget(f.name for f in facts)
        listen = self.config.listen
        listeners = {
            "mcp_http": self.http_url,
            "mcp_stdio": "stdin/stdout" if listen.stdio else None,
            "admin": self.admin_url,
        }
        origin = (
            self.http_url.removesuffix(listen.http.path) if self.http_url and listen.http else None
        )
        for name, served in self.servers.served.items():  # (virtual servers: their paths)
            listeners[f"server {name}"] = origin + served.config.path if origin else None
        return snapshot(
            self.status,
            version=__version__,
            listeners=listeners,
            backends=facts,
            servers=server_facts(self.budget),
            serving=self._serving,
            draining=self.draining,
            held=self.pins.pinning.held() if self.pins is not None else None,
        )

    def _render_metrics(self, accept: str) -> tuple[bytes, str]:
        return self.exposition.render(accept)

    def _queued(self) -> list[tuple[str, str, int]]:
        return queued(self.wired, self.dispatcher)

    def _listens(self) -> int:
        virtual = sum(d.subscriptions.active for d in self.servers.dispatchers)
        return self.dispatcher.subscriptions.active + virtual

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
        self.servers.mount(self._endpoint, self._server_endpoint)
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
            raise StartupError(f"listen.http: {exc}", in_use=exc.in_use) from None
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        self.http_url = f"{listen.scheme}://{host}:{port}{listen.path}"

    def _server_endpoint(
        self, dispatcher: Dispatcher, path: str, auth: Authenticator | None
    ) -> http_frontend.Endpoint:
        """A virtual server's endpoint: the listener's settings at its own path. Its legacy
        sessions are this process's own, cluster or not (docs/guides/virtual-servers.md)."""
        listen = self.config.listen.http
        assert listen is not None
        return http_frontend.Endpoint(dispatcher, replace(listen, path=path), auth=auth)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.drain()
        if self._endpoint is not None:
            self._endpoint.closing()
        self.servers.closing()
        with anyio.CancelScope(shield=True):
            for listener in (self._http, self._admin):
                if listener is not None:
                    await listener.close(HTTP_SHUTDOWN_GRACE)
        if self._endpoint is not None:
            self._endpoint.close()
        self.servers.close()
        if self.authenticator is not None:
            await self.authenticator.close()
        await self.servers.aclose()
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
            elif callable(flush := getattr(self._provider, "force_flush", None)):
                flush()  # (an SDK provider's; the API's own have none)

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
        self.servers.drain()

    async def serve_stdio(
        self, inbound: anyio.abc.ByteReceiveStream, outbound: anyio.abc.ByteSendStream
    ) -> None:
        origin = stdio_origin(self.config)
        await StdioFrontend(self.stdio_dispatcher, inbound, outbound, origin).serve()
