"""What the gateway knows of each backend: its discovery result and its lists, and the route
table built from them. Refreshed when stale (the backend's `ttlMs`) and rebuilt after each load.
A list the backend's own hints let any caller be shown (every page public, with a positive
`ttlMs`) is a `Shared` one: while fresh, a merged list's first page takes it from here rather
than asking the backend (core/fanout.py; server/utilities/caching).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel

from gateway import errors
from gateway.backends.base import GATEWAY_CALL, Backend, Call
from gateway.config.model import DEFAULT_FAN_OUT_START_WAIT
from gateway.core.pinning import Pinning
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.routing import names
from gateway.routing import table as routes
from gateway.routing.merge import LIST_CAPABILITY, LIST_KEYS
from gateway.routing.names import Naming
from gateway.routing.table import CatalogData, Exposure, RouteTable

log = logging.getLogger("gateway.catalog")

# A catalog without a positive ttlMs still counts as fresh this long, so a burst of unknown
# names cannot make the gateway refetch a backend's lists for every request.
MIN_REFRESH_INTERVAL = 1.0
# Pages followed per list when loading a catalog; a backend paginating forever is cut off.
MAX_PAGES = 100
# Bound on one catalog load, so a hung backend delays nothing else for long.
LOAD_TIMEOUT = 15.0
# A catalog whose load failed is loaded again in the background, first after this long,
# doubling to the ceiling: its state (`problem`, /readyz) follows the backend's without a
# client's request having to find out, at next to no cost while it stays broken.
FIRST_RELOAD = 1.0
MAX_RELOAD = 60.0


async def _ignore(_: Message) -> None:
    return None


@dataclass(frozen=True)
class Shared:
    """One of a backend's lists as its catalog holds it, which any caller may be shown until
    `until` (anyio's clock): its last load's every page was complete, public and had a positive
    ttlMs, and the earliest of them to go stale does so then."""

    items: tuple[dict[str, Any], ...]
    until: float
    # The first page's result without its items and cursor: a lone backend's own fields.
    base: dict[str, Any]


@dataclass
class _Entry:
    """One backend's catalog; shared by every virtual server's `Catalogs` that offers it."""

    backend: Backend
    data: CatalogData = field(default_factory=CatalogData)
    discover: dict[str, Any] | None = None
    fetched_at: float = -math.inf
    ttl: float = 0.0
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # Why its last load failed (None: loaded, or not tried yet), and how many in a row did.
    problem: str | None = None
    failures: int = 0
    reloading: bool = False  # a background reload is scheduled
    settled: bool = False  # a load has ended (loaded or failed): the backend is past its start
    began: float | None = None  # when its first load began (or a list first asked after it)
    loaded_once: bool = False  # a load has succeeded
    # Its lists that may be shown to any caller (by LIST_KEYS' keys), as its last load found
    # them; emptied by a list change, a restart, a failed load. `generation` counts those, so a
    # load that overlapped one does not hand out what it read before it.
    shared: dict[str, Shared] = field(default_factory=dict)
    generation: int = 0
    # Pinned (core/pinning.py): the lists as the backend sent them; `data` is what is served.
    sent: CatalogData | None = None

    def fresh(self, now: float) -> bool:
        return now < self.fetched_at + max(self.ttl, MIN_REFRESH_INTERVAL)


class Catalogs:
    def __init__(
        self,
        backends: Sequence[Backend],
        exposures: Sequence[Exposure],
        naming: Naming,
        client_info: dict[str, Any],
        start_wait: float = DEFAULT_FAN_OUT_START_WAIT,
        shared: Catalogs | None = None,
    ) -> None:
        """`shared`: the catalogs of the whole merged server, whose loads a virtual server's
        catalogs share (one load per backend, whatever the number of servers offering it):
        its entries are theirs, and each load rebuilds the route table of every one."""
        self.naming = naming
        self.start_wait = start_wait
        # Told of a backend's first successful load when merged lists went without it until
        # then (a failed first load, or past start_wait): core/listen.py tells open listens.
        self.on_late_arrival: list[Callable[[str], None]] = []
        # Told after each rebuild of the route table (a server's tool search reindexes then).
        self.on_rebuilt: list[Callable[[], None]] = []
        # Told of a backend whose served lists changed with no word from it (new pins): listens
        # tell their clients, as for a late arrival.
        self.on_pins_changed: list[Callable[[str], None]] = []
        self._root: Catalogs = self if shared is None else shared._root
        self._members: list[Catalogs] = [self] if shared is None else self._root._members
        if shared is not None:
            self._members.append(self)
        self._exposures = tuple(exposures)
        self._exposure_of = {e.backend: e for e in exposures}
        self._entries = self._take(backends, exposures, {})
        self._client_info = client_info
        self.table: RouteTable = routes.build(naming, exposures, self._data())
        self.refreshes: dict[str, int] = (
            dict.fromkeys(self._entries, 0) if shared is None else self._root.refreshes
        )
        # List requests whose part for a backend was its `Shared` list, every server's counted
        # together (core/fanout.py counts them).
        self.from_catalog: dict[str, int] = (
            dict.fromkeys(self._entries, 0) if shared is None else self._root.from_catalog
        )
        # Starts a task in the gateway's task group (set by the composition root): a lookup's
        # refreshes then run on their own, and the lookup waits only until its name routes.
        self.spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], object] | None = None
        self._refreshing: dict[str, anyio.Event] = {}  # a background refresh -> its end
        self._again: set[str] = set()  # lists changed during their background refresh
        self._changed = anyio.Event()  # set (and replaced) when the table or a refresh changes
        self._pinning: Pinning | None = None  # (the merged server's: `pinning`)

    def reconfigure(
        self, backends: Sequence[Backend], exposures: Sequence[Exposure], naming: Naming
    ) -> list[str]:
        """A reloaded config: a backend kept as it was (the same object) keeps its catalog, the
        others start with none; the table is rebuilt at once, so lists and calls see the new
        set. Returns the backends whose catalogs are to be loaded."""
        old = self._entries
        entries = self._entries = self._take(backends, exposures, old)
        self.naming = naming
        self._exposures = tuple(exposures)
        self._exposure_of = {e.backend: e for e in exposures}
        if self._root is self:
            self.refreshes = {name: self.refreshes.get(name, 0) for name in entries}
            self.from_catalog = {name: self.from_catalog.get(name, 0) for name in entries}
        else:
            self.refreshes = self._root.refreshes
            self.from_catalog = self._root.from_catalog
        self.table = routes.build(naming, self._exposures, self._data())
        self._notify()
        for hook in self.on_rebuilt:
            hook()
        if self._root is not self:
            return []  # (the merged server's catalogs load what is new)
        return [name for name, entry in entries.items() if old.get(name) is not entry]

    def _take(
        self, backends: Sequence[Backend], exposures: Sequence[Exposure], old: dict[str, _Entry]
    ) -> dict[str, _Entry]:
        """The entries of these backends: a virtual server's are the merged server's (which
        is reconfigured first); the merged server's are kept for a backend kept as it was
        (the same object), else new."""
        if self._root is not self:
            return {e.backend: self._root._entries[e.backend] for e in exposures}
        entries: dict[str, _Entry] = {}
        for backend, exposure in zip(backends, exposures, strict=True):
            entry = old.get(exposure.backend)
            if entry is None or entry.backend is not backend:
                entry = _Entry(backend)
            entries[exposure.backend] = entry
        return entries

    def leave(self) -> None:
        """A virtual server removed by a reload: its table is no longer rebuilt by loads."""
        if self._root is not self and self in self._members:
            self._members.remove(self)

    @property
    def pinning(self) -> Pinning | None:
        """`pins:` (core/pinning.py), the merged server's for every server; None: off."""
        return self._root._pinning

    @pinning.setter
    def pinning(self, pinning: Pinning | None) -> None:
        self._root._pinning = pinning

    @property
    def client_info(self) -> dict[str, Any]:
        """The gateway's `clientInfo` on requests of its own."""
        return self._client_info

    def capabilities(self, backend: str) -> Mapping[str, Any] | None:
        entry = self._entries.get(backend)  # (None: a reload removed it meanwhile)
        found = entry.discover if entry is not None else None
        caps = found.get("capabilities") if found else None
        return caps if isinstance(caps, dict) else None

    def data(self, backend: str) -> CatalogData | None:
        """What the backend lists, once its catalog has been loaded (None before)."""
        entry = self._entries.get(backend)
        return entry.data if entry is not None and entry.discover is not None else None

    def shared_list(self, backend: str, key: str, now: float) -> Shared | None:
        """The backend's list `key` (LIST_KEYS' keys) if its own hints let any caller be shown
        it from here at `now`, else None. One gone stale by them is loaded again in the
        background, as after a list change (and asked of the backend until then)."""
        entry = self._entries.get(backend)
        found = entry.shared.get(key) if entry is not None else None
        if found is None:
            return None
        if now < found.until:
            return found
        self.list_changed(backend)
        return None

    def sources(self) -> list[tuple[Exposure, CatalogData | None]]:
        """Each backend's exposure and catalog (None before its first load), in config order:
        what the merged lists are made of (core/budget.py estimates what they cost)."""
        return [(exposure, self.data(exposure.backend)) for exposure in self._exposures]

    def problem(self, backend: str) -> str | None:
        """Why the backend's last catalog load failed; None once one has succeeded (and before
        the first has ended)."""
        entry = self._entries.get(backend)
        return entry.problem if entry is not None else None

    def starting(self, backend: str) -> bool:
        """Whether the backend's first catalog load is still under way (bounded by
        LOAD_TIMEOUT): a merged list waits for a backend that is starting, not for one whose
        load has ended, however it ended."""
        entry = self._entries.get(backend)
        return entry is not None and not entry.settled

    def start_left(self, backend: str) -> float:
        """How much longer a merged list waits for the backend's first catalog: the rest of
        `start_wait` since its first load began while that load is under way, else 0 (a
        backend past its start, however it ended, or starting for longer, is not waited for)."""
        entry = self._entries.get(backend)
        if entry is None or entry.settled:
            return 0.0
        now = anyio.current_time()
        if entry.began is None:
            entry.began = now
        return max(0.0, entry.began + self.start_wait - now)

    @property
    def changed(self) -> anyio.Event:
        """Set when the table changes or a load ends (a new event after each)."""
        return self._changed

    def owners(self, visible: str) -> list[str]:
        """The backends a client-visible name or URI can belong to: with prefixed names, the
        ones whose namespace it begins with (however it was shortened, the prefix stays);
        otherwise any."""
        if not self.naming.prefixed:
            return list(self._entries)
        split = names.split_client_uri(visible)
        return [
            name
            for name, exposure in self._exposure_of.items()
            if (
                exposure.namespace == split[0]
                if split
                else visible.startswith(names.client_prefix(self.naming, exposure.namespace))
            )
        ]

    def has_capability(self, backend: str, capability: str) -> bool:
        """Whether to ask a backend for a list; unknown capabilities count as present."""
        caps = self.capabilities(backend)
        return caps is None or capability in caps

    async def load_all(self) -> None:
        async with anyio.create_task_group() as tg:
            for name in self._entries:
                tg.start_soon(self.refresh, name)

    async def refresh_stale(
        self,
        found: Callable[[RouteTable], bool] | None = None,
        only: Sequence[str] | None = None,
        during: Call = GATEWAY_CALL,
    ) -> None:
        """Refresh every stale catalog (of `only`, if given); with `found`, return as soon as
        the table satisfies it, so a lookup of a ready backend's name does not wait for a slow
        backend's catalog. `during`: the client request whose miss asked for it (its trace
        shows the loads), if any."""
        now = anyio.current_time()
        stale = [
            name
            for name, entry in self._entries.items()
            if not entry.fresh(now) and (only is None or name in only)
        ]
        if self.spawn is None or found is None:
            async with anyio.create_task_group() as tg:
                for name in stale:
                    tg.start_soon(self.refresh, name, during)
            return
        ends = [self._refresh_in_background(name, during) for name in stale]
        while not found(self.table) and not all(end.is_set() for end in ends):
            await self._changed.wait()

    def _refresh_in_background(self, backend: str, during: Call) -> anyio.Event:
        end = self._refreshing.get(backend)
        if end is not None:
            return end
        end = self._refreshing[backend] = anyio.Event()

        async def run() -> None:
            try:
                await self.refresh(backend, during)
                while backend in self._again:  # (changed while it loaded: once more)
                    self._again.discard(backend)
                    self.invalidate(backend)
                    await self.refresh(backend)
            finally:
                del self._refreshing[backend]
                end.set()
                self._notify()

        assert self.spawn is not None
        self.spawn(run)
        return end

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def list_changed(self, backend: str) -> anyio.Event | None:
        """The backend said one of its lists changed: its catalog is stale, and loaded again
        in the background (the route table and what follows it, core/budget.py and tool
        search's index, need not wait for a miss); more changes during that load make one more
        load, not one each. The one place a list change reloads a catalog (a relay, a listen,
        a cluster notice all come here). For a pinned backend, the load's end: a listen tells
        its client of the change once the new definitions are judged (core/pinning.py)."""
        self.invalidate(backend)
        if self.spawn is None:
            return None
        if backend in self._refreshing:
            self._again.add(backend)
            end = self._refreshing[backend]
        else:
            end = self._refresh_in_background(backend, GATEWAY_CALL)
        pinning = self._root._pinning
        return end if pinning is not None and pinning.covers(backend) else None

    def repin(self) -> None:
        """New pins: every pinned backend's lists judged again (as last loaded), the route
        tables rebuilt, and listens told of the backends whose served lists changed."""
        root = self._root
        pinning = root._pinning
        if pinning is None:
            return
        changed: list[str] = []
        for name, entry in root._entries.items():
            if entry.sent is None or not pinning.covers(name):
                continue
            before = entry.data
            entry.data = pinning.judge(name, entry.sent)
            _unshare(entry)  # (what it held was judged against the old pins)
            if entry.data != before:
                changed.append(name)
        for member in root._members:
            member.rebuild()
            for name in changed:
                if name in member._entries:
                    for hook in member.on_pins_changed:
                        hook(name)

    def invalidate(self, backend: str) -> None:
        entry = self._entries.get(backend)  # (None: a reload removed it)
        if entry is not None:
            entry.fetched_at = -math.inf
            _unshare(entry)

    async def refresh(self, backend: str, during: Call = GATEWAY_CALL) -> None:
        """Load a backend's catalog again, as the gateway's own requests even when a client's
        miss (`during`) started it: a backend with a child per client serves them from a child
        of their own (backends/isolated.py); they show in that client request's trace."""
        call = during if during is GATEWAY_CALL else during.as_gateway()
        entry = self._entries.get(backend)
        if entry is None:
            return  # a reload removed it
        if entry.began is None:
            entry.began = anyio.current_time()
        async with entry.lock:
            if entry.fresh(anyio.current_time()) or self._entries.get(backend) is not entry:
                return  # another task refreshed it while this one waited, or a reload left it
            root = self._root
            root.refreshes[backend] = root.refreshes.get(backend, 0) + 1
            problem: str | None = None
            with anyio.move_on_after(LOAD_TIMEOUT) as scope:
                try:
                    await self._load(entry, call)
                except errors.BackendError as exc:
                    problem = str(exc).removeprefix(f"backend {backend!r}: ")
                    # A backend that is down was logged as such; any other failure once, when
                    # it begins (the background reloads repeat it).
                    quiet = isinstance(exc, errors.BackendDown) or entry.problem is not None
                    log.log(
                        logging.DEBUG if quiet else logging.WARNING,
                        "catalog of %s not loaded: %s",
                        backend,
                        exc,
                    )
            if scope.cancelled_caught:
                problem = f"no catalog within {LOAD_TIMEOUT:g}s"
                log.warning("catalog of %s not loaded within %ss", backend, LOAD_TIMEOUT)
            self._loaded(backend, entry, problem)
            # Failed loads count too: the next attempt waits out the refresh interval.
            entry.fetched_at = max(entry.fetched_at, anyio.current_time() - entry.ttl)
            for i, member in enumerate(self._sharing(backend, entry)):
                if i:  # (each server's table is a stretch of its own: requests go between)
                    await anyio.lowlevel.checkpoint()
                member.rebuild()

    def _sharing(self, backend: str, entry: _Entry) -> list[Catalogs]:
        """Every server's catalogs that offer the backend's entry (this one among them)."""
        return [m for m in self._members if m._entries.get(backend) is entry]

    def rebuild(self) -> None:
        """The route table again, from the catalogs as they are now."""
        self.table = routes.build(self.naming, self._exposures, self._data())
        self._notify()
        for hook in self.on_rebuilt:
            hook()
        for collision in self.table.collisions:
            log.warning("%s", collision)
        for note in self.table.shortened:
            log.info("name shortened: %s", note)

    def _loaded(self, backend: str, entry: _Entry, problem: str | None) -> None:
        """Note how a load ended; a failed one is tried again in the background."""
        entry.settled = True
        if problem is None:
            if entry.problem is not None:
                log.info("catalog of %s loaded again", backend)
            # Lists went without it if an earlier load failed or it took past start_wait.
            late = entry.failures > 0 or (
                entry.began is not None and anyio.current_time() >= entry.began + self.start_wait
            )
            entry.problem, entry.failures = None, 0
            if not entry.loaded_once:
                entry.loaded_once = True
                if late:
                    for member in self._sharing(backend, entry):
                        for hook in member.on_late_arrival:
                            hook(backend)
            return
        entry.problem = problem
        entry.failures += 1
        _unshare(entry)  # (what it held may be what the backend no longer says)
        if self.spawn is None or entry.reloading:
            return
        entry.reloading = True
        delay = min(MAX_RELOAD, FIRST_RELOAD * 2.0 ** min(entry.failures - 1, 16))

        async def reload() -> None:
            try:
                await anyio.sleep(delay)
            finally:
                entry.reloading = False
            if self._entries.get(backend) is entry:
                self.invalidate(backend)
                await self.refresh(backend)

        self.spawn(reload)

    def _data(self) -> dict[str, CatalogData]:
        return {name: entry.data for name, entry in self._entries.items()}

    async def _load(self, entry: _Entry, call: Call) -> None:
        generation = entry.generation
        discover = await self._call(entry.backend, "server/discover", {}, call)
        result = discover.get("result")
        if not isinstance(result, dict):
            raise errors.BackendProtocolError(entry.backend.name, "server/discover failed")
        entry.discover = result
        found = result.get("capabilities")
        caps: dict[str, Any] = found if isinstance(found, dict) else {}
        lists: dict[str, tuple[dict[str, Any], ...]] = {}
        ttls = [result.get("ttlMs")]
        shared: dict[str, Shared] = {}
        for method, key in LIST_KEYS.items():
            if LIST_CAPABILITY[method] in caps:
                lists[key], ttl, found = await self._fetch_all(entry.backend, method, key, call)
                ttls.append(ttl)
                if found is not None:
                    shared[key] = found
        entry.data = CatalogData(
            tools=lists.get("tools", ()),
            prompts=lists.get("prompts", ()),
            resources=lists.get("resources", ()),
            templates=lists.get("resourceTemplates", ()),
        )
        pinning = self._root._pinning
        if pinning is not None and pinning.covers(entry.backend.name):
            entry.sent = entry.data
            entry.data = pinning.judge(entry.backend.name, entry.data)
            shared = _judged(shared, entry.data)
        else:
            entry.sent = None
        # (a list change, a restart during the load: what it read may be from before)
        entry.shared = shared if entry.generation == generation else {}
        entry.fetched_at = anyio.current_time()
        entry.ttl = min((t for t in ttls if isinstance(t, int) and t >= 0), default=0) / 1000
        log.info(
            "catalog of %s: %d tools, %d prompts, %d resources, %d templates",
            entry.backend.name,
            len(entry.data.tools),
            len(entry.data.prompts),
            len(entry.data.resources),
            len(entry.data.templates),
        )

    async def _fetch_all(
        self, backend: Backend, method: str, key: str, call: Call
    ) -> tuple[tuple[dict[str, Any], ...], object, Shared | None]:
        """Every page of one list: its items, the first page's ttlMs, and the list as any caller
        may be shown it (None: some page may not be, or a page failed or was cut off)."""
        items: list[dict[str, Any]] = []
        cursor: object = None
        ttl: object = None
        base: dict[str, Any] | None = None
        until = math.inf  # when the first of its pages goes stale (-inf: not to be shared)
        for _ in range(MAX_PAGES):
            params = {"cursor": cursor} if isinstance(cursor, str) else {}
            reply = await self._call(backend, method, params, call)
            result = reply.get("result")
            if not isinstance(result, dict):
                until = -math.inf
                break
            until = min(until, shared_until(result, anyio.current_time()))
            if base is None:
                base = {k: v for k, v in result.items() if k not in (key, "nextCursor")}
            ttl = result.get("ttlMs") if ttl is None else ttl
            items.extend(i for i in result.get(key, ()) if isinstance(i, dict))
            cursor = result.get("nextCursor")
            if not isinstance(cursor, str):
                break
        else:
            until = -math.inf  # (cut off at MAX_PAGES: not the whole list)
        listed = tuple(items)
        shared = Shared(listed, until, base) if base is not None and until > -math.inf else None
        return listed, ttl, shared

    async def _call(
        self, backend: Backend, method: str, params: dict[str, Any], call: Call
    ) -> Message:
        request = {
            "jsonrpc": "2.0",
            "id": f"gateway-{method}",
            "method": method,
            "params": {**params, "_meta": meta.gateway_meta(self._client_info)},
        }
        reply = await backend.request(request, _ignore, call)
        if "error" in reply:
            log.info(
                "catalog of %s: %s answered %s", backend.name, method, jsonrpc.error_code(reply)
            )
        return reply


def shared_until(result: dict[str, Any], received: float) -> float:
    """Until when a page received at `received` may be shown to any caller: a complete result,
    public, fresh for its positive ttlMs (server/utilities/caching); -inf for any other."""
    ttl = result.get("ttlMs")
    if (
        type(ttl) is not int
        or ttl <= 0
        or result.get("cacheScope") != "public"
        or result.get("resultType", "complete") != "complete"
    ):
        return -math.inf
    return received + ttl / 1000


def _judged(shared: dict[str, Shared], data: CatalogData) -> dict[str, Shared]:
    """The shareable lists without what pinning keeps from clients."""
    kept = {id(i) for i in (*data.tools, *data.prompts, *data.templates, *data.resources)}
    return {
        key: Shared(tuple(i for i in found.items if id(i) in kept), found.until, found.base)
        for key, found in shared.items()
    }


def _unshare(entry: _Entry) -> None:
    entry.shared = {}
    entry.generation += 1
