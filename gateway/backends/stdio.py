"""A backend reached over a child process's stdin/stdout (basic/transports/stdio).

One child serves every front-end request at once (request bookkeeping: channel.py); this module
supervises the child: start, restart with backoff, stderr, shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
from collections.abc import AsyncIterator

import anyio

from gateway.backends.channel import Channel
from gateway.config import BackendConfig, StdioTarget
from gateway.errors import BackendError, BackendTimeout, BackendUnavailable
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message
from gateway.protocol.lines import LineSplitter
from gateway.telemetry.api import Stats

log = logging.getLogger("gateway.backend")

# Variables a child inherits from the gateway unless its target has `inherit_env`; everything
# else (secrets included) stays out unless the config names it under `env`. The list is the
# official SDKs' stdio-client default plus the locale and TMPDIR.
INHERITED_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")
# A single line larger than this is a broken or hostile child, not a message worth buffering.
MAX_LINE_BYTES = 64 * 1024 * 1024
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


def child_env(extra: dict[str, str] | None = None, inherit: bool = False) -> dict[str, str]:
    """A child's environment: the gateway's (all of it with `inherit`, else INHERITED_ENV),
    then `extra` over it."""
    if inherit:
        env = dict(os.environ)
    else:
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    env.update(extra or {})
    return env


class StdioBackend(Channel):
    transport = "stdio"

    def __init__(self, config: BackendConfig, stats: Stats | None = None) -> None:
        assert isinstance(config.target, StdioTarget)
        super().__init__(config.name, config.request_timeout)
        self._stats = stats or Stats()
        self._target = config.target
        self._connect_timeout = config.connect_timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._ready = anyio.Event()
        self.restarts = 0

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
                env=child_env(dict(self._target.env), self._target.inherit_env),
                cwd=self._target.cwd,
                limit=READ_CHUNK,
                # Its own session and process group: Ctrl-C in the gateway's terminal (SIGINT to
                # the foreground group) must reach the gateway alone, which drains its requests
                # before it stops the child.
                start_new_session=True,
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
                tg.start_soon(self._open, proc)
                await self._read_stdout(proc)
                code = await proc.wait()
                self._last_problem = f"child exited with code {code}"
        finally:
            self._proc = None
            self._ready = anyio.Event()
            self._fail_all(f"backend {self.name!r} stopped: {self._last_problem}")
            with anyio.CancelScope(shield=True):
                await self._stop(proc)

    async def _open(self, proc: asyncio.subprocess.Process) -> None:
        if self.on_start is not None:
            try:
                await self.on_start()
            except BackendError as exc:
                self._last_problem = f"opening failed: {exc}"
                log.error("backend %s: %s; stopping it", self.name, self._last_problem)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                return
        self._ready.set()

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
            if msg.response:  # the request it answers fails now instead of timing out
                self.on_message(jsonrpc.error(msg.id, codes.BACKEND_PROTOCOL_ERROR, msg.message))
            return
        self.on_message(msg)

    # --- outbound --------------------------------------------------------------------------

    def _send_soon(self, msg: Message) -> None:
        self._send(msg)

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
        # Ready once opened, not once started: a request arriving during a new child's probe
        # and handshake would otherwise be taken for one of the era still unknown.
        if self._ready.is_set():
            return
        with anyio.move_on_after(self._connect_timeout):
            await self._ready.wait()
            return
        raise BackendUnavailable(self.name, f"not running ({self._last_problem})")

    @property
    def up(self) -> bool:
        return self._proc is not None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


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
