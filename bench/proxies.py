"""Other MCP proxies to measure next to the gateway: mcp-proxy (PyPI), supergateway (npm) and
fastmcp (PyPI), each installed into its own directory under a cache dir and launched in front of
the same echo backend.

`python -m bench.proxies --cache DIR` installs (idempotently) and prints what it got; with
`--verify` it also starts the echo backend and every launch, drives each with `bench.load`, and
prints a table.

What each one can do (found by trying, versions below):
- mcp-proxy is built on the 1.x `mcp` SDK, which knows protocol versions up to 2025-11-25: a
  modern request is refused ("Unsupported protocol version", or "Missing session ID"), so
  clients must speak legacy. It bridges stdio<->HTTP only; HTTP->HTTP is two mcp-proxy processes
  chained over a pipe.
- supergateway in stateless (default) or stateful mode answers modern traffic by spawning a
  fresh stdio child per request (a few req/s); with --stateful and legacy traffic a session
  keeps one child, which is how it is meant to be run. It has no HTTP->HTTP gateway either, so
  that pairing is supergateway chained in front of a second supergateway.
- fastmcp (`fastmcp run`) serves both eras and mirrors the front's era to the backend; its URL
  proxy opens a fresh upstream client per request (its documented default; reuse needs a
  pre-connected Client in a script of one's own, which it warns mixes request contexts), so
  HTTP backends are slow through it while a stdio backend is kept alive.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

# Versions that were installed and verified; pinned so a rerun measures the same code.
MCP_PROXY_VERSION = "0.13.0"
MCP_PROXY_PINS = ("mcp==1.30.0",)
SUPERGATEWAY_VERSION = "4.0.0"
FASTMCP_VERSION = "4.2.3"
FASTMCP_PINS = ("fastmcp-slim==4.2.3", "mcp==2.3.0")

MCP_PROXY = "mcp-proxy"
SUPERGATEWAY = "supergateway"
FASTMCP = "fastmcp"
NAMES = (MCP_PROXY, SUPERGATEWAY, FASTMCP)
PAIRINGS = ("http->http", "http->stdio", "stdio->http")
MODERN = "modern"
LEGACY = "legacy"

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTALL_TIMEOUT = 600.0
# Marks a finished install so a half-done one (killed mid-way) is redone, not trusted.
MARKER = ".bench-installed"


@dataclass(frozen=True)
class Installed:
    name: str
    version: str
    root: Path


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    era: str  # "modern" | "legacy": what clients must speak to the front end
    url: str | None  # front URL for HTTP front ends; None for a stdio front (spawn argv)
    ready: str  # regex on a stdout/stderr line meaning "ready" ("" when ready_stream is "none")
    ready_stream: str  # "stdout" | "stderr" | "none" (none: poll the port until it accepts)
    backend_era: str  # which era the proxy speaks to the echo backend
    note: str


# --- installing -------------------------------------------------------------------------------


def _run(argv: Sequence[str], cwd: Path | None = None) -> str | None:
    """Run an installer step; None on success, else a short reason with the output's tail."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode == 0:
        return None
    tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
    return f"{Path(argv[0]).name} exited {done.returncode}: {tail}"


def _marker_ok(root: Path, version: str) -> bool:
    with contextlib.suppress(OSError):
        return (root / MARKER).read_text().strip() == version
    return False


