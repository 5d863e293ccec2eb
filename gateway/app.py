"""Composition root: builds backends, the dispatcher and the front ends from a config, owns the
root task group and shuts everything down in order. The only module that wires concrete parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import ssl
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.to_thread
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from gateway import __version__, taskkey
from gateway.auth.authenticator import Authenticator
from gateway.auth.identity import CONFIGURED, Identity
from gateway.auth.outage import Unavailable
from gateway.auth.tokens import Rejected
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
    AuditConfig,
    BackendConfig,
    Config,
    ConfigInvalid,
    ListenerLimits,
    SseTarget,
    StdioTarget,
    TapConfig,
)
from gateway.core.changes import ClusterChanges
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BACKEND, OVERALL, Bound, BoundedBackend
from gateway.core.policy import Policy
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.frontends import guard
from gateway.frontends import http as http_frontend
from gateway.frontends.listener import BindError, Listener
from gateway.frontends.ops import Operations, admin_handler
from gateway.frontends.stdio import End, StdioFrontend, open_process_stdio
from gateway.oauth.authorizer import Authorizer
from gateway.oauth.caller_check import CallerCheck
from gateway.oauth.desk import LoginDesk
from gateway.oauth.fetch import OAuthHttp
from gateway.oauth.shared import PURPOSE as LOGINS_PURPOSE
from gateway.oauth.shared import LoginBook
from gateway.protocol import codes
from gateway.routing import cursor as cursors
from gateway.routing import taskids
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.shared.buckets import RedisBuckets
from gateway.shared.bus import RedisBus
from gateway.shared.logins import RedisLogins
from gateway.shared.sessions import RedisSessions
from gateway.telemetry.api import STDIO_ORIGIN, Origin, Stats
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.loop import measure_lag
from gateway.telemetry.metrics import (
    BackendState,
    GatewayCollector,
    Recorder,
    TraceExportCollector,
    process_metrics,
)
from gateway.telemetry.otel import GatewayTelemetry
from gateway.telemetry.otlp import OtlpSpanProcessor, Settings
from gateway.telemetry.status import BackendFacts, StatusBoard, snapshot
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


def login_desk(
    config: Config, authenticator: Authenticator | None, book: LoginBook | None = None
) -> LoginDesk | None:
    """Where callers log in to per-user backends: the origin of the listener's own resource URI
    (the address clients already reach the gateway at), when some backend needs it; whoever
    opens a link signs in at the listener's issuer first (oauth/caller_check.py). `book`: the
    cluster's shared logins in progress (None: the desk's memory)."""
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
    return LoginDesk(f"{parts.scheme}://{parts.netloc}", check, book=book)


def legacy_lane(
    transport: StdioBackend | HttpBackend | SseBackend, config: BackendConfig, stats: Stats
) -> Callable[[], StdioBackend | HttpBackend] | None:
    """How to reach the server again for legacy sessions of legacy clients, should it speak
    both eras (backends/era/dual.py): HTTP, a session on the same pools; stdio, a second child."""
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


def tracer_provider(config: Config) -> tuple[TracerProvider, OtlpSpanProcessor] | None:
    """An SDK tracer provider whose spans the gateway exports itself (OTLP over HTTP,
    telemetry/otlp.py), when an endpoint is configured (in the config or the standard
    OTEL_EXPORTER_OTLP_* variables) and OTEL_SDK_DISABLED is not set."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    endpoint = config.telemetry.otlp_endpoint
    traces_url = f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None
    settings = Settings.from_env(traces_url)
    if settings is None:
        return None
    service = os.environ.get("OTEL_SERVICE_NAME") or config.telemetry.service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    processor = OtlpSpanProcessor(settings)
    provider.add_span_processor(processor)
    return provider, processor


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


def rate_limiters(
    config: Config, stats: Stats, shared: RedisBuckets | None
) -> tuple[RateLimiter | None, SharedRateLimiter | None]:
    """The dispatcher's limiters: the replica's own alone, or (with cluster.redis) shared ones
    that fall back on the replica's own when Redis does not answer."""
    own = limiter(config, stats)
    if own is None or shared is None:
        return own, None
    return None, SharedRateLimiter(own, shared)


