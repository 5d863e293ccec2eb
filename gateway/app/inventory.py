"""What each virtual server would show (`check-config --catalogs`): the backends started as
`run` starts them, but with no front end, their catalogs loaded once, and each server's items
counted from its route table, per backend."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import anyio

from gateway.app.gateway import Gateway
from gateway.config import Config
from gateway.routing.table import RouteTable

# server -> backend -> list ("tools", "prompts", "resources", "templates") -> items.
Counts = dict[str, dict[str, dict[str, int]]]


def table_counts(table: RouteTable) -> dict[str, dict[str, int]]:
    """Per backend, the items a route table offers clients, list by list."""
    out: dict[str, dict[str, int]] = {}
    for kind, routes in (
        ("tools", table.tools),
        ("prompts", table.prompts),
        ("resources", table.resources),
    ):
        for backend, n in Counter(r.backend for r in routes.values()).items():
            out.setdefault(backend, {})[kind] = n
    for backend, patterns in table.backend_templates.items():
        if patterns:
            out.setdefault(backend, {})["templates"] = len(patterns)
    return out


async def inventory(config: Config, within: float) -> Counts:
    """Start the backends (no listener, no cluster, no recording), wait up to `within` seconds
    for their catalogs, and count each virtual server's items; a backend whose catalog did not
    load counts nothing."""
    quiet = replace(
        config,
        listen=replace(config.listen, http=None, admin=None, stdio=True),
        cluster=None,
        auth=None,
        tap=None,
        audit=None,
    )
    async with Gateway(quiet) as gw:
        with anyio.move_on_after(within):
            await gw.catalogs_loaded.wait()
        return {
            name: table_counts(served.dispatcher.catalogs.table)
            for name, served in gw.servers.served.items()
        }