def _pip_version(root: Path, dist: str) -> str | None:
    # Read the venv's own metadata so the version reported is what actually got installed.
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    try:
        out = subprocess.run(
            [str(root / "bin" / "python"), "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _ensure_pypi(
    cache: Path, name: str, version: str, pins: Sequence[str], exe: str
) -> Installed | str:
    root = cache / name
    if _marker_ok(root, version) and (root / "bin" / exe).exists():
        return Installed(name, version, root)
    if root.exists():
        shutil.rmtree(root)
    # The venv is built from the base interpreter, never the project's .venv, so nothing the
    # proxy pulls in can leak into (or be satisfied by) the gateway's own environment.
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    if reason := _run([base, "-m", "venv", str(root)]):
        return f"venv: {reason}"
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    if reason := _run([*pip, f"{name}=={version}", *pins]):
        return f"pip install {name}=={version}: {reason}"
    got = _pip_version(root, name)
    if got is None:
        return f"{name} installed but its version cannot be read"
    (root / MARKER).write_text(got)
    return Installed(name, got, root)


def _sg_script(root: Path) -> Path:
    return root / "node_modules" / "supergateway" / "dist" / "index.js"


def _ensure_npm(cache: Path) -> Installed | str:
    root = cache / SUPERGATEWAY
    if _marker_ok(root, SUPERGATEWAY_VERSION) and _sg_script(root).exists():
        return Installed(SUPERGATEWAY, SUPERGATEWAY_VERSION, root)
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return "node/npm not found on PATH"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    # npm's --prefix install wants a package.json to record into; a private stub keeps it local.
    (root / "package.json").write_bytes(
        orjson.dumps({"name": "bench-supergateway", "private": True})
    )
    argv = [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund"]
    if reason := _run([*argv, f"{SUPERGATEWAY}@{SUPERGATEWAY_VERSION}"]):
        return f"npm install {SUPERGATEWAY}@{SUPERGATEWAY_VERSION}: {reason}"
    try:
        meta = orjson.loads((root / "node_modules" / "supergateway" / "package.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        return f"supergateway installed but unreadable: {exc}"
    got = str(meta.get("version", "?"))
    (root / MARKER).write_text(got)
    return Installed(SUPERGATEWAY, got, root)


def ensure(cache: Path) -> dict[str, Installed | str]:
    """Install each proxy into its own directory under `cache` (idempotent). A proxy that cannot
    be installed maps to the reason, so the caller can report it and go on."""
    cache = cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    jobs: dict[str, Any] = {}
    # The three installs are independent network-bound jobs; side by side they take a third.
    with ThreadPoolExecutor(max_workers=len(NAMES)) as pool:
        jobs[MCP_PROXY] = pool.submit(
            _ensure_pypi, cache, MCP_PROXY, MCP_PROXY_VERSION, MCP_PROXY_PINS, "mcp-proxy"
        )
        jobs[SUPERGATEWAY] = pool.submit(_ensure_npm, cache)
        jobs[FASTMCP] = pool.submit(
            _ensure_pypi, cache, FASTMCP, FASTMCP_VERSION, FASTMCP_PINS, "fastmcp"
        )
        out: dict[str, Installed | str] = {}
        for name in NAMES:
            try:
                out[name] = jobs[name].result()
            except Exception as exc:  # one broken installer must not cost the others
                out[name] = f"{type(exc).__name__}: {exc}"
    return out


# --- launching --------------------------------------------------------------------------------


def launch(
    inst: Installed,
    pairing: str,
    echo_http_url: str,
    echo_stdio_cmd: list[str],
    port: int,
    *,
    allow_chain: bool = True,
) -> Launch | str:
    """How to run `inst` for `pairing` in front of the echo backend, or why it cannot.

    `port` must be a concrete free port: none of these print the port they bound in a form
    worth waiting on at the log level used for measuring. `allow_chain=False` refuses the
    HTTP->HTTP pairings that are only possible as two processes of the tool chained by stdio.
    """
    if pairing not in PAIRINGS:
        return f"unknown pairing {pairing!r}"
    if inst.name == MCP_PROXY:
        return _mcp_proxy(inst, pairing, echo_http_url, echo_stdio_cmd, port, allow_chain)
    if inst.name == SUPERGATEWAY:
        return _supergateway(inst, pairing, echo_http_url, echo_stdio_cmd, port, allow_chain)
    if inst.name == FASTMCP:
        return _fastmcp(inst, pairing, echo_http_url, echo_stdio_cmd, port)
    return f"unknown proxy {inst.name!r}"


def _front_url(port: int) -> str:
    return f"http://127.0.0.1:{port}/mcp"


def _write_once(path: Path, body: bytes, mode: int = 0o644) -> Path:
    """Write a content-addressed file atomically (launches of several runs may race)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(body)
        tmp.chmod(mode)
        tmp.replace(path)
    return path


def _stdio_wrapper(inst: Installed, stdio: list[str]) -> str:
    """A script that execs the stdio backend, so the proxy's own command line does not contain
    the backend's: load.py leaves out of its CPU count every process whose command line names
    `bench.echo`, and would otherwise leave out the proxy itself. `exec` keeps no extra
    process around."""
    body = f"#!/bin/sh\nexec {shlex.join(stdio)}\n".encode()
    name = f"stdio-{hashlib.sha256(body).hexdigest()[:12]}.sh"
    return str(_write_once(inst.root / "configs" / name, body, 0o755))


def _mcp_proxy(
    inst: Installed, pairing: str, url: str, stdio: list[str], port: int, allow_chain: bool
) -> Launch | str:
    exe = str(inst.root / "bin" / "mcp-proxy")
    # WARNING, not the default INFO: at INFO it logs a line per request, which is not the proxy.
    quiet = ["--log-level", "WARNING"]
    client = [exe, "--transport", "streamablehttp", *quiet, url]
    # Without --pass-environment the SDK hands the child a scrubbed environment (no PYTHONPATH),
    # and `python -m bench.echo` would not import.
    server = [exe, "--host", "127.0.0.1", "--port", str(port), *quiet, "--pass-environment", "--"]
    era_note = "1.x mcp SDK: refuses modern requests, legacy only"
    if pairing == "stdio->http":
        return Launch(client, LEGACY, None, "", "none", LEGACY, era_note)
    if pairing == "http->stdio":
        return Launch(
            [*server, _stdio_wrapper(inst, stdio)],
            LEGACY,
            _front_url(port),
            "",
            "none",
            LEGACY,
            f"{era_note}; one child",
        )
    if not allow_chain:
        return "no HTTP->HTTP mode (a URL argument means stdio front end only)"
    return Launch(
        [*server, *client],
        LEGACY,
        _front_url(port),
        "",
        "none",
        LEGACY,
        f"{era_note}; chained: mcp-proxy (HTTP front) spawns mcp-proxy (stdio->HTTP)",
    )


def _supergateway(
    inst: Installed, pairing: str, url: str, stdio: list[str], port: int, allow_chain: bool
) -> Launch | str:
    node = shutil.which("node")
    if node is None:
        return "node not found on PATH"
    sg = [node, str(_sg_script(inst.root))]
    # --logLevel info logs every message it relays; none keeps logging off the hot path.
    quiet = ["--logLevel", "none"]
    client = [*sg, "--streamableHttp", url, *quiet]
    # --stateful with legacy traffic keeps one child per session; stateless (or modern traffic
    # even when stateful) spawns a child per request.
    server = [
        *sg,
        "--outputTransport",
        "streamableHttp",
        "--stateful",
        "--port",
        str(port),
        "--streamableHttpPath",
        "/mcp",
        *quiet,
        "--stdio",
    ]
    stop = "stop with SIGTERM: children are in their own process groups"
    if pairing == "stdio->http":
        return Launch(
            client,
            LEGACY,
            None,
            "",
            "none",
            LEGACY,
            "modern requests also pass (relayed over a legacy upstream session)",
        )
    if pairing == "http->stdio":
        return Launch(
            [*server, _stdio_wrapper(inst, stdio)],
            LEGACY,
            _front_url(port),
            "",
            "none",
            LEGACY,
            f"--stateful: one child per session (modern: a child per request); {stop}",
        )
    if not allow_chain:
        return "no HTTP->HTTP gateway (streamableHttp input only has a stdio output)"
    return Launch(
        [*server, shlex.join(client)],
        LEGACY,
        _front_url(port),
        "",
        "none",
        LEGACY,
        f"chained: each session spawns a supergateway stdio->HTTP child; {stop}",
    )


def _fastmcp_config(inst: Installed, stdio: list[str]) -> Path:
    """An MCPConfig for `fastmcp run` naming the stdio backend, written under the install dir."""
    # The SDK gives a stdio child a scrubbed environment merged with `env`: put the repo (and
    # any PYTHONPATH we run with) back so `python -m bench.echo` imports from anywhere.
    path_parts = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    server = {
        "command": stdio[0],
        "args": stdio[1:],
        "cwd": str(REPO_ROOT),
        "env": {"PYTHONPATH": os.pathsep.join(p for p in path_parts if p)},
    }
    # One server in the config: fastmcp proxies it directly, so tool names stay unprefixed.
    body = orjson.dumps({"mcpServers": {"echo": server}}, option=orjson.OPT_SORT_KEYS)
    return _write_once(
        inst.root / "configs" / f"mcp-{hashlib.sha256(body).hexdigest()[:12]}.json", body
    )


def _fastmcp(inst: Installed, pairing: str, url: str, stdio: list[str], port: int) -> Launch | str:
    exe = str(inst.root / "bin" / "fastmcp")
    # --no-banner also skips the banner's PyPI update check; WARNING drops uvicorn's access log.
    quiet = ["--no-banner", "--log-level", "WARNING"]
    http_front = [
        "--transport",
        "http",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--path",
        "/mcp",
    ]
    # Measured with cProfile: most of its per-request CPU is httpx loading the CA bundle for the
    # new upstream client (even for http://), not MCP work.
    fresh = (
        "a fresh upstream client per request (fastmcp's default for a URL target); "
        "~30 ms CPU of each is a new httpx client loading the CA bundle"
    )
    if pairing == "stdio->http":
        argv = [exe, "run", url, "--transport", "stdio", *quiet]
        return Launch(argv, MODERN, None, "", "none", MODERN, f"also serves legacy; {fresh}")
    if pairing == "http->http":
        argv = [exe, "run", url, *http_front, *quiet]
        return Launch(
            argv, MODERN, _front_url(port), "", "none", MODERN, f"also serves legacy; {fresh}"
        )
    try:
        config = _fastmcp_config(inst, stdio)
    except OSError as exc:
        return f"cannot write the fastmcp config: {exc}"
    argv = [exe, "run", str(config), *http_front, *quiet]
    return Launch(
        argv,
        MODERN,
        _front_url(port),
        "",
        "none",
        MODERN,
        "also serves legacy; one kept-alive stdio child",
    )


# --- command line: install, and optionally verify every launch with bench.load ---------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes], bound: float) -> str | None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited {proc.returncode} before listening"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return None
        # No ready line to wait on (see Launch.ready_stream): poll, bounded.
        time.sleep(0.05)
    return f"not listening after {bound:.0f}s"


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        # The proxies' children live in the proxy's session; end the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _start_echo() -> tuple[subprocess.Popen[bytes], str]:
    echo = subprocess.Popen(
        [sys.executable, "-m", "bench.echo", "--http", "--port", "0"],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
        start_new_session=True,
    )
    assert echo.stdout is not None
    line = echo.stdout.readline().decode()
    match = re.match(r"READY (http://\S+)", line)
    if match is None:
        _stop(echo)
        raise SystemExit(f"echo backend did not start: {line!r}")
    return echo, match.group(1)


def _load(launch: Launch, method: str, requests: int, concurrency: int, pid: int | None) -> str:
    argv = [sys.executable, "-m", "bench.load", "--concurrency", str(concurrency)]
    argv += ["--requests", str(requests), "--warmup", str(min(50, requests)), "--method", method]
    argv += ["--era", launch.era]
    if launch.url is not None:
        argv += ["--url", launch.url]
        if pid is not None:
            argv += ["--pid", str(pid)]
    else:
        argv += ["--stdio", "--", *launch.argv]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        return "load timed out"
    try:
        res = orjson.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, orjson.JSONDecodeError):
        return f"load failed ({done.returncode}): {done.stderr.strip()[-200:]}"
    cpu = res.get("cpu_ms")
    per = f"{cpu / max(1, res['requests']):.2f}" if isinstance(cpu, (int, float)) else "-"
    return (
        f"{res['rps']:8.0f} req/s  p50 {res['p50_ms']:7.2f} ms  errors {res['errors']:4d}"
        f"  cpu/req {per} ms"
    )


def _verify(found: dict[str, Installed | str], requests: int, concurrency: int) -> None:
    echo, echo_url = _start_echo()
    stdio_cmd = [sys.executable, "-m", "bench.echo", "--stdio"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    try:
        for name, inst in found.items():
            if isinstance(inst, str):
                continue
            for pairing in PAIRINGS:
                got = launch(inst, pairing, echo_url, stdio_cmd, _free_port())
                head = f"{name:13s} {pairing:12s}"
                if isinstance(got, str):
                    print(f"{head} n/a: {got}", flush=True)
                    continue
                proc = None
                if got.url is not None:
                    proc = subprocess.Popen(
                        got.argv,
                        cwd=REPO_ROOT,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                    port = int(got.url.rsplit(":", 1)[1].split("/", 1)[0])
                    if reason := _wait_port(port, proc, 60.0):
                        print(f"{head} {got.era:6s} failed to start: {reason}", flush=True)
                        _stop(proc)
                        continue
                try:
                    for method in ("tools/call", "tools/list"):
                        pid = proc.pid if proc is not None else None
                        res = _load(got, method, requests, concurrency, pid)
                        print(f"{head} {got.era:6s} {method:10s} {res}", flush=True)
                finally:
                    if proc is not None:
                        _stop(proc)
    finally:
        _stop(echo)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.proxies", description=__doc__)
    ap.add_argument("--cache", type=Path, required=True, help="install root (one dir per proxy)")
    ap.add_argument("--verify", action="store_true", help="drive every launch with bench.load")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=8)
    ns = ap.parse_args(argv)
    found = ensure(ns.cache)
    for name, inst in found.items():
        if isinstance(inst, str):
            print(f"{name}: NOT AVAILABLE: {inst}")
        else:
            print(f"{name}: {inst.version} at {inst.root}")
    if ns.verify:
        _verify(found, ns.requests, ns.concurrency)
    return 0 if all(isinstance(v, Installed) for v in found.values()) else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
