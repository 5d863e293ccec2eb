"""A backend reached over Streamable HTTP (basic/transports/streamable-http).

Every request is its own POST on the backend's pooled aiohttp session: one exchange
(http_exchange.py: its headers, replica and token; its reply read as JSON or SSE). This module
holds what the exchanges share: the two connection pools (calls, with their deadlines; listen
streams, without), the start that requests wait for, and the end, which closes the pools and
ends the legacy sessions still open (a legacy server's session is era/http_session.py's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import anyio

from gateway.backends import web
from gateway.backends.base import Call, NotificationSink
from gateway.backends.http_exchange import HttpExchange
from gateway.backends.replicas import Replicas
from gateway.config import BackendConfig, ConfigInvalid
from gateway.errors import BackendUnavailable, Refused
from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol import jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.proxies import env_proxy
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

# Shutdown waits this long for a legacy session's DELETE.
END_SESSION_TIMEOUT = 1.0


class HttpBackend(HttpExchange):
    transport = "http"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        super().__init__(config, stats)
        self.config = config
        self._tls = web.ssl_context(config)
        self._proxy = _one_proxy(config, self.replicas)
        self._request_timeout = config.request_timeout
        self._deadlines: dict[float | None, aiohttp.ClientTimeout] = {}
        self.calls: aiohttp.ClientSession | None = None
        # Set once `run` has made the sessions: a request that comes before (a replica's own
        # listens begin with the gateway) waits for it rather than finding the backend down.
        self._started = asyncio.Event()
        self.streams: aiohttp.ClientSession | None = None
        # Other legacy sessions on this server, on these pools (session_view), ended with it.
        self._views: set[HttpBackend] = set()
        self.on_notification: Callable[[str, Message], None] | None = None
        if self._authorizer is not None:
            self._authorizer.on_token = self._count_token

    def _deadline(self, within: float | None) -> aiohttp.ClientTimeout:
        """A ClientTimeout per distinct deadline, built once (there are a handful)."""
        found = self._deadlines.get(within)
        if found is None:
            found = self._deadlines[within] = web.timeout(within, self.connect_timeout)
        return found

    def pool_connections(self) -> tuple[int, int]:
        """Its pooled connections (in use, idle), for /metrics."""
        return web.pool_connections(self.calls, self.streams)

    def replica_stats(self) -> list[tuple[str, int, int]] | None:
        """Per replica (several `urls` only): its address, requests in flight, failures."""
        return self.replicas.stats() if self.replicas.several else None

    async def run(self) -> None:
        config, tls, proxy = self.config, self._tls, self._proxy
        self.calls = web.session(
            config,
            limit=self.limits.max_connections,
            default_timeout=self._deadline(self._request_timeout),
            tls=tls,
            proxy=proxy,
        )
        # Listen streams stay open indefinitely: their own session without a connection limit
        # or deadline, so that they can never use up the connections that calls need.
        self.streams = web.session(
            config, limit=None, default_timeout=self._deadline(None), tls=tls, proxy=proxy
        )
        self._started.set()
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                with anyio.move_on_after(END_SESSION_TIMEOUT):
                    async with anyio.create_task_group() as tg:
                        for each in (self, *self._views):
                            if each.session is not None:
                                tg.start_soon(each.session.end)
                sessions = (self.calls, self.streams)
                self.calls = self.streams = None
                for session in sessions:
                    await session.close()
                if self._authorizer is not None:
                    await self._authorizer.close()

    @property
    def up(self) -> bool:
        return self.replicas.up

    def _count_token(self, grant: str, outcome: str) -> None:
        self.stats.backend_tokens[self.name, grant, outcome] += 1

    def session_view(self) -> HttpBackend:
        """The same server for another legacy session, on this backend's connection pools: a
        server speaking both eras gets one per legacy client session (era/dual.py)."""
        view = HttpBackend(self.config, self.stats)
        view.calls, view.streams = self.calls, self.streams
        view._started = self._started
        view._authorizer = self._authorizer
        view.replicas, view._safe = self.replicas, self._safe
        view.tap = self.tap
        view._views = self._views
        self._views.add(view)
        return view

    def leave(self) -> bool:
        """A view whose session its lane ends now, not at shutdown; False once the backend
        has stopped (and ended the session then)."""
        self._views.discard(self)
        return self.calls is not None and not self.calls.closed

    async def send(self, msg: Message, call: Call) -> None:
        await self.notify(msg, call.origin)

    async def exchange(
        self,
        msg: Message,
        sink: NotificationSink,
        within: float | None,
        *,
        wants_logs: bool | None = None,
    ) -> Message:
        if not self._started.is_set():
            await self._start()
        return await self._post(
            self.calls, msg, sink, GATEWAY_ORIGIN, within, self._deadline(within)
        )

    def request(
        self,
        msg: Message,
        sink: NotificationSink,
        call: Call,
        *,
        long_lived: bool = False,
        wants_logs: bool | None = None,  # (each reply stream carries its own request's logs)
    ) -> Coroutine[Any, Any, Message]:
        # A plain function that hands back _post's coroutine: one coroutine frame less on every
        # request. A listen stream has no deadline.
        if not self._started.is_set():
            return self._after_start(msg, sink, call.origin, long_lived)
        if long_lived:
            return self._post(self.streams, msg, sink, call.origin, None)
        within = self._request_timeout if call.deadline is None else call.deadline
        if within == self._request_timeout:
            return self._post(self.calls, msg, sink, call.origin, within)
        # (A deadline set above for this one request: resilience.py.)
        deadline = web.timeout(within, self.connect_timeout)
        return self._post(self.calls, msg, sink, call.origin, within, deadline)

    async def _start(self) -> None:
        """Until `run` has begun, within connect_timeout (then the request finds it not
        started)."""
        with anyio.move_on_after(self.connect_timeout):
            await self._started.wait()

    async def _after_start(
        self, msg: Message, sink: NotificationSink, origin: Origin, long_lived: bool
    ) -> Message:
        """A request made before `run` began: sent once it has."""
        await self._start()
        if long_lived:
            return await self._post(self.streams, msg, sink, origin, None)
        return await self._post(self.calls, msg, sink, origin, self._request_timeout)

    async def notify(self, msg: Message, origin: Origin = GATEWAY_ORIGIN) -> None:
        """Made for `origin` (its token, where callers have one); by default the gateway's own."""
        session = self.calls
        if session is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            sent = self._headers(msg)
        except Refused as exc:
            log.warning("backend %s: notification not sent: %s", self.name, exc)
            return
        body = jsonrpc.encode(msg)
        self.stats.bytes["backend", "out"] += len(body)
        if self.tap is not None:
            self.tap.record("backend", "out", msg, backend=self.name, headers=self._shown(sent))
        whose = web.caller(self._authorizer, origin)
        resp, replica = await self._open_post(
            msg, session, sent, body, self._request_timeout, None, whose
        )
        replica.in_flight -= 1
        try:
            if self.session is not None:
                self.session.check(resp)
            await self.read_body(resp)
        except BaseException as exc:
            resp.close()
            if isinstance(exc, aiohttp.ClientError | TimeoutError):
                raise web.failure(self.name, exc, self._request_timeout) from None
            raise
        resp.release()


def _one_proxy(config: BackendConfig, replicas: Replicas) -> str | None:
    """The proxy of the backend's session (aiohttp takes one per session): replicas that
    `HTTP(S)_PROXY`/`NO_PROXY` send different ways are refused at start-up."""
    found = {env_proxy(r.url, f"backend {config.name}") for r in replicas.all}
    if len(found) > 1:
        raise ConfigInvalid(
            [f"backends.{config.name}.http.urls: the replicas must share one proxy (or none)"]
        )
    return found.pop()
