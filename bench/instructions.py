"""Instructions per request: a deterministic A/B of the request path on a busy machine.

    python -m bench.instructions [--backend http|stdio] [--method tools/call|tools/list]
                                 [--era modern|legacy] [--clients 8] [--requests 1000]
                                 [--warmup 300] [--floor | --no-floor] [CHECKOUT ...]

Wall-clock A/B on a small machine shared with other work is noise; valgrind's callgrind counts
the instructions a process executes, the same from run to run within about 1.5%. Each subject (the
floor, the bare bridge or hop of bench/passthrough.py, then the gateway of each CHECKOUT, a
directory holding a `gateway` package; this one by default) runs under callgrind with its
instrumentation off while it starts and serves `--warmup` requests of bench/load.py, then on
for `--requests` more, and the instructions counted are divided by those requests. Only the
subject's own process is traced: the echo backend (its stdio child or its HTTP server) and the
load generator are not. The connections of the measured run's clients (and, for legacy
clients, their sessions) are part of the count, spread over its requests.

Each subject's line gives its instructions per request and, for a gateway, the ratio to the
floor of the same run (issue 34's target: 1.15x). valgrind and callgrind_control must be
installed (Debian's `valgrind`; `make ci-deps` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.profile import gateway_config
from bench.run import ECHO_STDIO, LISTENING, PY, READY, ROOT, Proc, Procs, base_env, wait_port

START_BOUND = 600.0  # a start under valgrind: seconds, not milliseconds
# A callgrind output file's totals, else its summary (the header's; 0 in a dump's part): the
# first number is the first event, instructions (Ir), the only one collected here.
_TOTALS = re.compile(r"^totals:\s+(\d+)", re.MULTILINE)
_SUMMARY = re.compile(r"^summary:\s+(\d+)", re.MULTILINE)


def instructions(outputs: Iterable[str]) -> int:
    """The instructions counted in callgrind's output files (one per dump, and the one written
    at exit): each file's `totals:` line, or its `summary:` where it has none, added up."""
    total = 0
    for text in outputs:
        found = _TOTALS.findall(text) or _SUMMARY.findall(text)
        total += sum(int(n) for n in found)
    return total


def per_request(total: int, requests: int) -> float:
    if requests <= 0:
        raise ValueError("no requests were counted")
    return total / requests


def ratio(subject: float, floor: float) -> float:
    return subject / floor


@dataclass(frozen=True)
class Count:
    name: str
    per_request: float
    requests: int
    errors: int


