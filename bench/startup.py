"""Start-up time and resident memory of `python -m gateway run`, config by config.

    python -m bench.startup [--runs N] [--root DIR] [--redis URL] [--json]

Per config, N times: the time from spawning `python -m gateway run` to its `listening on` line,
and its RSS one second later (backends started, catalogs loaded); then `python -m gateway
--help` to its exit. Medians are printed (and the spread). `--root` runs the gateway of another
checkout (e.g. main's, for a before/after); `--redis` adds a cluster config using that Redis.

Configs: `plain-http` and `plain-stdio` (an HTTP listener over the echo backend, nothing else:
the issue 34 case); `tracing` (an OTLP endpoint: the SDK and exporter), `admin` (an admin
listener: the metrics' exposition), `auth` (an issuer: the token checks and PyJWT), `cluster`
(with --redis: the Redis adapters).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from bench.run import ECHO_STDIO, LISTENING, PY, READY, ROOT, START_BOUND, STOP_BOUND

# Settling time between the listening line and reading the RSS: the echo backend's catalog
# arrives well within it.
SETTLE = 1.0
SECRET = "bench-startup-secret-Q4m9Tz2Lw7Kx5Rv"


def configs(echo_url: str, root: Path, redis: str | None) -> dict[str, dict[str, Any]]:
    listen = {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}}
    http = {"echo": {"http": {"url": echo_url}}}
    stdio = {"echo": {"stdio": {"command": PY, "args": ECHO_STDIO[1:], "cwd": str(root)}}}
    made: dict[str, dict[str, Any]] = {
        "plain-http": {"listen": listen, "backends": http},
        "plain-stdio": {"listen": listen, "backends": stdio},
        # Nothing is exported before a request, so an endpoint nobody answers is enough.
        "tracing": {"listen": listen, "backends": http, "telemetry": {"otlp_endpoint": _NOWHERE}},
        # An admin listener serves /metrics: prometheus_client's exposition, made at start.
        "admin": {
            "listen": {**listen, "admin": {"host": "127.0.0.1", "port": 0}},
            "backends": http,
        },
        # The issuer is asked on the first token, not at start.
        "auth": {
            "listen": listen,
            "backends": http,
            "auth": {"issuer": "https://issuer.invalid", "resource": "http://127.0.0.1/mcp"},
        },
    }
    if redis is not None:
        made["cluster"] = {
            "listen": listen,
            "backends": http,
            "cluster": {"redis": redis, "secrets": [SECRET]},
        }
    return made


_NOWHERE = "http://127.0.0.1:9"


def environment(root: Path) -> dict[str, str]:
    # Only the config decides what is on: no OTEL_* variable may turn tracing on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(root)
    return env


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    return int(found.group(1)) / 1024 if found else float("nan")


def one_start(config: Path, root: Path) -> tuple[float, float]:
    """(seconds to the listening line, RSS in MB after SETTLE)."""
    argv = [PY, "-m", "gateway", "run", "--config", str(config), "--log-level", "info"]
    began = time.perf_counter()
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=environment(root), cwd=root
    )
    try:
        assert proc.stderr is not None
        deadline = began + START_BOUND
        for raw in proc.stderr:
            if LISTENING.search(raw.decode(errors="replace")):
                break
            if time.perf_counter() > deadline:
                raise SystemExit(f"{config.name}: no listening line in {START_BOUND} s")
        else:
            raise SystemExit(f"{config.name}: the gateway exited before listening")
        took = time.perf_counter() - began
        time.sleep(SETTLE)
        return took, rss_mb(proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def one_help(root: Path) -> float:
    began = time.perf_counter()
    subprocess.run(
        [PY, "-m", "gateway", "--help"],
        stdout=subprocess.DEVNULL,
        env=environment(root),
        cwd=root,
        check=True,
        timeout=START_BOUND,
    )
    return time.perf_counter() - began


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(runs: int, root: Path, redis: str | None) -> dict[str, Any]:
    echo = subprocess.Popen(
        [PY, "-m", "bench.echo", "--http", "--port", "0"],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert echo.stdout is not None
        ready = READY.search(echo.stdout.readline().decode())
        if ready is None:
            raise SystemExit("the echo backend did not start")
        results: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
            for name, config in configs(ready.group(1), root, redis).items():
                path = Path(tmp) / f"{name}.yaml"
                path.write_bytes(orjson.dumps(config))  # JSON is YAML
                starts = [one_start(path, root) for _ in range(runs)]
                results[name] = {
                    "start_s": summary([s for s, _ in starts]),
                    "rss_mb": summary([r for _, r in starts]),
                }
                print(f"  {name}: done", file=sys.stderr)
        results["--help"] = {"start_s": summary([one_help(root) for _ in range(runs)])}
        return results
    finally:
        echo.send_signal(signal.SIGTERM)
        echo.wait(STOP_BOUND)


def table(results: dict[str, Any], root: Path, runs: int) -> str:
    lines = [
        f"gateway of {root}, {runs} runs each (median, min-max)",
        "",
        "| config | to `listening on` (ms) | RSS 1 s after (MB) |",
        "| --- | --- | --- |",
    ]
    for name, row in results.items():
        start = row["start_s"]
        cell = f"{start['median'] * 1000:.0f} ({start['min'] * 1000:.0f}-{start['max'] * 1000:.0f})"
        rss = row.get("rss_mb")
        memory = f"{rss['median']:.1f} ({rss['min']:.1f}-{rss['max']:.1f})" if rss else "n/a"
        lines.append(f"| {name} | {cell} | {memory} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose gateway runs")
    parser.add_argument("--redis", help="a Redis URL: adds the cluster config")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    results = measure(args.runs, root, args.redis)
    print(orjson.dumps(results).decode() if args.json else table(results, root, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
