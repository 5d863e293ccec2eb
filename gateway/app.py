"""Composition root: builds backends, the dispatcher and the front ends from a config, owns the
root task group and shuts everything down in order. The only module that wires concrete parts.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlsplit

import anyio
import anyio.abc
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from gateway import __version__
from gateway.auth.authenticator import Authenticator
from gateway.auth.identity import CONFIGURED, Identity
from gateway.auth.outage import Unavailable
from gateway.auth.tokens import Rejected
from gateway.backends.base import Backend
from gateway.backends.era import EraBackend
from gateway.backends.health import Guarded, Health
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.login_gate import LoginGate
from gateway.backends.sse import SseBackend
from gateway.backends.stdio import StdioBackend
from gateway.config import (
    AuditConfig,
    BackendConfig,
    Config,
    ListenerLimits,
    SseTarget,
    StdioTarget,
    TapConfig,
)
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BACKEND, OVERALL, Bound, BoundedBackend
from gateway.core.policy import Policy
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.frontends import guard
from gateway.frontends import http as http_frontend
from gateway.frontends.listener import BindError, Listener
from gateway.frontends.ops import Operations, admin_handler
from gateway.frontends.stdio import StdioFrontend, open_process_stdio
from gateway.oauth.authorizer import Authorizer
from gateway.oauth.caller_check import CallerCheck
from gateway.oauth.desk import LoginDesk
from gateway.oauth.fetch import OAuthHttp
from gateway.routing import cursor as cursors
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.shared.buckets import RedisBuckets
from gateway.telemetry.api import STDIO_ORIGIN, Origin, Stats
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.metrics import BackendState, GatewayCollector, Recorder
from gateway.telemetry.otel import GatewayTelemetry
from gateway.telemetry.tap import Tap

log = logging.getLogger("gateway")

INFO = GatewayInfo(name="mcp-gateway", version=__version__)
# Time given to open HTTP responses to finish when the gateway stops.
HTTP_SHUTDOWN_GRACE = 5.0
# The admin listener serves a scraper or two: the listener defaults bound it (no config keys).
ADMIN_LIMITS = ListenerLimits()


class StartupError(Exception):
    """The gateway cannot start as configured: an address it cannot listen on, a file it cannot
    open, backends that cannot be served together (a name collision under `never`)."""


def make_backend(
    config: BackendConfig, stats: Stats
) -> StdioBackend | HttpBackend | SseBackend | IsolatedBackend:
    if isinstance(config.target, StdioTarget):
        if config.isolation == "per_session":
            return IsolatedBackend(config, stats)  # its children have an era layer each
        return StdioBackend(config, stats)
    if isinstance(config.target, SseTarget):
        return SseBackend(config, stats)
    return HttpBackend(config, stats)


def login_desk(config: Config, authenticator: Authenticator | None) -> LoginDesk | None:
    """Where callers log in to per-user backends: the origin of the listener's own resource URI
    (the address clients already reach the gateway at), when some backend needs it; whoever
    opens a link signs in at the listener's issuer first (oauth/caller_check.py)."""
    auth = config.auth
    if auth is None or not any(b.auth and b.auth.per_user for b in config.backends):
        return None
    check = None
    if authenticator is not None and auth.issuer and auth.login_client_id:

        async def identify(token: str) -> tuple[str | None, str]:
            try:
                identity = await authenticator.authenticate(token)
            except (Rejected, Unavailable) as exc:
                raise ValueError(type(exc).__name__) from None
            return identity.issuer, identity.subject

        http = OAuthHttp(auth.fetch_timeout, auth.max_response_bytes, f"mcp-gateway/{__version__}")
        check = CallerCheck(
            http,
            auth.issuer,
            auth.login_client_id,
            auth.login_client_secret,
            auth.resource,
            identify,
        )
    parts = urlsplit(auth.resource)
    return LoginDesk(f"{parts.scheme}://{parts.netloc}", check)


def legacy_lane(
    transport: StdioBackend | HttpBackend | SseBackend, config: BackendConfig, stats: Stats
) -> Callable[[], StdioBackend | HttpBackend] | None:
    """How to reach the server again for legacy sessions of legacy clients, should it speak
    both eras (backends/dual.py): HTTP, a session on the same pools; stdio, a second child."""
    if isinstance(transport, HttpBackend):
        return transport.session_view
    if isinstance(transport, StdioBackend):

        def second() -> StdioBackend:
            child = StdioBackend(config, stats)
            child.tap = transport.tap  # (set before any lane is made, when the tap is on)
            return child

        return second
    return None  # HTTP+SSE (2024-11-05) is legacy by nature


