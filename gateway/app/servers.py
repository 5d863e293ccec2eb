"""Virtual servers (`servers:`): a dispatcher each over the shared, supervised backends, built at
start and changed by reloads, and the HTTP endpoint each is served at.

No virtual server starts anything of its own: its dispatcher is handed the very backend objects
the merged server routes to (app/wiring.py `build_stack`, once per backend), and its catalogs are
the merged server's (one load per backend, core/catalog.py)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from gateway import taskkey
from gateway.app.wiring import INFO, make_authenticator, make_exposure, naming_of
from gateway.backends.base import Backend
from gateway.config import AuthConfig, BackendConfig, Config, ServerConfig
from gateway.config.search import ToolSearchConfig
from gateway.core.budget import Budget
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.core.listen import Subscriptions
from gateway.core.policy import Policy
from gateway.core.ratelimit import RateLimiter
from gateway.core.virtual import Scope, VirtualDispatcher, scoped_keys, scoped_loader
from gateway.frontends import http as http_frontend
from gateway.routing import cursor as cursors
from gateway.routing import taskids
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.telemetry.api import Telemetry

if TYPE_CHECKING:
    from gateway.caller_auth.authenticator import Authenticator

# Starts a task in the gateway's task group; makes a server's endpoint (dispatcher, path, its
# authenticator): the composition root's.
Spawn = Callable[[Callable[[], Coroutine[Any, Any, None]]], object]
MakeEndpoint = Callable[[Dispatcher, str, "Authenticator | None"], http_frontend.Endpoint]

log = logging.getLogger("gateway")


def exposures(config: Config, server: ServerConfig) -> list[Exposure]:
    """The server's view of each backend it offers: the backend's own filters and renames, then
    the server's selection, renames and namespace. A backend whose items are selected does not
    forward names it does not list (`forward_unknown`): the selection would not hold then."""
    by_name = {b.name: b for b in config.backends}
    out = []
    for chosen in server.backends:
        backend: BackendConfig = by_name[chosen.name]
        base = make_exposure(backend)
        everything = chosen.tools is None and chosen.prompts is None and chosen.resources is None
        out.append(
            replace(
                base,
                namespace=chosen.namespace or base.namespace,
                rename={**base.rename, **chosen.rename},
                tools=chosen.tools,
                prompts=chosen.prompts,
                resources=chosen.resources,
                forward_unknown=base.forward_unknown and everything,
            )
        )
    return out


def naming(config: Config, server: ServerConfig) -> Naming:
    return naming_of(server.namespacing or config.namespacing, len(server.backends))


def scope(server: ServerConfig, main: Dispatcher) -> Scope:
    unselected = {b.name: b.hidden for b in server.backends if b.hidden}
    return Scope(server.name, main.catalogs, server.instructions, unselected)


def policy(config: Config, server: ServerConfig) -> Policy | None:
    """Its own `policy:`, else the top-level one."""
    chosen = server.policy or config.policy
    return Policy(chosen) if chosen is not None else None


def backends_of(server: ServerConfig, pool: Mapping[str, Backend]) -> list[Backend]:
    """The shared backends the server offers, in its order: the merged server's objects."""
    return [pool[b.name] for b in server.backends]


def tool_search(config: Config, server: ServerConfig) -> ToolSearchConfig:
    """Its own `tool_search:`, else the top-level one."""
    return server.tool_search if server.tool_search is not None else config.tool_search


def make(
    config: Config,
    server: ServerConfig,
    main: Dispatcher,
    pool: Mapping[str, Backend],
    telemetry: Telemetry,
) -> VirtualDispatcher:
    """One virtual server's dispatcher. Its own rate limits are buckets of its own (the
    replica's); without them it shares the merged server's limiters, buckets and all."""
    own = server.rate_limits
    cluster = config.cluster
    return VirtualDispatcher(
        backends_of(server, pool),
        exposures(config, server),
        naming(config, server),
        GatewayInfo(server.server_name, INFO.version),
        config.on_backend_failure,
        telemetry,
        scope=scope(server, main),
        own_limits=own is not None,
        policy=policy(config, server),
        limiter=RateLimiter(own, telemetry.stats.rate_limited) if own is not None else main.limiter,
        shared_limiter=None if own is not None else main.shared_limiter,
        cursor_keys=scoped_keys(cluster.keys(cursors.PURPOSE), server.name) if cluster else (),
        bound=main.bound,  # (the gateway's overall bound on requests in flight)
        grace=config.fan_out_grace,
        start_wait=config.fan_out_start_wait,
        task_keys=(
            scoped_keys(cluster.keys(taskids.PURPOSE), server.name)
            if cluster
            else scoped_loader(functools.partial(taskkey.load, config.task_key_file), server.name)
        ),
        tool_search=tool_search(config, server),
    )


