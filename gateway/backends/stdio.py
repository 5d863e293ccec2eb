"""A backend reached over a child process's stdin/stdout (basic/transports/stdio).

One child serves every front-end request at once (request bookkeeping: channel.py); this module
supervises the child: start, restart with backoff, stderr, shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
from collections import deque
from collections.abc import AsyncIterator, Awaitable

import anyio
import orjson

from gateway.backends.channel import Channel
from gateway.backends.child import Child, spawn
from gateway.backends.health import Health
from gateway.config import BackendConfig, StdioTarget
from gateway.errors import BackendError, BackendTimeout, BackendUnavailable
from gateway.origin import Origin
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
# Restart backoff of a child that had served: quick first retry so a crash costs one failed
# call, doubling to a ceiling so a child that crashes as it serves does not spin; reset once a
# child has stayed up for a while. (One that never served is down: health.py's backoff.)
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 10.0
STABLE_AFTER = 10.0
# A child whose stdout ends is given this long to exit (so that its exit code and last stderr
# lines can say why) before its requests fail; one still running then is stopped.
EOF_GRACE = 0.2
# Requests wait for a restart only this far off: past it (a child that keeps crashing soon after
# it starts, its backoff grown) they fail at once instead of waiting out the backoff.
RESTART_WAIT = 1.0
# Shutdown: time to exit after stdin closes, then after SIGTERM, before SIGKILL.
EXIT_GRACE = 2.0
TERM_GRACE = 2.0
# A child that exits is reported with its last stderr lines (each cut to this many characters),
# read for at most STDERR_GRACE seconds after it has gone.
STDERR_TAIL_LINES = 5
STDERR_TAIL_CHARS = 200
STDERR_GRACE = 1.0
# A stderr line is logged with at most this many characters (the rest counted, never held): a
# child's long line must not make a log record of megabytes, nor cost memory or time.
STDERR_LOG_CHARS = 8192
# A child's stderr line that looks like an error is logged at WARNING, any other at INFO (many
# servers log everything to stderr, so it cannot all be a warning): one of these words in any
# case, an exception's class name (`ValueError`, `IOException`), or a glog/klog error prefix
# (`E1206 12:00:00.000000 ...`, `F...`).
ERROR_LINE = re.compile(
    r"(?i:\b(?:error|exception|traceback|fatal|panic|critical)\b)"
    r"|\b[A-Z]\w*(?:Error|Exception)\b"
    r"|^[EF]\d{4} "
)
# A UTF-16 surrogate written as a JSON escape (orjson takes none, paired or not).
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


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
        self._start_timeout = config.start_timeout
        self._proc: Child | None = None
        self._ready = anyio.Event()
        self._settled = anyio.Event()  # set (and replaced) when the child is ready or gone
        self._opening_failure: str | None = None
        self._exit_code: int | None = None
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.health = Health(config.name)
        self.restarts = 0
        self._restart_at = 0.0  # when the supervisor starts the next child (after a backoff)
        # Lines written within one turn of the event loop go to the child's stdin together, in
        # one write at the end of the turn: under load, one system call for many requests
        # instead of one each (bench/README.md, issue 34). Each batch is for the child it was
        # made for; one that has exited by the flush takes nothing.
        self._outbox: list[bytes] = []
        self._outbox_size = 0
        self._outbox_for: Child | None = None

    # --- supervision -----------------------------------------------------------------------

    async def run(self) -> None:
        quick = FIRST_BACKOFF
        while True:
            started = anyio.current_time()
            served = await self._run_child()
            if served:
                # It had served: restarted soon (a crash costs one failed call), and requests
                # wait for it meanwhile, as for any starting child.
                if anyio.current_time() - started > STABLE_AFTER:
                    quick = FIRST_BACKOFF
                delay, quick = quick, min(quick * 2, MAX_BACKOFF)
                log.warning(
                    "backend %s: %s; restarting in %.2fs",
                    self.name,
                    self._last_problem,
                    delay,
                    extra=self._exit_details(),
                )
            else:
                # It never served: down, its requests fail at once, retried with backoff.
                delay = self.health.failed(self._last_problem, **self._exit_details())
            self._restart_at = anyio.current_time() + delay
            self._notify()
            await anyio.sleep(delay)
            self.restarts += 1

    def _exit_details(self) -> dict[str, object]:
        return {"exit_code": self._exit_code, "stderr_tail": list(self._stderr_tail)}

    async def _run_child(self) -> bool:
        """One child, from start to reaping; whether it became ready (served)."""
        command = [self._target.command, *self._target.args]
        self._exit_code = None
        self._stderr_tail.clear()
        try:
            # Streams of asyncio's (not anyio's wrappers): a write is then a synchronous call,
            # so each line goes out whole without a lock, and reads come in large chunks. The
            # child has its own session and process group: Ctrl-C in the gateway's terminal
            # (SIGINT to the foreground group) must reach the gateway alone, which drains its
            # requests before it stops the child.
            proc = await spawn(
                command,
                env=child_env(dict(self._target.env), self._target.inherit_env),
                cwd=self._target.cwd,
                limit=READ_CHUNK,
            )
        except OSError as exc:
            self._last_problem = f"cannot start {command[0]!r}: {exc.strerror or exc}"
            return False
        # Once per state change: retries of a child that is down are not worth a line each.
        level = logging.DEBUG if self.health.down else logging.INFO
        log.log(level, "backend %s: started pid %s", self.name, proc.pid)
        self._opening_failure = None
        stderr_done = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._drain_stderr, proc, stderr_done)
                self._proc = proc
                tg.start_soon(self._open, proc)
                if self.on_start is not None:
                    tg.start_soon(self._watch_opening, proc, self._ready)
                broken = await self._read_stdout(proc)
                if broken is None:
                    # Its stdout is closed: nothing it does can answer a request any more.
                    # Whatever waits on it (the opening's probe too) fails now, with its exit
                    # code and last words if it has exited; one still running is stopped below.
                    with anyio.move_on_after(EOF_GRACE):
                        self._exit_code = await proc.wait()
                    if self._exit_code is not None:
                        with anyio.move_on_after(STDERR_GRACE):
                            await stderr_done.wait()  # (a grandchild may hold stderr open)
                self._last_problem = broken or self._opening_failure or self._describe_exit()
                self._fail_all(f"stopped: {self._last_problem}")
                tg.cancel_scope.cancel()
        finally:
            served = self._ready.is_set()
            self._proc = None
            self._ready = anyio.Event()
            self._fail_all(f"stopped: {self._last_problem}")
            with anyio.CancelScope(shield=True):
                await self._stop(proc)
        return served

    def _describe_exit(self) -> str:
        code = self._exit_code
        if code is None:
            what = "closed its stdout while still running"
        elif code < 0:
            what = f"child killed by signal {-code}"
        else:
            what = f"child exited with code {code}"
        if self._stderr_tail:
            what += "; stderr: " + " | ".join(self._stderr_tail)
        return what

    async def _open(self, proc: Child) -> None:
        if self.on_start is not None:
            try:
                await self.on_start()
            except BackendError as exc:
                # Logged with the rest when the child is gone (once per state change).
                self._opening_failure = f"opening failed: {exc}"
                log.debug("backend %s: %s; stopping it", self.name, self._opening_failure)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # (with what it started)
                return
        self._ready.set()
        self.health.recovered()
        self._notify()

    async def _watch_opening(self, proc: Child, ready: anyio.Event) -> None:
        """A child that has not finished its opening within start_timeout (silent, or stuck in
        its handshake) is stopped: it is down, and its waiting requests fail now rather than
        after the opening's own bounds (connect_timeout, then request_timeout)."""
        with anyio.move_on_after(self._start_timeout):
            await ready.wait()
            return
        self._opening_failure = f"no answer to its opening within {self._start_timeout:g}s"
        log.debug("backend %s: %s; stopping it", self.name, self._opening_failure)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # (with what it started)

    def _notify(self) -> None:
        """Wake the requests waiting for this child to be ready or known down."""
        self._settled.set()
        self._settled = anyio.Event()

    async def _stop(self, proc: Child) -> None:
        """Close stdin, wait, SIGTERM, wait, SIGKILL, reap (basic/transports/stdio, Shutdown)."""
        try:
            await self._end(proc)
        finally:
            proc.close()

    async def _end(self, proc: Child) -> None:
        if proc.returncode is not None:
            return
        proc.stdin.close()
        # The signals go to the child's process group (it leads one: start_new_session), so
        # what it started (npx's node, a shell's command) stops with it.
        for grace, sig in ((EXIT_GRACE, signal.SIGTERM), (TERM_GRACE, signal.SIGKILL)):
            with anyio.move_on_after(grace):
                await proc.wait()
                return
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
        await proc.wait()

    async def _drain_stderr(self, proc: Child, done: anyio.Event) -> None:
        """Log the child's stderr line by line, each line's head only: a line of any length
        costs its head and a count (linear time, bounded memory), so the child never waits on
        a full pipe."""
        child_log = logging.getLogger(f"gateway.backend.{self.name}")
        tail = self._stderr_tail
        lines = HeadLines(STDERR_LOG_CHARS * 4)  # (a character is up to 4 bytes of UTF-8)
        try:
            while chunk := await proc.stderr.read(READ_CHUNK):
                for head, cut in lines.feed(chunk):
                    text = head.decode(errors="replace").rstrip()
                    if len(text) > STDERR_LOG_CHARS:
                        cut += len(text[STDERR_LOG_CHARS:].encode(errors="replace"))
                        text = text[:STDERR_LOG_CHARS]
                    if cut:
                        text = f"{text}... ({cut} more bytes)"
                    level = logging.WARNING if ERROR_LINE.search(text) else logging.INFO
                    # (The log's formatter keeps it one line: a child cannot forge records.)
                    child_log.log(level, "%s", text, extra={"backend": self.name})
                    if text:
                        tail.append(text[:STDERR_TAIL_CHARS])
        finally:
            done.set()

    async def _read_stdout(self, proc: Child) -> str | None:
        """Until the child's stdout ends; what is wrong with the child if it broke the framing."""
        try:
            async for line in _lines(proc.stdout):
                if line.strip():
                    self._stats.bytes["backend", "in"] += len(line) + 1
                    self._on_line(line)
        except _LineTooLong:
            problem = f"wrote a line over {MAX_LINE_BYTES} bytes"
            log.error("backend %s: %s; stopping it", self.name, problem)
            return problem
        return None

    # --- inbound ---------------------------------------------------------------------------

    def _on_line(self, line: bytes) -> None:
        msg = jsonrpc.decode(line, keep=True)
        if isinstance(msg, jsonrpc.Invalid):
            log.warning(
                "backend %s: dropped a line that is not JSON-RPC: %s", self.name, msg.message
            )
            # The request it answers fails now instead of timing out.
            if msg.response:
                self._reply_unusable(msg.id, f"its reply is not JSON-RPC: {msg.message}")
            elif msg.code == codes.PARSE_ERROR and (bid := salvaged_id(line)) is not None:
                self._reply_unusable(bid, f"its reply is not valid JSON: {msg.message}")
            return
        if self.tap is not None:
            self.tap.record("backend", "in", msg, backend=self.name)  # (before ids are restored)
        self.on_message(msg)

    # --- outbound --------------------------------------------------------------------------

    def _send_soon(self, msg: Message, origin: Origin) -> None:
        self._send(msg)

    def _send(self, msg: Message) -> asyncio.StreamWriter:
        """Queue one line for the child (written at the end of this turn of the loop); the
        caller awaits `_drain` when the pipe is backed up."""
        proc = self._proc
        if proc is None or proc.stdin.is_closing():
            raise BackendUnavailable(self.name, self._last_problem)
        line = jsonrpc.encode(msg) + b"\n"
        self._stats.bytes["backend", "out"] += len(line)
        if self.tap is not None:
            self.tap.record("backend", "out", msg, backend=self.name)
        if self._outbox_for is not proc:
            self._flush()  # (what was queued for an earlier child is dropped there)
            self._outbox_for = proc
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(line)
        self._outbox_size += len(line)
        return proc.stdin

    def _flush(self) -> None:
        proc, lines = self._outbox_for, self._outbox
        if proc is None:
            return
        self._outbox, self._outbox_size, self._outbox_for = [], 0, None
        if proc is self._proc and not proc.stdin.is_closing():
            proc.stdin.write(lines[0] if len(lines) == 1 else b"".join(lines))

    async def _write(self, msg: Message, origin: Origin) -> None:
        waiting = self._put(msg, origin)
        if waiting is not None:
            await waiting

    def _put(self, msg: Message, origin: Origin) -> Awaitable[None] | None:
        stdin = self._send(msg)
        if self._outbox_size + stdin.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            self._flush()
            return self._drain(stdin)
        return None  # (the common case: queued, nothing to wait for)

    async def _drain(self, stdin: asyncio.StreamWriter) -> None:
        # A child that stops reading its stdin: bounded like a request.
        try:
            with anyio.fail_after(self._request_timeout):
                await stdin.drain()
        except TimeoutError:
            raise BackendTimeout(self.name, "the child stopped reading its input") from None
        except (ConnectionError, OSError) as exc:
            raise BackendUnavailable(self.name, f"cannot write to the child: {exc!r}") from None

    def _ready_now(self) -> bool:
        return self._ready.is_set()

    async def _wait_ready(self) -> None:
        if self._ready.is_set():
            return
        # A starting child is waited for as long as its opening may take (the first answer
        # within connect_timeout, the handshake within request_timeout); a child known to be
        # down fails at once.
        with anyio.move_on_after(self._connect_timeout + self._request_timeout):
            while not self._ready.is_set():
                if self.health.down:
                    raise self.health.refusal()
                left = self._restart_at - anyio.current_time()
                if left > RESTART_WAIT:
                    # A child that keeps crashing soon after its start: not worth the wait.
                    raise BackendUnavailable(
                        self.name, f"{self._last_problem}; restarting in {left:.1f}s"
                    )
                await self._settled.wait()
            return
        raise BackendUnavailable(self.name, f"not ready ({self._last_problem})")

    @property
    def up(self) -> bool:
        return self._ready.is_set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running_pids(self) -> tuple[int, ...]:
        """Its child's pid while the child runs, not yet reaped (/metrics reads its CPU and
        memory from /proc; a reaped pid may be another process's by then)."""
        proc = self._proc
        return (proc.pid,) if proc is not None and proc.returncode is None else ()


def salvaged_id(line: bytes) -> object:
    """The id of a reply that orjson refused only for its text (bytes that are not UTF-8, an
    escaped lone surrogate), read leniently so that its request can fail at once; None when
    the line is no reply at all. Only lines that failed to parse come here: the slow path is
    rare."""
    text = _SURROGATE.sub(r"\\ufffd", line.decode(errors="replace"))
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict or "method" in value or not ("result" in value or "error" in value):
        return None
    return value.get("id")


class HeadLines:
    """Lines split from chunks, each as its first `keep` bytes and the count of the rest: one
    pass over each chunk, and never more than `keep` bytes held, however long a line is."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._head = bytearray()
        self._cut = 0

    def feed(self, chunk: bytes) -> list[tuple[bytes, int]]:
        out: list[tuple[bytes, int]] = []
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            self._take(chunk, start, end)
            out.append((bytes(self._head), self._cut))
            self._head.clear()
            self._cut = 0
            start = end + 1
        self._take(chunk, start, len(chunk))
        return out

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        room = max(self._keep - len(self._head), 0)
        kept = min(end - start, room)
        self._head += chunk[start : start + kept]
        self._cut += end - start - kept


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
