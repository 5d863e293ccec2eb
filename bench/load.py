"""The load generator: N concurrent MCP clients against a URL or a spawned stdio server.

    python -m bench.load (--url URL | --stdio -- CMD [ARG...]) --concurrency N --requests N
        [--warmup N] [--method tools/call|tools/list] [--era modern|legacy] [--pid PID ...]
        [--duration S] [--sample-rss S]

Prints one JSON object with throughput, latency percentiles and the CPU time the measured
processes (the --pid ones, or the spawned child, plus descendants, minus any `bench.echo`
backend) used during the measured phase.

It must never be the bottleneck, so the hot path is callback driven: a reply's arrival sends
the next request straight from the protocol callback, without a task switch per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import orjson

from bench import run

MODERN = "2026-07-28"
LEGACY = "2025-11-25"
META: dict[str, Any] = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
}
CLIENT_INFO = {"name": "bench-load", "version": "1.0.0"}
TIMEOUT = 10.0
# How long a legacy client waits for its session's end (DELETE) once the run is over.
END_BOUND = 2.0
# How often timeouts are looked for: a late request is failed at most this much after 10 s.
WATCH_EVERY = 0.25

_ids = itertools.count(1)
perf = time.perf_counter


class Failed(Exception):
    """A setup exchange (connect, initialize) that did not succeed."""


class Phase:
    """Hands out request slots for one phase (warm-up or measured) and tallies the outcomes.
    Every slot taken ends in exactly one `ok` or `fail`."""

    __slots__ = ("deadline", "errors", "latencies", "remaining")

    def __init__(self, count: int, deadline: float | None = None) -> None:
        self.remaining = count
        self.deadline = deadline
        self.latencies: list[float] = []
        self.errors = 0

    def take(self) -> bool:
        if self.deadline is not None:
            return perf() < self.deadline
        if self.remaining > 0:
            self.remaining -= 1
            return True
        return False

    def fail(self) -> None:
        self.errors += 1

    def give_up(self) -> None:
        """The target is gone for good: the slots not yet handed out fail at once."""
        if self.deadline is None:
            self.errors += self.remaining
            self.remaining = 0
        else:
            self.deadline = perf()


@dataclass(frozen=True)
class Rpc:
    """The request the clients repeat, as bytes around its id so nothing is re-encoded."""

    method: str
    prefix: bytes
    suffix: bytes

    @classmethod
    def build(cls, method: str, era: str) -> Rpc:
        params: dict[str, Any] = (
            {"name": "echo", "arguments": {"text": "hello"}} if method == "tools/call" else {}
        )
        if era == "modern":
            params["_meta"] = META
        rest = orjson.dumps({"method": method, "params": params})
        return cls(method, b'{"jsonrpc":"2.0","id":', b"," + rest[1:])


def rpc_body(rid: int | str, method: str, params: dict[str, Any] | None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    if method.startswith("notifications/"):
        return orjson.dumps(msg)
    return orjson.dumps({"id": rid, **msg})


def initialize_params() -> dict[str, Any]:
    return {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": CLIENT_INFO}


def find_reply(body: bytes, event_stream: bool, rid: object) -> dict[str, Any] | None:
    """The JSON-RPC response with id `rid`: the whole JSON body, or the SSE event carrying it."""
    if not event_stream:
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        return msg if isinstance(msg, dict) and msg.get("id") == rid else None
    for event in body.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [
            line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")
        ]
        if not data:
            continue
        try:
            msg = orjson.loads(b"\n".join(data))
        except orjson.JSONDecodeError:
            continue
        if isinstance(msg, dict) and msg.get("id") == rid:
            return msg
    return None


# --- HTTP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"only http:// URLs are supported: {url}")
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(parts.hostname, parts.port or 80, path)


@dataclass
class Reply:
    status: int
    event_stream: bool
    session: bytes | None
    body: bytes
    keep_alive: bool


class Conn(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; hands each complete response to its client."""

    __slots__ = ("_body", "_client", "_event_stream", "_parser", "_session", "transport")

    def __init__(self, client: HttpClient) -> None:
        self._client = client
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self._body: list[bytes] = []
        self._event_stream = False
        self._session: bytes | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._client.lost(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.abort()
            self._client.lost(self)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
            self.transport = None

    def on_message_begin(self) -> None:
        self._body = []
        self._event_stream = False
        self._session = None

    def on_header(self, name: bytes, value: bytes) -> None:
        # Only two headers matter; comparing lengths first keeps the common case cheap.
        if len(name) == 12 and name.lower() == b"content-type":
            self._event_stream = value.startswith(b"text/event-stream")
        elif len(name) == 14 and name.lower() == b"mcp-session-id":
            self._session = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser = self._parser
        self._client.response(
            self,
            parser.get_status_code(),
            self._event_stream,
            self._session,
            b"".join(self._body),
            parser.should_keep_alive(),
        )


class HttpClient:
    """One simulated client: a keep-alive connection, and for the legacy era a session."""

    def __init__(self, target: Target, rpc: Rpc, era: str) -> None:
        self.target = target
        self.rpc = rpc
        self.era = era
        self.conn: Conn | None = None
        self.phase = Phase(0)
        self.waiter: asyncio.Future[bool] | None = None
        self.setup: asyncio.Future[Reply] | None = None
        self.initialized = era == "modern"
        self.end_head: bytes | None = None  # a legacy session's DELETE, once it has one
        self.rid = 0
        self.started = 0.0
        self.busy = False
        modern = self._head({"MCP-Protocol-Version": MODERN})
        self.head = self._mirror(modern, rpc.method) if era == "modern" else b""

    def _head(self, headers: dict[str, str], method: str = "POST") -> bytes:
        lines = [
            f"{method} {self.target.path} HTTP/1.1",
            f"Host: {self.target.host}:{self.target.port}",
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            *(f"{k}: {v}" for k, v in headers.items()),
        ]
        return ("\r\n".join(lines) + "\r\n").encode()

    @staticmethod
    def _mirror(base: bytes, method: str) -> bytes:
        """Modern headers mirroring the body (streamable-http, Request Metadata); Mcp-Name for
        the one tools/call this generator makes. Legacy requests carry none of them."""
        extra = f"Mcp-Method: {method}\r\n"
        if method == "tools/call":
            extra += "Mcp-Name: echo\r\n"
        return base + extra.encode()

    # The measured loop ---------------------------------------------------------------------

    async def run(self, phase: Phase) -> None:
        self.phase = phase
        loop = asyncio.get_running_loop()
        while phase.take():
            if self.conn is None or not self.initialized:
                try:
                    await asyncio.wait_for(self._prepare(), TIMEOUT)
                except (OSError, Failed, TimeoutError):
                    self._drop()
                    phase.fail()
                    continue
            if self.conn is None or self.conn.transport is None:
                phase.fail()  # closed by the server before the first request could go out
                continue
            self.waiter = waiter = loop.create_future()
            self._send()
            if await waiter:
                return  # phase over; otherwise the connection broke: reconnect and go on

    def _send(self) -> None:
        rid = self.rid = next(_ids)
        body = self.rpc.prefix + str(rid).encode() + self.rpc.suffix
        conn = self.conn
        assert conn is not None and conn.transport is not None
        self.busy = True
        self.started = perf()
        conn.transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (self.head, len(body), body))

    def response(
        self,
        conn: Conn,
        status: int,
        event_stream: bool,
        session: bytes | None,
        body: bytes,
        keep_alive: bool,
    ) -> None:
        if conn is not self.conn:
            return
        if self.setup is not None:
            if not self.setup.done():
                self.setup.set_result(Reply(status, event_stream, session, body, keep_alive))
            return
        if not self.busy:
            return  # nothing was asked: a stray response is not counted
        self.busy = False
        phase = self.phase
        if 200 <= status < 300:
            msg = find_reply(body, event_stream, self.rid)
            if msg is not None and "result" in msg:
                phase.latencies.append(perf() - self.started)
            else:
                phase.fail()
        else:
            phase.fail()
        if not keep_alive:
            self._drop()
            self._wake(False)
        elif phase.take():
            self._send()
        else:
            self._wake(True)

    def lost(self, conn: Conn) -> None:
        if conn is not self.conn:
            return
        self.conn = None
        if self.setup is not None and not self.setup.done():
            self.setup.set_exception(Failed("connection lost"))
        if self.busy:
            self.busy = False
            self.phase.fail()
            self._wake(False)

    def check_timeout(self, now: float) -> None:
        if self.busy and now - self.started > TIMEOUT:
            self.busy = False
            self.phase.fail()
            self._drop()
            self._wake(False)

    def _wake(self, phase_over: bool) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(phase_over)

    def _drop(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.abort()

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    # Setup ---------------------------------------------------------------------------------

    async def _prepare(self) -> None:
        if not self.initialized:
            await self._initialize()
        if self.conn is None:
            await self._connect()

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, self.conn = await loop.create_connection(
            lambda: Conn(self), self.target.host, self.target.port
        )

    async def _exchange(self, head: bytes, body: bytes) -> Reply:
        if self.conn is None:
            await self._connect()
        conn = self.conn
        if conn is None or conn.transport is None:
            raise Failed("not connected")
        self.setup = asyncio.get_running_loop().create_future()
        try:
            conn.transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
            reply = await self.setup
        finally:
            self.setup = None
        if not reply.keep_alive:
            self._drop()
        return reply

    async def _initialize(self) -> None:
        """The legacy handshake: initialize, then notifications/initialized on the session.
        A session outlives its connection, so a reconnect does not repeat it."""
        reply = await self._exchange(
            self._head({}),
            rpc_body("init", "initialize", initialize_params()),
        )
        msg = find_reply(reply.body, reply.event_stream, "init")
        if not 200 <= reply.status < 300 or msg is None or "result" not in msg:
            raise Failed(f"initialize failed: HTTP {reply.status}")
        version = msg["result"].get("protocolVersion", LEGACY)
        headers = {"MCP-Protocol-Version": str(version)}
        if reply.session is not None:
            headers["Mcp-Session-Id"] = reply.session.decode()
        base = self._head(headers)
        done = await self._exchange(
            base,
            rpc_body(0, "notifications/initialized", None),
        )
        if not 200 <= done.status < 300:
            raise Failed(f"notifications/initialized failed: HTTP {done.status}")
        self.head = base
        if reply.session is not None:
            self.end_head = self._head(headers, "DELETE")
        self.initialized = True

    async def end(self) -> None:
        """A legacy client that is done ends its session (Session Management): sessions of
        finished runs must not pile up in the subject from one measurement to the next. After
        the measured phase: not timed, not counted."""
        if self.end_head is None or self.conn is None or self.conn.transport is None:
            return
        with contextlib.suppress(Failed, OSError, TimeoutError):
            await asyncio.wait_for(self._exchange(self.end_head, b""), END_BOUND)


class HttpLoad:
    def __init__(self, url: str, concurrency: int, rpc: Rpc, era: str) -> None:
        target = Target.parse(url)
        self.clients = [HttpClient(target, rpc, era) for _ in range(concurrency)]

    async def run(self, phase: Phase) -> None:
        await asyncio.gather(*(c.run(phase) for c in self.clients))

    def check_timeouts(self, now: float) -> None:
        for client in self.clients:
            client.check_timeout(now)

    async def close(self) -> None:
        await asyncio.gather(*(client.end() for client in self.clients))
        for client in self.clients:
            client.close()


# --- stdio -----------------------------------------------------------------------------------


class StdioLoad(asyncio.SubprocessProtocol):
    """N requests in flight on one spawned server's stdin/stdout, matched by id."""

    def __init__(self, concurrency: int, rpc: Rpc) -> None:
        self.concurrency = concurrency
        self.rpc = rpc
        self.transport: asyncio.SubprocessTransport | None = None
        self.stdin: asyncio.WriteTransport | None = None
        self.pending: dict[int, float] = {}
        self.setup: dict[object, asyncio.Future[dict[str, Any]]] = {}
        self.phase = Phase(0)
        self.waiter: asyncio.Future[None] | None = None
        self.out: list[bytes] = []
        self.buffer = b""
        self.alive = True
        self.exited: asyncio.Future[None] | None = None

    async def start(self, argv: Sequence[str]) -> int:
        loop = asyncio.get_running_loop()
        self.exited = loop.create_future()
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: self, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise SystemExit(f"cannot start {argv[0]}: {exc}") from exc
        self.transport = transport
        self.stdin = cast(asyncio.WriteTransport, transport.get_pipe_transport(0))
        pid = transport.get_pid()
        assert pid is not None
        return pid

    async def initialize(self) -> bool:
        """One legacy handshake for the whole pipe; False when the server did not take it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[dict[str, Any]] = loop.create_future()
        self.setup["init"] = waiter
        self._write(rpc_body("init", "initialize", initialize_params()) + b"\n")
        try:
            msg = await asyncio.wait_for(waiter, TIMEOUT)
        except (TimeoutError, Failed):
            return False
        finally:
            self.setup.pop("init", None)
        if "result" not in msg:
            return False
        self._write(rpc_body(0, "notifications/initialized", None) + b"\n")
        return True

    async def run(self, phase: Phase) -> None:
        self.phase = phase
        if not self.alive:
            phase.give_up()
            return
        self.waiter = asyncio.get_running_loop().create_future()
        for _ in range(self.concurrency):
            if not phase.take():
                break
            self._issue()
        self._flush()
        if self.pending:
            await self.waiter
        self.waiter = None

    def _issue(self) -> None:
        rid = next(_ids)
        self.pending[rid] = perf()
        self.out.append(self.rpc.prefix + str(rid).encode() + self.rpc.suffix + b"\n")

    def _flush(self) -> None:
        if self.out:
            self._write(b"".join(self.out))
            self.out.clear()

    def _write(self, data: bytes) -> None:
        if self.alive and self.stdin is not None and not self.stdin.is_closing():
            self.stdin.write(data)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        now = perf()
        phase, pending = self.phase, self.pending
        for line in lines:
            try:
                msg = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(msg, dict) or "method" in msg:
                continue  # server notifications and requests are not replies
            rid = msg.get("id")
            started = pending.pop(rid, None) if isinstance(rid, int) else None
            if started is None:
                waiter = self.setup.get(rid)
                if waiter is not None and not waiter.done():
                    waiter.set_result(msg)
                continue
            if "result" in msg:
                phase.latencies.append(now - started)
            else:
                phase.fail()
            if phase.take():
                self._issue()
        self._flush()
        self._maybe_done()

    def check_timeouts(self, now: float) -> None:
        expired = 0
        # Insertion order is send order, so the oldest requests come first.
        for rid, started in list(self.pending.items()):
            if now - started <= TIMEOUT:
                break
            del self.pending[rid]
            expired += 1
        for _ in range(expired):
            self.phase.fail()
            if self.phase.take():
                self._issue()
        self._flush()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self.pending and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self._dead()

    def process_exited(self) -> None:
        self._dead()
        if self.exited is not None and not self.exited.done():
            self.exited.set_result(None)

    def _dead(self) -> None:
        if not self.alive:
            return
        self.alive = False
        for _ in self.pending:
            self.phase.fail()
        self.pending.clear()
        self.phase.give_up()
        for waiter in self.setup.values():
            if not waiter.done():
                waiter.set_exception(Failed("the server exited"))
        self._maybe_done()

    async def close(self) -> None:
        """Close stdin (the stdio way to ask for exit), then insist if the child lingers."""
        transport = self.transport
        if transport is None:
            return
        if self.stdin is not None:
            self.stdin.close()
        assert self.exited is not None
        for action in (None, transport.terminate, transport.kill):
            if action is not None and transport.get_returncode() is None:
                action()
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), 3.0)
                break
            except TimeoutError:
                continue
        transport.close()


# --- measuring processes ---------------------------------------------------------------------

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, user+system ticks) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses; fields resume after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _is_backend(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    args = cmdline.split(b"\0")
    if b"-m" in args:
        # A Python process is the module it runs: the stdio bridge names bench.echo too, as
        # the command of its child, and is measured.
        at = args.index(b"-m")
        return args[at + 1 : at + 2] == [b"bench.echo"]
    return b"bench.echo" in cmdline  # a launcher (a shell, npx) running the backend


def cpu_ticks(roots: Sequence[int]) -> dict[int, int]:
    """CPU ticks of each measured process: the roots and their descendants, minus backends."""
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            stats[int(entry)] = stat
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    todo = [pid for pid in roots if pid in stats]
    seen = set(todo)
    while todo:
        pid = todo.pop()
        if not _is_backend(pid):
            out[pid] = stats[pid][1]
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return out


def cpu_ms(before: dict[int, int], after: dict[int, int]) -> float:
    # A process that started mid-phase counts from zero; one that ended took its ticks along.
    return sum(ticks - before.get(pid, 0) for pid, ticks in after.items()) * TICK_MS


def status_mb(pid: int, field: bytes) -> float | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(field + b":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# --- the run ---------------------------------------------------------------------------------


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))
    return round(ordered[index] * 1000, 3)


async def watch(load: HttpLoad | StdioLoad) -> None:
    while True:
        await asyncio.sleep(WATCH_EVERY)
        load.check_timeouts(perf())


async def sample_rss(pid: int, every: float, samples: list[float]) -> None:
    while True:
        if (mb := status_mb(pid, b"VmRSS")) is not None:
            samples.append(round(mb, 2))
        await asyncio.sleep(every)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rpc = Rpc.build(args.method, args.era)
    roots: list[int] = list(args.pid or [])
    load: HttpLoad | StdioLoad
    if args.url is not None:
        load = HttpLoad(args.url, args.concurrency, rpc, args.era)
    else:
        load = StdioLoad(args.concurrency, rpc)
        child = await load.start(args.stdio)
        if not roots:
            roots = [child]
    watcher = asyncio.create_task(watch(load))
    try:
        if isinstance(load, StdioLoad) and args.era == "legacy" and not await load.initialize():
            # Without a session every request would fail the same way: fail them all now.
            load.alive = False
        if args.warmup > 0:
            await load.run(Phase(args.warmup))
        samples: list[float] = []
        sampler = None
        if args.sample_rss and roots:
            sampler = asyncio.create_task(sample_rss(roots[0], args.sample_rss, samples))
        before = cpu_ticks(roots)
        started = perf()
        deadline = started + args.duration if args.duration is not None else None
        phase = Phase(args.requests, deadline)
        await load.run(phase)
        seconds = perf() - started
        after = cpu_ticks(roots)
        if sampler is not None:
            sampler.cancel()
        # Read before close: a spawned stdio child is gone afterwards.
        peak = status_mb(roots[0], b"VmHWM") if roots else None
    finally:
        watcher.cancel()
        await load.close()
    ordered = sorted(phase.latencies)
    requests = len(ordered) + phase.errors
    result: dict[str, Any] = {
        "requests": requests,
        "errors": phase.errors,
        "seconds": round(seconds, 4),
        "rps": round(requests / seconds, 1) if seconds > 0 else 0.0,
        "p50_ms": percentile(ordered, 0.50),
        "p90_ms": percentile(ordered, 0.90),
        "p99_ms": percentile(ordered, 0.99),
        "cpu_ms": round(cpu_ms(before, after), 1) if roots else None,
        "peak_rss_mb": None if peak is None else round(peak, 2),
        "target_pid": roots[0] if roots else None,
    }
    if args.sample_rss:
        result["rss_samples_mb"] = samples
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the MCP endpoint to load over HTTP")
    target.add_argument(
        "--stdio",
        action="store_true",
        help="spawn the command that follows (after --) and load it over stdio; must come last",
    )
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--method", choices=["tools/call", "tools/list"], default="tools/call")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--pid", type=int, action="extend", nargs="+", metavar="PID")
    parser.add_argument("--duration", type=float, help="run S seconds instead of --requests")
    parser.add_argument("--sample-rss", type=float, metavar="SECONDS")
    words = list(sys.argv[1:] if argv is None else argv)
    # The command after --stdio keeps its own options, so it is cut off before argparse looks.
    command: list[str] | None = None
    if "--stdio" in words:
        at = words.index("--stdio")
        words, command = words[: at + 1], words[at + 1 :]
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            parser.error("--stdio needs a command")
    args = parser.parse_args(words)
    args.stdio = command
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(measure(args))
    sys.stdout.buffer.write(orjson.dumps(result) + b"\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
