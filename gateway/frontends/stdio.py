"""The stdio front end (basic/transports/stdio): one JSON-RPC message per line in and out.

stdout carries protocol messages only; the gateway logs to stderr. Each request runs in its own
task so a slow call never holds up the next line, and `notifications/cancelled` cancels it.

A client that opens with `initialize` is a legacy client: the process then holds its session
(frontends/legacy/front.py) and its requests are served through it; requests with modern `_meta` are
served statelessly either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO

import anyio
import anyio.abc
import anyio.to_thread
from anyio.streams.file import FileReadStream

from gateway.config import DEFAULT_STDOUT_STALL_TIMEOUT
from gateway.core.dispatcher import Dispatcher
from gateway.frontends.legacy.front import LegacyFront, Session
from gateway.origin import STDIO_ORIGIN, Origin
from gateway.protocol import codes, jsonrpc, meta
from gateway.protocol.jsonrpc import Message, RequestId
from gateway.protocol.lines import LineSplitter

log = logging.getLogger("gateway.stdio")

# Larger lines are refused: one message must fit in memory, and no real request is this big.
MAX_LINE_BYTES = 64 * 1024 * 1024
# Bytes queued for stdout beyond which a writer waits for the client to read.
WRITE_HIGH_WATER = 256 * 1024
# After stdin closes (or SIGINT/SIGTERM), in-flight requests get this long to finish before
# they are cancelled, each answered with GATEWAY_SHUTTING_DOWN.
DRAIN_TIMEOUT = 5.0
# That last error reply gets this long to be written (the client may have stopped reading).
CUT_REPLY_TIMEOUT = 1.0
# What stdout's failing to be written means: the client closed its end (or it went away).
_LOST = (
    BrokenPipeError,
    ConnectionResetError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


class End(enum.Enum):
    """How `serve` ended."""

    INPUT = "the end of stdin"
    STOPPED = "stop() (a signal)"
    OUTPUT_CLOSED = "stdout closed by the client"
    STALLED = "the client stopped reading the last replies"


class StdioFrontend:
    def __init__(
        self,
        dispatcher: Dispatcher,
        inbound: anyio.abc.ByteReceiveStream,
        outbound: anyio.abc.ByteSendStream,
        origin: Origin = STDIO_ORIGIN,
        stall_timeout: float = DEFAULT_STDOUT_STALL_TIMEOUT,
    ) -> None:
        self._dispatcher = dispatcher
        # Every request's origin: stdio has one caller, the parent process, under the identity
        # the config gives it (if any), so the policy judges its requests too.
        self._origin = origin
        self._legacy = LegacyFront(dispatcher)
        self._session: Session | None = None  # set by a legacy client's `initialize`
        self._in = inbound
        self._out = outbound
        self._write_lock = anyio.Lock()
        # Plain asyncio tasks, not a task group's: spawning one is a fraction of the cost, and
        # `serve` still cancels and awaits every one of them before it returns.
        self._in_flight: dict[RequestId, asyncio.Task[None]] = {}
        self._notifying: set[asyncio.Task[None]] = set()
        # Requests answered whose reply waits for the client to read (stdout backed up): no
        # longer in flight, so the drain does not wait for them; the final flush does.
        self._writing: set[asyncio.Task[None]] = set()
        self._idle = anyio.Event()
        self._reading = anyio.CancelScope()
        self._draining = anyio.CancelScope()  # (entered once stdin ends)
        self._cutting = False  # the drain is over: a request cancelled now is answered
        self._hurried = False  # cut at once (a second signal), not at the drain's end
        self._gone = False  # stdout is closed: nothing more can reach the client
        self._stall_timeout = stall_timeout
        self.ending = False  # stdin ended (or `stop`): shutdown is under way
        if isinstance(outbound, _PipeSend):
            outbound.on_lost = self._output_lost

    def stop(self) -> None:
        """Stop reading, as if stdin had ended; `serve` then drains and returns."""
        self._reading.cancel()

    def hurry(self) -> None:
        """Stop now (a second signal): reading ends, and every request in flight is cut at
        once, each answered with GATEWAY_SHUTTING_DOWN; `serve` returns once those replies
        are written."""
        self._hurried = True
        self._reading.cancel()
        self._draining.cancel()

    async def serve(self) -> End:
        """Serve until stdin ends (or `stop`), then let in-flight requests drain (bounded), and
        return once every reply is written, however slowly the client reads; only a client
        that reads nothing for `stall_timeout` is given up on (STALLED)."""
        try:
            end = await self._serve()
            flushed = await self._flush()
        finally:
            # Replies that waited on the pipe are in it now, or never will be.
            await _cancel(self._writing)
        if not flushed:
            return End.STALLED
        return End.OUTPUT_CLOSED if self._gone else end

    async def _serve(self) -> End:
        """The client is gone or going, so open listen streams end gracefully at once rather
        than holding the drain open."""
        try:
            with self._reading:
                async for line in self._lines():
                    if line.strip():
                        await self._on_line(line)
            end = End.STOPPED if self._reading.cancel_called else End.INPUT
            self.ending = True
            self._dispatcher.close_streams()
            if self._in_flight:
                self._draining.deadline = anyio.current_time() + DRAIN_TIMEOUT
                with self._draining:
                    await self._idle.wait()
            return end
        finally:
            self.ending = self._cutting = True
            tasks = {*self._in_flight.values(), *self._notifying}
            if self._session is not None:
                self._session.close()
                if self._session.watcher is not None:
                    tasks.add(self._session.watcher)
            await _cancel(tasks)

    async def _flush(self) -> bool:
        """Every reply handed over before `serve` returns (the process exits next, and what is
        still buffered would be lost); False when the client stopped reading."""
        out = self._out
        if self._gone:
            return True
        if isinstance(out, _PipeSend):
            try:
                left = await out.flush(self._stall_timeout)
            except _LOST:
                self._output_lost()
                return True
            if left:
                return self._stalled(left)
        # The writers finish now (a pipe's: their drain returns; a file's: its worker thread).
        writers = [*self._writing]
        with anyio.move_on_after(self._stall_timeout) as waited:
            await asyncio.gather(*writers, return_exceptions=True)
        return not waited.cancelled_caught or self._stalled(len(writers))

    def _stalled(self, left: int) -> bool:
        log.error(
            "stdout: the client read nothing for %g s with %d %s still to write "
            "(shutdown.stdout_stall_timeout); giving up on it",
            self._stall_timeout,
            left,
            "bytes of replies" if isinstance(self._out, _PipeSend) else "replies",
        )
        return False

    def _output_lost(self, why: str = "") -> None:
        """stdout is closed: no reply can reach the client any more, so serving ends now and
        what runs for it is cancelled (each backend is told), without replies."""
        if self._gone:
            return
        self._gone = True
        if why:
            log.warning("stdout cannot be written (%s): shutting down", why)
        else:
            log.warning("stdout was closed by the client: shutting down")
        self._reading.cancel()
        self._draining.cancel()
        for task in self._in_flight.values():
            task.cancel()

    async def _lines(self) -> AsyncIterator[bytes]:
        """stdin's lines, read in chunks: a client with many requests in flight often sends
        several lines per read, and each is handled before the next read."""
        splitter = LineSplitter(MAX_LINE_BYTES)
        while True:
            try:
                chunk = await self._in.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return
            for line in splitter.feed(chunk):
                self._dispatcher.telemetry.stats.bytes["frontend", "in"] += len(line) + 1
                yield line
            if splitter.overflowing:
                log.error("stdin: a line over %d bytes; stopping", MAX_LINE_BYTES)
                return

    async def _on_line(self, line: bytes) -> None:
        msg = jsonrpc.decode(line)
        if isinstance(msg, jsonrpc.Invalid):
            await self._write(jsonrpc.error(msg.id, msg.code, msg.message))
            return
        kind = jsonrpc.kind(msg)
        if kind is jsonrpc.Kind.REQUEST:
            if msg["id"] in self._in_flight:
                await self._write(
                    jsonrpc.error(msg["id"], codes.INVALID_REQUEST, "This id is already in flight")
                )
                return
            if self._session is None and meta.is_legacy_opening(msg):
                self._session = Session(deliver=self._write)
            if not self._in_flight:
                self._idle = anyio.Event()
            self._in_flight[msg["id"]] = asyncio.get_running_loop().create_task(self._run(msg))
        elif kind is jsonrpc.Kind.NOTIFICATION:
            if msg["method"] == "notifications/cancelled":
                # Handled here: neither the dispatcher nor the session sees it to tap it.
                telemetry = self._dispatcher.telemetry
                if telemetry.tapping:
                    telemetry.record("frontend", "in", msg)
                self._cancel(jsonrpc.params(msg).get("requestId"))
            else:
                session = self._session
                notified = (
                    self._dispatcher.notify(msg)
                    if session is None or meta.is_modern(msg)
                    else self._legacy.notify(session, msg)
                )
                # In its own task: a backend slow to take a notification must not stop the reading.
                task = asyncio.get_running_loop().create_task(notified)
                self._notifying.add(task)
                task.add_done_callback(self._notifying.discard)
        elif self._session is None or not self._legacy.answer(self._session, msg):
            log.debug("stdin: ignored a response for id %r", msg["id"])

    def _cancel(self, request_id: object) -> None:
        if isinstance(request_id, (str, int)) and request_id in self._in_flight:
            self._in_flight[request_id].cancel()

    async def _run(self, msg: Message) -> None:
        request_id = msg["id"]
        try:
            session = self._session
            if session is None or meta.is_modern(msg):
                reply = await self._dispatcher.handle(msg, self._write, self._origin)
            else:
                reply = await self._legacy.handle(session, msg, self._write, self._origin)
        except asyncio.CancelledError:
            self._done(request_id)
            # A request the client cancelled gets nothing more (basic/patterns/cancellation);
            # one cut by the end of the drain gets an error, so the client is not left waiting.
            if self._cutting and not self._gone:
                await self._cut(request_id)
            return
        except Exception:
            self._done(request_id)
            log.exception("stdin: request %r failed", request_id)
            return
        self._done(request_id)
        task = asyncio.current_task()
        assert task is not None
        self._writing.add(task)
        try:
            await self._write(reply)
        finally:
            self._writing.discard(task)

    def _done(self, request_id: RequestId) -> None:
        del self._in_flight[request_id]
        if not self._in_flight:
            self._idle.set()

    async def _cut(self, request_id: RequestId) -> None:
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()  # the cancellation is handled: this reply is what it comes to
        why = (
            "The gateway is shutting down at once (a second signal)"
            if self._hurried
            else f"The gateway is shutting down; the request ran past the {DRAIN_TIMEOUT:g} s drain"
        )
        # (written at once to the pipe's buffer: the flush at the end waits for the client)
        with contextlib.suppress(TimeoutError, OSError):
            async with asyncio.timeout(CUT_REPLY_TIMEOUT):
                await self._write(jsonrpc.error(request_id, codes.GATEWAY_SHUTTING_DOWN, why))

    async def _write(self, msg: Message) -> None:
        if self._gone:
            return
        data = jsonrpc.encode(msg) + b"\n"
        self._dispatcher.telemetry.stats.bytes["frontend", "out"] += len(data)
        out = self._out
        try:
            if isinstance(out, _PipeSend):
                # A pipe write is synchronous and whole: no lock, and a drain only once the pipe
                # backs up (the reader is slow).
                if out.write_now(data):
                    await out.drain()
                return
            async with self._write_lock:
                await out.send(data)
        except _LOST:
            self._output_lost()
        except OSError as exc:  # (a file that cannot take more: a full disk)
            self._output_lost(exc.strerror or type(exc).__name__)


async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
    """Cancel `tasks` (plain asyncio tasks, spawned cheaply) and wait for every one to end."""
    for task in tasks:
        task.cancel()
    with anyio.CancelScope(shield=True):
        await asyncio.gather(*tasks, return_exceptions=True)


class _PipeReceive(anyio.abc.ByteReceiveStream):
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def receive(self, max_bytes: int = 65536) -> bytes:
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        return None


class _StdoutProtocol(asyncio.streams.FlowControlMixin):
    """Flow control for stdout, which also tells when the client closed its end: the event loop
    watches a pipe's write end for that even while nothing is written."""

    def __init__(self) -> None:
        super().__init__()
        self.on_lost: Callable[[], None] | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost()