def _address(config: BackendConfig) -> tuple[str, int] | None:
    if isinstance(config.target, StdioTarget):
        return None
    url = urlsplit(config.target.url)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def tracer_provider(config: Config) -> TracerProvider | None:
    """An SDK tracer provider exporting OTLP over HTTP, when an endpoint is configured (in the
    config or the standard OTEL_EXPORTER_OTLP_* variables) and OTEL_SDK_DISABLED is not set."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    endpoint = config.telemetry.otlp_endpoint
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if endpoint is None and env_endpoint is None:
        return None
    service = os.environ.get("OTEL_SERVICE_NAME") or config.telemetry.service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    traces_url = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url)))
    return provider


def _open_tap(config: TapConfig) -> Tap:
    try:
        return Tap(config)
    except OSError as exc:
        raise StartupError(f"tap: cannot open {config.path}: {exc.strerror}") from None


def _open_audit(config: AuditConfig) -> AuditLog:
    try:
        return AuditLog(config)
    except OSError as exc:
        raise StartupError(f"audit: cannot open {config.path}: {exc.strerror}") from None


def access_logger(config: Config) -> logging.Logger | None:
    target = config.telemetry.access_log
    if target is None:
        return None
    logger = logging.getLogger("gateway.access")
    logger.propagate = False  # one JSON line per request, not wrapped by the text log format
    logger.setLevel(logging.INFO)
    try:
        handler: logging.Handler = (
            logging.StreamHandler(sys.stderr) if target == "stderr" else logging.FileHandler(target)
        )
    except OSError as exc:
        raise StartupError(f"telemetry.access_log: cannot open {target}: {exc.strerror}") from None
    handler.setFormatter(logging.Formatter("%(message)s"))
    for old in logger.handlers:  # a gateway made before in this process (tests, the CLI's checks)
        old.close()
    logger.handlers = [handler]
    return logger


def limiter(config: Config, stats: Stats) -> RateLimiter | None:
    limits = config.rate_limits
    return RateLimiter(limits, stats.rate_limited) if limits is not None else None


def shared_buckets(config: Config, stats: Stats) -> RedisBuckets | None:
    """The replicas' shared buckets (cluster.redis), when there are limits to share."""
    cluster = config.cluster
    if config.rate_limits is None or cluster is None or cluster.redis is None:
        return None
    return RedisBuckets(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, stats)


def make_exposure(config: BackendConfig) -> Exposure:
    return Exposure(
        backend=config.name,
        namespace=config.effective_namespace,
        allow=config.allow_tools,
        deny=config.deny_tools,
        rename=dict(config.rename_tools),
        strict_headers=not isinstance(config.target, StdioTarget),
    )


def make_naming(config: Config) -> Naming:
    n = config.namespacing
    return Naming(
        mode=PrefixMode(n.prefix),
        separator=n.separator,
        max_length=n.max_name_length,
        backends=len(config.backends),
    )


