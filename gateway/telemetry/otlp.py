"""The gateway's span processor and OTLP/HTTP exporter in one: finished spans are kept as they
end, and a task on the gateway's event loop encodes them (otlp_wire.py) a chunk at a time and
posts them in batches with aiohttp.

Why not the SDK's BatchSpanProcessor with its OTLP exporter: that encoder builds protobuf objects
per span and attribute (~40 us a span, against ~8 here), in a thread of its own that takes the
GIL from the event loop; and aiohttp is the gateway's HTTP. docs/decisions/0050 has the decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import gzip
import logging
import math
import random
import threading
import time
import zlib
from urllib.parse import urlsplit

import aiohttp
import anyio
import anyio.lowlevel
import anyio.to_thread
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway import __version__
from gateway.telemetry import otlp_wire
from gateway.telemetry.otlp_settings import Settings

log = logging.getLogger("gateway.telemetry.otlp")

CONTENT_TYPE = "application/x-protobuf"
# The statuses a collector uses to say "later": everything else is final.
RETRYABLE = frozenset({429, 502, 503, 504})
# The first pause before a retry, doubled each time, each drawn within +-20% so that gateways
# refused together do not come back together.
BACKOFF = 1.0
JITTER = 0.2
# How long an answer's body may be read (the collector's partial-success message; not used).
MAX_ANSWER = 64 * 1024
# Ended spans encoded at a time, between two turns of the event loop (~0.6 ms of encoding).
ENCODE_CHUNK = 64


def _where(url: str) -> str:
    """The URL without userinfo and query, which may hold credentials, for log lines."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return max(0.0, seconds) if math.isfinite(seconds) else None


