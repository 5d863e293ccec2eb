"""A backend of either protocol era, shown to the engine as a modern one (basic/versioning,
Backward Compatibility with Initialization-Based Versions).

The era is probed once (`probe.py`, waiting up to `connect_timeout`) unless the config pins
it, and remembered until the backend fails to open under it; a modern error to `initialize`
still proves a modern server, served with a discovery result made from its answers if it has
no `server/discover` (discovery.py). A legacy backend gets an `initialize` handshake (after every
child restart; again when an HTTP backend has forgotten the session) and each request is
translated on the way (`translate.py`); a call the backend interrupts with a question of its
own is held for the client's answer (`held.py`); `subscriptions/listen` is emulated from the
session's notifications (`listen.py`). A modern backend that speaks the legacy era
too serves legacy clients' requests in that era, on legacy sessions of its own (`dual.py`).
This module composes them, and follows an HTTP session's GET stream. A modern backend costs
two comparisons per request here.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio

from gateway.backends.base import GATEWAY_CALL, Call, Layer, NotificationSink
from gateway.backends.channel import Channel
from gateway.backends.era import discovery, questions
from gateway.backends.era.dual import Lanes
from gateway.backends.era.held import HeldCall, HeldCalls
from gateway.backends.era.link import Link, SessionLink
from gateway.backends.era.listen import Listens
from gateway.backends.era.probe import GATEWAY_INFO, ProvenModern, handshake, ignore, probe
from gateway.backends.era.translate import (
    LOG_LEVELS,
    LegacySession,
    discover_result,
    to_legacy,
)
from gateway.config import BackendConfig
from gateway.errors import BackendError, BackendUnavailable, SessionExpired
from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.backend")

# The GET stream is opened again after it ends: quick first, doubling to a ceiling, reset once a
# stream has lasted a while.
FIRST_RETRY = 0.1
MAX_RETRY = 10.0
STABLE_AFTER = 30.0
# HTTP: how long a new legacy session's first requests wait for its standing GET stream to be
# answered. Some servers send a reply owed on a closed request stream on whatever GET stream
# connects next; with the standing stream there first, the reply comes on the resumed one.
STREAM_READY_WAIT = 1.0


class EraBackend(Layer[Link]):
    """Wraps a transport; see the module docstring."""

    def __init__(
        self,
        inner: Link,
        config: BackendConfig,
        lane: Callable[[], Link] | None = None,
        *,
        legacy_first: bool = False,
    ) -> None:
        """`lane` makes another link to the same server for a legacy session of its own: a
        view of the HTTP transport, or a second stdio child (dual.py)."""
        super().__init__(inner)
        self._pinned = config.era != "auto"
        # A child serving one legacy client (isolation: per_session) opens with `initialize`
        # instead of the probe: a stdio server of both eras settles a connection's era on its
        # first request, and in the legacy era its own requests during a call reach that client;
        # a modern-only server's error to it proves it modern (basic/versioning).
        self._legacy_first = legacy_first and config.era == "auto"
        self.roots = config.roots
        self.era: str | None = None if config.era == "auto" else config.era
        # stdio and HTTP+SSE open once per connection (on_start); HTTP on first use.
        self._channel = isinstance(inner, Channel)
        # HTTP keeps the legacy session in the transport: begun, agreed, forgotten and ended
        # there, with a GET stream of its own to follow (link.py).
        self._session_link = inner if isinstance(inner, SessionLink) else None
        self._open_timeout = config.connect_timeout + config.request_timeout
        # A legacy server may stay silent on a method it does not know (transports/stdio,
        # Backward Compatibility); a slow starter is silent too until it has started. The
        # probe waits as long as the backend is given to start.
        self._probe_timeout = config.connect_timeout
        # Modern without a `server/discover` of its own: the versions its error named (or
        # None), and the discovery result made for it once.
        self._no_discover: list[str] | None = None
        self._made_discover: dict[str, Any] | None = None
        self.session: LegacySession | None = None
        self._opening: asyncio.Lock | None = None
        self._level: str | None = None
        self._held = HeldCalls(self.name, self.unsolicited, config.roots)
        self._listens = Listens(inner, self.name, self._unattended)
        # A legacy session is open / has ended (HTTP's GET stream follows them).
        self.opened = asyncio.Event()
        self.ended = asyncio.Event()
        # Receives the backend's notifications that belong to no request (list changes).
        self.on_notification: Callable[[str, Message], None] | None = None
        inner.on_notification = self.unsolicited
        self._first_open: asyncio.Future[None] | None = None
        # Whether `run` follows the session's GET stream (`_watch`): an HTTP lane (dual.py) is
        # never run, and must not wait at each opening for a stream nobody opens.
        self._watching = False
        if isinstance(inner, Channel):
            inner.on_start = self._on_start
            inner.roots = config.roots
        self._lanes: Lanes | None = None
        if lane is not None and config.era != "legacy":
            legacy = dataclasses.replace(config, era="legacy")
            self._lanes = Lanes(
                self.name,
                lambda: EraBackend(lane(), legacy),
                shared=self._channel,
                within=config.connect_timeout,
            )

    async def run(self) -> None:
        try:
            if self._session_link is None:
                await self.inner.run()
                return
            self._watching = True
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.inner.run)
                tg.start_soon(self._watch, self._session_link)
        finally:
            if self._lanes is not None:
                with anyio.CancelScope(shield=True):
                    await self._lanes.close()

    async def _watch(self, link: SessionLink) -> None:
        """HTTP: a legacy session's GET stream, where its change notifications come."""
        delay = FIRST_RETRY
        while True:
            await self.opened.wait()
            started = time.monotonic()
            try:
                offered = await link.watch(self.unsolicited)
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
            await anyio.sleep(delay)
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
        if self._session_link is not None:
            await self._session_link.end_session()

    async def _open_channel(self) -> None:
        """Before a (re)started stdio child or SSE connection takes requests."""
        self._session_ended()
        if self.era == "modern" and not self._pinned:
            self.era = None  # the era is the server process's: a new one is asked again
        if self.era == "modern":
            return
        if self.era is None and not self._legacy_first:
            self.era = await self._probe()
            if self.era == "modern":
                log.info("backend %s: speaks the modern era", self.name)
                return
        try:
            await self._handshake()
        except BackendError:
            if not self._pinned:
                self.era = None  # probe again next time: it may have changed
            raise
        if self.era is None:
            self.era = "legacy"  # (legacy first: a modern error would have made it modern)

    async def _settle(self) -> None:
        """HTTP: probe and open the session on first use (and after it has expired)."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self.era is None:
                self.era = await self._probe()
                if self.era == "modern":
                    log.info("backend %s: speaks the modern era", self.name)
            if self.era == "legacy" and self.session is None:
                try:
                    await self._handshake()
                except BackendError:
                    if not self._pinned:
                        self.era = None
                    raise

    async def _probe(self) -> str:
        self._made_discover = None
        era, self._no_discover = await probe(self.inner, self._channel, self._probe_timeout)
        return era

    def _proven_modern(self, reply: Message) -> bool:
        """A modern error to `initialize` (basic/versioning: a recognised modern error means a
        modern server, however the probe went): modern from now on, unless pinned legacy."""
        if self._pinned:
            return False
        self.era = "modern"
        self._no_discover = discovery.supported_versions(reply) or []
        self._made_discover = None
        if self._session_link is not None:
            self._session_link.forget_session()
        log.info(
            "backend %s: speaks the modern era (its answer to initialize: %s)",
            self.name,
            jsonrpc.error_code(reply),
        )
        return True

    async def _handshake(self) -> None:
        self._session_ended()
        try:
            session = await handshake(self.inner, self._open_timeout)
        except ProvenModern as exc:
            if self._proven_modern(exc.reply):
                return
            raise
        self.session = session
        self.ended.clear()
        self.opened.set()
        if self._session_link is not None and self._watching:
            with anyio.move_on_after(STREAM_READY_WAIT):
                await self._session_link.stream_ready.wait()
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
        call: Call,
        *,
        long_lived: bool = False,
    ) -> Message:
        if self.era != "modern":
            if isinstance(self.inner, Channel):
                await self.inner.ready()
            elif self.era is None or self.session is None:
                await self._settle()
            if self.era != "modern":
                return await self._legacy(msg, sink, call)
        if self._lanes is not None:
            client = call.origin.legacy
            if client is not None:
                # A legacy client: in its era where the server speaks both (dual.py).
                reply = await self._lanes.serve(client, msg, sink, call, long_lived)
                if reply is not None:
                    return reply
        if self._no_discover is not None and msg["method"] == "server/discover":
            return await self._discover_for(msg, call)
        try:
            return await self.inner.request(msg, sink, call, long_lived=long_lived)
        except BackendUnavailable:
            if not self._pinned and not self._channel:
                self.era = None  # remembered until it fails: ask again next time
            raise

    async def _discover_for(self, msg: Message, call: Call) -> Message:
        """`server/discover` of a modern backend that serves none (discovery.py)."""
        made = self._made_discover
        if made is None:
            try:
                reply = await self.inner.request(msg, ignore, call)
            except BackendUnavailable:
                if not self.inner.up:
                    raise
                reply = {}  # (HTTP 404 without a JSON-RPC body)
            if discovery.is_discover_result(reply):
                self._no_discover = None  # it has one after all (it was only slow to start)
                return reply
            ask = functools.partial(self.inner.request, sink=ignore, call=call)
            made = await discovery.synthesise(ask, GATEWAY_INFO, self._no_discover or None)
            self._made_discover = made
        return jsonrpc.result(msg["id"], copy.deepcopy(made))

    async def notify(self, msg: Message) -> None:
        if self.era == "modern":
            await self.inner.notify(msg)
            return
        if not self._channel and (self.era is None or self.session is None):
            await self._settle()
        await self.inner.notify(to_legacy(msg) if self.era == "legacy" else msg)

    async def _legacy(self, msg: Message, sink: NotificationSink, call: Call) -> Message:
        session = self.session
        if session is None:
            raise BackendUnavailable(self.name, "the legacy session is not open")
        method = msg["method"]
        if method == "server/discover":
            return jsonrpc.result(msg["id"], discover_result(session))
        if method == "subscriptions/listen":
            return await self._listens.listen(msg, sink, session, call)
        params = jsonrpc.params(msg)
        if "requestState" in params:
            return await self._held.resume(msg, sink, call)
        fields = jsonrpc.meta(msg)
        level = fields.get(meta.LOG_LEVEL)
        if isinstance(level, str):
            await self._lower_level(level, session, call)
        held = self._held.new(self.inner, call, fields.get(meta.CLIENT_CAPABILITIES))
        held.sink = sink
        # (The transport gives the request an id of the gateway's on the backend's session,
        # and tells the backend when it is given up: channel.py, http_session.py.)
        out = to_legacy(msg)
        task = asyncio.get_running_loop().create_task(
            self._run_call(out, held, isinstance(level, str), session)
        )
        self._held.start(held, task)
        return await self._held.attend(held, msg)

    async def _run_call(
        self,
        out: Message,
        held: HeldCall,
        wants_logs: bool,
        session: LegacySession,
    ) -> Message:
        on_message, made_for = held.on_message, held.made_for
        try:
            return await self.inner.request(out, on_message, made_for, wants_logs=wants_logs)
        except SessionExpired:
            await self._reopen(session)
            return await self.inner.request(out, on_message, made_for, wants_logs=wants_logs)

    async def _lower_level(self, level: str, session: LegacySession, call: Call) -> None:
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
            await self.inner.request(set_level, self._unattended, call)

    async def _unattended(self, msg: Message) -> None:
        """The sink of a request the gateway makes on its own once the session is open: a
        question it receives is answered as one asked outside any request."""
        if "id" in msg and "method" in msg:
            refusal = "The gateway answers only ping and roots/list itself"
            with contextlib.suppress(BackendError):
                refused = questions.refuse_unattended(msg, self.roots, refusal)
                await self.inner.send(refused, GATEWAY_CALL)

    # --- change notifications -------------------------------------------------------------

    def unsolicited(self, backend: str, note: Message) -> None:
        """A notification outside any request: to the listens that want it, and upwards."""
        self._listens.offer(note)
        if self.on_notification is not None:
            self.on_notification(backend, note)
