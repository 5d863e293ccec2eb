"""Building the parts from the config: each backend's transport and the layers over it, the
login desk, the rate limiters, the names and exposures the dispatcher routes by, and the stdio
front end's origin.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio

from gateway import __version__, taskkey
from gateway.app.errors import StartupError
from gateway.backends import resilience
from gateway.backends.base import Backend
from gateway.backends.breaker import Breaker
from gateway.backends.era.http_session import HttpSession
from gateway.backends.era.layer import EraBackend
from gateway.backends.health import Guarded, Health
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.login_gate import LoginGate
from gateway.backends.sse import SseBackend
from gateway.backends.stdio import StdioBackend
from gateway.caller_auth.identity import CONFIGURED, Identity
from gateway.caller_auth.outage import Unavailable
from gateway.caller_auth.tokens import Rejected
from gateway.config import (
    AuthConfig,
    BackendConfig,
    Config,
    ConfigInvalid,
    Namespacing,
    Overload,
    SseTarget,
    StdioTarget,
)
from gateway.config.describe import prefix_notices
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.fused import FusedBackend
from gateway.core.instrument import InstrumentedBackend
from gateway.core.overload import BACKEND, OVERALL, Bound, BoundedBackend
from gateway.core.policy import Policy
from gateway.core.ratelimit import RateLimiter, SharedRateLimiter
from gateway.origin import STDIO_ORIGIN, Origin
from gateway.routing import cursor as cursors
from gateway.routing import taskids
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure
from gateway.telemetry.api import Stats
from gateway.telemetry.otel import GatewayTelemetry

if TYPE_CHECKING:
    from gateway.backend_auth.desk import LoginDesk
    from gateway.backend_auth.shared import LoginBook
    from gateway.caller_auth.authenticator import Authenticator
    from gateway.cluster.buckets import RedisBuckets
    from gateway.cluster.logins import RedisLogins
    from gateway.config.hooks import HookConfig

log = logging.getLogger("gateway")
INFO = GatewayInfo(name="mcp-gateway", version=__version__)


def make_authenticator(auth: AuthConfig) -> Authenticator:
    """The token checks of an endpoint under `auth:`. Imported here, once there is `auth:`:
    PyJWT and cryptography under it (~8 MB) are loaded by no gateway without one (0063)."""
    from gateway.caller_auth.authenticator import Authenticator

    return Authenticator(auth)


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
    opens a link signs in at the listener's issuer first (backend_auth/caller_check.py). `book`: the
    cluster's shared logins in progress (None: the desk's memory)."""
    auth = config.auth
    if auth is None or not any(b.auth and b.auth.per_user for b in config.backends):
        return None
    from gateway.backend_auth.caller_check import CallerCheck
    from gateway.backend_auth.desk import LoginDesk
    from gateway.backend_auth.fetch import OAuthHttp

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
) -> Callable[[], StdioBackend | HttpSession] | None:
    """How to reach the server again for legacy sessions of legacy clients, should it speak
    both eras (backends/era/dual.py): HTTP, a session on the same pools; stdio, a second child."""
    if isinstance(transport, HttpBackend):
        return lambda: HttpSession(transport.session_view())
    if isinstance(transport, StdioBackend):

        def second() -> StdioBackend:
            child = StdioBackend(config, stats)
            child.tap = transport.tap  # (set before any lane is made, when the tap is on)
            return child

        return second
    return None  # HTTP+SSE (2024-11-05) is legacy by nature


def address(config: BackendConfig) -> tuple[str, int] | None:
    if isinstance(config.target, StdioTarget):
        return None
    url = urlsplit(config.target.url)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def rate_limiters(
    config: Config, stats: Stats, shared: RedisBuckets | None
) -> tuple[RateLimiter | None, SharedRateLimiter | None]:
    """The dispatcher's limiters: the replica's own alone, or (with cluster.redis) shared ones
    that fall back on the replica's own when Redis does not answer."""
    own = limiter(config, stats)
    if own is None or shared is None:
        return own, None
    return None, SharedRateLimiter(own, shared)


def limiter(config: Config, stats: Stats) -> RateLimiter | None:
    limits = config.rate_limits
    return RateLimiter(limits, stats.rate_limited) if limits is not None else None


def make_exposure(config: BackendConfig) -> Exposure:
    return Exposure(
        backend=config.name,
        namespace=config.effective_namespace,
        allow=config.allow_tools,
        deny=config.deny_tools,
        rename=dict(config.rename_tools),
        strict_headers=not isinstance(config.target, StdioTarget),
        forward_unknown=config.forward_unknown,
        lists_from_catalog=config.lists_from_catalog,
    )


