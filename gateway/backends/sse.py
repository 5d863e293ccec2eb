"""A backend on the deprecated HTTP+SSE transport of 2024-11-05 (2025-11-25
basic/transports, Backwards Compatibility), for servers that speak nothing newer.

The gateway opens the server's SSE stream (GET); its first event, `endpoint`, names the URL
that takes the gateway's messages (POST, answered 202). Everything the server says (replies,
notifications, its own requests) comes as `message` events on the one stream, so request
bookkeeping is that of a channel, as with stdio. The stream is opened again when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import aiohttp
import anyio
from multidict import CIMultiDict
from yarl import URL

from gateway.backend_auth import setup as oauth_setup
from gateway.backends import web
from gateway.backends.channel import Channel
from gateway.config import BackendConfig, SseTarget
from gateway.errors import BackendError, BackendUnavailable
from gateway.origin import GATEWAY_ORIGIN, Origin
from gateway.protocol import codes, jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.proxies import env_proxy
from gateway.telemetry.api import Stats

if TYPE_CHECKING:
    from gateway.backend_auth.authorizer import Authorizer

log = logging.getLogger("gateway.backend")

SSE = "text/event-stream"
# Reconnecting: quick first, doubling to a ceiling, reset once a stream has lasted a while.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 10.0
STABLE_AFTER = 30.0
# A POST's answer is only an acknowledgement; its body is read and dropped up to this size.
MAX_ACK_BYTES = 1024 * 1024


class SseBackend(Channel):
    transport = "sse"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, SseTarget)
        super().__init__(config.name, config.request_timeout)
        self._config = config
        self._stats = stats or Stats()
        self._url = web.target_url(config)  # a malformed URL fails here, at start-up
        self._tls = web.ssl_context(config)
        self._proxy = env_proxy(self._url, f"backend {config.name}")
        self._limits = config.target.limits
        custom = web.fixed_headers(config)
        self._stream_headers = CIMultiDict([*custom, ("Accept", SSE)])
        self._post_headers = CIMultiDict(
            [*custom, ("Content-Type", "application/json"), ("Accept", "application/json")]
        )
        self._connect_timeout = config.connect_timeout
        self._streams: aiohttp.ClientSession | None = None
        self._posts: aiohttp.ClientSession | None = None
        self._endpoint: URL | None = None  # where messages go, once the stream has named it
        # The gateway's login to this server (its `auth:`): on the stream's GET and each POST.
        self._authorizer = oauth_setup.authorizer(config)
        if self._authorizer is not None:
            self._authorizer.on_token = self._count_token
        self._ready: asyncio.Event | None = None
        self._opener: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()  # held so they are not collected
        self.restarts = 0
        # The stream is being made again after a loss: logged once, retries at debug.
        self._reconnecting = False

    @property
    def up(self) -> bool:
        return self._ready is not None and self._ready.is_set()

    @property
    def authorizer(self) -> Authorizer | None:
        return self._authorizer

    def _count_token(self, grant: str, outcome: str) -> None:
        self._stats.backend_tokens[self.name, grant, outcome] += 1

    def pool_connections(self) -> tuple[int, int]:
        """Its pooled connections (in use, idle), for /metrics."""
        return web.pool_connections(self._streams, self._posts)

    async def run(self) -> None:
        self._ready = asyncio.Event()
        config, tls, proxy = self._config, self._tls, self._proxy
        # The stream stays open indefinitely: a session of its own, without a deadline.
        self._streams = web.session(
            config,
            limit=None,
            default_timeout=web.timeout(None, self._connect_timeout),
            tls=tls,
            proxy=proxy,
        )
        self._posts = web.session(
            config,
            limit=self._limits.max_connections,
            default_timeout=web.timeout(self._request_timeout, self._connect_timeout),
            tls=tls,
            proxy=proxy,
        )
        try:
            await self._keep_connected()
        finally:
            with anyio.CancelScope(shield=True):
                sessions = (self._streams, self._posts)
                self._streams = self._posts = None
                for session in sessions:
                    await session.close()
                if self._authorizer is not None:
                    await self._authorizer.close()

    async def _keep_connected(self) -> None:
        backoff = FIRST_BACKOFF
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self._connect_once()
                self._last_problem = "the server ended the stream"
            except (BackendError, aiohttp.ClientError, TimeoutError) as exc:
                if isinstance(exc, aiohttp.ClientError):
                    exc = web.failure(self.name, exc, None)
                self._last_problem = str(exc) or type(exc).__name__
            finally:
                self._disconnected()
            if asyncio.get_running_loop().time() - started > STABLE_AFTER:
                backoff = FIRST_BACKOFF
            # The log says so once per loss, not once per retry (a dead server is retried forever).
            report = log.debug if self._reconnecting else log.warning
            report("backend %s: reconnecting in %.2fs (%s)", self.name, backoff, self._last_problem)
            self._reconnecting = True
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            self.restarts += 1

    def _disconnected(self) -> None:
        assert self._ready is not None
        self._ready.clear()
        if self._opener is not None:
            self._opener.cancel()
            self._opener = None
        self._fail_all(f"backend {self.name!r} stream lost: {self._last_problem}")
        self._endpoint = None

    async def _connect_once(self) -> None:
        assert self._streams is not None
        streams = self._streams
        async with asyncio.timeout(self._connect_timeout):
            if self._authorizer is None:
                resp = await web.send(streams, "GET", self._url, self._stream_headers)
            else:
                resp = await web.send_with_token(
                    self.name,
                    self._authorizer,
                    web.caller(self._authorizer, GATEWAY_ORIGIN, True),
                    lambda headers: web.send(streams, "GET", self._url, headers),
                    self._stream_headers,
                )
        try:
            if resp.status != 200 or resp.content_type != SSE:
                raise BackendUnavailable(self.name, f"SSE stream answered HTTP {resp.status}")
            await self._read(resp)
        except sse.EventTooLarge as exc:
            raise BackendUnavailable(self.name, f"stream dropped: {exc}") from None
        finally:
            resp.close()

    async def _read(self, resp: aiohttp.ClientResponse) -> None:
        decoder = sse.Decoder(self._limits.max_event_bytes)
        async for chunk in resp.content.iter_any():
            self._stats.bytes["backend", "in"] += len(chunk)
            for name, data in decoder.feed_named(chunk):  # (EventTooLarge: the stream ends)
                if name == "endpoint":
                    self._on_endpoint(data.decode("utf-8", "replace").strip())
                elif name == "message":
                    msg = jsonrpc.decode(data, keep=True)
                    if isinstance(msg, jsonrpc.Invalid):
                        log.warning("backend %s: dropped an event that is not JSON-RPC", self.name)
                        if msg.response:  # its request fails now instead of timing out
                            error = jsonrpc.error(msg.id, codes.BACKEND_PROTOCOL_ERROR, msg.message)
                            self.on_message(error)
                    else:
                        if self.tap is not None:  # (before ids are restored)
                            self.tap.record("backend", "in", msg, backend=self.name)
                        self.on_message(msg)

    def _on_endpoint(self, where: str) -> None:
        try:
            url = self._url.join(URL(where))
        except ValueError:
            raise BackendUnavailable(self.name, f"endpoint {where!r} is not a URL") from None
        if url.origin() != self._url.origin():
            # (2024-11-05: the endpoint is on the server's own origin)
            raise BackendUnavailable(self.name, f"endpoint {where!r} is on another origin")
        if self._endpoint is not None:
            return  # only the first one counts
        self._endpoint = url
        self._opener = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        if self.on_start is not None:
            try:
                await self.on_start()
            except BackendError as exc:
                log.error("backend %s: opening failed: %s", self.name, exc)
                return  # requests keep failing until the stream is made again
        assert self._ready is not None
        self._ready.set()
        if self._reconnecting:
            self._reconnecting = False
            log.info("backend %s: stream open again", self.name)

    # --- outbound ----------------------------------------------------------------------------

    async def _write(self, msg: Message, origin: Origin) -> None:
        posts, endpoint = self._posts, self._endpoint
        if posts is None or endpoint is None:
            raise BackendUnavailable(self.name, f"not connected ({self._last_problem})")
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        if self.tap is not None:
            self.tap.record("backend", "out", msg, backend=self.name)  # (fixed headers only)
        try:
            if self._authorizer is None:
                resp = await web.send(posts, "POST", endpoint, self._post_headers, body)
            else:
                resp = await web.send_with_token(
                    self.name,
                    self._authorizer,
                    web.caller(self._authorizer, origin, web.shared(msg)),
                    lambda headers: web.send(posts, "POST", endpoint, headers, body),
                    self._post_headers,
                )
            try:
                await _drain(resp)
            finally:
                resp.close()  # (an acknowledgement left unread must not reach the next POST)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise web.failure(self.name, exc, self._request_timeout) from None
        if resp.status >= 300:
            raise BackendUnavailable(self.name, f"a message was refused: HTTP {resp.status}")

    def _send_soon(self, msg: Message, origin: Origin) -> None:
        async def send() -> None:
            with contextlib.suppress(BackendError):
                await self._write(msg, origin)

        task = asyncio.get_running_loop().create_task(send())
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _wait_ready(self) -> None:
        ready = self._ready
        if ready is not None and ready.is_set():
            return
        if ready is None:
            raise BackendUnavailable(self.name, "not started")
        try:
            async with asyncio.timeout(self._connect_timeout):
                await ready.wait()
        except TimeoutError:
            raise BackendUnavailable(self.name, f"not connected ({self._last_problem})") from None


async def _drain(resp: aiohttp.ClientResponse) -> None:
    """Read an acknowledgement's body to its end, so its connection can be reused; one that
    grows past MAX_ACK_BYTES is cut off with its connection."""
    read = 0
    async for chunk in resp.content.iter_any():
        read += len(chunk)
        if read > MAX_ACK_BYTES:
            return
    resp.release()
