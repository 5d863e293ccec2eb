"""`core.bus.Bus` over Redis pub/sub: one channel per topic, with the gateway's prefix.

Two connections: one subscribed (it reads for as long as the replica runs, so it has no read
timeout; a Redis that goes away closes it, and the loop subscribes again after
`redis_retry_interval`), one to publish (each publish bounded by `redis_timeout`, no retry:
a message is a notice, and a late one is worth less than none). Each change of state is one
log line and `mcp_gateway_redis_pubsub_up`; messages by topic and outcome are counted in
`mcp_gateway_cluster_messages_total`.

What arrives is input from whoever can write to Redis: a message that is not the expected
JSON object is dropped with a debug line, and a handler's failure is one warning.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import anyio
import orjson
from redis.exceptions import RedisError

from gateway.cluster.connection import connect
from gateway.cluster.outage import Breaker, RedisDown
from gateway.core.bus import Handler
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway")

PREFIX = "mcp-gateway:bus:"


class RedisBus:
    def __init__(
        self,
        url: str,
        timeout: float,
        retry_interval: float,
        stats: Stats,
        prefix: str = PREFIX,
    ) -> None:
        self.replica = secrets.token_hex(8)
        self._prefix = prefix
        self._timeout = timeout
        self._retry_interval = retry_interval
        self._stats = stats
        self._handlers: dict[str, Handler] = {}
        self._publisher = connect(url, timeout)
        self._subscriber = connect(url, timeout, read_timeout=False)
        # Set once every topic is subscribed (tests and start-up wait on it); `up` follows
        # the subscription's state after that.
        self.ready = anyio.Event()
        self.up = False
        # Publishing: one attempt each, no retry interval (a message is a notice), no line when
        # it works again (the subscription's state says that).
        self._publishing = Breaker(
            timeout, down="redis: a message to the other replicas was not sent (%s)", back=None
        )

    def on(self, topic: str, handler: Handler) -> None:
        if self.ready.is_set():
            raise RuntimeError("topics are named before the bus runs")
        self._handlers[self._prefix + topic] = handler

    async def publish(self, topic: str, body: dict[str, Any]) -> bool:
        data = orjson.dumps({"from": self.replica, "body": body})
        try:
            await self._publishing.call(lambda: self._publisher.publish(self._prefix + topic, data))
        except RedisDown:
            self._stats.cluster_messages[topic, "unsent"] += 1
            return False
        self._stats.cluster_messages[topic, "sent"] += 1
        return True

    async def run(self) -> None:
        """Subscribe, deliver, and subscribe again whenever the connection is lost."""
        if not self._handlers:
            self.ready.set()
            return
        while True:
            try:
                await self._listen()
            except (RedisError, OSError, TimeoutError) as exc:
                self._state(False, exc)
            await anyio.sleep(self._retry_interval)

    async def _listen(self) -> None:
        pubsub = self._subscriber.pubsub()
        try:
            with anyio.fail_after(self._timeout * 10 + 1):
                await pubsub.subscribe(*self._handlers)
            waiting = set(self._handlers)
            async for raw in pubsub.listen():
                kind = raw.get("type")
                channel = _text(raw.get("channel"))
                if kind == "subscribe":
                    waiting.discard(channel)
                    if not waiting:
                        self._state(True, None)
                        self.ready.set()
                elif kind == "message":
                    await self._deliver(channel, raw.get("data"))
        finally:
            # Also when cancelled (shutdown): the connection is closed, not left to the GC.
            with anyio.CancelScope(shield=True):
                await pubsub.aclose()

    async def _deliver(self, channel: str, data: object) -> None:
        handler = self._handlers.get(channel)
        topic = channel.removeprefix(self._prefix)
        try:
            message = orjson.loads(data) if isinstance(data, bytes | str) else None
        except orjson.JSONDecodeError:
            message = None
        sender = message.get("from") if isinstance(message, dict) else None
        body = message.get("body") if isinstance(message, dict) else None
        if handler is None or not isinstance(sender, str) or not isinstance(body, dict):
            self._stats.cluster_messages[topic, "malformed"] += 1
            log.debug("redis: a malformed message on %s dropped", channel)
            return
        if sender == self.replica:
            return  # (Redis sends a publisher's own messages back to it)
        self._stats.cluster_messages[topic, "received"] += 1
        try:
            await handler(sender, body)
        except Exception as exc:
            log.warning("redis: a message on %s was not handled: %r", topic, exc)

    def _state(self, up: bool, exc: BaseException | None) -> None:
        if up == self.up and self._stats.redis_pubsub_up is not None:
            return
        self.up = up
        self._stats.redis_pubsub_up = up
        if up:
            log.info("redis: replicas' messages flowing (pub/sub subscribed)")
        else:
            log.warning(
                "redis: replicas' messages lost (%s); this replica hears no other until Redis"
                " answers (tried again every %g s)",
                _why(exc),
                self._retry_interval,
            )

    async def close(self) -> None:
        await self._publisher.aclose()
        await self._subscriber.aclose()


def _why(exc: BaseException | None) -> str:
    # The reason, never the URL (it may carry the password); redis-py names host and port.
    return (str(exc) or type(exc).__name__) if exc is not None else "unknown"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
