"""How both eras share one backend: the era follows the client where the server speaks both.

A modern backend is asked in the modern era. A legacy client's requests (marked by
frontends/legacy/front.py on their `Origin`) go to it in the legacy era instead when the server
speaks that too, because only a legacy connection carries the server's own requests during a
call (sampling, elicitation by `ctx.elicit`, roots); the held-call machinery (held.py) turns
those into `input_required`, which frontends/legacy/front.py puts to the client as requests of
its session.

A lane is a legacy session on the server: over HTTP one per legacy client session, opened on
that session's first request and ended (DELETE) with it; over stdio, where a child keeps the
era of its first request for life, one second child started on first use and shared by every
legacy client session (its questions go to the one request in flight, channel.py).

Whether the server speaks both is learnt on the first legacy client's request: a
DiscoverResult lists only modern versions (the SDK's does), so the signal is the handshake
itself: a lane whose `initialize` is answered in a legacy version proves it; one refused (or
not answered in time) means modern only, remembered, and legacy clients are served in the
modern era as before. A server not reached at all teaches nothing: the next request asks again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import anyio

from gateway.backends.base import Call, NotificationSink
from gateway.backends.era import discovery
from gateway.backends.era.link import Link
from gateway.backends.era.probe import ProvenModern
from gateway.errors import BackendError, BackendUnavailable
from gateway.origin import LegacyClient
from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

# Requests that stay in the modern era for legacy clients too: the gateway's own discovery, and
# over HTTP the session's change watch (the server process is the same, so its modern listen
# hears what the client's legacy session does). Over stdio the watch goes to the second child:
# the changes a legacy client makes happen in that process.
MODERN_METHODS = frozenset({"server/discover"})
WATCH = "subscriptions/listen"


class Lane(Protocol):
    """A legacy session on the server (an `EraBackend` pinned to the legacy era)."""

    inner: Link

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message: ...

    async def run(self) -> None: ...

    async def open_legacy(self) -> None: ...

    async def close(self) -> None: ...


class Lanes:
    """The legacy lanes of one backend. `shared`: one lane for all clients (stdio), which runs
    a transport of its own; else one per client session on the backend's transport (HTTP)."""

    def __init__(self, name: str, make: Callable[[], Lane], shared: bool, within: float) -> None:
        self._name = name
        self._make = make
        self._shared = shared
        self._within = within
        self.dual: bool | None = None  # unknown until a legacy client comes
        self._lanes: dict[LegacyClient | None, Lane] = {}
        # Held while the first lane is tried (nothing else is known yet), then one per lane, so
        # a slow handshake holds up only the client session it is for.
        self._trial = asyncio.Lock()
        self._opening: dict[LegacyClient | None, asyncio.Lock] = {}
        # The second child's transport, each stopped by its scope: anyio's cancellation, which
        # its StdioBackend's shielded stop (stdin closed, SIGTERM, SIGKILL, reaped) respects;
        # a second task.cancel() (the backend stopping while a refused lane still stops) would
        # cut that stop short and leave the child running, never reaped.
        self._runners: dict[asyncio.Task[None], anyio.CancelScope] = {}
        self._closing: set[asyncio.Task[None]] = set()  # sessions being ended

    async def serve(
        self,
        client: LegacyClient,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        long_lived: bool,
    ) -> Message | None:
        """The reply in the legacy era; None: serve it in the modern era."""
        method = msg["method"]
        if self.dual is False or client.closed or method in MODERN_METHODS:
            return None
        if method == WATCH and not self._shared:
            return None
        lane = self._lanes.get(None if self._shared else client)
        if lane is None:
            lane = await self._open(client)
            if lane is None:
                return None
        return await lane.request(msg, sink, call, long_lived=long_lived)

    async def _open(self, client: LegacyClient) -> Lane | None:
        key = None if self._shared else client
        if self.dual is None:
            async with self._trial:
                return await self._open_one(key, client)
        lock = self._opening.get(key)
        if lock is None:
            lock = self._opening[key] = asyncio.Lock()
            if not self._shared:
                client.on_close(lambda: self._end(client))
        async with lock:
            return await self._open_one(key, client)

    async def _open_one(self, key: LegacyClient | None, client: LegacyClient) -> Lane | None:
        """Open the lane for `key`, unless a request before this one has."""
        lane = self._lanes.get(key)
        if lane is not None or self.dual is False:
            return lane
        lane = self._make()
        runner = None
        if self._shared and self.dual is None:
            log.info(
                "backend %s: a legacy client came: trying the legacy era on a second process "
                "of its command (legacy_lane: false keeps every client on the first)",
                self._name,
            )
        if self._shared:
            runner = self._run(lane)
        try:
            async with asyncio.timeout(self._within):
                await lane.open_legacy()
        except (BackendError, TimeoutError) as exc:
            if runner is not None:
                runner.cancel()
            if isinstance(exc, BackendUnavailable) and not lane.inner.up:
                return None  # not reached at all: nothing learnt (asked again next time)
            if self.dual is None:
                self.dual = False
                log.info(
                    "backend %s: speaks only the modern era: %s; legacy clients are served in "
                    "the modern era, as before (nothing to fix)",
                    self._name,
                    refusal(exc, self._within),
                )
                return None
            raise
        if self.dual is None:
            log.info(
                "backend %s: speaks both eras; legacy clients get legacy sessions%s",
                self._name,
                " on the second process (its in-memory state is not the first one's)"
                if self._shared
                else "",
            )
        self.dual = True
        if key is not None and client.closed:
            # The client session ended while its lane opened: the lane ends too.
            _keep(self._closing, asyncio.get_running_loop().create_task(lane.close()))
            return None
        self._lanes[key] = lane
        if not self._shared and key not in self._opening:
            client.on_close(lambda: self._end(client))  # (opened in the trial)
        return lane

    def _end(self, client: LegacyClient) -> None:
        self._opening.pop(client, None)
        lane = self._lanes.pop(client, None)
        if lane is not None:
            _keep(self._closing, asyncio.get_running_loop().create_task(lane.close()))

    async def close(self) -> None:
        """The backend stops: every lane ends (sessions deleted, the second child stopped)."""
        lanes, self._lanes = list(self._lanes.values()), {}
        closing = [*self._closing, *(asyncio.create_task(lane.close()) for lane in lanes)]
        await asyncio.gather(*closing, return_exceptions=True)
        runners = list(self._runners.items())
        for _, scope in runners:
            scope.cancel()
        await asyncio.gather(*(task for task, _ in runners), return_exceptions=True)

    def _run(self, lane: Lane) -> anyio.CancelScope:
        """Run the shared lane's transport (its child) until its scope is cancelled."""
        scope = anyio.CancelScope()

        async def run() -> None:
            with scope:
                await lane.run()

        task = asyncio.get_running_loop().create_task(run())
        self._runners[task] = scope
        task.add_done_callback(lambda _: self._runners.pop(task, None))
        return scope


def refusal(exc: BaseException, within: float) -> str:
    """Why a legacy handshake proved the server modern-only, in plain words (no error dict)."""
    if isinstance(exc, TimeoutError):
        return f"no answer to the legacy handshake (initialize) within {within:g}s"
    reply = exc.reply if isinstance(exc, ProvenModern) else None
    error = reply.get("error") if reply is not None else None
    if isinstance(error, dict):
        code = error.get("code")
        versions = discovery.supported_versions(reply) if reply is not None else None
        known = f" (it supports {', '.join(versions)})" if versions else ""
        what = "unsupported protocol version" if code == codes.UNSUPPORTED_PROTOCOL_VERSION else ""
        return (
            f"it answered the legacy handshake (initialize {meta.LEGACY_VERSIONS[0]}) with "
            f"{code}{', ' + what if what else ''}{known}"
        )
    return f"the legacy handshake (initialize) failed: {exc}"


def _keep(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    tasks.add(task)
    task.add_done_callback(tasks.discard)