def _carry_over(dispatcher: Dispatcher, limiter: RateLimiter | None) -> None:
    """A reload keeps the buckets of every limit it did not change (the replica's own; the
    shared ones are in Redis and stay anyway)."""
    shared = dispatcher.shared_limiter
    before = dispatcher.limiter or (shared.local if shared is not None else None)
    if limiter is not None and before is not None:
        limiter.carry_over(before)


def limiter(config: Config, stats: Stats) -> RateLimiter | None:
    limits = config.rate_limits
    return RateLimiter(limits, stats.rate_limited) if limits is not None else None


def shared_buckets(config: Config, stats: Stats) -> RedisBuckets | None:
    """The replicas' shared buckets (cluster.redis), when there are limits to share."""
    cluster = config.cluster
    if config.rate_limits is None or cluster is None or cluster.redis is None:
        return None
    return RedisBuckets(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, stats)


def cluster_bus(config: Config, stats: Stats) -> RedisBus | None:
    """The replicas' messages to each other (cluster.redis); None: this replica is alone."""
    cluster = config.cluster
    if cluster is None or cluster.redis is None:
        return None
    return RedisBus(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, stats)


def session_records(config: Config, stats: Stats) -> RedisSessions | None:
    """Legacy sessions' records in Redis (cluster.redis, with an HTTP listener), so that any
    replica serves any request of a session; None: each process keeps its own."""
    cluster = config.cluster
    listen = config.listen.http
    if cluster is None or cluster.redis is None or listen is None:
        return None
    return RedisSessions(
        cluster.redis,
        listen.session_idle_timeout,
        cluster.redis_timeout,
        cluster.redis_retry_interval,
        stats,
    )


# --- cluster: the backends' logins, shared by the replicas (cluster.redis) ------------------
# (oauth/shared.py, shared/logins.py; docs/decisions/0013-backend-logins-in-a-cluster.md)

# Each operation on the shared logins waits this long for Redis at most (or redis_timeout, if
# longer). Not the rate limits' 0.1 s: these run once per login step, per renewal, and per
# request of a caller this replica holds no token for, never on every request, and a request
# that needs one would otherwise fail outright; 1 s is far beyond a healthy Redis's answer yet
# well inside the request's own wait for a token (connect_timeout, 10 s by default).
SHARED_LOGINS_TIMEOUT = 1.0
# The bus topic on which a replica says that a login ended (its id's digest, and the failure).
LOGIN_TOPIC = "oauth-login"


def shared_logins(config: Config) -> RedisLogins | None:
    """The replicas' store of backend logins (tokens, registrations, per-user logins in
    progress), sealed with keys from cluster.secrets; None without cluster.redis (then tokens
    are the file store's and logins in progress the desk's memory). Made whenever the cluster
    has Redis: its client connects on first use, and a reload may add a backend with auth:."""
    cluster = config.cluster
    if cluster is None or cluster.redis is None:
        return None
    timeout = max(cluster.redis_timeout, SHARED_LOGINS_TIMEOUT)
    return RedisLogins(cluster.redis, cluster.keys(LOGINS_PURPOSE), timeout)


def login_notices(desk: LoginDesk | None, bus: RedisBus | None) -> None:
    """A login finished by one replica ends another's wait for it (the operator's login, whose
    link every replica logs) over the bus. At most once: a lost notice costs that replica its
    wait, and its next request finds the token in the shared store anyway."""
    if desk is None or bus is None:
        return

    async def announce(digest: str, failure: str | None) -> None:
        await bus.publish(LOGIN_TOPIC, {"login": digest, "failure": failure})

    async def heard(sender: str, body: dict[str, Any]) -> None:
        login, failure = body.get("login"), body.get("failure")
        if isinstance(login, str):
            await desk.heard(login, failure if isinstance(failure, str) else None)

    desk.announce = announce
    bus.on(LOGIN_TOPIC, heard)


# --- end of the shared logins' block ------------------------------------------------------


def make_exposure(config: BackendConfig) -> Exposure:
    return Exposure(
        backend=config.name,
        namespace=config.effective_namespace,
        allow=config.allow_tools,
        deny=config.deny_tools,
        rename=dict(config.rename_tools),
        strict_headers=not isinstance(config.target, StdioTarget),
        forward_unknown=config.forward_unknown,
    )


