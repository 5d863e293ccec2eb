"""`python -m bench.instructions`: callgrind's count of the instructions a request costs in the
gateway and in its floor (bench/README, "Instructions per request"). The arithmetic on made-up
callgrind output; then a real run with tiny counts, which needs valgrind (`make ci-deps`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.instructions import Count, instructions, parse_args, per_request, ratio, report
from tests.support import missing

ROOT = Path(__file__).resolve().parents[2]
RUN_BOUND = 240.0

# What callgrind writes: a dump's part (its totals) and, at exit, the part since that dump
# (instrumentation was off by then: zero). The header's `summary:` of a dump's part is 0.
DUMPED = """\
version: 1
creator: callgrind-3.19.0
pid: 27677
cmd:  python -m gateway run --config gw.yaml
part: 1
desc: Timerange: Basic block 0 - 86375561
desc: Trigger: dump
positions: line
events: Ir
summary: 0
fl=(1) ???
fn=(1) 0x0000000000401000
0 12
totals: 435212478
"""
AT_EXIT = """\
version: 1
part: 2
desc: Trigger: Program termination
events: Ir
summary: 0
totals: 0
"""
# An older callgrind writes the part's count on `summary:` only.
SUMMARY_ONLY = "events: Ir\nsummary: 1000\n"


def test_instructions_add_each_files_totals() -> None:
    assert instructions([DUMPED, AT_EXIT]) == 435_212_478
    assert instructions([DUMPED, AT_EXIT, SUMMARY_ONLY]) == 435_213_478
    assert instructions([]) == 0


def test_per_request_and_ratio() -> None:
    assert per_request(435_212_478, 1000) == pytest.approx(435_212.478)
    assert ratio(442_000, 256_000) == pytest.approx(1.7265625)
    with pytest.raises(ValueError):
        per_request(1, 0)


def test_report_gives_each_gateway_its_ratio_to_the_floor() -> None:
    floor = Count("floor", 256_000, 1000, 0)
    gateway = Count("main@abc1234", 294_400, 1000, 0)
    failing = Count("h7@def5678+", 300_000, 1000, 3)
    lines = report([floor, gateway, failing], floor)
    assert lines[0] == "floor: 256.0k instructions a request"
    assert lines[1] == "main@abc1234: 294.4k instructions a request, 1.15x the floor (target 1.15x)"
    assert lines[2].endswith("1.17x the floor (target 1.15x); 3 of 1000 requests failed")
    assert report([gateway], None) == ["main@abc1234: 294.4k instructions a request"]


def test_arguments_default_to_this_checkout_and_refuse_other_directories(tmp_path: Path) -> None:
    args = parse_args([])
    assert args.checkouts == [ROOT] and args.floor and args.backend == "stdio"
    assert parse_args(["--no-floor", str(ROOT)]).floor is False
    with pytest.raises(SystemExit):
        parse_args([str(tmp_path)])
    with pytest.raises(SystemExit):
        parse_args(["--requests", "0"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_counts_the_floor_and_the_gateway_for_real() -> None:
    """HTTP->HTTP (the echo server, the aiohttp hop, the gateway), a few requests: each count is
    a request's worth (not zero: instrumentation was on; not millions: start-up was not
    counted), and the gateway's ratio is its count over the floor's."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        missing("valgrind", "make ci-deps installs Debian's valgrind")
    cmd = [sys.executable, "-m", "bench.instructions", "--backend", "http"]
    cmd += ["--clients", "2", "--requests", "40", "--warmup", "20"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_BOUND)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == "HTTP->http, tools/call, modern client, 2 clients, 40 requests counted after 20:"
    )
    floor = re.fullmatch(r"floor: ([\d.]+)k instructions a request", lines[1])
    assert floor is not None, lines
    gateway = re.fullmatch(
        r"\S+: ([\d.]+)k instructions a request, ([\d.]+)x the floor \(target 1\.15x\)", lines[2]
    )
    assert gateway is not None, lines
    floor_k, gateway_k = float(floor.group(1)), float(gateway.group(1))
    for k in (floor_k, gateway_k):
        assert 20 < k < 5_000
    assert float(gateway.group(2)) == pytest.approx(gateway_k / floor_k, abs=0.01)
