"""Each server's context budget: how many items its lists hold and what showing them costs a
model in tokens (routing/budget.py), per kind and per backend. Kept current as catalogs load,
change and are reconfigured, computed in passes in a worker thread (core/passes.py: a 1,000-tool
catalog takes ~10 ms, and the event loop has its turn after each pass of 64 items), never on a
request's path; the metrics and the status page read what was computed last.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import anyio

from gateway.config.virtual import MERGED_SERVER
from gateway.core import passes
from gateway.routing.budget import KINDS, Cost, cost_passes
from gateway.routing.names import Naming
from gateway.routing.table import CatalogData, Exposure

log = logging.getLogger("gateway.budget")

# The name the whole merged server (`/mcp`, stdio) goes by in the metrics and on the status page
# (no virtual server may take it: config/servers.py).
DEFAULT_SERVER = MERGED_SERVER

# A backend's exposure and its catalog (None: not loaded yet), as one server shows it.
Source = tuple[Exposure, CatalogData | None]


class Listed(Protocol):
    """What one server's lists are made of: `Catalogs` (core/catalog.py) for the merged
    server, or a virtual server's view over the same catalogs."""

    @property
    def changed(self) -> anyio.Event: ...  # set (and replaced) at each change

    @property
    def naming(self) -> Naming: ...

    def sources(self) -> Sequence[Source]: ...


@dataclass(frozen=True)
class _Known:
    """One backend's costs and what they were computed from (to know when they are stale)."""

    naming: Naming
    exposure: Exposure
    data: CatalogData
    costs: Mapping[str, Cost]

    def of(self, naming: Naming, exposure: Exposure, data: CatalogData) -> bool:
        return self.data is data and self.exposure is exposure and self.naming == naming


class Budget:
    """The costs of every server the gateway serves, by server name."""

    def __init__(self) -> None:
        self._servers: dict[str, dict[str, _Known]] = {}
        self._changed = anyio.Event()

    @property
    def changed(self) -> anyio.Event:
        """Set when an update changed what is known (a new event after each)."""
        return self._changed

    def servers(self) -> list[str]:
        return list(self._servers)

    def backends(self, server: str) -> dict[str, Mapping[str, Cost]]:
        """Each loaded backend's part of the server's lists, by kind."""
        return {name: known.costs for name, known in self._servers.get(server, {}).items()}

    def costs(self, server: str) -> dict[str, Cost]:
        """The server's lists, by kind: every kind, 0 where nothing is loaded."""
        out = dict.fromkeys(KINDS, Cost())
        for known in self._servers.get(server, {}).values():
            for kind, cost in known.costs.items():
                out[kind] += cost
        return out

    def tokens(self, server: str) -> int:
        """What all of the server's lists cost a model together."""
        return sum(cost.tokens for cost in self.costs(server).values())

    def rows(self) -> list[tuple[str, str, Cost]]:
        """(server, kind, cost) of every server, for the metrics."""
        return [(s, kind, cost) for s in self._servers for kind, cost in self.costs(s).items()]

    def forget(self, server: str) -> None:
        """A server no longer served (a reload removed it)."""
        if self._servers.pop(server, None) is not None:
            self._notify()

    async def update(self, server: str, naming: Naming, sources: Sequence[Source]) -> None:
        """Estimate what changed since the last update of `server`: a backend's catalog loaded
        again, its exposure or the naming reconfigured; the rest is kept."""
        known = self._servers.get(server, {})
        stale = [
            (exposure, data)
            for exposure, data in sources
            if data is not None
            and ((k := known.get(exposure.backend)) is None or not k.of(naming, exposure, data))
        ]
        fresh = await passes.run(_estimate(naming, stale)) if stale else {}
        loaded = [e.backend for e, d in sources if d is not None]
        kept = {name: fresh.get(name) or known[name] for name in loaded}
        if stale or kept.keys() != known.keys():
            self._servers[server] = kept
            self._notify()

    async def follow(self, server: str, catalogs: Listed) -> None:
        """Keep `server`'s costs current with `catalogs` until cancelled (a task of the
        gateway's): after each load, list change and reload."""
        while True:
            changed = catalogs.changed  # (taken first: a change during the update is not missed)
            try:
                await self.update(server, catalogs.naming, catalogs.sources())
            except Exception as exc:  # (a figure for operators: never worth the gateway)
                log.warning("context budget of %s not estimated: %r", server, exc)
            await changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()


def _estimate(
    naming: Naming, stale: Sequence[tuple[Exposure, CatalogData]]
) -> Generator[None, None, dict[str, _Known]]:
    out = {}
    for exposure, data in stale:
        costs = yield from cost_passes(naming, exposure, data, passes.PER_PASS)
        out[exposure.backend] = _Known(naming, exposure, data, costs)
    return out
