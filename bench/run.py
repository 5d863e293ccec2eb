"""The benchmark orchestrator: starts the echo backend, the gateway in every pairing and
telemetry mode, the bare pass-throughs and the other proxies, drives them with load.py
interleaved with the direct path, and writes the table, results.json and results.png.

Every process it starts is stopped on the way out, on errors and Ctrl-C/SIGTERM too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import importlib
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from bench import report, targets
from bench.report import (
    GATEWAY,
    GATEWAY_VIRTUAL,
    NO_TELEMETRY,
    PAIRINGS,
    PASSTHROUGH_NAMES,
    LoadResult,
    RoundPair,
    Series,
)

if TYPE_CHECKING:
    from bench.proxies import Installed

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CACHE = ROOT / "bench" / ".cache"
DEFAULT_OUT = ROOT / "bench" / "results"
ECHO_STDIO = [PY, "-m", "bench.echo", "--stdio"]
READY = re.compile(r"READY (http://\S+)")
# The gateway logs this at INFO, so HTTP front ends run with --log-level info: the request path
# logs nothing at INFO (only debug), so the hot path is the same as at warning.
LISTENING = re.compile(r"listening on (http://\S+)")
START_BOUND = 20.0
# Telemetry modes of the gateway: none; tracing with every request sampled (the worst case); and
# the documented production setting, a parent-based 10% ratio through the standard variables.
SAMPLED = "10%"
TELEMETRY_MODES = ("off", "on", SAMPLED)
SAMPLER_ENV = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
# npx/pip-installed proxies start slower than our own processes (node, big imports).
PROXY_START_BOUND = 60.0
STOP_BOUND = 5.0
# How long one measurement should take at the expected speed; slow subjects get fewer requests.
TARGET_SECONDS = 2.5
MIN_ADAPTED_REQUESTS = 200
SMOKE_REQUESTS = 30
STREAM_LIMIT = 1 << 20
METHODS = ("tools/call", "tools/list")
ERAS = targets.ERAS
# `--check` (`make bench-check`): the gateway against its floors where its request path is, in a
# few minutes; the exit status says whether a ratio target failed.
CHECK_PAIRINGS = tuple(targets.FLOORS)
CHECK_CONCURRENCY = (64, 1)
CHECK_OUT = CACHE / "check"


class StartFailed(Exception):
    pass


# --- processes --------------------------------------------------------------------------------


class Proc:
    """A child in its own session (so its whole tree can be killed) whose stdout and stderr are
    drained into bounded line buffers, so its pipes never fill and a wait can match a line."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, keep: int) -> None:
        self.name = name
        self.proc = proc
        self.lines: dict[str, deque[str]] = {
            "stdout": deque(maxlen=keep),
            "stderr": deque(maxlen=keep),
        }
        self._waiters: list[tuple[str, re.Pattern[str], asyncio.Future[re.Match[str]]]] = []
        self._pumps = [
            asyncio.create_task(self._pump("stdout", proc.stdout)),
            asyncio.create_task(self._pump("stderr", proc.stderr)),
        ]

    @classmethod
    async def start(
        cls,
        name: str,
        argv: Sequence[str],
        env: dict[str, str],
        keep: int = 200,
        cwd: Path = ROOT,
    ) -> Proc:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,  # held open: some servers exit on stdin EOF
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            limit=STREAM_LIMIT,
        )
        return cls(name, proc, keep)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def _pump(self, name: str, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line beyond STREAM_LIMIT: keep its tail only
                raw = await stream.read(STREAM_LIMIT)
            if not raw:
                break
            text = raw.decode(errors="replace").rstrip("\r\n")
            self.lines[name].append(text)
            for stream_name, pattern, fut in self._waiters:
                if stream_name == name and not fut.done() and (m := pattern.search(text)):
                    fut.set_result(m)
        for stream_name, _, fut in self._waiters:
            if stream_name == name and not fut.done():
                fut.set_exception(StartFailed(f"{self.name} closed its {name}"))

    async def wait_line(self, stream: str, pattern: re.Pattern[str], bound: float) -> re.Match[str]:
        for line in self.lines[stream]:
            if m := pattern.search(line):
                return m
        fut: asyncio.Future[re.Match[str]] = asyncio.get_running_loop().create_future()
        self._waiters.append((stream, pattern, fut))
        try:
            return await asyncio.wait_for(fut, bound)
        except TimeoutError:
            raise StartFailed(
                f"{self.name}: no line matching {pattern.pattern!r} on {stream} within "
                f"{bound:.0f} s; {self.tail()}"
            ) from None
        except StartFailed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), STOP_BOUND)
            raise StartFailed(
                f"{self.name} exited (code {self.returncode}) before it was ready; {self.tail()}"
            ) from None
        finally:
            self._waiters.remove((stream, pattern, fut))

    async def wait_exit(self, bound: float) -> int:
        await asyncio.wait_for(self.proc.wait(), bound)
        # The pipes may still hold output after the exit status is in; a lingering grandchild
        # holding them open must not turn a finished run into a failed one.
        await asyncio.wait(self._pumps, timeout=STOP_BOUND)
        return self.proc.returncode if self.proc.returncode is not None else -1

    def tail(self, n: int = 6) -> str:
        err = list(self.lines["stderr"])[-n:]
        return "stderr: " + (" | ".join(err) if err else "(empty)")

    async def stop(self) -> None:
        tree: dict[int, int] = {}
        if self.proc.returncode is None:
            tree = descendants(self.proc.pid)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), STOP_BOUND)
        # Whatever is left of its tree goes too: its process group, and children that moved to
        # groups of their own (supergateway does that), known by pid and start time.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid, started in tree.items():
            stat = _proc_stat(pid)
            if stat is not None and stat[1] == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        if self.proc.returncode is None:
            await self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        for task in self._pumps:
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)


