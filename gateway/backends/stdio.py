"""A backend reached over a child process's stdin/stdout (basic/transports/stdio).

One child serves every front-end request at once: the gateway gives each request its own id
(and progress token) on this hop, so two clients both using id 1 never see each other's replies.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from gateway.backends.base import NotificationSink
from gateway.config import BackendConfig, StdioTarget
from gateway.errors import BackendTimeout, BackendUnavailable
from gateway.protocol import jsonrpc, meta
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message
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
# Restart backoff: quick first retry so a crash costs one failed call, doubling to a ceiling so
# a child that cannot start does not spin; reset once a child has stayed up for a while.
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 10.0
STABLE_AFTER = 10.0
# Shutdown: time to exit after stdin closes, then after SIGTERM, before SIGKILL.
EXIT_GRACE = 2.0
TERM_GRACE = 2.0


@dataclass(eq=False)
class _Pending:
    client_id: jsonrpc.RequestId
    client_token: object
    wants_logs: bool
    send: MemoryObjectSendStream[Message]
    recv: MemoryObjectReceiveStream[Message]
    reply: Message | None = None
    failure: str = ""
    dropped: int = field(default=0)

    def finish(self, reply: Message | None, failure: str = "") -> None:
        self.reply, self.failure = reply, failure
        self.send.close()


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
        self._proc: anyio.abc.Process | None = None
        self._ready = anyio.Event()
        self._write_lock = anyio.Lock()
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
            proc = await anyio.open_process(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=child_env(dict(self._target.env)),
                cwd=self._target.cwd,
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

    async def _stop(self, proc: anyio.abc.Process) -> None:
        """Close stdin, wait, SIGTERM, wait, SIGKILL, reap (basic/transports/stdio, Shutdown)."""
        if proc.returncode is not None:
            return
        if proc.stdin is not None:
            await proc.stdin.aclose()
        for grace, escalate in ((EXIT_GRACE, proc.terminate), (TERM_GRACE, proc.kill)):
            with anyio.move_on_after(grace):
                await proc.wait()
                return
            escalate()
        await proc.wait()

    async def _drain_stderr(self, proc: anyio.abc.Process) -> None:
        assert proc.stderr is not None
        buffered = BufferedByteReceiveStream(proc.stderr)
        child_log = logging.getLogger(f"gateway.backend.{self.name}")
        try:
            while True:
                line = await buffered.receive_until(b"\n", MAX_LINE_BYTES)
                child_log.info("%s", line.decode(errors="replace").rstrip())
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound):
            return

    async def _read_stdout(self, proc: anyio.abc.Process) -> None:
        assert proc.stdout is not None
        buffered = BufferedByteReceiveStream(proc.stdout)
        while True:
            try:
                line = await buffered.receive_until(b"\n", MAX_LINE_BYTES)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return
            except anyio.DelimiterNotFound:
                self._last_problem = f"wrote a line over {MAX_LINE_BYTES} bytes"
                log.error("backend %s: %s; stopping it", self.name, self._last_problem)
                return
            if line.strip():
                self._stats.bytes["backend", "in"] += len(line)
                await self._on_line(line)

    # --- inbound ---------------------------------------------------------------------------

    async def _on_line(self, line: bytes) -> None:
        msg = jsonrpc.decode(line)
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
            # A modern server never sends requests (transports/stdio, Receiving Messages).
            await self._write(jsonrpc.error(msg["id"], -32601, "The gateway accepts no requests"))

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
        try:
            target.send.send_nowait(msg)
        except anyio.WouldBlock:
            target.dropped += 1
        except anyio.ClosedResourceError:
            pass

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.finish(None, reason)

    # --- outbound --------------------------------------------------------------------------

    async def _write(self, msg: Message) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None:
            raise BackendUnavailable(self.name, self._last_problem)
        line = jsonrpc.encode(msg) + b"\n"
        self._stats.bytes["backend", "out"] += len(line)
        try:
            async with self._write_lock:
                await proc.stdin.send(line)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
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
        send, recv = anyio.create_memory_object_stream[Message](REQUEST_QUEUE)
        pending = _Pending(msg["id"], token, meta.LOG_LEVEL in req_meta, send, recv)
        self._pending[bid] = pending
        try:
            timeout = math.inf if long_lived else self._request_timeout
            with send, recv, anyio.fail_after(timeout):
                await self._write(out)
                async for note in recv:
                    await sink(note)
        except TimeoutError:
            await self._cancel_on_child(bid, "timed out at the gateway")
            raise BackendTimeout(self.name, f"no reply within {self._request_timeout:g}s") from None
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._cancel_on_child(bid, "cancelled by the client")
            raise
        finally:
            self._pending.pop(bid, None)
        if pending.dropped:
            log.warning(
                "backend %s: %d notifications dropped for a slow client", self.name, pending.dropped
            )
        if pending.reply is None:
            raise BackendUnavailable(self.name, pending.failure or "no reply")
        return pending.reply

    async def _cancel_on_child(self, bid: int, reason: str) -> None:
        if bid not in self._pending:
            return
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": bid, "reason": reason},
        }
        with contextlib.suppress(BackendUnavailable):
            await self._write(note)

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