class _PipeSend(anyio.abc.ByteSendStream):
    def __init__(self, writer: asyncio.StreamWriter, protocol: _StdoutProtocol) -> None:
        self._writer = writer
        self._protocol = protocol

    @property
    def on_lost(self) -> Callable[[], None] | None:
        """Called once the client has closed its end of the pipe."""
        return self._protocol.on_lost

    @on_lost.setter
    def on_lost(self, callback: Callable[[], None] | None) -> None:
        self._protocol.on_lost = callback

    async def send(self, item: bytes) -> None:
        self._writer.write(item)
        await self._writer.drain()

    def write_now(self, item: bytes) -> bool:
        """Write without waiting; True when the pipe is backed up and a drain is due."""
        self._writer.write(item)
        return self._writer.transport.get_write_buffer_size() > WRITE_HIGH_WATER

    async def drain(self) -> None:
        await self._writer.drain()

    async def flush(self, stall: float) -> int:
        """Wait until every byte written has been handed to the pipe: 0; or the bytes left once
        the reader has taken none of them for `stall` seconds."""
        transport = self._writer.transport
        transport.set_write_buffer_limits(high=0)  # drain() now returns on an empty buffer only
        left = transport.get_write_buffer_size()
        while left:
            with anyio.move_on_after(stall):
                await self._writer.drain()
                return 0
            now = transport.get_write_buffer_size()
            if now >= left:
                return now
            left = now
        return 0

    async def aclose(self) -> None:
        self._protocol.on_lost = None  # (our own close, not the client's)
        self._writer.close()


