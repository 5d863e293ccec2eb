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
from urllib.parse import urljoin, urlsplit

from gateway.backends import http1
from gateway.backends.channel import Channel
from gateway.config import BackendConfig, SseTarget
from gateway.errors import BackendError, BackendUnavailable
from gateway.protocol import jsonrpc, sse
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

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
        self._stats = stats or Stats()
        self._url = config.target.url
        http1.Target(self._url)  # a malformed URL fails here, at start-up
        custom = tuple(config.target.headers.items())
        self._stream_headers = http1.encode_headers((*custom, ("Accept", "text/event-stream")))
        self._post_headers = http1.encode_headers(
            (*custom, ("Content-Type", "application/json"), ("Accept", "application/json"))
        )
        self._connect_timeout = config.connect_timeout
        self._posts: http1.Pool | None = None
        self._ready: asyncio.Event | None = None
        self._opener: asyncio.Task[None] | None = None
        self._sending: set[asyncio.Task[None]] = set()  # held so they are not collected
        self.restarts = 0

    @property
    def up(self) -> bool:
        return self._ready is not None and self._ready.is_set()

    async def run(self) -> None:
        self._ready = asyncio.Event()
        backoff = FIRST_BACKOFF
        while True:
            started = asyncio.get_running_loop().time()
            try:
                await self._connect_once()
                self._last_problem = "the server ended the stream"
            except (BackendError, http1.HttpClientError, TimeoutError) as exc:
                self._last_problem = str(exc) or type(exc).__name__
            finally:
                await self._disconnected()
            if asyncio.get_running_loop().time() - started > STABLE_AFTER:
                backoff = FIRST_BACKOFF
            log.warning(
                "backend %s: reconnecting in %.2fs (%s)", self.name, backoff, self._last_problem
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            self.restarts += 1

    async def _disconnected(self) -> None:
        assert self._ready is not None
        self._ready.clear()
        if self._opener is not None:
            self._opener.cancel()
            self._opener = None
        self._fail_all(f"backend {self.name!r} stream lost: {self._last_problem}")
        posts, self._posts = self._posts, None
        if posts is not None:
            await posts.close()

    async def _connect_once(self) -> None:
        stream_pool = http1.Pool(self._url, limit=None, connect_timeout=self._connect_timeout)
        try:
            async with asyncio.timeout(self._connect_timeout):
                resp = await stream_pool.request(self._stream_headers, b"", method="GET")
            try:
                if resp.status != 200 or resp.content_type != "text/event-stream":
                    raise BackendUnavailable(self.name, f"SSE stream answered HTTP {resp.status}")
                await self._read(resp)
            finally:
                resp.abort()
        finally:
            await stream_pool.close()

    async def _read(self, resp: http1.Response) -> None:
        decoder = sse.Decoder()
        async for chunk in resp.chunks():
            self._stats.bytes["backend", "in"] += len(chunk)
            for name, data in decoder.feed_named(chunk):
                if name == "endpoint":
                    self._on_endpoint(data.decode("utf-8", "replace").strip())
                elif name == "message":
                    msg = jsonrpc.decode(data, keep=True)
                    if isinstance(msg, jsonrpc.Invalid):
                        log.warning("backend %s: dropped an event that is not JSON-RPC", self.name)
                    else:
                        self.on_message(msg)

    def _on_endpoint(self, where: str) -> None:
        url = urljoin(self._url, where)
        if urlsplit(url)[:2] != urlsplit(self._url)[:2]:
            # (2024-11-05: the endpoint is on the server's own origin)
            raise BackendUnavailable(self.name, f"endpoint {where!r} is on another origin")
        if self._posts is not None:
            return  # only the first one counts
        self._posts = http1.Pool(url, limit=None, connect_timeout=self._connect_timeout)
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

    # --- outbound ----------------------------------------------------------------------------

    async def _write(self, msg: Message) -> None:
        posts = self._posts
        if posts is None:
            raise BackendUnavailable(self.name, f"not connected ({self._last_problem})")
        body = jsonrpc.encode(msg)
        self._stats.bytes["backend", "out"] += len(body)
        try:
            resp = await posts.request(self._post_headers, body, within=self._request_timeout)
            try:
                await resp.read(MAX_ACK_BYTES)
            finally:
                resp.release()
        except TimeoutError:
            raise BackendUnavailable(self.name, "a message was not accepted in time") from None
        except http1.HttpClientError as exc:
            raise BackendUnavailable(self.name, f"cannot post a message: {exc}") from None
        if resp.status >= 300:
            raise BackendUnavailable(self.name, f"a message was refused: HTTP {resp.status}")

    def _send_soon(self, msg: Message) -> None:
        async def send() -> None:
            with contextlib.suppress(BackendError):
                await self._write(msg)

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