def log_prefixing(config: Config, before: Config | None = None) -> None:
    """Say when `prefix: auto` prefixes a server's names (two backends or more): at start-up,
    and on a reload that makes it so (adding a second backend renames the first's tools)."""
    was = set(prefix_notices(before)) if before is not None else set()
    for notice in prefix_notices(config):
        if notice not in was:
            log.info("%s", notice)


def make_naming(config: Config) -> Naming:
    return naming_of(config.namespacing, len(config.backends))


def naming_of(n: Namespacing, backends: int) -> Naming:
    """The names of a server of `backends` backends: the merged one's, or a virtual server's."""
    return Naming(
        mode=PrefixMode(n.prefix),
        separator=n.separator,
        max_length=n.max_name_length,
        backends=backends,
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


def build_stack(
    config: BackendConfig,
    overload: Overload,
    telemetry: GatewayTelemetry,
    shared: RedisLogins | None,
    desk: LoginDesk | None,
    hooks: tuple[HookConfig, ...] = (),
) -> Wired:
    """One backend's stack: the layers a request passes, top to bottom, each a
    `backends.base.Layer` over the next. A layer that would do nothing for this backend is
    left out; the others act on every backend.

    0. `HookedBackend` (hooks/runner.py): the top-level `hooks` and the backend's own, on the
       requests and results of the methods they see; above the bound, so a hook's time holds
       no slot of the backend's. Only for a backend with hooks (its own or top-level ones).
    1. `BoundedBackend` (core/overload.py): the bound on requests in flight (`max_in_flight`);
       one refused there reaches nothing below (no span, no transport). Always: every backend
       has a bound, which a reload's drain and the in-flight gauge read too.
    2. `InstrumentedBackend` (core/instrument.py): the CLIENT observation (metrics always,
       a span when tracing) and the trace context in `_meta`.
    3. `Resilient` (backends/resilience.py): tools' own timeouts, safe retries and the breaker,
       below the observation so a retried request is one to the client, its span and metrics.
       Left out with none of them (`retries.attempts: 1`, no `tools.*.timeout`, no `breaker:`).
    4. `Guarded` (backends/health.py): fails at once while the backend is down, and retries
       it in the background (a stdio child: its supervisor, reporting to the same `Health`).
    5. `LoginGate` (backends/login_gate.py): the login link for a caller not logged in yet.
       Only for a per-user backend (`auth:` with `per_user`).
    6. `EraBackend` (backends/era/layer.py): a legacy backend shown as a modern one. Left out
       of a backend with a child per client (`isolation: per_session`): each child has its
       own, inside the transport. Over HTTP it holds the transport through `HttpSession`
       (backends/era/http_session.py), the legacy session's keeper, which hands the
       transport's own methods over (no frame of its own on a request).
    7. The transport (backends/stdio.py, http.py with http_exchange.py, sse.py, isolated.py).

    Where 3 is absent or has no tool timeouts and no breaker (the common case), 1-4 take their
    steps in one coroutine frame, `FusedBackend` (core/fused.py), over the chain of them.

    `shared`: the cluster's backend logins (tokens in Redis); `desk`: where per-user logins
    are served.
    """
    stats = telemetry.stats
    transport = make_backend(config, stats)
    if telemetry.tapping:
        transport.tap = telemetry  # (it records what it writes and reads)
    layer = era_layer(transport, config, stats)
    health = transport.health if isinstance(transport, StdioBackend) else Health(transport.name)
    guarded = Guarded(
        login_gate(layer, transport, shared, desk),
        health,
        supervised=isinstance(transport, StdioBackend | IsolatedBackend),
    )
    breaker = Breaker(config.breaker) if config.breaker is not None else None
    bound = Bound(BACKEND, config.name, config.max_in_flight, overload, stats.overloaded)
    outer = top(config, telemetry, bound, guarded, breaker)
    if hooks or config.hooks:
        outer = hooked(outer, hooks, config, telemetry)
    return Wired(config, transport, layer, health, guarded, bound, outer, breaker=breaker)


def top(
    config: BackendConfig,
    telemetry: GatewayTelemetry,
    bound: Bound,
    guarded: Guarded,
    breaker: Breaker | None,
) -> Backend:
    """Layers 1-4 of `build_stack` over the guard; fused into one frame (core/fused.py) where
    the resilience layer is absent or plain, over their chain, which serves what it leaves out."""
    resilient = (
        resilience.Resilient(guarded, config, breaker) if resilience.needed(config) else None
    )
    instrumented = InstrumentedBackend(
        resilient if resilient is not None else guarded, telemetry, address(config)
    )
    chain = BoundedBackend(instrumented, bound)
    if resilient is None or resilient.plain:
        return FusedBackend(chain, bound, instrumented, resilient, guarded)
    return chain


def hooked(
    inner: Backend,
    top: tuple[HookConfig, ...],
    config: BackendConfig,
    telemetry: GatewayTelemetry,
) -> Backend:
    """The backend behind its hooks: top-level ones first, then its own. Imported here, once a
    backend has hooks (and the built-ins only by the hooks that use them): a gateway without
    hooks loads none of their code (0066)."""
    from gateway.hooks.load import load_all
    from gateway.hooks.runner import HookedBackend

    try:
        hooks = load_all(top, "hooks") + load_all(config.hooks, f"backends.{config.name}.hooks")
    except ConfigInvalid as exc:  # (`check_hooks` found it first on a reload)
        raise StartupError("; ".join(exc.problems)) from None
    return HookedBackend(inner, hooks, telemetry.stats, telemetry.audit_events)


def check_hooks(config: Config) -> list[str]:
    """Whether every hook of `config` can be loaded (its module imported, its function found):
    the problems, for `check-config` and a reload to refuse the config before it is used."""
    if not config.hooks and not any(b.hooks for b in config.backends):
        return []
    from gateway.hooks.load import load_all

    problems: list[str] = []
    for hooks, where in [(config.hooks, "hooks")] + [
        (b.hooks, f"backends.{b.name}.hooks") for b in config.backends
    ]:
        try:
            load_all(hooks, where)
        except ConfigInvalid as exc:
            problems += [f"{config.source}: {p}" for p in exc.problems]
    return problems


def era_layer(
    transport: StdioBackend | HttpBackend | SseBackend | IsolatedBackend,
    config: BackendConfig,
    stats: Stats,
) -> EraBackend | IsolatedBackend:
    """The transport behind its era layer, or alone when it has an era layer per child."""
    if isinstance(transport, IsolatedBackend):
        return transport
    # HTTP keeps a legacy session across requests: the era layer sees it through HttpSession.
    link = HttpSession(transport) if isinstance(transport, HttpBackend) else transport
    lane = legacy_lane(transport, config, stats) if config.legacy_lane else None
    return EraBackend(link, config, lane)


def login_gate(
    layer: EraBackend | IsolatedBackend,
    transport: StdioBackend | HttpBackend | SseBackend | IsolatedBackend,
    shared: RedisLogins | None,
    desk: LoginDesk | None,
) -> Backend:
    """The era layer behind a login gate when the backend's logins are per user; its
    authorizer given the cluster's shared logins and the desk either way."""
    # (an HTTP transport's, made for a backend with `auth:`; None otherwise)
    authorizer = getattr(transport, "authorizer", None)
    if authorizer is None:
        return layer
    if shared is not None:
        authorizer.share(shared)  # (shared logins: tokens in Redis)
    if not authorizer.per_user:
        return layer
    authorizer.desk = desk
    return LoginGate(layer)


def make_dispatcher(
    config: Config,
    backends: list[Backend],
    telemetry: GatewayTelemetry,
    limiters: tuple[RateLimiter | None, SharedRateLimiter | None],
) -> Dispatcher:
    """The engine over the wired backends, with the limiters `rate_limiters` chose."""
    own, shared = limiters
    overload = config.overload
    log_prefixing(config)
    return Dispatcher(
        backends,
        [make_exposure(b) for b in config.backends],
        make_naming(config),
        INFO,
        config.on_backend_failure,
        telemetry,
        policy=Policy(config.policy) if config.policy is not None else None,
        limiter=own,
        shared_limiter=shared,
        cursor_keys=config.cluster.keys(cursors.PURPOSE) if config.cluster else (),
        bound=Bound(OVERALL, "", overload.max_in_flight, overload, telemetry.stats.overloaded),
        grace=config.fan_out_grace,
        start_wait=config.fan_out_start_wait,
        task_keys=(
            config.cluster.keys(taskids.PURPOSE)
            if config.cluster
            else functools.partial(taskkey.load, config.task_key_file)
        ),
        tool_search=config.tool_search,
    )
