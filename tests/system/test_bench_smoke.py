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

from bench.report import (
    LoadResult,
    RoundPair,
    Series,
    build_rows,
    check_targets,
    slope_per_min,
    soak_summary,
    write_json,
)

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


def _load(rps: float, p50: float, cpu_ms: float | None = 100.0, errors: int = 0) -> LoadResult:
    return LoadResult(1000, errors, 1000 / rps, rps, p50, p50 * 2, p50 * 3, cpu_ms, 50.0, 1)


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


def test_targets_pass_fail_and_skip() -> None:
    def series(
        subject: str, conc: int, rps: float, p50: float, cpu: float, tel: str = "off"
    ) -> Series:
        tel = tel if subject.startswith("gateway") else "n/a"
        s = Series("http->http", tel, "tools/call", conc, subject, "modern")
        s.rounds = [RoundPair(0, _load(20000, 0.05), _load(rps, p50, cpu_ms=cpu))]
        return s

    rows = build_rows(
        [
            series("gateway", 1, 3000, 0.30, 120.0),
            series("gateway", 64, 9000, 5.0, 140.0),
            series("gateway", 64, 6000, 7.0, 210.0, tel="on"),
            series("gateway /mcp/v", 64, 8800, 5.1, 144.0),
            series("passthrough-aiohttp", 64, 10000, 4.0, 120.0),
            series("fastmcp", 64, 600, 90.0, 3000.0),
        ]
    )
    status = {c.name.split(",")[0]: c.status for c in check_targets(rows)}
    assert status["gateway CPU / passthrough-aiohttp CPU"] == "PASS"  # 140 / 120
    assert status["added p50 ms"] == "PASS"  # 0.30 - 0.05
    assert status["rps share of passthrough-aiohttp"] == "PASS"  # 0.9
    assert status["rps vs fastmcp's best"] == "FAIL"  # 15x < 20x
    assert status["rps vs supergateway's best"] == "SKIP"
    assert status["gateway CPU tracing on / off"] == "PASS"  # 210 / 140 = 1.5x
    assert status["gateway CPU virtual server / merged server"] == "PASS"  # 144 / 140
    heavy = build_rows(
        [
            series("gateway", 64, 7000, 5.0, 160.0),
            series("gateway", 64, 3000, 9.0, 480.0, tel="on"),
            series("gateway /mcp/v", 64, 6500, 5.5, 180.0),
            series("passthrough-aiohttp", 64, 10000, 4.0, 120.0),
        ]
    )
    status = {c.name.split(",")[0]: c.status for c in check_targets(heavy)}
    assert status["gateway CPU virtual server / merged server"] == "FAIL"  # 180 / 160 > 1.05
    assert status["gateway CPU / passthrough-aiohttp CPU"] == "FAIL"  # 1.33x > 1.25x
    assert status["rps share of passthrough-aiohttp"] == "FAIL"  # 0.7
    assert status["added p50 ms"] == "SKIP"  # no 1-client row
    assert status["gateway CPU tracing on / off"] == "FAIL"  # 3x


def test_soak_slope_and_json_without_nan(tmp_path: Path) -> None:
    assert slope_per_min([50.0, 51.0, 52.0], 30.0) == pytest.approx(2.0)
    assert slope_per_min([50.0], 10.0) is None
    res = LoadResult(5000, 0, 60.0, 83.3, 1.0, 2.0, 3.0, None, 60.0, 1, None, (50.0, 60.0, 60.0))
    soak = soak_summary(res, 20.0)
    assert (soak.rss_start_mb, soak.rss_end_mb, soak.rss_max_mb) == (50.0, 60.0, 60.0)
    assert soak.late_slope_mb_per_min == pytest.approx(0.0)
    write_json(tmp_path / "r.json", {"x": float("nan"), "soak": soak})
    assert orjson.loads((tmp_path / "r.json").read_bytes())["x"] is None