def make_naming(config: Config) -> Naming:
    n = config.namespacing
    return Naming(
        mode=PrefixMode(n.prefix),
        separator=n.separator,
        max_length=n.max_name_length,
        backends=len(config.backends),
    )


@dataclass(eq=False)
class Wired:
    """One configured backend: its transport and the layers over it, outermost last, and the
    scope its tasks run in, so that a reload can stop it alone."""

    config: BackendConfig
    transport: StdioBackend | HttpBackend | SseBackend | IsolatedBackend
    layer: EraBackend | IsolatedBackend
    health: Health
    guarded: Guarded
    bound: Bound
    outer: Backend
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    stopped: anyio.Event = field(default_factory=anyio.Event)
    breaker: Breaker | None = None  # (backends.NAME.breaker; None: off)


# The sections a reload applies; every other one (listen addresses, TLS, `auth:`, telemetry,
# tap, audit, overload, cluster) is what the running process was built around, so a change
# there is logged as needing a restart and left as it was, never half-applied.
RELOADED = frozenset(
    {"backends", "namespacing", "on_backend_failure", "policy", "rate_limits", "shutdown"}
)
# What a removed backend is given beyond its request timeout to finish what it was sent (the
# timeout's own error takes that long to come back through the layers).
RETIRE_MARGIN = 1.0


@dataclass(frozen=True)
class Reloaded:
    """What one applied reload changed, by backend name, and the sections left for a restart."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    kept: tuple[str, ...]
    needs_restart: tuple[str, ...]


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


def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "none"


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


# How often `--watch` looks at the config file's modification time: a stat a second is
# nothing, and an edit is picked up about as fast as an operator could send SIGHUP.
WATCH_INTERVAL = 1.0


async def run(
    config: Config,
    load: Callable[[], Config] | None = None,
    *,
    pid_file: Path | None = None,
    watch: Path | None = None,
) -> int:
    """Run until SIGINT/SIGTERM, or (with a stdio front end) until stdin closes or the client
    closes stdout. Either way open listen streams end with their completion result and
    in-flight requests get time to finish; a second signal cuts that short. With `load`,
    SIGHUP (and, with `watch`, a change to that file) reloads the config. Returns the exit
    status: 0, or non-zero as `Stopping` says."""
    # The file as it was loaded (near enough: just after), so an edit made while the gateway
    # starts is a change too.
    stamp = await _stamp(watch) if watch is not None else None
    stopping = Stopping()
    # SIGHUP is taken before anything starts: its default action would end the process.
    # SIGINT and SIGTERM, once taken, are held to the very end (`held`), watched by a task that
    # outlives the gateway's own shutdown (a task group around the gateway would wrap its
    # start-up errors in an exception group).
    with anyio.open_signal_receiver(signal.SIGHUP) as hangups, contextlib.ExitStack() as held:
        try:
            async with Gateway(config) as gateway, anyio.create_task_group() as tg:
                settle_gc()
                stdio: StdioFrontend | None = None
                if config.listen.stdio:
                    inbound, outbound = await open_process_stdio()
                    stdio = StdioFrontend(
                        gateway.dispatcher,
                        inbound,
                        outbound,
                        stdio_origin(config),
                        config.shutdown.stdout_stall_timeout,
                    )

                    async def serve_stdio(frontend: StdioFrontend) -> None:
                        end = await frontend.serve()
                        if end is End.INPUT:
                            log.info("stdin closed, shutting down")
                        elif end is End.STALLED:
                            stopping.fail(STALLED_STATUS)
                        tg.cancel_scope.cancel()

                    tg.start_soon(serve_stdio, stdio)
                tg.start_soon(_reload_on_sighup, gateway, load, hangups)
                if load is not None and watch is not None:
                    tg.start_soon(_reload_on_change, gateway, load, watch, stamp)
                signals = held.enter_context(
                    anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
                )
                stopping.watch(gateway, stdio, signals)
                if pid_file is not None:
                    # Written once SIGHUP reloads: whoever reads it may signal at once.
                    await anyio.Path(pid_file).write_text(f"{os.getpid()}\n")
                try:
                    await stopping.requested.wait()
                finally:
                    if pid_file is not None:
                        _remove(pid_file)
                if stdio is not None:
                    stdio.stop()  # serve_stdio drains, then cancels the group
                else:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await stopping.close()
    return stopping.status


# The exit status when the stdio client stopped reading its last replies (some were lost).
STALLED_STATUS = 1


class Stopping:
    """SIGINT and SIGTERM from the start of serving to the process's end. The first begins the
    graceful shutdown (after `shutdown.pre_stop_delay`, for SIGTERM); the next (or the first,
    once the end of stdin began the shutdown) stops at once: requests in flight are cut, each
    answered with GATEWAY_SHUTTING_DOWN, and the exit status is 128 + the signal's number, as
    for a process the signal ended. Held to the end, so a signal never lands as a
    KeyboardInterrupt in whatever the loop is running."""

    def __init__(self) -> None:
        self.requested = anyio.Event()  # the graceful shutdown is asked for
        self.status = 0
        self._hurried = False
        self._watcher: asyncio.Task[None] | None = None

    def fail(self, status: int) -> None:
        self.status = self.status or status

    def watch(
        self, gateway: Gateway, stdio: StdioFrontend | None, signals: AsyncIterator[int]
    ) -> None:
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(gateway, stdio, signals), name="signals"
        )

    async def close(self) -> None:
        """The process is ending: signals are no longer watched (once their receiver is
        closed, the next SIGINT is a KeyboardInterrupt again, which the CLI takes)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)

    async def _watch(
        self, gateway: Gateway, stdio: StdioFrontend | None, signals: AsyncIterator[int]
    ) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not self.requested.is_set() and not (stdio is not None and stdio.ending):
                await _pre_stop(gateway, signum, signals)
                # Unready before the line is logged: whoever sees the line sees 503.
                gateway.drain()
                log.info("received %s, shutting down", name)
                self.requested.set()
            elif not self._hurried:
                self._hurried = True
                log.warning(
                    "received %s during the shutdown: stopping at once; requests in flight "
                    "are answered with %d",
                    name,
                    codes.GATEWAY_SHUTTING_DOWN,
                )
                self.fail(128 + signum)
                gateway.hurry()
                if stdio is not None:
                    stdio.hurry()


