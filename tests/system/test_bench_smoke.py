"""The benchmark runs end to end (`python -m bench --smoke`): every pairing, method and telemetry
mode yields error-free rows, and the JSON and chart are written. Speed is not asserted here; the
report's arithmetic is checked on made-up numbers."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import targets
from bench.report import (
    LoadResult,
    RoundPair,
    Row,
    Series,
    build_rows,
    slope_per_min,
    soak_summary,
    write_json,
)
from bench.run import parse_args

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The smoke run takes well under a minute on two cores; the bound leaves room for a slow CI box.
RUN_BOUND = 160.0
STOP_BOUND = 15.0


def run_smoke(out: Path) -> tuple[int, str, str]:
    cmd = [sys.executable, "-m", "bench", "--smoke", "--no-proxies", "--out", str(out)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_BOUND)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the orchestrator stop everything it started before it exits.
        proc.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=STOP_BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"smoke run exceeded {RUN_BOUND:.0f} s:\n{stderr.decode()[-3000:]}")
    return proc.returncode, stdout.decode(), stderr.decode()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_smoke_run_writes_complete_results(tmp_path: Path) -> None:
    for extra in ("matplotlib", "httptools", "uvloop"):
        pytest.importorskip(extra, reason="bench extras missing (make bench installs them)")
    code, stdout, stderr = run_smoke(tmp_path)
    assert code == 0, f"exit {code}\n{stdout[-2000:]}\n--- stderr ---\n{stderr[-4000:]}"

    doc: dict[str, Any] = orjson.loads((tmp_path / "results.json").read_bytes())
    rows: list[dict[str, Any]] = doc["rows"]
    assert rows
    for row in rows:
        where = f"{row['pairing']} {row['subject']} {row['method']} c={row['concurrency']}"
        assert row["requests"] > 0, f"{where}: no requests measured ({row['issue']})"
        assert row["errors"] == 0, f"{where}: {row['errors']} errors ({row['issue']})"

    assert {r["pairing"] for r in rows} == {"http->http", "http->stdio", "stdio->http"}
    assert {r["method"] for r in rows} == {"tools/call", "tools/list"}
    for pairing in ("http->http", "http->stdio", "stdio->http"):
        gateway = [r for r in rows if r["pairing"] == pairing and r["subject"] == "gateway"]
        # The 10% parent-based ratio runs where tracing costs the most, HTTP->HTTP only.
        modes = {"off", "on", "10%"} if pairing == "http->http" else {"off", "on"}
        assert {r["telemetry"] for r in gateway} == modes, pairing
        assert any(r["subject"] == "direct" for r in rows if r["pairing"] == pairing), pairing
        assert all(r["added_p50_ms"] is not None for r in gateway), pairing

    # Issue 33: the same gateway's virtual server (/mcp/v) beside the merged server, and its
    # target row.
    virtual = [r for r in rows if r["subject"] == "gateway /mcp/v"]
    assert {(r["pairing"], r["telemetry"]) for r in virtual} == {("http->http", "off")}
    assert {r["method"] for r in virtual} == {"tools/call", "tools/list"}
    # (30 requests may take no 10 ms CPU tick: present, perhaps 0)
    assert all(r["added_p50_ms"] is not None for r in virtual)
    assert all(r["cpu_ms_per_1k"] is not None for r in virtual)
    assert any("virtual server / merged server" in t["name"] for t in doc["targets"])

    # Issue 34: each pairing with a floor has it as rows of the same run, and the gateway (telemetry
    # off) and the floor are measured in both client eras; the cell targets compare them.
    for pairing, floor in (
        ("http->http", "passthrough-aiohttp"),
        ("http->stdio", "passthrough-stdio"),
    ):
        mine = [r for r in rows if r["pairing"] == pairing]
        for subject, tel in (("gateway", "off"), (floor, "n/a")):
            eras = {r["era"] for r in mine if r["subject"] == subject and r["telemetry"] == tel}
            assert eras == {"modern", "legacy"}, (pairing, subject)
        floor_rows = [r for r in mine if r["subject"] == floor]
        assert all(r["added_p50_ms"] is not None for r in floor_rows), pairing
        assert all(r["cpu_ms_per_1k"] is not None for r in floor_rows), pairing
    cells = {t["cell"] for t in doc["targets"] if t["cell"]}
    assert "http->stdio legacy tools/list 8" in cells and "http->http modern tools/call 1" in cells
    assert {t["kind"] for t in doc["targets"] if t["cell"]} == {"cpu", "rps", "p50", "era"}
    assert not [r for r in rows if r["pairing"] == "stdio->http" and r["era"] != "modern"]

    assert doc["machine"]["cpu_count"] >= 1
    assert "--smoke" in doc["machine"]["command"]
    assert doc["raw"] and all(s["rounds"] for s in doc["raw"])
    assert {t["status"] for t in doc["targets"]} <= {"PASS", "FAIL", "SKIP"}
    assert "| pairing" in stdout and "## Targets" in stdout

    png = tmp_path / "results.png"
    assert png.read_bytes()[: len(PNG_SIGNATURE)] == PNG_SIGNATURE


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_search_through_the_gateway_runs(tmp_path: Path) -> None:
    """`python -m bench.search_e2e --smoke`: a started gateway serves tool search over the
    generated 1,000 tools at a virtual server's path, and a backend's list change
    (notifications/tools/list_changed) reaches the index while calls go on. Speed is not
    asserted."""
    out = tmp_path / "search.json"
    cmd = [sys.executable, "-m", "bench.search_e2e", "--smoke", "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    figures: dict[str, Any] = orjson.loads(out.read_bytes())
    assert figures["tools"] == 1000 and figures["search"] == "on"
    assert figures["latency"]["calls"] > 0 and figures["latency"]["search_p50_ms"] > 0
    assert figures["rss_before_mb"] and figures["rss_after_mb"]
    reindex = figures["reindex"]
    assert reindex["relists"] >= 1 and reindex["seen"] >= 1  # the change reached the index
    assert reindex["calm"]["calls"] > 0 and reindex["churn"]["calls"] > 0
    assert "_search_tools" in done.stdout


# --- the report's arithmetic, on made-up numbers (no processes) -------------------------------


def _load(
    rps: float, p50: float, cpu_ms: float | None = 100.0, errors: int = 0, rss: float = 45.0
) -> LoadResult:
    return LoadResult(1000, errors, 1000 / rps, rps, p50, p50 * 2, p50 * 3, cpu_ms, rss, 1)


def test_rows_compare_each_round_with_its_own_direct_run() -> None:
    series = Series("http->http", "off", "tools/call", 1, "gateway", "modern")
    series.rounds = [
        RoundPair(0, _load(10000, 0.10), _load(2000, 0.40, cpu_ms=200.0)),
        RoundPair(1, _load(8000, 0.20), _load(1000, 0.60, cpu_ms=300.0)),
        RoundPair(2, _load(12000, 0.05), _load(3000, 0.30, cpu_ms=250.0)),
    ]
    direct, gateway = build_rows([series])
    assert (direct.subject, direct.rounds, direct.rps, direct.cpu_ms_per_1k) == (
        "direct",
        3,
        10000,
        None,
    )
    assert gateway.rps == 2000 and gateway.p50_ms == 0.40
    assert gateway.added_p50_ms == pytest.approx(0.30)  # medians of 0.30, 0.40, 0.25
    assert gateway.rps_ratio == pytest.approx(0.2)  # medians of 0.2, 0.125, 0.25
    assert gateway.cpu_ms_per_1k == 250.0
    assert gateway.requests == 3000 and gateway.errors == 0


def _series(
    subject: str,
    conc: int,
    rps: float,
    p50: float,
    cpu: float,
    tel: str = "off",
    pairing: str = "http->http",
    era: str = "modern",
    method: str = "tools/call",
    rss: float = 45.0,
) -> Series:
    tel = tel if subject.startswith("gateway") else "n/a"
    s = Series(pairing, tel, method, conc, subject, era)
    s.rounds = [RoundPair(0, _load(20000, 0.05), _load(rps, p50, cpu_ms=cpu, rss=rss))]
    return s


def test_cell_targets_hold_the_gateway_to_its_floor() -> None:
    """Issue 34: per pairing, era, method and clients, the gateway against its floor of the same
    run: CPU <= 1.15x, rps >= 0.9x, +p50 at one client <= the floor's + 0.3 ms, and a modern
    request's CPU <= a legacy one's."""
    rows = build_rows(
        [
            _series("gateway", 1, 900, 0.50, 230.0),  # +0.45 ms
            _series("passthrough-aiohttp", 1, 1000, 0.30, 200.0),  # +0.25 ms
            _series("gateway", 1, 800, 0.65, 260.0, era="legacy"),  # +0.60 ms
            _series("passthrough-aiohttp", 1, 1000, 0.30, 200.0, era="legacy"),
            _series("gateway", 64, 2600, 5.0, 240.0, pairing="http->stdio"),
            _series("passthrough-stdio", 64, 3000, 4.0, 200.0, pairing="http->stdio"),
            _series("gateway", 64, 2000, 5.0, 300.0, pairing="http->stdio", era="legacy"),
        ]
    )
    checks = {(c.cell, c.kind): c for c in targets.check_targets(rows) if c.cell}
    cpu = checks[("http->http modern tools/call 1", "cpu")]
    assert (cpu.status, cpu.measured, cpu.reference) == ("PASS", 230.0, 200.0)
    assert cpu.value == pytest.approx(1.15)
    rps = checks[("http->http modern tools/call 1", "rps")]
    assert rps.status == "PASS" and rps.value == pytest.approx(0.9)
    p50 = checks[("http->http modern tools/call 1", "p50")]
    assert p50.status == "PASS" and p50.value == pytest.approx(0.2)
    assert checks[("http->http modern tools/call 1", "era")].status == "PASS"  # 230 < 260
    assert checks[("http->http legacy tools/call 1", "cpu")].status == "FAIL"  # 1.3x
    assert checks[("http->http legacy tools/call 1", "rps")].status == "FAIL"  # 0.8x
    assert checks[("http->http legacy tools/call 1", "p50")].status == "FAIL"  # 0.35 over
    assert ("http->http legacy tools/call 1", "era") not in checks  # said once, on modern
    assert checks[("http->stdio modern tools/call 64", "cpu")].status == "FAIL"  # 1.2x
    assert checks[("http->stdio modern tools/call 64", "rps")].status == "FAIL"  # 0.87x
    assert ("http->stdio modern tools/call 64", "p50") not in checks  # one client only
    assert checks[("http->stdio modern tools/call 64", "era")].status == "PASS"
    # No floor measured in the legacy era there: the gateway's cell is not measured, not passed.
    assert checks[("http->stdio legacy tools/call 64", "cpu")].status == "SKIP"

    floors_only = targets.check_targets(rows, floors_only=True)
    assert floors_only and {c.kind for c in floors_only} == {"cpu", "rps", "p50"}
    text = targets.section(targets.check_targets(rows))
    assert "230 / 200 = 1.15x PASS" in text
    assert "| 0.45 / 0.25 = +0.20 ms PASS |" in text
    assert "| 800 / 1000 = 0.80x FAIL " in text


def test_other_targets_pass_fail_and_skip() -> None:
    def status(rows: list[Row]) -> dict[str, str]:
        checks = targets.check_targets(rows)
        return {c.name.split(" tools/call")[0].rstrip(",").removesuffix(", telemetry off"): c.status
                for c in checks if not c.cell}  # fmt: skip

    good = status(
        build_rows(
            [
                _series("gateway", 64, 9000, 5.0, 140.0),
                _series("gateway", 64, 6000, 7.0, 210.0, tel="on"),
                _series("gateway", 64, 8500, 5.5, 160.0, tel="10%"),
                _series("gateway /mcp/v", 64, 8800, 5.1, 144.0, rss=49.0),
                _series("gateway", 64, 9000, 5.0, 160.0, pairing="stdio->http"),
                _series("gateway", 1, 3000, 0.3, 160.0, pairing="http->stdio", rss=51.0),
                _series("fastmcp", 64, 600, 90.0, 3000.0),
            ]
        )
    )
    assert good["gateway CPU tracing on / off, HTTP->HTTP"] == "PASS"  # 210 / 140 = 1.5x
    assert good["gateway CPU tracing on / off, HTTP->STDIO"] == "SKIP"
    assert good["gateway CPU tracing 10% / off, HTTP->HTTP"] == "PASS"  # 1.14x
    assert good["gateway CPU virtual server / merged server, HTTP->HTTP"] == "PASS"  # 144 / 140
    assert good["gateway CPU STDIO->HTTP / HTTP->HTTP"] == "PASS"  # 1.14x
    assert good["rps vs fastmcp's best"] == "FAIL"  # 15x < 20x
    assert good["rps vs supergateway's best"] == "SKIP"
    # The peak over the gateway process's rows, /mcp/v's included: the same process.
    assert good["gateway peak RSS MB, http->http"] == "PASS"  # 49 MB
    assert good["gateway peak RSS MB, http->stdio"] == "FAIL"  # 51 MB
    heavy = status(
        build_rows(
            [
                _series("gateway", 64, 7000, 5.0, 160.0),
                _series("gateway", 64, 3000, 9.0, 480.0, tel="on"),
                _series("gateway", 64, 3000, 9.0, 200.0, tel="10%"),
                _series("gateway /mcp/v", 64, 6500, 5.5, 180.0),
            ]
        )
    )
    assert heavy["gateway CPU virtual server / merged server, HTTP->HTTP"] == "FAIL"  # > 1.05
    assert heavy["gateway CPU tracing on / off, HTTP->HTTP"] == "FAIL"  # 3x
    assert heavy["gateway CPU tracing 10% / off, HTTP->HTTP"] == "FAIL"  # 1.25x
    assert heavy["gateway peak RSS MB, http->stdio"] == "SKIP"


def test_soak_slope_and_json_without_nan(tmp_path: Path) -> None:
    assert slope_per_min([50.0, 51.0, 52.0], 30.0) == pytest.approx(2.0)
    assert slope_per_min([50.0], 10.0) is None
    res = LoadResult(5000, 0, 60.0, 83.3, 1.0, 2.0, 3.0, None, 60.0, 1, None, (50.0, 60.0, 60.0))
    soak = soak_summary(res, 20.0)
    assert (soak.rss_start_mb, soak.rss_end_mb, soak.rss_max_mb) == (50.0, 60.0, 60.0)
    assert soak.late_slope_mb_per_min == pytest.approx(0.0)
    write_json(tmp_path / "r.json", {"x": float("nan"), "soak": soak})
    assert orjson.loads((tmp_path / "r.json").read_bytes())["x"] is None


def test_check_picks_the_floor_comparison_and_lets_options_win() -> None:
    """`make bench-check`: HTTP->HTTP and HTTP->stdio, modern, tools/call, 64 and 1 clients,
    telemetry off, 3 rounds, no proxies and no virtual server, FAIL as the exit status."""
    opts = parse_args(["--check"])
    assert opts.check and opts.strict
    assert opts.pairings == ("http->http", "http->stdio")
    assert (opts.eras, opts.methods, opts.concurrency) == (("modern",), ("tools/call",), (64, 1))
    assert (opts.telemetry, opts.rounds, opts.proxies, opts.virtual) == (("off",), 3, False, False)
    assert opts.out != parse_args([]).out  # the full run's results stay as they are
    given = parse_args(["--check", "--rounds", "5", "--pairings", "http-stdio"])
    assert (given.rounds, given.pairings) == (5, ("http->stdio",))
    full = parse_args([])
    assert full.eras == ("modern", "legacy") and not full.check and not full.strict


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_check_run_exits_with_its_targets(tmp_path: Path) -> None:
    """`python -m bench --check` (here with tiny counts): only the floor targets, and the exit
    status is 1 exactly when one of them FAILs."""
    for extra in ("matplotlib", "httptools", "uvloop"):
        pytest.importorskip(extra, reason="bench extras missing (make bench installs them)")
    cmd = [sys.executable, "-m", "bench", "--check", "--rounds", "1", "--requests", "40"]
    done = subprocess.run(
        [*cmd, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, timeout=RUN_BOUND
    )
    doc: dict[str, Any] = orjson.loads((tmp_path / "results.json").read_bytes())
    checks = doc["targets"]
    assert checks and {t["kind"] for t in checks} == {"cpu", "rps", "p50"}
    assert {t["cell"].rsplit(" ", 1)[0] for t in checks} == {
        "http->http modern tools/call",
        "http->stdio modern tools/call",
    }
    failed = any(t["status"] == "FAIL" for t in checks)
    assert done.returncode == (1 if failed else 0), done.stderr.decode()[-3000:]
    assert {r["subject"] for r in doc["rows"]} == {
        "direct",
        "gateway",
        "passthrough-aiohttp",
        "passthrough-stdio",
    }
