"""A backend reached over a child process's stdin/stdout (basic/transports/stdio).

One child serves every front-end request at once: the gateway gives each request its own id
(and progress token) on this hop, so two clients both using id 1 never see each other's replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable

import anyio

from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, StdioTarget
from gateway.errors import BackendTimeout, BackendUnavailable
from gateway.protocol import jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
from gateway.protocol.lines import LineSplitter
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

# Variables a child inherits from the gateway; everything else (secrets included) stays out
# unless the config names it under `env`.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")
# A single line larger than this is a broken or hostile child, not a message worth buffering.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Notifications queued for one request while its client reads slowly; beyond this, progress and
# log notifications (which later ones supersede) are dropped rather than stalling the child.
REQUEST_QUEUE = 256
# Reads from the child's stdout take up to this much at once.
READ_CHUNK = 256 * 1024
# Lines queued for the child beyond this make a writer wait for the pipe to drain.
WRITE_HIGH_WATER = 1024 * 1024
# Restart backoff: quick first retry so a crash costs one failed call, doubling to a ceiling so
# a child that cannot start does not spin; reset once a child has stayed up for a while.
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 10.0
STABLE_AFTER = 10.0
# Shutdown: time to exit after stdin closes, then after SIGTERM, before SIGKILL.
EXIT_GRACE = 2.0
TERM_GRACE = 2.0


class _Pending:
    """One request in flight on the child: its reply, and the notifications its client has not
    yet been given. A plain future and deque: no stream or task per request."""

    __slots__ = (
        "_waiter",
        "client_id",
        "client_token",
        "done",
        "dropped",
        "failure",
        "notes",
        "reply",
        "wants_logs",
    )

    def __init__(self, client_id: jsonrpc.RequestId, client_token: object, wants_logs: bool):
        self.client_id = client_id
        self.client_token = client_token
        self.wants_logs = wants_logs
        self.reply: Message | None = None
        self.failure = ""
        self.dropped = 0
        self.notes: deque[Message] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.done = False

    def finish(self, reply: Message | None, failure: str = "") -> None:
        self.reply, self.failure, self.done = reply, failure, True
        self._wake()

    def push(self, note: Message) -> None:
        if self.done:
            return
        if len(self.notes) >= REQUEST_QUEUE:
            self.dropped += 1
            return
        self.notes.append(note)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(extra or {})
    return env


class StdioBackend:
    transport = "stdio"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, StdioTarget)
        self._stats = stats or Stats()
        self.name = config.name
        self._target = config.target
        self._connect_timeout = config.connect_timeout
        self._request_timeout = config.request_timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = anyio.Event()
        self._last_problem = "not started yet"
        self.restarts = 0
        # Receives notifications that belong to no request (e.g. list changes).
        self.on_notification: Callable[[str, Message], None] | None = None

    # --- supervision -----------------------------------------------------------------------

    async def run(self) -> None:
        backoff = FIRST_BACKOFF
        while True:
            started = anyio.current_time()
            await self._run_child()
            if anyio.current_time() - started > STABLE_AFTER:
                backoff = FIRST_BACKOFF
            log.warning(
                "backend %s: restarting in %.2fs (%s)", self.name, backoff, self._last_problem
            )
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
            self.restarts += 1

    async def _run_child(self) -> None:
        command = [self._target.command, *self._target.args]
        try:
            # asyncio's own pipes (not anyio's wrappers): a write is then a synchronous call, so
            # each line goes out whole without a lock, and reads come in large chunks.
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(dict(self._target.env)),
                cwd=self._target.cwd,
                limit=READ_CHUNK,
            )
        except OSError as exc:
            self._last_problem = f"cannot start {command[0]!r}: {exc.strerror or exc}"
            log.error("backend %s: %s", self.name, self._last_problem)
            return
        log.info("backend %s: started pid %s", self.name, proc.pid)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain_stderr, proc)
                self._proc = proc
                self._ready.set()
                await self._read_stdout(proc)
                code = await proc.wait()
                self._last_problem = f"child exited with code {code}"
        finally:
            self._proc = None
            self._ready = anyio.Event()
            self._fail_all(f"backend {self.name!r} stopped: {self._last_problem}")
            with anyio.CancelScope(shield=True):
                await self._stop(proc)

    async def _stop(self, proc: asyncio.subprocess.Process) -> None:
        """Close stdin, wait, SIGTERM, wait, SIGKILL, reap (basic/transports/stdio, Shutdown)."""
        if proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        for grace, escalate in ((EXIT_GRACE, proc.terminate), (TERM_GRACE, proc.kill)):
            with anyio.move_on_after(grace):
                await proc.wait()
                return
            try:
                escalate()
            except ProcessLookupError:
                break
        await proc.wait()

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        child_log = logging.getLogger(f"gateway.backend.{self.name}")
        try:
            async for line in _lines(proc.stderr):
                child_log.info("%s", line.decode(errors="replace").rstrip())
        except _LineTooLong:
            child_log.warning("a stderr line over %d bytes; the rest is discarded", MAX_LINE_BYTES)
            # Keep reading: a child blocked on a full stderr pipe would stop answering.
            while await proc.stderr.read(READ_CHUNK):
                pass

    async def _read_stdout(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            async for line in _lines(proc.stdout):
                if line.strip():
                    self._stats.bytes["backend", "in"] += len(line) + 1
                    self._on_line(line)
        except _LineTooLong:
            self._last_problem = f"wrote a line over {MAX_LINE_BYTES} bytes"
            log.error("backend %s: %s; stopping it", self.name, self._last_problem)

    # --- inbound ---------------------------------------------------------------------------

    def _on_line(self, line: bytes) -> None:
        msg = jsonrpc.decode(line, keep=True)
        if isinstance(msg, jsonrpc.Invalid):
            log.warning(
                "backend %s: dropped a line that is not JSON-RPC: %s", self.name, msg.message
            )
            return
        kind = jsonrpc.kind(msg)
        if kind is jsonrpc.Kind.RESPONSE:
            pending = self._pending.get(msg["id"]) if isinstance(msg["id"], int) else None
            if pending is None:
                log.debug("backend %s: reply for unknown id %r dropped", self.name, msg["id"])
                return
            msg["id"] = pending.client_id
            pending.finish(msg)
        elif kind is jsonrpc.Kind.NOTIFICATION:
            self._on_notification(msg)
        else:
            # A modern server never sends requests (transports/stdio, Receiving Messages). The
            # reader must outlive a child whose stdin is already gone.
            with contextlib.suppress(BackendUnavailable):
                self._send(jsonrpc.error(msg["id"], -32601, "The gateway accepts no requests"))

    def _on_notification(self, msg: Message) -> None:
        method = msg["method"]
        params = jsonrpc.params(msg)
        target: _Pending | None = None
        if method == "notifications/progress":
            token = params.get("progressToken")
            target = self._pending.get(token) if isinstance(token, int) else None
            if target is not None:
                msg["params"] = {**params, "progressToken": target.client_token}
        elif isinstance(sub := jsonrpc.meta(msg).get(meta.SUBSCRIPTION_ID), int):
            target = self._pending.get(sub)  # a listen stream's acknowledgement or notification
        elif method == "notifications/message":
            # stdio gives a log message no request id; it can only belong to a request that
            # asked for logs, and is delivered only when exactly one such request is in flight.
            askers = [p for p in self._pending.values() if p.wants_logs]
            target = askers[0] if len(askers) == 1 else None
        if target is None:
            if self.on_notification is not None:
                self.on_notification(self.name, msg)
            else:
                log.debug("backend %s: notification %s matched no request", self.name, method)
            return
        target.push(msg)

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.finish(None, reason)

    # --- outbound --------------------------------------------------------------------------

    def _send(self, msg: Message) -> asyncio.StreamWriter:
        """Queue one line for the child; the caller awaits `drain` when the pipe is full."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            raise BackendUnavailable(self.name, self._last_problem)
        line = jsonrpc.encode(msg) + b"\n"
        self._stats.bytes["backend", "out"] += len(line)
        proc.stdin.write(line)
        return proc.stdin

    async def _write(self, msg: Message) -> None:
        stdin = self._send(msg)
        if stdin.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            # A child that stops reading its stdin: bounded like a request.
            try:
                async with asyncio.timeout(self._request_timeout):
                    await stdin.drain()
            except TimeoutError:
                raise BackendTimeout(self.name, "the child stopped reading its input") from None
            except (ConnectionError, OSError) as exc:
                raise BackendUnavailable(self.name, f"cannot write to the child: {exc!r}") from None

    async def _wait_ready(self) -> None:
        if self._proc is not None:
            return
        with anyio.move_on_after(self._connect_timeout):
            await self._ready.wait()
            return
        raise BackendUnavailable(self.name, f"not running ({self._last_problem})")

    async def request(
        self,
        msg: Message,
        sink: NotificationSink,
        param_headers: tuple[ParamHeader, ...] = (),
        *,
        long_lived: bool = False,
    ) -> Message:
        await self._wait_ready()
        bid = next(self._ids)
        params = jsonrpc.params(msg)
        req_meta = jsonrpc.meta(msg)
        token = req_meta.get(meta.PROGRESS_TOKEN)
        out = {**msg, "id": bid}
        if token is not None:
            out["params"] = {**params, "_meta": {**req_meta, meta.PROGRESS_TOKEN: bid}}
        pending = _Pending(msg["id"], token, meta.LOG_LEVEL in req_meta)
        self._pending[bid] = pending
        loop = asyncio.get_running_loop()
        # A timer that finishes the request with a timeout, rather than a cancel scope: one
        # heap entry per request.
        timer = None if long_lived else loop.call_later(self._request_timeout, pending.finish, None)
        try:
            await self._write(out)
            while True:
                while pending.notes:
                    await sink(pending.notes.popleft())
                if pending.done:
                    break
                await pending.wait()
        except asyncio.CancelledError:
            if not pending.done:
                self._cancel_on_child(bid, "cancelled by the client")
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(bid, None)
        if pending.dropped:
            log.warning(
                "backend %s: %d notifications dropped for a slow client", self.name, pending.dropped
            )
        if pending.reply is None:
            if not pending.failure:
                self._cancel_on_child(bid, "timed out at the gateway")
                raise BackendTimeout(self.name, f"no reply within {self._request_timeout:g}s")
            raise BackendUnavailable(self.name, pending.failure)
        return pending.reply

    def _cancel_on_child(self, bid: int, reason: str) -> None:
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": bid, "reason": reason},
        }
        with contextlib.suppress(BackendUnavailable):
            self._send(note)

    async def notify(self, msg: Message) -> None:
        await self._wait_ready()
        await self._write(msg)

    @property
    def up(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def in_flight(self) -> int:
        return len(self._pending)


class _LineTooLong(Exception):
    pass


async def _lines(stream: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a child's output, read in large chunks: with many requests in flight one
    read often carries many replies, and each is handled before the next read."""
    splitter = LineSplitter(MAX_LINE_BYTES)
    while chunk := await stream.read(READ_CHUNK):
        for line in splitter.feed(chunk):
            yield line
        if splitter.overflowing:
            raise _LineTooLong