def reconfigure(
    dispatcher: VirtualDispatcher,
    config: Config,
    server: ServerConfig,
    main: Dispatcher,
    pool: Mapping[str, Backend],
    telemetry: Telemetry,
) -> None:
    """A kept server after a reload: the backends as they now are, its settings as now
    configured (its own rate limits keep the buckets of limits that did not change)."""
    own = server.rate_limits
    limiter = main.limiter
    if own is not None:
        limiter = RateLimiter(own, telemetry.stats.rate_limited)
        before = dispatcher.limiter if dispatcher.tasks.attaches else None
        if before is not None:
            limiter.carry_over(before)
    dispatcher.tasks.attaches = own is not None
    dispatcher.reconfigure(
        backends_of(server, pool),
        exposures(config, server),
        naming(config, server),
        config.on_backend_failure,
        policy(config, server),
        limiter,
        None if own is not None else main.shared_limiter,
        tool_search(config, server),
    )
    dispatcher.rescope(scope(server, main))


def server_auth(auth: AuthConfig, server: ServerConfig) -> AuthConfig:
    """The token rules of the server's endpoint: the top-level ones, with its own resource (by
    default the top-level resource's origin and the server's path), audience and scopes."""
    own = server.auth
    parts = urlsplit(auth.resource)
    resource = (own.resource if own else "") or f"{parts.scheme}://{parts.netloc}{server.path}"
    audience = (own.audience if own else "") or auth.audience or resource
    return replace(
        auth,
        resource=resource,
        audience=audience,
        required_scopes=tuple(dict.fromkeys(auth.required_scopes + (own.scopes if own else ()))),
        scopes_supported=(own.scopes_supported if own and own.scopes_supported else ())
        or auth.scopes_supported,
    )


@dataclass
class Served:
    """One virtual server as it runs: its config, dispatcher, and authenticator (None: no
    `auth:`)."""

    config: ServerConfig
    dispatcher: VirtualDispatcher
    authenticator: Authenticator | None = None
    # Ends the task keeping its context budget current (None: not started yet).
    budgeting: anyio.CancelScope | None = None


def authenticator(config: Config, server: ServerConfig) -> Authenticator | None:
    """Every endpoint checks tokens for its own resource (RFC 8707: a token for /mcp/docs is not
    one for /mcp/ops), so each has an authenticator of its own under `auth:`."""
    if config.auth is None:
        return None
    return make_authenticator(server_auth(config.auth, server))


