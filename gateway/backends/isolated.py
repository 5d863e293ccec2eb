"""A stdio backend with a child process per client (`isolation: per_session`), for servers that
keep state per client: each client gets a server of its own, as if it had started the command
itself.

Whose a request is (the key of its child) comes from its call's origin (`base.Call`):

- a request of a legacy client's session: that session (HTTP: one per `Mcp-Session-Id`; stdio:
  the process's one session). The child ends with the session (DELETE, expiry) or when idle;
- any other client request: its caller identity, `Origin.caller()` (the front end and a digest
  of the `Authorization` header), so anonymous modern callers of one front end share a child;
- the gateway's own requests (catalog loads at start-up and after changes, and requests made
  outside any client) and `server/discover`, whose answer is the server's, not a client's: one
  more child, the catalog child, which counts against no cap and is reaped when idle too.

Each child is what a shared backend is: a `StdioBackend` behind its own `EraBackend` (probe,
legacy handshake, held calls), started on its key's first request and stopped (stdin closed,
SIGTERM, SIGKILL) when its client has had no request in flight for `child_idle_timeout`. A
listen stream counts: a client listening is still there (a legacy session's watch is one, so
its child lasts until the session ends). Beyond `max_children` a new client is refused with
-31004 until a child ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc

from gateway.backends.base import Call, NotificationSink
from gateway.backends.era.layer import EraBackend
from gateway.backends.stdio import StdioBackend
from gateway.config import BackendConfig, StdioTarget
from gateway.errors import BackendError, BackendOverloaded, BackendUnavailable
from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats, Telemetry

log = logging.getLogger("gateway.backend")

# The key of the child that serves the gateway's own requests.
CATALOG = "catalog"


@dataclass(eq=False)
class _Child:
    number: int
    kind: str  # whose it is, for the log (never the key: a session's key is not for logs)
    stdio: StdioBackend
    era: EraBackend
    ended: asyncio.Event | None  # the end of its legacy session
    last_used: float
    busy: int = 0  # requests in flight, listen streams included
    # anyio scopes, not task.cancel(): the child's StdioBackend stops its process in a shielded
    # scope, which only anyio's cancellation respects.
    runner: anyio.CancelScope = field(default_factory=anyio.CancelScope, repr=False)
    reaper: anyio.CancelScope = field(default_factory=anyio.CancelScope, repr=False)


class IsolatedBackend:
    """A `Backend` (backends/base.py) made of children; see the module docstring."""

    transport = "stdio"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, StdioTarget)
        self.name = config.name
        self._config = config
        self._stats = stats or Stats()
        self._idle = config.child_idle_timeout
        self._max = config.max_children
        self._children: dict[str, _Child] = {}
        self._numbers = itertools.count(1)
        self._tg: anyio.abc.TaskGroup | None = None
        self._running = asyncio.Event()
        self._era: str | None = None if config.era == "auto" else config.era
        self._past_restarts = 0
        self._full = False  # the cap was reached (logged once until a child ends)
        # Receives the children's notifications that belong to no request (list changes).
        self.on_notification: Callable[[str, Message], None] | None = None
        # The traffic tap, when it is on (set by gateway/app/): handed to each child's transport.
        self.tap: Telemetry | None = None

    # --- what the composition root and the metrics read -----------------------------------------

    @property
    def up(self) -> bool:
        """Running, and some child is up or none is needed yet (each starts on demand)."""
        if self._tg is None:
            return False
        return not self._children or any(c.stdio.up for c in self._children.values())

    @property
    def children(self) -> int:
        return len(self._children)

    @property
    def restarts(self) -> int:
        return self._past_restarts + sum(c.stdio.restarts for c in self._children.values())

    @property
    def era(self) -> str | None:
        """The era the children speak, as the last of them to know it found."""
        for child in self._children.values():
            if child.era.era is not None:
                self._era = child.era.era
        return self._era

    def pids(self) -> list[int]:
        return [c.stdio.pid for c in self._children.values() if c.stdio.pid is not None]

    def running_pids(self) -> tuple[int, ...]:
        """Its running children's pids (for /metrics, as StdioBackend.running_pids)."""
        return tuple(pid for c in self._children.values() for pid in c.stdio.running_pids())

    # --- the Backend protocol --------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self._running.set()
                await anyio.sleep_forever()
        finally:
            self._tg = None
            self._running.clear()
            self._children.clear()

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        if self._tg is None:
            with anyio.move_on_after(self._config.connect_timeout):
                await self._running.wait()
        child = self._child(msg, call.origin)
        loop = asyncio.get_running_loop()
        child.busy += 1
        try:
            return await child.era.request(msg, sink, call, long_lived=long_lived)
        finally:
            child.busy -= 1
            child.last_used = loop.time()

    async def notify(self, msg: Message) -> None:
        """To the child of the notification's client, if it has one (none is started for it):
        a client's notification comes with no origin, so the catalog child's."""
        key, _, _ = _key(msg, None)
        child = self._children.get(key)
        if child is None:
            log.debug("backend %s: %s for no running child, dropped", self.name, msg["method"])
            return
        await child.era.notify(msg)

    # --- children ----------------------------------------------------------------------------

    def _child(self, msg: Message, origin: Origin) -> _Child:
        """The child of the request's key, started if it has none. Synchronous, so that the
        reaper never stops a child between its lookup here and the caller's `busy` count."""
        key, ended, kind = _key(msg, origin)
        child = self._children.get(key)
        if child is not None:
            return child
        if ended is not None and ended.is_set():
            # What a session started may still be winding down (its watch): no child for it.
            raise BackendUnavailable(self.name, "the client's session has ended")
        tg = self._tg
        if tg is None:
            raise BackendUnavailable(self.name, "not running")
        clients = len(self._children) - (CATALOG in self._children)
        if key != CATALOG and clients >= self._max:
            if not self._full:
                self._full = True
                log.warning(
                    "backend %s: %d children running (max_children); new clients are refused",
                    self.name,
                    clients,
                )
            raise BackendOverloaded(
                self.name,
                f"{clients} clients have a child of their own, the most allowed (max_children);"
                " try again later",
            )
        stdio = StdioBackend(self._config, self._stats)
        stdio.tap = self.tap
        # A legacy session's child is opened in the legacy era where the server speaks it.
        era = EraBackend(stdio, self._config, legacy_first=ended is not None)
        era.on_notification = self._relay
        child = _Child(
            next(self._numbers), kind, stdio, era, ended, asyncio.get_running_loop().time()
        )
        self._children[key] = child
        tg.start_soon(self._run, key, child, name=f"{self.name} child {child.number}")
        tg.start_soon(self._reap, key, child, name=f"{self.name} reaper {child.number}")
        log.info(
            "backend %s: child %d started for %s (%d running)",
            self.name,
            child.number,
            kind,
            len(self._children),
        )
        return child

    async def _run(self, key: str, child: _Child) -> None:
        with child.runner:
            try:
                await child.era.run()
            except Exception:  # one child's failure must not take the others down with it
                log.exception("backend %s: child %d failed", self.name, child.number)
                self._forget(key, child)
                child.reaper.cancel()

    async def _reap(self, key: str, child: _Child) -> None:
        with child.reaper:
            why = await self._until_unused(child)
            self._retire(key, child, why)
            # A child is stopped once it has started: cancelled while being spawned, its
            # process would be left running.
            with contextlib.suppress(BackendError):
                await child.stdio.ready()
            child.runner.cancel()  # its StdioBackend closes stdin, then SIGTERM, then SIGKILL

    def _retire(self, key: str, child: _Child, why: str) -> None:
        self._forget(key, child)
        log.info(
            "backend %s: child %d stopped: %s (%d running)",
            self.name,
            child.number,
            why,
            len(self._children),
        )

    async def _until_unused(self, child: _Child) -> str:
        loop = asyncio.get_running_loop()
        while True:
            if child.ended is not None and child.ended.is_set():
                return "its session ended"
            left = child.last_used + self._idle - loop.time()
            if child.busy == 0 and left <= 0:
                return f"idle for {self._idle:g}s"
            delay = left if child.busy == 0 and left > 0 else self._idle
            with anyio.move_on_after(delay):
                if child.ended is None:
                    await anyio.sleep_forever()
                else:
                    await child.ended.wait()

    def _forget(self, key: str, child: _Child) -> None:
        if self._children.get(key) is child:
            del self._children[key]
            self._past_restarts += child.stdio.restarts
            self._full = False

    def _relay(self, backend: str, note: Message) -> None:
        # Any child's list change makes the backend's catalog stale, as with one shared child.
        if self.on_notification is not None:
            self.on_notification(backend, note)


def _key(msg: Message, origin: Origin | None) -> tuple[str, asyncio.Event | None, str]:
    """Whose child serves `msg`, made for `origin` (None: for no client): its key, the end of
    its session (if any), and who it is for the log."""
    if origin is None or msg.get("method") == "server/discover":
        return CATALOG, None, "the gateway's own requests"
    if origin.session is not None:
        return f"session {origin.session.key}", origin.session.ended, "a legacy session"
    if origin.frontend == GATEWAY_ORIGIN.frontend:
        return CATALOG, None, "the gateway's own requests"
    return f"caller {origin.caller()}", None, f"a caller on {origin.frontend}"
