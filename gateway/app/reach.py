"""A start that needs its backends reached (`connect`, `expose`: one server each, nothing to
serve without it): the gateway waits for each backend's first outcome before it serves.

The gateway's listeners are taken and its backends started first (its HTTP requests are held
until then, and a command's log lines too: cli/startup.py). A backend's first catalog load
ending lets the start go on when it loaded; the backend going
down first (a child that exits or cannot be started, a URL that cannot be connected to) stops it
with `Unreachable` and the health's reason, and so does a load the backend refused (an error
reply, a login that cannot be had). Nothing else waits: the catalog load's own bound
(core/catalog.py LOAD_TIMEOUT) ends a backend that stays silent or a login still under way, and
that one is served as a config's backends are, retried in the background.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence

import anyio

from gateway.app.errors import Unreachable
from gateway.app.gateway import Gateway
from gateway.app.wiring import Wired
from gateway.core.catalog import LOAD_TIMEOUT, Catalogs


class MustReach(Gateway):
    """A gateway whose start ends once its backends were reached (`reachable`); one that was
    not is stopped again, and its `Unreachable` raised from the `async with` (not from within
    its body, which its task group would wrap)."""

    async def __aenter__(self) -> MustReach:
        await super().__aenter__()
        try:
            await reachable(self.wired, self.dispatcher.catalogs)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self


async def reachable(wired: Sequence[Wired], catalogs: Catalogs) -> None:
    """Until every backend's first catalog load has ended; `Unreachable` for the first one
    found down."""
    for backend in wired:
        name, health = backend.config.name, backend.health
        while catalogs.starting(name) and not health.down:
            await _either(health.changed, catalogs.changed.wait)
        if health.down:
            raise Unreachable(name, health.reason or "down")
        problem = catalogs.problem(name)
        if problem is None or problem == LATE:
            continue
        # (a child per client is down behind its catalog child, whose refusal says so)
        if (down := _DOWN.match(problem)) is not None:
            raise Unreachable(name, down["reason"])
        raise Unreachable(name, problem, answered=True)


# How a first load that ran out of time is told (core/catalog.py): a backend slow to start, or
# a login under way, which is served and retried, not a failure.
LATE = f"no catalog within {LOAD_TIMEOUT:g}s"
# A down backend's refusal (backends/health.py `Health.refusal`): its reason inside.
_DOWN = re.compile(r"^down \((?P<reason>.*)\); retrying in the background$")


async def _either(*waits: Callable[[], Awaitable[object]]) -> None:
    """Until the first of `waits` returns."""
    async with anyio.create_task_group() as tg:

        async def first(wait: Callable[[], Awaitable[object]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in waits:
            tg.start_soon(first, wait)
