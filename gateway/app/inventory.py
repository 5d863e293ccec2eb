"""`check-config --catalog`: start a config's backends with no front end, load their catalogs,
say what each server's lists hold and cost a model (core/budget.py), and stop them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import anyio
from opentelemetry import trace

from gateway.app.gateway import Gateway
from gateway.config import Config, Listen
from gateway.core.budget import DEFAULT_SERVER
from gateway.core.catalog import LOAD_TIMEOUT
from gateway.routing.budget import KINDS, Cost

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
    """The config with nothing but its backends: no listener, tap, audit, access log, span
    export or Redis (an inventory is no traffic of anyone's, and shares nothing)."""
    telemetry = replace(config.telemetry, access_log=None, otlp_endpoint=None)
    cluster = replace(config.cluster, redis=None) if config.cluster is not None else None
    return replace(
        config, listen=Listen(), tap=None, audit=None, telemetry=telemetry, cluster=cluster
    )


async def inventory(config: Config) -> list[ServerCatalog]:
    """Each server's catalog as `run` would load it, the backends stopped again."""
    with anyio.fail_after(LOAD_TIMEOUT + SLACK):
        async with Gateway(quiet(config), tracing=trace.NoOpTracerProvider()) as gateway:
            await gateway.catalogs_loaded.wait()
            catalogs, budget = gateway.dispatcher.catalogs, gateway.budget
            await budget.update(DEFAULT_SERVER, catalogs.naming, catalogs.sources())
            known = budget.backends(DEFAULT_SERVER)
            backends = tuple(
                BackendCatalog(b.name, known.get(b.name), catalogs.problem(b.name))
                for b in config.backends
            )
            return [ServerCatalog(DEFAULT_SERVER, budget.costs(DEFAULT_SERVER), backends)]


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
