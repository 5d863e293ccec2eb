"""Where a request's CPU goes in the gateway, layer by layer: py-spy samples the gateway under
load, each sample is given to the layer of the innermost frame that belongs to one, and the
layers' shares of the samples are turned into microseconds of the gateway's CPU per request
(measured by the load generator over the same seconds). `python -m bench.profile` (bench/README,
issue 34); py-spy comes with the bench extras (`make bench` installs them).

    python -m bench.profile [--backend http|stdio] [--method tools/call|tools/list]
                            [--era modern|legacy] [--concurrency 64] [--seconds 12] [--floor]

`--floor` profiles the bare pass-through the gateway is compared with instead (the same
layers: its own handler falls under "other").

A sampling profile: a layer under about 1% of the samples is within its noise, and the per-layer
figures add up to the measured total by construction.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import orjson

from bench.run import (
    ECHO_STDIO,
    PY,
    READY,
    ROOT,
    Procs,
    base_env,
    free_port,
    start_proc,
    wait_port,
)

OTHER = "other (interpreter, imports, start-up)"
# aiohttp's own frames are the client's when the sample's stack holds the client's modules.
AIOHTTP = "aiohttp"
_CLIENT = re.compile(r"aiohttp/(client|connector|client_proto|client_reqrep)\.py")
# (layer, pattern over "function (path)") from the most specific; the first match, walking a
# sample's stack from its innermost frame outwards, takes the sample.
LAYERS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("numbers scan", r"gateway/protocol/numbers\.py"),
        ("encode", r"^(encode|dumps) \(.*gateway/protocol/jsonrpc\.py"),
        ("decode", r"gateway/protocol/jsonrpc\.py"),
        ("mirrored headers", r"gateway/protocol/headers\.py|gateway/backends/hop\.py"),
        ("_meta and era checks", r"gateway/protocol/meta\.py"),
        ("ids", r"gateway/backends/ids\.py"),
        ("metrics and status feed", r"gateway/telemetry/|gateway/core/instrument\.py"),
        ("overload bound", r"gateway/core/overload\.py|gateway/core/ratelimit\.py"),
        ("policy and apps", r"gateway/core/(policy|apps|unknown|tasks)\.py"),
        ("health", r"gateway/backends/health\.py"),
        ("resilience", r"gateway/backends/(resilience|breaker|safety)\.py"),
        ("login gate", r"gateway/backends/login_gate\.py"),
        ("era", r"gateway/backends/era/"),
        ("backend transport", r"gateway/backends/|gateway/capped\.py"),
        ("dispatcher and routing", r"gateway/core/|gateway/routing/|gateway/origin\.py"),
        ("screening and reply", r"gateway/frontends/|gateway/timers\.py"),
        (AIOHTTP, r"aiohttp/|multidict/|yarl/"),
        ("event loop, sockets and pipes", r"asyncio/|uvloop|anyio/"),
    )
)
_FRAME = re.compile(r"(.*) \((.*?):\d+\)$")


def _frame(text: str) -> str:
    found = _FRAME.match(text)
    if found is None:
        return text
    function, path = found.groups()
    path = re.sub(r".*/site-packages/", "", path)
    return f"{function} ({path})"


def classify(folded: str) -> collections.Counter[str]:
    """Samples per layer from py-spy's raw (folded) output."""
    counts: collections.Counter[str] = collections.Counter()
    for line in folded.splitlines():
        if not line.strip():
            continue
        stack, _, number = line.rpartition(" ")
        frames = [_frame(f) for f in stack.split(";")]
        layer = OTHER
        for frame in reversed(frames):
            hit = next((name for name, pattern in LAYERS if pattern.search(frame)), None)
            if hit is not None:
                layer = hit
                break
        if layer == AIOHTTP:
            client = any(_CLIENT.search(frame) for frame in frames)
            layer = "aiohttp client" if client else "aiohttp server"
        counts[layer] += int(number)
    return counts


def table(counts: collections.Counter[str], us_per_request: float) -> str:
    total = sum(counts.values()) or 1
    rows = ["| layer | share of samples | µs per request |", "| --- | --- | --- |"]
    for layer, n in counts.most_common():
        rows.append(f"| {layer} | {n / total:.1%} | {n / total * us_per_request:.1f} |")
    rows.append(f"| **total (measured)** | 100% | {us_per_request:.1f} |")
    return "\n".join(rows)