class _Failed(Exception):
    """One POST that did not deliver: why, and whether to try again."""

    def __init__(self, why: str, retryable: bool, wait: float | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.retryable = retryable
        self.wait = wait


# (the Resource, the scope, spans): a buffer's group, keyed by the objects' ids, which are the
# same for every span of a tracer (hashing a Resource serialises its attributes).
_Ended = tuple[Resource, InstrumentationScope | None, list[ReadableSpan]]
_Encoded = tuple[Resource, InstrumentationScope | None, list[bytes]]


class OtlpSpanProcessor(SpanProcessor):
    """Keeps sampled spans as they end; `run`, a task on the event loop, encodes them every
    ENCODE_CHUNK spans and exports them in batches.

    Why not encode in `on_end`: measured in the gateway under load, a span encoded among the
    request's other work costs about twice what a run of spans encoded together does (the
    encoder's code and caches stay hot). Why not keep them until a whole batch is due (as the
    SDK's batch processor does): hundreds of ended spans held at once cost the request path
    ~10 us a span in caches (measured too); encoded, a span is one bytes object.

    `on_end` may be called from any thread; `run`, `flush` and `close` belong to the loop.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Spans by outcome: exported (the collector took them), dropped (the buffer was full,
        # or tracing had shut down), failed (their batch was refused or never reached it).
        self.spans = {"exported": 0, "dropped": 0, "failed": 0}
        self._lock = threading.Lock()
        self._ended: dict[tuple[int, int], _Ended] = {}  # (under the lock)
        self._ending = 0  # spans in `_ended`
        # Ended spans that wake `run` to encode them (a batch may be smaller than a chunk).
        self._chunk = min(ENCODE_CHUNK, settings.max_export_batch_size)
        self._encoded: dict[tuple[int, int], _Encoded] = {}  # (the loop's)
        self._queued = 0  # spans in both
        self._closed = False
        self._encoder = otlp_wire.Encoder()  # the loop's: spans are encoded by the export task
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._ready: asyncio.Event | None = None
        self._sending: asyncio.Lock | None = None
        self._session: aiohttp.ClientSession | None = None
        # The batch being delivered (shielded: a batch cancelled halfway would be lost, or
        # sent twice by the final flush), and the loop time by which shutdown wants it done.
        self._delivering: anyio.CancelScope | None = None
        self._deadline: float | None = None
        self._flush_asked = False

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def unencoded(self) -> int:
        """Ended spans not yet encoded (at most a chunk, while `run` keeps up)."""
        return self._ending

    # --- the SDK's side (any thread) ---

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        resource, scope = span.resource, span.instrumentation_scope
        key = (id(resource), id(scope))
        with self._lock:
            if self._queued >= self.settings.max_queue_size or self._closed:
                self.spans["dropped"] += 1
                return
            group = self._ended.get(key)
            if group is None:
                group = self._ended[key] = (resource, scope, [])
            group[2].append(span)
            self._queued += 1
            self._ending += 1
            chunk = self._ending == self._chunk
        if chunk:
            self._wake()

    def shutdown(self) -> None:
        """The SDK's shutdown (TracerProvider.shutdown, at exit too): no more spans. From
        another thread, with the loop running, what is buffered is flushed first (bounded by
        the export timeout); on the loop's thread, or with no loop, it cannot wait, so it only
        marks the processor closed (the gateway flushes on its own way out)."""
        self.force_flush(int(self.settings.export_timeout * 1000))
        with self._lock:
            self._closed = True
        self._wake()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        loop = self._loop
        if loop is None or not loop.is_running() or self._loop_thread == threading.get_ident():
            self._flush_asked = True
            self._wake()
            return not self._queued
        future = asyncio.run_coroutine_threadsafe(self.flush(), loop)
        try:
            future.result(timeout_millis / 1000)
        except TimeoutError:
            future.cancel()
            return False
        return not self._queued

    def _wake(self) -> None:
        loop, ready = self._loop, self._ready
        if loop is None or ready is None:
            return
        if self._loop_thread == threading.get_ident():
            ready.set()
        elif loop.is_running():
            with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
                loop.call_soon_threadsafe(ready.set)

    # --- the event loop's side ---

    def _attach(self) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self._ready = asyncio.Event()
            self._sending = asyncio.Lock()

    async def run(self) -> None:
        """Encodes every ENCODE_CHUNK spans; exports until cancelled: every schedule delay, or
        as soon as a batch is full."""
        self._attach()
        assert self._ready is not None
        if self._ending >= self._chunk:
            self._ready.set()  # (filled before this task ran, when no one could be woken)
        due = anyio.current_time() + self.settings.schedule_delay
        while True:
            with anyio.move_on_at(due):
                await self._ready.wait()
            self._ready.clear()
            await self._encode_ended()
            # Before the delay is up: full batches only, the rest waits for it.
            whole = anyio.current_time() >= due or self._closed or self._flush_asked
            self._flush_asked = False
            if whole or self._queued >= self.settings.max_export_batch_size:
                await self._export(whole)
            if whole:
                due = anyio.current_time() + self.settings.schedule_delay

    async def flush(self) -> None:
        """Everything buffered now, in batches, bounded by the export timeout (or by what is
        left of it once shutdown has begun)."""
        self._attach()
        deadline = self._deadline or anyio.current_time() + self.settings.export_timeout
        with anyio.move_on_at(deadline):
            await self._export(whole=True, deadline=deadline)

    def stopping(self) -> None:
        """Shutdown begins (on the loop, before `run` is cancelled): the batch in flight, and
        then `close`'s flush, have the export timeout from now between them."""
        self._deadline = anyio.current_time() + self.settings.export_timeout
        if self._delivering is not None:
            self._delivering.deadline = min(self._delivering.deadline, self._deadline)

    async def close(self) -> None:
        """The gateway's way out: no more spans, what is buffered is sent (bounded by the
        export timeout, counted from `stopping`), and the connection is closed."""
        with self._lock:
            self._closed = True
        try:
            await self.flush()
        finally:
            await self._close_session()

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _export(self, whole: bool, deadline: float = math.inf) -> None:
        """Batches until the buffer is empty (`whole`) or holds less than a full batch."""
        assert self._sending is not None
        async with self._sending:  # one POST in flight
            limit = self.settings.max_export_batch_size
            while self._queued and (whole or self._queued >= limit):
                await self._encode_ended()
                body, count = self._take(limit)
                await self._deliver(body, count, deadline)

    async def _encode_ended(self) -> None:
        """The spans ended so far, encoded (the loop gets a turn every ENCODE_CHUNK)."""
        with self._lock:
            ended, self._ended, self._ending = self._ended, {}, 0
        encoder = self._encoder
        done = 0
        for key, (resource, scope, spans) in ended.items():
            group = self._encoded.get(key)
            if group is None:
                group = self._encoded[key] = (resource, scope, [])
            out = group[2]
            for span in spans:
                out.append(encoder.span(span))
                done += 1
                if done % ENCODE_CHUNK == 0:
                    await anyio.lowlevel.checkpoint()

    def _take(self, limit: int) -> tuple[bytes, int]:
        """Up to `limit` encoded spans out of the buffer, as one request body."""
        taken: list[_Encoded] = []
        count = 0
        for key, (resource, scope, spans) in list(self._encoded.items()):
            room = limit - count
            if room <= 0:
                break
            part = spans[:room]
            if len(part) == len(spans):
                del self._encoded[key]
            else:
                del spans[:room]
            taken.append((resource, scope, part))
            count += len(part)
        with self._lock:
            self._queued -= count
        by_resource: dict[
            int, tuple[Resource, list[tuple[InstrumentationScope | None, list[bytes]]]]
        ]
        by_resource = {}
        for resource, scope, encoded in taken:
            by_resource.setdefault(id(resource), (resource, []))[1].append((scope, encoded))
        return otlp_wire.request(by_resource.values()), count

    async def _deliver(self, body: bytes, count: int, deadline: float) -> None:
        """One batch, retried while the collector says "later" and the export timeout allows;
        never raises (one warning line when the batch is lost). Not cancelled halfway: a
        cancellation waits for it, which its own export timeout (and `stopping`) bounds."""
        why: str | None = "shutdown's export timeout passed"
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = min(deadline, self._deadline or math.inf)
            self._delivering = scope
            try:
                why = await self._attempts(body)
            except Exception as exc:  # a bug here must not end tracing for the process's life
                why = type(exc).__name__
            finally:
                self._delivering = None
        if why is None:
            self.spans["exported"] += count
            return
        self.spans["failed"] += count
        log.warning(
            "OTLP export of %d spans to %s failed: %s", count, _where(self.settings.url), why
        )

    async def _attempts(self, body: bytes) -> str | None:
        settings = self.settings
        deadline = time.monotonic() + settings.export_timeout
        headers = {**settings.headers, "Content-Type": CONTENT_TYPE}
        if settings.compression == "gzip":
            body = await anyio.to_thread.run_sync(gzip.compress, body)
            headers["Content-Encoding"] = "gzip"
        elif settings.compression == "deflate":
            body = await anyio.to_thread.run_sync(zlib.compress, body)
            headers["Content-Encoding"] = "deflate"
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "the export timeout passed"
            try:
                await self._post(body, headers, min(settings.timeout, left))
            except _Failed as failed:
                if not failed.retryable:
                    return failed.why
                wait = failed.wait
                if wait is None:
                    wait = BACKOFF * 2**attempt * random.uniform(1 - JITTER, 1 + JITTER)
                if wait >= deadline - time.monotonic():
                    return f"{failed.why}; no time left to try again"
                attempt += 1
                await anyio.sleep(wait)
            else:
                return None

    async def _post(self, body: bytes, headers: dict[str, str], seconds: float) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1, ssl=self.settings.tls or True),
                headers={"User-Agent": f"mcp-gateway/{__version__}"},
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        try:
            async with self._session.post(
                self.settings.url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=seconds),
                allow_redirects=False,
                proxy=self.settings.proxy,
            ) as answer:
                await answer.content.read(MAX_ANSWER)
                status = answer.status
                retry_after = answer.headers.get("Retry-After")
        except TimeoutError:
            raise _Failed(f"no answer within {seconds:g} s", retryable=True) from None
        except aiohttp.ClientError as exc:
            raise _Failed(type(exc).__name__, retryable=True) from None
        except OSError as exc:
            raise _Failed(exc.strerror or type(exc).__name__, retryable=True) from None
        if 200 <= status < 300:
            return
        retryable = status in RETRYABLE
        wait = _retry_after(retry_after) if retryable else None
        raise _Failed(f"HTTP {status}", retryable, wait)
