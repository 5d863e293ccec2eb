"""A backend of either protocol era, shown to the engine as a modern one (basic/versioning,
Backward Compatibility with Initialization-Based Versions).

The era is probed once (`probe.py`) unless the config pins it, and remembered until the
backend fails to open under it. A legacy backend gets an `initialize` handshake (after every
child restart; again when an HTTP backend has forgotten the session) and each request is
translated on the way (`translate.py`); a call the backend interrupts with a question of its
own is held for the client's answer (`held.py`); `subscriptions/listen` is emulated from the
session's notifications (`legacy_listen.py`). A modern backend that speaks the legacy era
too serves legacy clients' requests in that era, on legacy sessions of its own (`dual.py`).
This module composes them, and follows an HTTP session's GET stream. A modern backend costs
two comparisons per request here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Callable

import anyio

from gateway.backends.base import NotificationSink
from gateway.backends.channel import Channel
from gateway.backends.dual import Lanes
from gateway.backends.held import HOLD_TTL, HeldCall, HeldCalls, Sealer
from gateway.backends.legacy_listen import LISTEN_QUEUE, Listens, _Listener
from gateway.backends.link import Link
from gateway.backends.probe import (
    GATEWAY_CAPABILITIES,
    GATEWAY_INFO,
    PROBE_TIMEOUT,
    handshake,
    ignore,
    is_modern_answer,
    probe,
)
from gateway.backends.translate import (
    INPUT_METHODS,
    LOG_LEVELS,
    LegacySession,
    discover_result,
    required_capability,
    to_legacy,
)
from gateway.config import BackendConfig
from gateway.errors import BackendError, BackendUnavailable, SessionExpired
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import SERVING

# Re-exported: the names the era layer was known by before it was split.
__all__ = [
    "GATEWAY_CAPABILITIES",
    "GATEWAY_INFO",
    "HOLD_TTL",
    "INPUT_METHODS",
    "LISTEN_QUEUE",
    "PROBE_TIMEOUT",
    "EraBackend",
    "LegacySession",
    "Link",
    "Sealer",
    "_Listener",
    "discover_result",
    "is_modern_answer",
    "required_capability",
    "to_legacy",
]

log = logging.getLogger("gateway.backend")

# The GET stream is opened again after it ends: quick first, doubling to a ceiling, reset once a
# stream has lasted a while.
FIRST_RETRY = 0.1
MAX_RETRY = 10.0
STABLE_AFTER = 30.0


class EraBackend:
    """Wraps a transport; see the module docstring."""

    def __init__(
        self,
        inner: Link,
        config: BackendConfig,
        lane: Callable[[], Link] | None = None,
    ) -> None:
        """`lane` makes another link to the same server for a legacy session of its own: a
        view of the HTTP transport, or a second stdio child (dual.py)."""
        self.inner = inner
        self.name = inner.name
        self.transport = inner.transport
        self._pinned = config.era != "auto"
        self.era: str | None = None if config.era == "auto" else config.era
        # stdio and HTTP+SSE open once per connection (on_start); HTTP on first use.
        self._channel = isinstance(inner, Channel)
        self._open_timeout = config.connect_timeout + config.request_timeout
        self.session: LegacySession | None = None
        self._opening: asyncio.Lock | None = None
        self._level: str | None = None
        self._held = HeldCalls(self.name, self.unsolicited)
        self._listens = Listens(inner, self.name)
        self._ids = itertools.count(1)
        # A legacy session is open / has ended (HTTP's GET stream follows them).
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()
        # Receives the backend's notifications that belong to no request (list changes).
        self.on_notification: Callable[[str, Message], None] | None = None
        inner.on_notification = self.unsolicited
        self._first_open: asyncio.Future[None] | None = None
        if isinstance(inner, Channel):
            inner.on_start = self._on_start
        self._lanes: Lanes | None = None
        if lane is not None and config.era != "legacy":
            legacy = dataclasses.replace(config, era="legacy")
            self._lanes = Lanes(
                self.name,
                lambda: EraBackend(lane(), legacy),
                shared=self._channel,
                within=config.connect_timeout,
            )

    @property
    def up(self) -> bool:
        return self.inner.up

    async def run(self) -> None:
        try:
            if self._channel:
                await self.inner.run()
                return
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.inner.run())
                tg.create_task(self._watch())
        finally:
            if self._lanes is not None:
                with anyio.CancelScope(shield=True):
                    await self._lanes.close()

    async def _watch(self) -> None:
        """HTTP: a legacy session's GET stream, where its change notifications come."""
        delay = FIRST_RETRY
        while True:
            await self.opened.wait()
            started = time.monotonic()
            try:
                offered = await self.inner.watch(self.unsolicited)  # type: ignore[attr-defined]
            except SessionExpired:
                if self.session is not None:
                    self._session_ended()
                continue  # the next request opens a new session
            except BackendError as exc:
                log.info("backend %s: GET stream lost (%s)", self.name, exc)
                offered = True
            if time.monotonic() - started > STABLE_AFTER:
                delay = FIRST_RETRY
            if not offered:
                # No GET stream on this server: changes come only inside calls.
                await self.ended.wait()
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY)

    # --- opening -----------------------------------------------------------------------------

    async def _on_start(self) -> None:
        try:
            await self._open_channel()
        except BackendError as exc:
            self._opened(exc)
            raise
        self._opened(None)

    def _opened(self, failure: BackendError | None) -> None:
        """The first opening's outcome, for `open_legacy`."""
        first = self._first_open
        if first is not None and not first.done():
            if failure is None:
                first.set_result(None)
            else:
                first.set_exception(failure)

    async def open_legacy(self) -> None:
        """A lane's legacy session, opened now (or BackendError): HTTP opens it on first use,
        a channel when its connection (run elsewhere) has started."""
        if not self._channel:
            await self._settle()
            if self.session is None:
                raise BackendUnavailable(self.name, "the legacy session is not open")
            return
        if self.session is None:
            self._first_open = asyncio.get_running_loop().create_future()
            try:
                await self._first_open
            finally:
                self._first_open = None  # nobody waits for a later outcome

    async def close(self) -> None:
        """A lane's end: its HTTP session is deleted (a channel's ends with its transport)."""
        end = getattr(self.inner, "end_session", None)
        if end is not None:
            await end()

    async def _open_channel(self) -> None:
        """Before a (re)started stdio child or SSE connection takes requests."""
        self._session_ended()
        if self.era == "modern" and not self._pinned:
            self.era = None  # the era is the server process's: a new one is asked again
        if self.era == "modern":
            return
        if self.era is None:
            self.era = await self._probe()
            log.info("backend %s: speaks the %s era", self.name, self.era)
            if self.era == "modern":
                return
        try:
            await self._handshake()
        except BackendError:
            if not self._pinned:
                self.era = None  # probe again next time: it may have changed
            raise

    async def _settle(self) -> None:
        """HTTP: probe and open the session on first use (and after it has expired)."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self.era is None:
                self.era = await self._probe()
                log.info("backend %s: speaks the %s era", self.name, self.era)
            if self.era == "legacy" and self.session is None:
                try:
                    await self._handshake()
                except BackendError:
                    if not self._pinned:
                        self.era = None
                    raise

    async def _probe(self) -> str:
        return await probe(self.inner, self._channel)

    async def _handshake(self) -> None:
        self._session_ended()
        session = await handshake(self.inner, self._open_timeout)
        self.session = session
        self.ended.clear()
        self.opened.set()
        log.info(
            "backend %s: legacy session open (version %s, server %s)",
            self.name,
            session.version,
            session.server_info.get("name"),
        )

    def _session_ended(self) -> None:
        """The backend forgot the session (restart, expiry): what hung on it ends."""
        self.session = None
        self._level = None
        self.opened.clear()
        self.ended.set()
        self._listens.end()

    async def _reopen(self, stale: LegacySession) -> None:
        """Open a new session in place of `stale` (once, however many requests found it gone)."""
        if self.session is stale:
            self._session_ended()
        await self._settle()

    # --- requests ----------------------------------------------------------------------------

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        *,
        long_lived: bool = False,
    ) -> Message:
        if self.era != "modern":
            if isinstance(self.inner, Channel):
                await self.inner.ready()
            elif self.era is None or self.session is None:
                await self._settle()
            if self.era != "modern":
                return await self._legacy(msg, sink)
        if self._lanes is not None:
            client = SERVING.get()[1].legacy
            if client is not None:
                # A legacy client: in its era where the server speaks both (dual.py).
                reply = await self._lanes.serve(client, msg, sink, long_lived)
                if reply is not None:
                    return reply
        try:
            return await self.inner.request(msg, sink, long_lived=long_lived)
        except BackendUnavailable:
            if not self._pinned and not self._channel:
                self.era = None  # remembered until it fails: ask again next time
            raise

    async def notify(self, msg: Message) -> None:
        if self.era == "modern":
            await self.inner.notify(msg)
            return
        if not self._channel and (self.era is None or self.session is None):
            await self._settle()
        await self.inner.notify(to_legacy(msg) if self.era == "legacy" else msg)

    async def _legacy(self, msg: Message, sink: NotificationSink) -> Message:
        session = self.session
        if session is None:
            raise BackendUnavailable(self.name, "the legacy session is not open")
        method = msg["method"]
        if method == "server/discover":
            return jsonrpc.result(msg["id"], discover_result(session))
        if method == "subscriptions/listen":
            return await self._listens.listen(msg, sink, session)
        params = jsonrpc.params(msg)
        caller = SERVING.get()[1].caller()
        if "requestState" in params:
            return await self._held.resume(msg, sink, caller)
        fields = jsonrpc.meta(msg)
        level = fields.get(meta.LOG_LEVEL)
        if isinstance(level, str):
            await self._lower_level(level, session)
        call = self._held.new(self.inner, caller, fields.get(meta.CLIENT_CAPABILITIES))
        call.sink = sink
        out = to_legacy(msg)
        if not self._channel:
            # One HTTP session carries every client's requests: ids must not collide on it
            # (a channel gives each request its own id already).
            out["id"] = call.backend_id = f"gateway-{next(self._ids)}"
        task = asyncio.get_running_loop().create_task(
            self._run_call(out, call, isinstance(level, str), session)
        )
        self._held.start(call, task)
        return await self._held.attend(call, msg)

    async def _run_call(
        self,
        out: Message,
        call: HeldCall,
        wants_logs: bool,
        session: LegacySession,
    ) -> Message:
        try:
            return await self.inner.request(out, call.on_message, wants_logs=wants_logs)
        except SessionExpired:
            await self._reopen(session)
            return await self.inner.request(out, call.on_message, wants_logs=wants_logs)

    async def _lower_level(self, level: str, session: LegacySession) -> None:
        """Logging is per session in the legacy era: the most verbose level any request asked
        for (each request still gets only the messages routed to it)."""
        if "logging" not in session.capabilities or level not in LOG_LEVELS:
            return
        if self._level is not None and LOG_LEVELS.index(level) >= LOG_LEVELS.index(self._level):
            return
        self._level = level
        set_level: Message = {
            "jsonrpc": "2.0",
            "id": "gateway-set-level",
            "method": "logging/setLevel",
            "params": {"level": level},
        }
        with contextlib.suppress(BackendError):
            await self.inner.request(set_level, ignore)

    # --- change notifications -------------------------------------------------------------

    def unsolicited(self, backend: str, note: Message) -> None:
        """A notification outside any request: to the listens that want it, and upwards."""
        self._listens.offer(note)
        if self.on_notification is not None:
            self.on_notification(backend, note)