def gateway_config(backend: str, echo_url: str | None) -> bytes:
    target: dict[str, object] = (
        {"http": {"url": echo_url}}
        if backend == "http"
        else {"stdio": {"command": PY, "args": ECHO_STDIO[1:], "cwd": str(ROOT)}}
    )
    config = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": {"echo": target},
    }
    return orjson.dumps(config)  # (JSON is YAML)


def _py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return found if Path(found).exists() else None


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


async def profile(args: argparse.Namespace) -> int:
    spy = _py_spy()
    if spy is None:
        print("py-spy is not installed (make bench installs the bench extras)", file=sys.stderr)
        return 2
    env = base_env()
    with tempfile.TemporaryDirectory() as scratch:
        async with Procs() as procs:
            echo_url = None
            if args.backend == "http":
                port = free_port()
                echo = await start_proc(
                    procs, "echo", [PY, "-m", "bench.echo", "--http", "--port", str(port)], env
                )
                echo_url = f"http://127.0.0.1:{port}/mcp"
                await wait_port(echo_url, 10.0, echo)
            if args.floor:
                argv = [PY, "-m", "bench.passthrough", "--port", "0"]
                if args.backend == "http":
                    argv += ["--client", "aiohttp", "--upstream", str(echo_url)]
                else:
                    argv += ["--client", "stdio", "--", *ECHO_STDIO]
                gateway = await start_proc(procs, "floor", argv, env)
                url = (await gateway.wait_line("stdout", READY, 20.0)).group(1)
            else:
                config = Path(scratch, "gateway.yaml")
                _write(config, gateway_config(args.backend, echo_url))
                argv = [PY, "-m", "gateway", "run", "--config", str(config)]
                gateway = await start_proc(procs, "gateway", [*argv, "--log-level", "info"], env)
                found = await gateway.wait_line(
                    "stderr", re.compile(r"listening on (http://\S+)"), 20.0
                )
                url = found.group(1)
            load = [PY, "-m", "bench.load", "--url", url, "--method", args.method]
            load += ["--era", args.era, "--concurrency", str(args.concurrency)]
            warm = await start_proc(procs, "warm-up", [*load, "--duration", "2"], env)
            await warm.wait_exit(60.0)
            folded = Path(scratch, "samples.txt")
            sampler = await start_proc(
                procs,
                "py-spy",
                [spy, "record", "-p", str(gateway.pid), "-o", str(folded), "-f", "raw"]
                + ["-r", "500", "-d", str(round(args.seconds)), "--nonblocking"],
                env,
            )
            measured = await start_proc(
                procs,
                "load",
                [*load, "--duration", str(args.seconds), "--pid", str(gateway.pid)],
                env,
            )
            await measured.wait_exit(args.seconds + 60.0)
            await sampler.wait_exit(args.seconds + 30.0)
            out = [line for line in measured.lines["stdout"] if line.strip()]
            result = orjson.loads(out[-1]) if out else {}
            text = _read(folded)
            if not text or not result.get("requests") or result.get("cpu_ms") is None:
                print(
                    "no samples or no measurement: is py-spy allowed to attach?",
                    *sampler.lines["stderr"],
                    *measured.lines["stderr"],
                    sep="\n",
                    file=sys.stderr,
                )
                return 1
    us = result["cpu_ms"] / result["requests"] * 1000
    subject = "floor (bench.passthrough)" if args.floor else "gateway"
    print(
        f"{subject} HTTP->{args.backend}, {args.method}, {args.era} client, "
        f"{args.concurrency} clients: {result['rps']:.0f} requests/s, {us:.1f} µs of CPU a "
        f"request over {result['requests']} requests\n"
    )
    print(table(classify(text), us))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--backend", choices=["http", "stdio"], default="http")
    parser.add_argument("--method", choices=["tools/call", "tools/list"], default="tools/call")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument(
        "--floor", action="store_true", help="profile the floor (the bare pass-through) instead"
    )
    return asyncio.run(profile(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