class Gateway:
    """The running gateway: `async with Gateway(config) as gw:` starts backends and the HTTP
    listener (if configured); `serve_stdio` runs the stdio front end on given streams."""

    def __init__(self, config: Config, tracing: trace.TracerProvider | None = None) -> None:
        self.config = config
        self.registry = CollectorRegistry()
        self._provider = tracing if tracing is not None else tracer_provider(config)
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
        )
        stats = self.telemetry.stats
        self.transports = [make_backend(b, stats) for b in config.backends]
        for transport in self.transports if self.telemetry.tapping else ():
            transport.tap = self.telemetry  # (each records what it writes and reads)
        # Each transport behind its era layer: a legacy backend looks modern from here on.
        # (A backend with a child per client has an era layer per child, inside it.)
        self.layers = [
            t if isinstance(t, IsolatedBackend) else EraBackend(t, c, legacy_lane(t, c, stats))
            for t, c in zip(self.transports, config.backends, strict=True)
        ]
        # Each behind its health: one that cannot be reached fails at once and is retried in
        # the background (a stdio child by its own supervisor, which reports to the same one;
        # a backend with a child per client by each child's).
        self.health = [
            t.health if isinstance(t, StdioBackend) else Health(t.name) for t in self.transports
        ]
        # Per-user backend logins are served by the HTTP listener (frontends/logins.py); a
        # caller who has none is sent its link by the gate above the era layer.
        # The HTTP listener's token checks (`auth:`); None: no authentication.
        self.authenticator = Authenticator(config.auth) if config.auth is not None else None
        self.logins = login_desk(config, self.authenticator)
        gated: list[Backend] = []
        for layer, transport in zip(self.layers, self.transports, strict=True):
            authorizer = getattr(transport, "authorizer", None)
            if isinstance(authorizer, Authorizer) and authorizer.per_user:
                authorizer.desk = self.logins
                gated.append(LoginGate(layer))
            else:
                gated.append(layer)
        self.guarded = [
            Guarded(e, h, supervised=isinstance(t, StdioBackend | IsolatedBackend))
            for e, h, t in zip(gated, self.health, self.transports, strict=True)
        ]
        self.eras = [e for e in self.layers if isinstance(e, EraBackend)]
        # Outermost, each backend's bound on requests in flight: a request refused there
        # reaches nothing below (no span, no transport).
        overload = config.overload
        self.bounds = [
            Bound(BACKEND, c.name, c.max_in_flight, overload, stats.overloaded)
            for c in config.backends
        ]
        self.backends: list[Backend] = [
            BoundedBackend(InstrumentedBackend(g, self.telemetry, _address(c)), bound)
            for g, c, bound in zip(self.guarded, config.backends, self.bounds, strict=True)
        ]
        own = limiter(config, stats)
        # With cluster.redis the limits are shared, and `own` decides only when Redis does not.
        self.shared_buckets = shared_buckets(config, stats)
        shared = None
        if own is not None and self.shared_buckets is not None:
            shared, own = SharedRateLimiter(own, self.shared_buckets), None
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
        )
        for era in self.layers:
            era.on_notification = self.dispatcher.backend_notification
        for health in self.health:
            health.on_change = self._on_health(health.name)
        # Set once every backend's catalog has been asked for (loaded, or failed) at start-up.
        self.catalogs_loaded = anyio.Event()
        self.registry.register(
            GatewayCollector(self.telemetry.stats, self._backend_states, self._listens)
        )
        self._serving = False
        # Set when shutdown begins (a signal, the end of stdin): /readyz answers 503 from then
        # on, so a load balancer stops sending while what runs drains.
        self.draining = False
        self.operations = Operations(
            metrics=self._render_metrics,
            backends=self._backends_up,
            serving=lambda: self._serving,
            draining=lambda: self.draining,
        )
        self._admin: Listener | None = None
        self.admin_url: str | None = None
        self._http: Listener | None = None
        self._endpoint: http_frontend.Endpoint | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.http_url: str | None = None

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
            for backend in self.backends:
                self._tg.start_soon(backend.run, name=f"backend {backend.name}")
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
            )
            for t, e, g in zip(self.transports, self.layers, self.guarded, strict=True)
        ]

    def _on_health(self, name: str) -> Callable[[bool], None]:
        def changed(up: bool) -> None:
            # Back up: its catalog is loaded again now, not at the next lookup that misses.
            if up and self._tg is not None:
                self.dispatcher.catalogs.invalidate(name)
                self._tg.start_soon(self.dispatcher.catalogs.refresh, name)

        return changed

    def _listens(self) -> int:
        return self.dispatcher.subscriptions.active

    def _backends_up(self) -> dict[str, bool]:
        return {g.name: g.up for g in self.guarded}

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
        self._endpoint = http_frontend.Endpoint(
            self.dispatcher, listen, self.operations, self.authenticator, self.logins
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
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            if self.tap is not None:
                self.tap.close()
            if self.audit is not None:
                self.audit.close()
            if self._provider is not None and isinstance(self._provider, TracerProvider):
                self._provider.force_flush()

    def drain(self) -> None:
        """Shutdown begins: unready from now on (/readyz), and open listen streams end with
        their completion result; requests in flight get the front ends' drain or grace."""
        self.draining = True
        self.dispatcher.close_streams()

    async def serve_stdio(
        self, inbound: anyio.abc.ByteReceiveStream, outbound: anyio.abc.ByteSendStream
    ) -> None:
        await StdioFrontend(self.dispatcher, inbound, outbound, stdio_origin(self.config)).serve()


def stdio_origin(config: Config) -> Origin:
    """The stdio front end's requests' origin: under the configured identity, if one is."""
    who = config.listen.stdio_identity
    if who is None:
        return STDIO_ORIGIN
    identity = Identity(
        subject=who.subject,
        client_id=who.client_id,
        scopes=frozenset(who.scopes),
        claims=dict(who.claims),
        method=CONFIGURED,
    )
    return Origin("stdio", identity=identity)


# Allocations between young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """Once started: what exists now (modules, config, catalogs) lives as long as the process,
    so it leaves the collector's scans; and young collections run less often, since every
    request allocates a few dozen short-lived containers (the default made one every few
    requests). Cycles are still collected."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


async def run(config: Config) -> None:
    """Run until SIGINT/SIGTERM, or (with a stdio front end) until stdin closes. Either way open
    listen streams end with their completion result and in-flight requests get time to finish."""
    async with Gateway(config) as gateway, anyio.create_task_group() as tg:
        settle_gc()
        stdio: StdioFrontend | None = None
        if config.listen.stdio:
            inbound, outbound = await open_process_stdio()
            stdio = StdioFrontend(gateway.dispatcher, inbound, outbound, stdio_origin(config))

            async def serve_stdio(frontend: StdioFrontend) -> None:
                await frontend.serve()
                log.info("stdin closed, shutting down")
                tg.cancel_scope.cancel()

            tg.start_soon(serve_stdio, stdio)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                # Unready before the line is logged: whoever sees the line sees /readyz 503.
                gateway.drain()
                log.info("received %s, shutting down", signal.Signals(signum).name)
                break
        if stdio is not None:
            stdio.stop()  # serve_stdio drains, then cancels the group
        else:
            tg.cancel_scope.cancel()