class Procs:
    """Processes that live and die together: `async with Procs() as procs:` stops every one
    started through it on the way out, side by side, so a slow one costs its bound only once."""

    def __init__(self) -> None:
        self.procs: list[Proc] = []

    async def __aenter__(self) -> Procs:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        procs, self.procs = self.procs, []
        await asyncio.gather(*(p.stop() for p in procs))


def _proc_stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of `root` with its start time (so a reused pid is not mistaken)."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
                children.setdefault(stat[0], []).append(int(entry))
                started[int(entry)] = stat[1]
    out: dict[int, int] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = started[pid]
            todo.extend(children.get(pid, []))
    return out


async def start_proc(procs: Procs, name: str, argv: Sequence[str], env: dict[str, str]) -> Proc:
    proc = await Proc.start(name, argv, env)
    procs.procs.append(proc)
    return proc


def base_env() -> dict[str, str]:
    # Telemetry "off" must really be off: the standard OTEL_* variables would turn tracing on.
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def proxy_env() -> dict[str, str]:
    # Proxies spawn `python -m bench.echo` from wherever they like; make `bench` importable.
    env = base_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_port(url: str, bound: float, proc: Proc) -> None:
    """For servers that print nothing when ready: connect until the port accepts."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    deadline = time.monotonic() + bound
    while True:
        if proc.returncode is not None:
            raise StartFailed(f"{proc.name} exited (code {proc.returncode}); {proc.tail()}")
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            if time.monotonic() > deadline:
                raise StartFailed(
                    f"{proc.name}: {url} not accepting within {bound:.0f} s"
                ) from None
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return


# --- the OTLP sink ----------------------------------------------------------------------------


class OtlpSink:
    """Accepts OTLP/HTTP exports and drops them, so "telemetry on" pays the full export cost
    without a collector's own CPU landing on the machine's measurements."""

    def __init__(self) -> None:
        self.posts: Counter[str] = Counter()
        self.bytes = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.posts[request.path] += 1
        self.bytes += len(body)
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    async def start(self) -> str:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._handle)
        app.router.add_post("/v1/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def summary(self) -> dict[str, Any]:
        return {"url": self.url, "posts": dict(self.posts), "bytes": self.bytes}


# --- options ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    quick: bool
    smoke: bool
    out: Path
    pairings: tuple[str, ...]
    concurrency: tuple[int, ...]
    methods: tuple[str, ...]
    telemetry: tuple[str, ...]
    proxies: bool
    passthroughs: bool
    rounds: int
    requests: int | None
    soak: float
    strict: bool
    # The eras the gateway (telemetry off) and the floors are measured in, where a floor is.
    eras: tuple[str, ...] = ERAS
    # --check: the floors only (no passthrough-raw), the floor targets only, FAIL exits 1.
    check: bool = False
    # Keys added to the benchmarked backend's config (--backend), e.g. to leave a layer out.
    backend: dict[str, Any] = field(default_factory=dict)
    # The HTTP->HTTP gateway (telemetry off) also serves a virtual server of the echo backend,
    # measured as its own subject (--no-virtual: not).
    virtual: bool = True

    def requests_for(self, concurrency: int) -> int:
        if self.smoke:
            return self.requests or SMOKE_REQUESTS
        if self.requests:
            n = self.requests
        elif concurrency <= 1:
            n = 2000
        elif concurrency <= 8:
            n = 5000
        else:
            n = 10000
        return max(concurrency, n // 5 if self.quick else n)


def _pairing(text: str) -> str:
    norm = text.lower().replace("->", "-").replace("2", "-").replace("_", "-")
    for p in PAIRINGS:
        if p.replace("->", "-") == norm:
            return p
    raise argparse.ArgumentTypeError(f"unknown pairing {text!r}; one of {', '.join(PAIRINGS)}")


def parse_args(argv: Sequence[str]) -> Options:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark the gateway against the direct path, bare pass-throughs and "
        "other MCP proxies.",
    )
    ap.add_argument("--quick", action="store_true", help="a fifth of the default request counts")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny counts, 1 round, 1 and 8 clients, no proxies"
    )
    ap.add_argument("--out", type=Path, default=None, help=f"default: {DEFAULT_OUT}")
    ap.add_argument(
        "--pairings",
        nargs="+",
        type=_pairing,
        default=None,
        metavar="P",
        help="http->http http->stdio stdio->http (also http-http, ...)",
    )
    ap.add_argument("--concurrency", nargs="+", type=int, default=None, metavar="N")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=None, metavar="M")
    ap.add_argument("--telemetry", nargs="+", choices=TELEMETRY_MODES, default=None)
    ap.add_argument("--no-proxies", action="store_true", help="skip mcp-proxy/supergateway/fastmcp")
    ap.add_argument("--no-passthroughs", action="store_true", help="skip bench.passthrough rows")
    ap.add_argument("--rounds", type=int, default=None, help="default 3 (smoke: 1)")
    ap.add_argument("--requests", type=int, default=None, help="per measurement, every concurrency")
    ap.add_argument(
        "--soak", type=float, default=0.0, metavar="SECONDS", help="memory soak through the gateway"
    )
    ap.add_argument(
        "--no-virtual",
        action="store_true",
        help="no virtual server row (HTTP->HTTP tools/call through /mcp/v of the same gateway)",
    )
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target FAILs")
    ap.add_argument(
        "--eras",
        nargs="+",
        choices=ERAS,
        default=None,
        help="client eras of the gateway and its floors (HTTP->HTTP, HTTP->stdio); default both",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="make bench-check: HTTP->HTTP and HTTP->stdio, modern, tools/call, 64 and 1 "
        "clients, telemetry off, the gateway and its floors only, 3 rounds; exit 1 when a "
        "CPU, rps or +p50 target against the floor FAILs",
    )
    ap.add_argument(
        "--backend",
        type=orjson.loads,
        default=None,
        metavar="JSON",
        help='keys added to the echo backend, as {"retries": {"attempts": 1}}',
    )
    ns = ap.parse_args(list(argv))
    smoke: bool = ns.smoke
    check: bool = ns.check
    # --check picks its own defaults; options given beside it still win.
    concurrency = CHECK_CONCURRENCY if check else (1, 8) if smoke else (1, 8, 64)
    return Options(
        quick=ns.quick,
        smoke=smoke,
        out=(ns.out or (CHECK_OUT if check else DEFAULT_OUT)).resolve(),
        pairings=tuple(dict.fromkeys(ns.pairings or (CHECK_PAIRINGS if check else PAIRINGS))),
        concurrency=tuple(ns.concurrency or concurrency),
        methods=tuple(ns.methods or (("tools/call",) if check else METHODS)),
        telemetry=tuple(ns.telemetry or (("off",) if check else TELEMETRY_MODES)),
        proxies=not (ns.no_proxies or smoke or check),
        passthroughs=not ns.no_passthroughs,
        rounds=max(1, ns.rounds or (1 if smoke else 3)),
        requests=ns.requests,
        soak=max(0.0, ns.soak),
        backend=dict(ns.backend or {}),
        strict=ns.strict or check,
        virtual=not (ns.no_virtual or check),
        eras=tuple(dict.fromkeys(ns.eras or (("modern",) if check else ERAS))),
        check=check,
    )


# --- subjects ---------------------------------------------------------------------------------


@dataclass
class Subject:
    """Something measured against the direct path: an HTTP front end (url, and the pid whose
    tree load.py measures) or a stdio command load.py spawns and measures itself."""

    name: str
    telemetry: str
    era: str = "modern"
    url: str | None = None
    stdio: list[str] | None = None
    proc: Proc | None = None
    note: str = ""
    env: dict[str, str] | None = None  # for load.py (and what it spawns); None: the run's
    dead: str | None = None
    slow_rps: float | None = None  # set once it proved too slow for the default counts


@dataclass
class Run:
    opts: Options
    env: dict[str, str]
    echo: Proc
    echo_url: str
    sink: OtlpSink
    config_dir: Path
    series: list[Series] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    proxies: dict[str, Any] = field(default_factory=dict)
    installed: list[Installed] = field(default_factory=list)
    gateway_uvloop: bool | None = None
    started: float = field(default_factory=time.monotonic)

    def log(self, text: str) -> None:
        print(f"[{time.monotonic() - self.started:7.1f}s] {text}", file=sys.stderr, flush=True)

    def skip(self, pairing: str, subject: str, reason: str) -> None:
        self.skipped.append({"pairing": pairing, "subject": subject, "reason": reason})
        self.log(f"skip {pairing} {subject}: {reason}")


# The virtual server of the echo backend (`{}`: all of it), served at /mcp/v beside /mcp.
VIRTUAL_SERVER = "v"


def gateway_config(
    pairing: str,
    echo_url: str,
    otlp: str | None,
    backend: dict[str, Any] | None = None,
    virtual: bool = False,
) -> dict[str, Any]:
    front, back = pairing.split("->")
    listen: dict[str, Any] = (
        {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}}
        if front == "http"
        else {"stdio": True}
    )
    target: dict[str, Any] = (
        {"http": {"url": echo_url}}
        if back == "http"
        else {"stdio": {"command": PY, "args": ECHO_STDIO[1:], "cwd": str(ROOT)}}
    )
    config: dict[str, Any] = {"listen": listen, "backends": {"echo": target | (backend or {})}}
    if virtual:
        config["servers"] = {VIRTUAL_SERVER: {"backends": {"echo": {}}}}
    if otlp is not None:
        # An endpoint is what turns tracing on (app.tracer_provider); metrics are always on.
        config["telemetry"] = {"service_name": "mcp-gateway-bench", "otlp_endpoint": otlp}
    return config


def serves_virtual(run: Run, pairing: str, telemetry: str) -> bool:
    """Whether this gateway also serves the virtual server: HTTP->HTTP, telemetry off."""
    return run.opts.virtual and pairing == "http->http" and telemetry == "off"


def write_config(run: Run, pairing: str, telemetry: str) -> Path:
    otlp = run.sink.url if telemetry != "off" else None
    virtual = serves_virtual(run, pairing, telemetry)
    config = gateway_config(pairing, run.echo_url, otlp, run.opts.backend, virtual)
    mode = telemetry.replace("%", "pct")
    path = run.config_dir / f"gateway-{pairing.replace('->', '-')}-{mode}.yaml"
    path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))  # JSON is YAML
    return path


def gateway_argv(config: Path, level: str) -> list[str]:
    return [PY, "-m", "gateway", "run", "--config", str(config), "--log-level", level]


def gateway_env(run: Run, telemetry: str) -> dict[str, str]:
    """The ratio mode samples through the standard variables, the documented production setting."""
    if telemetry != SAMPLED:
        return run.env
    return {**run.env, **SAMPLER_ENV}


async def start_gateway(run: Run, procs: Procs, pairing: str, telemetry: str) -> Subject:
    config = write_config(run, pairing, telemetry)
    subject = Subject(GATEWAY, telemetry)
    env = gateway_env(run, telemetry)
    if pairing.startswith("stdio"):
        subject.stdio = gateway_argv(config, "warning")
        subject.env = env
        return subject
    gw = await start_proc(
        procs, f"gateway ({pairing}, telemetry {telemetry})", gateway_argv(config, "info"), env
    )
    subject.proc = gw
    subject.url = (await gw.wait_line("stderr", LISTENING, START_BOUND)).group(1)
    if run.gateway_uvloop is None:
        run.gateway_uvloop = uses_uvloop(gw.pid)
    return subject


def uses_uvloop(pid: int) -> bool | None:
    """Whether a running process has uvloop's extension mapped: what the gateway really runs
    on, whatever its defaults and MCP_GATEWAY_UVLOOP say."""
    try:
        return "uvloop" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return None


async def start_passthrough(run: Run, procs: Procs, client: str) -> Subject:
    name = PASSTHROUGH_NAMES[client]
    argv = [PY, "-m", "bench.passthrough", "--client", client, "--port", "0"]
    if client == "stdio":
        argv += ["--", *ECHO_STDIO]
    else:
        argv += ["--upstream", run.echo_url]
    proc = await start_proc(procs, name, argv, run.env)
    url = (await proc.wait_line("stdout", READY, START_BOUND)).group(1)
    return Subject(name, NO_TELEMETRY, url=url, proc=proc)


async def start_proxy(run: Run, procs: Procs, inst: Installed, pairing: str) -> Subject | str:
    from bench import proxies  # imported late: a broken proxies module only costs its rows

    launch = proxies.launch(inst, pairing, run.echo_url, list(ECHO_STDIO), free_port())
    if isinstance(launch, str):
        return launch
    env = proxy_env()
    subject = Subject(inst.name, NO_TELEMETRY, era=launch.era, note=launch.note, env=env)
    if launch.url is None:
        subject.stdio = list(launch.argv)
        return subject
    proc = await start_proc(procs, inst.name, list(launch.argv), env)
    subject.proc, subject.url = proc, launch.url
    if launch.ready_stream in ("stdout", "stderr"):
        await proc.wait_line(launch.ready_stream, re.compile(launch.ready), PROXY_START_BOUND)
    await wait_port(subject.url, PROXY_START_BOUND, proc)
    return subject


async def start_ours(run: Run, procs: Procs, pairing: str) -> list[Subject]:
    """The gateway in each telemetry mode and the pass-throughs, started side by side; one that
    cannot start is reported and left out, never fatal."""
    names: list[str] = []
    jobs: list[Any] = []
    for tel in run.opts.telemetry:
        if tel == SAMPLED and pairing != "http->http":
            continue  # the sampled mode prices the ratio once, where tracing costs the most
        names.append(f"gateway (telemetry {tel})")
        jobs.append(start_gateway(run, procs, pairing, tel))
    if run.opts.passthroughs:
        for client in passthroughs_of(run, pairing):
            names.append(PASSTHROUGH_NAMES[client])
            jobs.append(start_passthrough(run, procs, client))
    results = await asyncio.gather(*jobs, return_exceptions=True)
    subjects: list[Subject] = []
    for name, res in zip(names, results, strict=True):
        if isinstance(res, Subject):
            subjects += in_eras(run, pairing, res)
            if res.name == GATEWAY and serves_virtual(run, pairing, res.telemetry):
                subjects.append(virtual_subject(res))
        elif isinstance(res, asyncio.CancelledError):
            raise res
        else:
            run.skip(pairing, name, f"{type(res).__name__}: {res}")
    return subjects


def passthroughs_of(run: Run, pairing: str) -> list[str]:
    """The pass-throughs of a pairing: its floor, and on HTTP->HTTP the hand-rolled client's
    (not under --check, which measures the floors only)."""
    if pairing == "http->http":
        return ["aiohttp"] if run.opts.check else ["raw", "aiohttp"]
    return ["stdio"] if pairing == "http->stdio" else []


def in_eras(run: Run, pairing: str, subject: Subject) -> list[Subject]:
    """A subject once per client era where the floor targets compare eras: the gateway with
    telemetry off and the floors, on pairings with a floor; the same process each time (so its
    CPU is the same tree's), measured right after one another in every round."""
    floor = targets.FLOORS.get(pairing)
    split = subject.name == floor or (subject.name == GATEWAY and subject.telemetry == "off")
    if floor is None or not split:
        return [subject]
    return [dataclasses.replace(subject, era=era) for era in run.opts.eras]


def virtual_subject(gateway: Subject) -> Subject:
    """The virtual server of a gateway started with one: the same process (so its CPU is the
    same tree's), its own path; measured right after the merged server in every round."""
    assert gateway.url is not None
    url = f"{gateway.url.rstrip('/')}/{VIRTUAL_SERVER}"
    return Subject(GATEWAY_VIRTUAL, gateway.telemetry, url=url, proc=gateway.proc, env=gateway.env)


async def start_other(run: Run, procs: Procs, inst: Installed, pairing: str) -> Subject | None:
    launch = run.proxies.setdefault(inst.name, {}).setdefault("launch", {})
    try:
        res = await start_proxy(run, procs, inst, pairing)
    except Exception as exc:  # a proxy that cannot start costs its own rows only
        res = f"{type(exc).__name__}: {exc}"
    if isinstance(res, str):
        launch[pairing] = res
        run.skip(pairing, inst.name, res)
        return None
    launch[pairing] = "ok"
    return res


# --- measuring --------------------------------------------------------------------------------


def load_argv(
    target_url: str | None,
    stdio: Sequence[str] | None,
    concurrency: int,
    requests: int,
    method: str,
    era: str,
    pid: int | None,
    extra: Sequence[str] = (),
) -> list[str]:
    argv = [PY, "-m", "bench.load", "--concurrency", str(concurrency), "--requests", str(requests)]
    # A legacy client's handshake (and what a subject does for a new session) belongs to the
    # warm-up, never to the measured phase: at least one warm-up request per client.
    warmup = max(concurrency if era == "legacy" else 1, requests // 10)
    argv += ["--warmup", str(warmup), "--method", method, "--era", era]
    if pid is not None:
        argv += ["--pid", str(pid)]
    argv += list(extra)
    if target_url is not None:
        return argv + ["--url", target_url]
    assert stdio is not None
    return argv + ["--stdio", "--", *stdio]  # --stdio takes the rest of the line


async def run_load(
    run: Run,
    name: str,
    argv: list[str],
    requests: int,
    bound: float,
    env: dict[str, str] | None = None,
) -> LoadResult:
    async with Procs() as procs:
        proc = await start_proc(procs, name, argv, env or run.env)
        try:
            code = await proc.wait_exit(bound)
        except TimeoutError:
            return LoadResult.failed(f"load.py did not finish within {bound:.0f} s", requests)
        out = [line for line in proc.lines["stdout"] if line.strip()]
        if code != 0 or not out:
            return LoadResult.failed(f"load.py exited {code}; {proc.tail(3)}", requests)
        try:
            return LoadResult.from_json(orjson.loads(out[-1]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return LoadResult.failed(
                f"load.py printed no result ({exc}): {out[-1][:200]}", requests
            )


def load_bound(requests: int, duration: float = 0.0) -> float:
    # Generous: a stuck subject must not hang the run, a slow one must still finish.
    return 60.0 + requests * 0.02 + duration


async def measure(
    run: Run, subject: Subject, concurrency: int, requests: int, method: str, era: str
) -> LoadResult:
    pid = subject.proc.pid if subject.proc is not None else None
    argv = load_argv(subject.url, subject.stdio, concurrency, requests, method, era, pid)
    bound = load_bound(requests)
    return await run_load(run, f"load ({subject.name})", argv, requests, bound, subject.env)


# A probe with more failures than this share: the subject cannot take this load, and a measurement
# of it would mostly time requests out (10 s each) while its backlog skews the next runs.
PROBE_MAX_FAILED = 0.1


async def probe(run: Run, subject: Subject, concurrency: int, base: int, method: str) -> str | None:
    """A few requests before a proxy's first measurement at this method and concurrency: one
    that manages a few dozen requests per second must not be given 10000 of them, and one that
    mostly times out at this concurrency is not measured at it (the reason is returned)."""
    if subject.name in (GATEWAY, GATEWAY_VIRTUAL) or subject.name in PASSTHROUGH_NAMES.values():
        return None
    if base <= MIN_ADAPTED_REQUESTS:
        return None
    n = max(concurrency * 2, 50)
    res = await measure(run, subject, concurrency, n, method, subject.era)
    run.log(f"probe {subject.name} {method} c={concurrency}: {_brief(res)}")
    if res.failure is not None:
        return f"probe failed: {res.failure}"
    if res.requests == 0 or res.errors > PROBE_MAX_FAILED * res.requests:
        failed = f"{res.errors}/{res.requests}"
        return f"not measured at {concurrency} clients: {failed} probe requests failed"
    if res.rps * TARGET_SECONDS < base:
        subject.slow_rps = res.rps
    return None


def subject_requests(subject: Subject, base: int) -> int:
    if subject.slow_rps is None:
        return base
    return max(min(base, MIN_ADAPTED_REQUESTS), min(base, int(subject.slow_rps * TARGET_SECONDS)))


def note_speed(subject: Subject, res: LoadResult) -> None:
    if res.failure is not None or res.errors >= res.requests:
        return
    if subject.slow_rps is not None or res.seconds > 2 * TARGET_SECONDS:
        subject.slow_rps = res.rps


def alive(run: Run, subject: Subject) -> bool:
    if subject.dead is None and subject.proc is not None and subject.proc.returncode is not None:
        subject.dead = f"exited (code {subject.proc.returncode}); {subject.proc.tail(3)}"
    return subject.dead is None


def _brief(r: LoadResult) -> str:
    if r.failure:
        return f"FAILED {r.failure}"
    return f"{r.rps:8.0f} rps  p50 {r.p50_ms:.3f} ms  err {r.errors}"


async def measure_pairing(run: Run, pairing: str) -> None:
    """Our own subjects first, then each other proxy alone: a proxy still chewing on requests it
    gave up on must not steal CPU from anything else's measurement."""
    # The direct path speaks the backend's transport.
    if pairing.endswith("http"):
        direct = Subject(report.DIRECT, NO_TELEMETRY, url=run.echo_url)
    else:
        direct = Subject(report.DIRECT, NO_TELEMETRY, stdio=list(ECHO_STDIO))
    async with Procs() as procs:
        started = time.monotonic()
        ours = await start_ours(run, procs, pairing)
        run.log(f"{pairing}: {len(ours)} subjects up in {time.monotonic() - started:.1f} s")
        await measure_subjects(run, pairing, direct, ours)
    for inst in run.installed:
        async with Procs() as procs:
            other = await start_other(run, procs, inst, pairing)
            if other is not None:
                run.log(f"{pairing}: {inst.name} up")
                await measure_subjects(run, pairing, direct, [other])


async def measure_subjects(
    run: Run, pairing: str, direct: Subject, subjects: list[Subject]
) -> None:
    for method in run.opts.methods:
        for conc in run.opts.concurrency:
            await measure_group(run, pairing, direct, subjects, method, conc)
    for s in subjects:
        if s.dead is not None:
            run.skip(pairing, f"{s.name} (from then on)", s.dead)


async def measure_group(
    run: Run, pairing: str, direct: Subject, subjects: list[Subject], method: str, conc: int
) -> None:
    """One (pairing, method, concurrency): R rounds of direct, subject for every subject."""
    base = run.opts.requests_for(conc)
    group = {
        id(s): Series(pairing, s.telemetry, method, conc, s.name, s.era, s.note)
        for s in subjects
        if alive(run, s)
    }
    benched: dict[int, str] = {}  # subjects given up on at this method and concurrency
    for rnd in range(run.opts.rounds):
        for s in subjects:
            if id(s) not in group or id(s) in benched or not alive(run, s):
                continue
            if run.echo.returncode is not None:
                code = run.echo.returncode
                raise StartFailed(f"the echo backend exited (code {code}); {run.echo.tail()}")
            if rnd == 0 and (reason := await probe(run, s, conc, base, method)):
                benched[id(s)] = reason
                continue
            tag = f"{pairing} {method} c={conc} r{rnd + 1}"
            base_res = await measure(run, direct, conc, base, method, s.era)
            res = await measure(run, s, conc, subject_requests(s, base), method, s.era)
            group[id(s)].rounds.append(RoundPair(rnd, base_res, res))
            tel = "" if s.telemetry == NO_TELEMETRY else f" tel={s.telemetry}"
            run.log(f"{tag} direct {_brief(base_res)}")
            run.log(f"{tag} {s.name}{tel} {_brief(res)}")
            note_speed(s, res)
            if res.requests == 0 or res.errors >= res.requests:
                # Exited, or up but failing everything here: no point in more rounds of it.
                benched[id(s)] = res.failure or "every request failed"
    for s in subjects:
        series = group.get(id(s))
        if series is None:
            continue
        for reason in (benched.get(id(s)), s.dead):
            if reason and reason not in series.issue:
                series.issue = "; ".join(p for p in (series.issue, reason) if p)
        if series.rounds or id(s) in benched:
            run.series.append(series)


async def soak(run: Run, seconds: float) -> report.Soak:
    """HTTP->HTTP tools/call at 64 clients through a fresh gateway (telemetry off) for a while,
    sampling its RSS: memory should level off, not climb."""
    interval = round(max(1.0, min(10.0, seconds / 6)), 2)
    async with Procs() as procs:
        gw = await start_gateway(run, procs, "http->http", "off")
        assert gw.url is not None and gw.proc is not None
        extra = ["--duration", f"{seconds:g}", "--sample-rss", f"{interval:g}"]
        argv = load_argv(gw.url, None, 64, 10**9, "tools/call", "modern", gw.proc.pid, extra)
        # A duration run still takes --warmup from the request count: keep it modest.
        argv[argv.index("--warmup") + 1] = "1000"
        run.log(f"soak: {seconds:g} s through the gateway, RSS every {interval:g} s")
        res = await run_load(run, "load (soak)", argv, 0, load_bound(0, seconds))
        run.log(f"soak: {_brief(res)}")
        return report.soak_summary(res, interval)


# --- proxies ----------------------------------------------------------------------------------


async def prepare_proxies(run: Run) -> None:
    """Install the other proxies (idempotent, cached); any that cannot be installed is reported."""
    try:
        from bench import proxies
    except Exception as exc:  # missing or broken: the rest of the run does not need it
        run.proxies["(all)"] = {"error": f"bench.proxies unavailable: {exc}"}
        run.log(f"other proxies skipped: {exc}")
        return
    run.log(f"installing/checking other proxies under {CACHE} ...")
    try:
        found = await asyncio.to_thread(proxies.ensure, CACHE)
    except Exception as exc:  # a broken installer must not cost the rest of the run
        run.proxies["(all)"] = {"error": f"ensure failed: {type(exc).__name__}: {exc}"}
        run.log(f"other proxies skipped: {exc}")
        return
    for key, value in found.items():
        if isinstance(value, str):
            run.proxies[key] = {"error": value}
            run.log(f"proxy {key}: not available: {value}")
        else:
            run.proxies[key] = {
                "name": value.name,
                "version": value.version,
                "root": str(value.root),
            }
            run.installed.append(value)
            run.log(f"proxy {key}: {value.version}")


# --- machine info -----------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def machine_info(argv: Sequence[str]) -> dict[str, Any]:
    try:
        uvloop = importlib.import_module("uvloop")
        uv_version: str | None = str(getattr(uvloop, "__version__", "?"))
    except ImportError:
        uv_version = None
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 0
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([PY, "-m", "bench", *argv]),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_model": _cpu_model(),
        # echo.py and load.py use uvloop whenever it is importable in this interpreter.
        "uvloop": uv_version is not None,
        "uvloop_version": uv_version,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--", "gateway")),
    }


# --- main -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    text: str
    checks: list[report.Check]


async def amain(opts: Options, argv: Sequence[str]) -> Outcome:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        # Once: a second SIGTERM must not cut short the clean-up the first one started.
        def terminate() -> None:
            loop.remove_signal_handler(signal.SIGTERM)
            task.cancel()

        loop.add_signal_handler(signal.SIGTERM, terminate)
    machine = machine_info(argv) | {"smoke": opts.smoke, "quick": opts.quick}
    opts.out.mkdir(parents=True, exist_ok=True)
    sink = OtlpSink()
    async with AsyncExitStack() as stack:
        config_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        await sink.start()
        stack.push_async_callback(sink.stop)
        procs = await stack.enter_async_context(Procs())
        env = base_env()
        echo = await start_proc(
            procs, "echo", [PY, "-m", "bench.echo", "--http", "--port", "0"], env
        )
        echo_url = (await echo.wait_line("stdout", READY, START_BOUND)).group(1)
        run = Run(opts, env, echo, echo_url, sink, config_dir)
        run.log(f"echo backend at {echo_url}; OTLP sink at {sink.url}")
        if opts.proxies:
            await prepare_proxies(run)
        for pairing in opts.pairings:
            await measure_pairing(run, pairing)
        soaked = await soak(run, opts.soak) if opts.soak > 0 else None

    machine["gateway_uvloop"] = run.gateway_uvloop
    rows = report.build_rows(run.series)
    checks = targets.check_targets(rows, soaked, floors_only=opts.check)
    text = report.render_text(machine, rows, targets.section(checks), soaked, run.proxies)
    if run.skipped:
        text += "\nNot measured:\n" + "".join(
            f"- {s['pairing']} {s['subject']}: {s['reason']}\n" for s in run.skipped
        )
    extra = {
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
        "proxies": run.proxies,
        "skipped": run.skipped,
        "otlp_sink": sink.summary(),
        "elapsed_s": round(time.monotonic() - run.started, 1),
    }
    document = report.results_document(machine, run.series, rows, checks, soaked, extra)
    report.write_json(opts.out / "results.json", document)
    (opts.out / "results.md").write_text(text)
    report.write_chart(opts.out / "results.png", rows)
    text += f"\nwritten: {opts.out / 'results.json'}, {opts.out / 'results.png'}\n"
    return Outcome(text, checks)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(args)
    try:
        outcome = asyncio.run(amain(opts, args))
    except KeyboardInterrupt:
        print("interrupted; every process started was stopped", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        print("terminated; every process started was stopped", file=sys.stderr)
        return 143
    except StartFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(outcome.text)
    if opts.strict and any(c.status == "FAIL" for c in outcome.checks):
        return 1
    return 0
