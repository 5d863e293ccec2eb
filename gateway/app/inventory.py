"""`check-config --catalogs`: start a config's backends with no front end, load their catalogs
once, say what each server (the merged one, then each virtual server) lists and what that costs
a model (core/budget.py), backend by backend, and stop them again. The same for `pins`: the
pinned backends' definitions as they list them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio

from gateway.app.gateway import Gateway
from gateway.config import Config, Listen
from gateway.core import pins
from gateway.core.budget import DEFAULT_SERVER, Budget
from gateway.core.catalog import LOAD_TIMEOUT, Catalogs
from gateway.routing.budget import KINDS, Cost
from gateway.routing.table import CatalogData

# Past the loads' own bound (LOAD_TIMEOUT each, all at once): the backends' start and stop.
SLACK = 10.0


@dataclass(frozen=True)
class BackendCatalog:
    name: str
    costs: Mapping[str, Cost] | None  # by kind; None: its catalog did not load
    problem: str | None = None  # why not


@dataclass(frozen=True)
class ServerCatalog:
    name: str
    costs: Mapping[str, Cost]  # by kind, of the backends whose catalog loaded
    backends: tuple[BackendCatalog, ...]

    @property
    def complete(self) -> bool:
        return all(b.costs is not None for b in self.backends)


def quiet(config: Config) -> Config:
    """The config with nothing but its backends and servers: no listener, tap, audit, access
    log, span export or Redis (an inventory is no traffic of anyone's, and shares nothing)."""
    telemetry = replace(config.telemetry, access_log=None, otlp_endpoint=None)
    cluster = replace(config.cluster, redis=None) if config.cluster is not None else None
    return replace(
        config, listen=Listen(), tap=None, audit=None, telemetry=telemetry, cluster=cluster
    )


async def server_catalog(
    budget: Budget, name: str, catalogs: Catalogs, backends: list[str]
) -> ServerCatalog:
    """One server's lists as its catalogs show them now, estimated at once."""
    await budget.update(name, catalogs.naming, catalogs.sources())
    known = budget.backends(name)
    parts = tuple(BackendCatalog(b, known.get(b), catalogs.problem(b)) for b in backends)
    return ServerCatalog(name, budget.costs(name), parts)


async def inventory(config: Config) -> list[ServerCatalog]:
    """Each server's catalog as `run` would load it (the merged server first, then the virtual
    servers in config order), the backends stopped again."""
    from opentelemetry import trace  # (no spans, whatever the config or environment says)

    with anyio.fail_after(LOAD_TIMEOUT + SLACK):
        async with Gateway(quiet(config), tracing=trace.NoOpTracerProvider()) as gateway:
            await gateway.catalogs_loaded.wait()
            budget, main = gateway.budget, gateway.dispatcher.catalogs
            names = [b.name for b in config.backends]
            found = [await server_catalog(budget, DEFAULT_SERVER, main, names)]
            for name, served in gateway.servers.served.items():
                names = [b.name for b in served.config.backends]
                found.append(await server_catalog(budget, name, served.dispatcher.catalogs, names))
            return found


def _counts(costs: Mapping[str, Cost]) -> str:
    tokens = sum(c.tokens for c in costs.values())
    items = ", ".join(f"{kind} {costs[kind].items}" for kind in KINDS)
    return f"{items}; about {tokens} tokens"


def describe_catalogs(servers: list[ServerCatalog]) -> str:
    """check-config's lines: per server its lists and their tokens (by kind), then per backend
    its part, or why its catalog did not load."""
    lines = ["catalogs (backends started, their lists loaded, stopped again):"]
    for server in servers:
        by_kind = ", ".join(f"{kind} {server.costs[kind].tokens}" for kind in KINDS)
        lines.append(f"  server {server.name}: {_counts(server.costs)} ({by_kind})")
        for b in server.backends:
            why = b.problem or "no catalog"
            what = _counts(b.costs) if b.costs is not None else f"not loaded: {why}"
            lines.append(f"    backend {b.name}: {what}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Definitions:
    """One backend's definitions as it lists them (pins' form), or why they are not known."""

    name: str
    found: pins.BackendPins | None
    problem: str | None = None


async def definitions(config: Config, only: Sequence[str] | None = None) -> list[Definitions]:
    """`pins record|diff|approve`: the pinned backends' definitions (of `only`, if given) as
    `run` would load them, unjudged by the pins, the backends stopped again."""
    from opentelemetry import trace  # (no spans, whatever the config or environment says)

    wanted = [
        b
        for b in config.backends
        if config.pin_mode(b) is not None and (only is None or b.name in only)
    ]
    plain = replace(quiet(config), backends=tuple(wanted), servers=(), pins=None)
    out: list[Definitions] = []
    with anyio.fail_after(LOAD_TIMEOUT + SLACK):
        async with Gateway(plain, tracing=trace.NoOpTracerProvider()) as gateway:
            await gateway.catalogs_loaded.wait()
            catalogs = gateway.dispatcher.catalogs
            for backend in wanted:
                data = catalogs.data(backend.name)
                if data is None or catalogs.problem(backend.name) is not None:
                    why = catalogs.problem(backend.name) or "no catalog"
                    out.append(Definitions(backend.name, None, why))
                    continue
                out.append(Definitions(backend.name, pins.current(_lists(data))))
    return out


def _lists(data: CatalogData) -> dict[str, tuple[dict[str, Any], ...]]:
    return {"tools": data.tools, "prompts": data.prompts, "resourceTemplates": data.templates}