async def _pre_stop(gateway: Gateway, signum: int, signals: AsyncIterator[int]) -> None:
    """`shutdown.pre_stop_delay` after SIGTERM: unready (/readyz 503) at once, yet serving as
    before, so a load balancer that has not yet heard (a Service's endpoints take seconds to
    reach every node) sends nothing into a closed port. SIGINT is someone at a terminal: no
    wait; a second signal ends the wait."""
    delay = gateway.config.shutdown.pre_stop_delay
    if signum != signal.SIGTERM or delay <= 0:
        return
    gateway.draining = True
    log.info("received SIGTERM: unready, serving %g s more (shutdown.pre_stop_delay)", delay)
    with anyio.move_on_after(delay):
        async for _ in signals:
            return


async def _reload_on_sighup(
    gateway: Gateway, load: Callable[[], Config] | None, hangups: AsyncIterator[int]
) -> None:
    async for _ in hangups:
        if load is None:
            log.warning("received SIGHUP: this gateway has no config file to reload")
            continue
        log.info("received SIGHUP, reloading the config")
        await gateway.reload(load)


async def _reload_on_change(
    gateway: Gateway, load: Callable[[], Config], path: Path, seen: tuple[int, int] | None
) -> None:
    """`--watch`: a stat of the file every WATCH_INTERVAL, a reload when its modification time
    or size changed (a poll, not inotify: portable, and one stat a second costs nothing)."""
    log.info("watching %s for changes", path)
    while True:
        await anyio.sleep(WATCH_INTERVAL)
        stamp = await _stamp(path)
        if stamp != seen:
            seen = stamp
            log.info("%s changed, reloading the config", path)
            await gateway.reload(load)


def _remove(pid_file: Path) -> None:
    # One unlink, synchronous: it runs in a `finally` that cancellation may be passing through,
    # where an await would not run.
    pid_file.unlink(missing_ok=True)


async def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        found = await anyio.Path(path).stat()
    except OSError:
        return None  # (being replaced: the next look sees the new file)
    return found.st_mtime_ns, found.st_size