class VirtualServers:
    """The virtual servers of the running gateway, by name, and their HTTP endpoints (mounted
    on the merged server's endpoint, which hands them the requests for their paths)."""

    def __init__(
        self,
        config: Config,
        main: Dispatcher,
        pool: Mapping[str, Backend],
        telemetry: Telemetry,
        budget: Budget,
    ) -> None:
        """`budget`: the gateway's, which each server's costs are kept in, by its name."""
        self._main = main
        self._telemetry = telemetry
        self._budget = budget
        self.served: dict[str, Served] = {}
        self._endpoints: dict[str, http_frontend.Endpoint] = {}
        self._host: http_frontend.Endpoint | None = None
        self._endpoint_for: MakeEndpoint | None = None
        self._spawn: Spawn | None = None
        self._closing: list[Authenticator] = []  # replaced by a reload, closed at the end
        self._leader: Subscriptions | None = None  # with a cluster bus: the merged server's
        for server in config.servers:
            self.served[server.name] = self._make(config, server, pool)

    def _make(self, config: Config, server: ServerConfig, pool: Mapping[str, Backend]) -> Served:
        dispatcher = make(config, server, self._main, pool, self._telemetry)
        if self._leader is not None:
            dispatcher.subscriptions.follow(self._leader)
        served = Served(server, dispatcher, authenticator(config, server))
        if self._spawn is not None:
            self._run(served, self._spawn)
        return served

    def _run(self, served: Served, spawn: Spawn) -> None:
        """The server's background work: its catalogs' loads, and its context budget kept
        current (core/budget.py), until the server is removed."""
        served.dispatcher.catalogs.spawn = spawn
        name, scope = served.config.name, anyio.CancelScope()
        served.budgeting = scope

        async def follow() -> None:
            try:
                with scope:
                    await self._budget.follow(name, served.dispatcher.catalogs)
            finally:
                # (an estimate under way when the server was removed may have stored it again)
                if self.served.get(name) is not served:
                    self._budget.forget(name)

        spawn(follow)

    @property
    def dispatchers(self) -> list[VirtualDispatcher]:
        return [s.dispatcher for s in self.served.values()]

    def follow(self, leader: Subscriptions) -> None:
        """With a cluster bus: their listens take part in the replicas' changes as the merged
        server's do (core/changes.py), through `leader`, the merged server's listens."""
        self._leader = leader
        for dispatcher in self.dispatchers:
            dispatcher.subscriptions.follow(leader)

    def start(self, spawn: Spawn) -> None:
        """Their background work (catalog loads, budgets) runs in the gateway's task group."""
        self._spawn = spawn
        for served in self.served.values():
            self._run(served, spawn)

    def mount(self, host: http_frontend.Endpoint, endpoint_for: MakeEndpoint) -> None:
        """Each server's endpoint (made by `endpoint_for`), at its path on the listener of
        `host`, the merged server's endpoint."""
        self._host, self._endpoint_for = host, endpoint_for
        for served in self.served.values():
            self._mount(served)

    def _mount(self, served: Served) -> None:
        if self._host is None or self._endpoint_for is None:
            return  # (no HTTP listener)
        endpoint = self._endpoint_for(served.dispatcher, served.config.path, served.authenticator)
        self._endpoints[served.config.name] = endpoint
        self._host.mount(served.config.path, endpoint)

    def _unmount(self, served: Served) -> None:
        endpoint = self._endpoints.pop(served.config.name, None)
        if endpoint is not None and self._host is not None:
            self._host.unmount(served.config.path, endpoint)
            endpoint.closing()
            endpoint.close()

    def apply(
        self, config: Config, pool: Mapping[str, Backend]
    ) -> tuple[list[str], list[str], list[str]]:
        """A reload, after the merged server's (whose catalogs these share): servers added,
        changed and removed, by name. A changed server is reconfigured in place: its clients,
        legacy sessions and listens stay, unless its path or token rules changed (then its
        endpoint is made anew)."""
        added: list[str] = []
        changed: list[str] = []
        wanted = {s.name: s for s in config.servers}
        removed = [name for name in self.served if name not in wanted]
        for name in removed:
            gone = self.served.pop(name)
            self._unmount(gone)
            gone.dispatcher.leave()
            if gone.budgeting is not None:
                gone.budgeting.cancel()
            self._budget.forget(name)
            if self._leader is not None:
                gone.dispatcher.subscriptions.unfollow(self._leader)
            self._retire(gone)
        for name, server in wanted.items():
            served = self.served.get(name)
            if served is None:
                added.append(name)
                self.served[name] = served = self._make(config, server, pool)
                self._mount(served)
                continue
            reconfigure(served.dispatcher, config, server, self._main, pool, self._telemetry)
            if served.config == server:
                continue
            changed.append(name)
            remount = (served.config.path, served.config.auth) != (server.path, server.auth)
            if remount:
                self._unmount(served)
                self._retire(served)
                served.authenticator = authenticator(config, server)
            served.config = server
            if remount:
                self._mount(served)
        return added, changed, removed

    def _retire(self, served: Served) -> None:
        if served.authenticator is not None:
            self._closing.append(served.authenticator)

    def drain(self) -> None:
        """Shutdown: their open listens end too."""
        for dispatcher in self.dispatchers:
            dispatcher.close_streams()

    def closing(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.closing()

    def close(self) -> None:
        for endpoint in self._endpoints.values():
            endpoint.close()

    async def aclose(self) -> None:
        """The authenticators' connections (to the authorization server)."""
        for found in [s.authenticator for s in self.served.values()] + self._closing:
            if found is not None:
                await found.close()
        self._closing.clear()