def _pollable(fd: int) -> bool:
    """Whether the event loop can watch `fd`: pipes, sockets and terminals. epoll refuses a
    regular file or /dev/null (EPERM): asyncio's pipe transports refuse a regular file up front
    but take /dev/null and never read it; uvloop hands either to libuv, which aborts the
    process (SIGABRT) when epoll refuses it."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    return stat.S_ISCHR(mode) and os.isatty(fd)


class _FileSend(anyio.abc.ByteSendStream):
    """stdout as a regular file or /dev/null: each line written whole and flushed, in a worker
    thread (a file on a slow disk must not stall the loop); `_write`'s lock keeps lines whole."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def _write_all(self, item: bytes) -> None:
        self._file.write(item)  # a buffered writer loops over short writes itself
        self._file.flush()

    async def send(self, item: bytes) -> None:
        await anyio.to_thread.run_sync(self._write_all, item)

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._file.close)


async def open_process_stdio() -> tuple[anyio.abc.ByteReceiveStream, anyio.abc.ByteSendStream]:
    """This process's stdin and stdout as byte streams, stdout reserved for protocol messages.

    File descriptor 1 is duplicated for our use and then pointed at stderr, so a stray print
    from any library lands in the log instead of corrupting the protocol stream. Pipes,
    sockets and terminals are read and written by the event loop; files and /dev/null (not
    pollable) by worker threads.
    """
    out_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    loop = asyncio.get_running_loop()
    inbound: anyio.abc.ByteReceiveStream
    if _pollable(sys.stdin.fileno()):
        reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        inbound = _PipeReceive(reader)
    else:
        inbound = FileReadStream(sys.stdin.buffer)
    outbound: anyio.abc.ByteSendStream
    if _pollable(out_fd):
        protocol_out = os.fdopen(out_fd, "wb", buffering=0)
        transport, proto = await loop.connect_write_pipe(_StdoutProtocol, protocol_out)
        outbound = _PipeSend(asyncio.StreamWriter(transport, proto, None, loop), proto)
    else:
        outbound = _FileSend(os.fdopen(out_fd, "wb"))
    return inbound, outbound
