"""What the gateway shows of itself: the backends' states for the metrics, the status page's
facts, the queues of its bounds, readiness. Each reads the wired backends and the dispatcher;
none changes anything."""

from __future__ import annotations

from gateway.app.wiring import Wired
from gateway.backends.http import HttpBackend
from gateway.backends.isolated import IsolatedBackend
from gateway.backends.sse import SseBackend
from gateway.backends.stdio import StdioBackend
from gateway.core.budget import Budget
from gateway.core.catalog import Catalogs
from gateway.core.dispatcher import Dispatcher
from gateway.core.overload import BACKEND, OVERALL
from gateway.telemetry.recorder import BackendState
from gateway.telemetry.status import BackendFacts, ServerFacts


def backend_states(wired: list[Wired], dispatcher: Dispatcher) -> list[BackendState]:
    return [backend_state(w, dispatcher) for w in wired]


def backend_state(w: Wired, dispatcher: Dispatcher) -> BackendState:
    t = w.transport
    return BackendState(
        name=t.name,
        up=w.guarded.up,
        restarts=t.restarts if isinstance(t, StdioBackend | SseBackend | IsolatedBackend) else 0,
        catalog_refreshes=dispatcher.catalogs.refreshes.get(t.name, 0),
        fanout_failures=dispatcher.fan_out_failures.get(t.name, 0),
        era=w.layer.era or "unknown",
        children=t.children if isinstance(t, IsolatedBackend) else None,
        pids=t.running_pids() if isinstance(t, StdioBackend | IsolatedBackend) else None,
        in_flight=w.bound.busy,
        pool=t.pool_connections() if isinstance(t, HttpBackend | SseBackend) else None,
        breaker=w.breaker.state if w.breaker is not None else None,
        breaker_opens=w.breaker.opens if w.breaker is not None else 0,
        replicas=t.replica_stats() if isinstance(t, HttpBackend) else None,
        lists_from_catalog=dispatcher.catalogs.from_catalog.get(t.name, 0),
    )


def backend_facts(wired: list[Wired], catalogs: Catalogs) -> list[BackendFacts]:
    """The status page's line per backend (/status.json)."""
    facts = []
    for w in wired:
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
    return facts


def catalog_rows(budget: Budget) -> list[tuple[str, str, int, int]]:
    """(server, kind, items, tokens) for the metrics."""
    return [(server, kind, cost.items, cost.tokens) for server, kind, cost in budget.rows()]


def server_facts(budget: Budget) -> list[ServerFacts]:
    """The status page's line per server: its lists and their estimated tokens."""
    return [
        ServerFacts(
            name=server,
            items={kind: cost.items for kind, cost in budget.costs(server).items()},
            tokens={kind: cost.tokens for kind, cost in budget.costs(server).items()},
            backend_tokens={
                name: sum(cost.tokens for cost in costs.values())
                for name, costs in budget.backends(server).items()
            },
        )
        for server in budget.servers()
    ]


def queued(wired: list[Wired], dispatcher: Dispatcher) -> list[tuple[str, str, int]]:
    """Every bound's queue, the empty ones too: a gauge that is there at 0 can be graphed
    and alerted on before the first overload."""
    out = [(OVERALL, "", dispatcher.bound.queued)] if dispatcher.bound else []
    return out + [(BACKEND, w.config.name, w.bound.queued) for w in wired]


def backends_up(wired: list[Wired], dispatcher: Dispatcher) -> dict[str, bool]:
    """Reachable, and its catalog loaded last time it was tried: a backend that accepts
    connections yet answers nothing usable (HTTP 500 to everything, a redirect, silence)
    is not ready either."""
    problem = dispatcher.catalogs.problem
    return {w.guarded.name: w.guarded.up and problem(w.guarded.name) is None for w in wired}