def describe(checkout: Path) -> str:
    """The checkout's name and commit (with `+` when its tree has changes) for the report."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return checkout.name
    return f"{checkout.name}@{commit}{'+' if dirty else ''}"


def report(counts: Sequence[Count], floor: Count | None, target: float = 1.15) -> list[str]:
    lines = []
    for count in counts:
        line = f"{count.name}: {count.per_request / 1000:.1f}k instructions a request"
        if floor is not None and count is not floor:
            times = ratio(count.per_request, floor.per_request)
            line += f", {times:.2f}x the floor (target {target:.2f}x)"
        if count.errors:
            line += f"; {count.errors} of {count.requests} requests failed"
        lines.append(line)
    return lines


def _outputs(folder: Path) -> list[str]:
    return [p.read_text(errors="replace") for p in sorted(folder.glob("callgrind.out*"))]


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


async def _control(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        "callgrind_control",
        *args,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120.0)
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)}: {err.decode(errors='replace')}")


async def _load(procs: Procs, url: str, args: argparse.Namespace, requests: int) -> dict[str, int]:
    argv = [PY, "-m", "bench.load", "--url", url, "--method", args.method, "--era", args.era]
    argv += ["--concurrency", str(args.clients), "--requests", str(requests)]
    load = await Proc.start("load", argv, base_env())
    procs.procs.append(load)
    await load.wait_exit(START_BOUND)
    out = [line for line in load.lines["stdout"] if line.strip()]
    if load.returncode != 0 or not out:
        raise RuntimeError(f"bench.load failed (code {load.returncode}); {load.tail()}")
    result: dict[str, int] = orjson.loads(out[-1])
    return result


async def count(
    name: str,
    argv: Sequence[str],
    cwd: Path,
    ready: tuple[str, re.Pattern[str]],
    args: argparse.Namespace,
) -> Count:
    """Run one subject under callgrind and count its instructions over the measured requests."""
    env = base_env()
    env["PYTHONPATH"] = str(cwd)
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts in every run
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as scratch:
        out = Path(scratch, "callgrind.out")
        grind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        grind += [f"--callgrind-out-file={out}"]
        async with Procs() as procs:
            subject = await Proc.start(name, [*grind, *argv], env, cwd=cwd)
            procs.procs.append(subject)
            url = (await subject.wait_line(*ready, START_BOUND)).group(1)
            await _load(procs, url, args, args.warmup)
            await _control("-i", "on", str(subject.pid))
            result = await _load(procs, url, args, args.requests)
            await _control("-i", "off", str(subject.pid))
            await _control("-d", str(subject.pid))
        texts = _outputs(Path(scratch))
    return Count(
        name, per_request(instructions(texts), args.requests), result["requests"], result["errors"]
    )


async def run(args: argparse.Namespace) -> list[Count]:
    env = base_env()
    counts: list[Count] = []
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as scratch:
        async with Procs() as procs:
            echo_url = None
            if args.backend == "http":
                argv = [PY, "-m", "bench.echo", "--http", "--port", "0"]
                echo = await Proc.start("echo", argv, env)
                procs.procs.append(echo)
                echo_url = (await echo.wait_line("stdout", READY, 30.0)).group(1)
                await wait_port(echo_url, 30.0, echo)
            if args.floor:
                argv = [PY, "-m", "bench.passthrough", "--port", "0"]
                if echo_url is not None:
                    argv += ["--client", "aiohttp", "--upstream", echo_url]
                else:
                    argv += ["--client", "stdio", "--", *ECHO_STDIO]
                counts.append(await count("floor", argv, ROOT, ("stdout", READY), args))
            config = Path(scratch, "gateway.yaml")
            _write(config, gateway_config(args.backend, echo_url))
            for checkout in args.checkouts:
                argv = [PY, "-m", "gateway", "run", "--config", str(config), "--log-level", "info"]
                counts.append(
                    await count(describe(checkout), argv, checkout, ("stderr", LISTENING), args)
                )
    return counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("--backend", choices=["http", "stdio"], default="stdio")
    parser.add_argument("--method", choices=["tools/call", "tools/list"], default="tools/call")
    parser.add_argument("--era", choices=["modern", "legacy"], default="modern")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument(
        "--floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count the floor (bench/passthrough.py's bridge or hop) first (default: yes)",
    )
    parser.add_argument(
        "checkouts",
        nargs="*",
        type=Path,
        metavar="CHECKOUT",
        help="a directory holding a gateway package (default: this one)",
    )
    args = parser.parse_args(argv)
    if args.clients < 1 or args.requests < 1 or args.warmup < 0:
        parser.error("--clients and --requests must be at least 1, --warmup at least 0")
    args.checkouts = [c.resolve() for c in args.checkouts] or [ROOT]
    for checkout in args.checkouts:
        if not (checkout / "gateway" / "__init__.py").is_file():
            parser.error(f"{checkout} holds no gateway package")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian's valgrind; make ci-deps)", file=sys.stderr)
        return 2
    print(
        f"HTTP->{args.backend}, {args.method}, {args.era} client, {args.clients} clients, "
        f"{args.requests} requests counted after {args.warmup}:"
    )
    counts = asyncio.run(run(args))
    floor = counts[0] if args.floor else None
    print("\n".join(report(counts, floor)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
