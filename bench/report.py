"""Turning load.py measurements into rows, a table, target checks, results.json and a chart.

Everything here except `write_json` and `write_chart` is a pure function of its arguments, so the
numbers in the table, the JSON and the chart cannot disagree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

PAIRINGS = ("http->http", "http->stdio", "stdio->http")
DIRECT = "direct"
GATEWAY = "gateway"
# The same gateway process's virtual server over the same backend (`servers: {v: ...}` at
# /mcp/v), measured beside the merged server's /mcp.
GATEWAY_VIRTUAL = "gateway /mcp/v"
PASSTHROUGH_RAW = "passthrough-raw"
PASSTHROUGH_AIOHTTP = "passthrough-aiohttp"
# The bare HTTP->stdio bridge (bench/passthrough.py --client stdio): HTTP->stdio's floor.
PASSTHROUGH_STDIO = "passthrough-stdio"
PASSTHROUGH_NAMES = {
    "raw": PASSTHROUGH_RAW,
    "aiohttp": PASSTHROUGH_AIOHTTP,
    "stdio": PASSTHROUGH_STDIO,
}
NO_TELEMETRY = "n/a"  # subjects that have no telemetry switch (everything but the gateway)


@dataclass(frozen=True)
class LoadResult:
    """One load.py run, as it printed it; `failure` is set when load.py itself did not finish."""

    requests: int
    errors: int
    seconds: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    cpu_ms: float | None
    peak_rss_mb: float | None
    target_pid: int | None
    failure: str | None = None
    rss_samples_mb: tuple[float, ...] | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> LoadResult:
        samples = obj.get("rss_samples_mb")
        return cls(
            requests=int(obj["requests"]),
            errors=int(obj["errors"]),
            seconds=float(obj["seconds"]),
            rps=float(obj["rps"]),
            p50_ms=float(obj["p50_ms"]),
            p90_ms=float(obj["p90_ms"]),
            p99_ms=float(obj["p99_ms"]),
            cpu_ms=_opt_float(obj.get("cpu_ms")),
            peak_rss_mb=_opt_float(obj.get("peak_rss_mb")),
            target_pid=None if obj.get("target_pid") is None else int(obj["target_pid"]),
            rss_samples_mb=None if samples is None else tuple(float(s) for s in samples),
        )

    @classmethod
    def failed(cls, reason: str, requests: int) -> LoadResult:
        """A run that produced no numbers counts every planned request as an error."""
        nan = float("nan")
        return cls(0, requests, 0.0, 0.0, nan, nan, nan, None, None, None, failure=reason)

    @property
    def cpu_ms_per_1k(self) -> float | None:
        if self.cpu_ms is None or self.requests <= 0:
            return None
        return self.cpu_ms * 1000.0 / self.requests


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class RoundPair:
    """One round for one subject: the direct path measured right before the subject."""

    round: int
    direct: LoadResult
    subject: LoadResult


@dataclass
class Series:
    """All rounds of one subject at one (pairing, telemetry, method, concurrency)."""

    pairing: str
    telemetry: str
    method: str
    concurrency: int
    subject: str
    era: str
    note: str = ""  # about the subject (how a proxy was launched); shown once, under the table
    issue: str = ""  # what went wrong (gave up at this concurrency, died); shown on the row
    rounds: list[RoundPair] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    pairing: str
    telemetry: str
    method: str
    concurrency: int
    subject: str
    era: str
    rounds: int
    requests: int  # measured requests summed over the rounds
    errors: int
    rps: float  # medians over rounds from here on
    p50_ms: float
    p90_ms: float
    p99_ms: float
    added_p50_ms: float | None  # subject p50 - direct p50 of the same round
    rps_ratio: float | None  # subject rps / direct rps of the same round
    direct_rps: float | None
    direct_p50_ms: float | None
    cpu_ms_per_1k: float | None
    peak_rss_mb: float | None  # max over rounds
    note: str = ""
    issue: str = ""


@dataclass(frozen=True)
class Soak:
    seconds: float
    requests: int
    errors: int
    rps: float
    interval_s: float
    samples_mb: tuple[float, ...]
    rss_start_mb: float | None
    rss_end_mb: float | None
    rss_max_mb: float | None
    slope_mb_per_min: float | None  # least squares over every sample
    late_slope_mb_per_min: float | None  # over the second half: warm-up growth excluded
    note: str = ""


@dataclass(frozen=True)
class Check:
    """One target line (bench/targets.py)."""

    name: str
    status: str  # PASS | FAIL | SKIP
    value: float | None  # what is held to the limit: a ratio, a difference, a size
    limit: float | None
    detail: str
    measured: float | None = None  # the gateway's number
    reference: float | None = None  # the one it is compared with (its floor's, ...)
    cell: str = ""  # "pairing era method clients" of a per-cell target; "" for the others
    kind: str = ""  # which per-cell target (targets.CPU, RPS, P50, ERA)


# --- aggregation ------------------------------------------------------------------------------


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None and v == v]  # drops None and NaN
    return statistics.median(present) if present else None


def _median0(values: Iterable[float | None]) -> float:
    m = _median(values)
    return float("nan") if m is None else m


def _ok(r: LoadResult) -> bool:
    # A run where every request failed measured how fast errors come back, not the subject.
    return r.failure is None and r.requests > 0 and r.errors < r.requests


def _notes(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def aggregate(series: Series) -> Row:
    subj = [p.subject for p in series.rounds]
    good = [p for p in series.rounds if _ok(p.subject) and _ok(p.direct)]
    failures = sorted({r.failure for r in subj if r.failure})
    peaks = [r.peak_rss_mb for r in subj if r.peak_rss_mb is not None]
    return Row(
        pairing=series.pairing,
        telemetry=series.telemetry,
        method=series.method,
        concurrency=series.concurrency,
        subject=series.subject,
        era=series.era,
        rounds=len(series.rounds),
        requests=sum(r.requests for r in subj),
        errors=sum(r.errors for r in subj),
        rps=_median0(r.rps for r in subj if _ok(r)),
        p50_ms=_median0(r.p50_ms for r in subj if _ok(r)),
        p90_ms=_median0(r.p90_ms for r in subj if _ok(r)),
        p99_ms=_median0(r.p99_ms for r in subj if _ok(r)),
        added_p50_ms=_median(p.subject.p50_ms - p.direct.p50_ms for p in good),
        rps_ratio=_median(p.subject.rps / p.direct.rps for p in good if p.direct.rps > 0),
        direct_rps=_median(p.direct.rps for p in good),
        direct_p50_ms=_median(p.direct.p50_ms for p in good),
        cpu_ms_per_1k=_median(r.cpu_ms_per_1k for r in subj if _ok(r)),
        peak_rss_mb=max(peaks) if peaks else None,
        note=series.note,
        issue=_notes(series.issue, *failures),
    )


def direct_row(group: Sequence[Series]) -> Row | None:
    """The direct path of one (pairing, method, concurrency) over every subject's rounds: at 64
    clients on HTTP this is the load generator's own ceiling. Only modern-era runs are pooled
    when there are any, so a legacy-speaking proxy's baseline does not blur the common one."""
    if not group:
        return None
    runs = [(s.era, p.direct) for s in group for p in s.rounds]
    if not runs:
        return None
    eras = {era for era, _ in runs}
    era = "modern" if "modern" in eras else sorted(eras)[0]
    picked = [r for e, r in runs if e == era]
    ok = [r for r in picked if _ok(r)]
    first = group[0]
    return Row(
        pairing=first.pairing,
        telemetry=NO_TELEMETRY,
        method=first.method,
        concurrency=first.concurrency,
        subject=DIRECT,
        era=era,
        rounds=len(picked),
        requests=sum(r.requests for r in picked),
        errors=sum(r.errors for r in picked),
        rps=_median0(r.rps for r in ok),
        p50_ms=_median0(r.p50_ms for r in ok),
        p90_ms=_median0(r.p90_ms for r in ok),
        p99_ms=_median0(r.p99_ms for r in ok),
        added_p50_ms=0.0,
        rps_ratio=1.0,
        direct_rps=None,
        direct_p50_ms=None,
        cpu_ms_per_1k=None,  # nothing of ours runs on the direct path
        peak_rss_mb=None,
        issue=_notes(*sorted({r.failure for r in picked if r.failure})),
    )


def build_rows(series: Sequence[Series]) -> list[Row]:
    """A direct row then one row per subject for each (pairing, method, concurrency), in the
    order the series were measured."""
    groups: dict[tuple[str, str, int], list[Series]] = {}
    for s in series:
        groups.setdefault((s.pairing, s.method, s.concurrency), []).append(s)
    rows: list[Row] = []
    for group in groups.values():
        d = direct_row(group)
        if d is not None:
            rows.append(d)
        rows.extend(aggregate(s) for s in group)
    return rows


def soak_summary(result: LoadResult, interval_s: float, note: str = "") -> Soak:
    samples = result.rss_samples_mb or ()
    half = samples[len(samples) // 2 :]
    return Soak(
        seconds=result.seconds,
        requests=result.requests,
        errors=result.errors,
        rps=result.rps,
        interval_s=interval_s,
        samples_mb=samples,
        rss_start_mb=samples[0] if samples else None,
        rss_end_mb=samples[-1] if samples else None,
        rss_max_mb=max(samples) if samples else result.peak_rss_mb,
        slope_mb_per_min=slope_per_min(samples, interval_s),
        late_slope_mb_per_min=slope_per_min(half, interval_s),
        note=_notes(note, result.failure or ""),
    )


def slope_per_min(samples: Sequence[float], interval_s: float) -> float | None:
    """Least-squares slope of evenly spaced samples, in units per minute."""
    n = len(samples)
    if n < 2 or interval_s <= 0:
        return None
    xs = [i * interval_s / 60.0 for i in range(n)]
    mx, my = sum(xs) / n, sum(samples) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, samples, strict=True)) / var


# --- text -------------------------------------------------------------------------------------


def num(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    # Other proxies keep well under a tenth of the direct path's rps: show them, not 0.00.
    return num(value, 2 if value is None or value >= 0.1 else 3)


def _signed(value: float | None, digits: int = 3) -> str:
    if value is None or value != value:
        return "-"
    return f"{value:+.{digits}f}"


COLUMNS = (
    "pairing",
    "telemetry",
    "method",
    "clients",
    "subject",
    "rps",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "+p50 ms",
    "x direct",
    "cpu ms/1k",
    "peak RSS MB",
    "errors",
    "issue",
)


def row_cells(row: Row) -> list[str]:
    return [
        row.pairing,
        row.telemetry,
        row.method,
        str(row.concurrency),
        row.subject if row.era == "modern" else f"{row.subject} ({row.era})",
        num(row.rps, 0),
        num(row.p50_ms, 3),
        num(row.p90_ms, 3),
        num(row.p99_ms, 3),
        "" if row.subject == DIRECT else _signed(row.added_p50_ms),
        "" if row.subject == DIRECT else _ratio(row.rps_ratio),
        num(row.cpu_ms_per_1k, 1),
        num(row.peak_rss_mb, 1),
        str(row.errors),
        row.issue,
    ]


def markdown_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in body)])


def rows_table(rows: Sequence[Row]) -> str:
    return markdown_table(COLUMNS, [row_cells(r) for r in rows])


def soak_text(soak: Soak) -> str:
    body = [
        [
            num(soak.seconds, 0),
            str(soak.requests),
            str(soak.errors),
            num(soak.rps, 0),
            num(soak.rss_start_mb, 1),
            num(soak.rss_end_mb, 1),
            num(soak.rss_max_mb, 1),
            _signed(soak.slope_mb_per_min, 2),
            _signed(soak.late_slope_mb_per_min, 2),
            soak.note,
        ]
    ]
    head = (
        "seconds",
        "requests",
        "errors",
        "rps",
        "RSS start MB",
        "RSS end MB",
        "RSS max MB",
        "slope MB/min",
        "2nd-half slope MB/min",
        "note",
    )
    return markdown_table(head, body)


def subject_notes(rows: Sequence[Row]) -> list[str]:
    """Each subject's launch note once per pairing, instead of on every row."""
    seen: dict[tuple[str, str], str] = {}
    for r in rows:
        if r.note:
            seen.setdefault((r.pairing, r.subject), r.note)
    return [f"{pairing} {subject}: {note}" for (pairing, subject), note in seen.items()]


def ceiling(rows: Sequence[Row]) -> Row | None:
    """The load generator's own ceiling: load.py straight at the echo backend over HTTP at the
    highest measured concurrency, tools/call."""
    direct = [
        r
        for r in rows
        if r.subject == DIRECT and r.pairing == "http->http" and r.method == "tools/call"
    ]
    return max(direct, key=lambda r: r.concurrency) if direct else None


def render_text(
    machine: Mapping[str, Any],
    rows: Sequence[Row],
    targets: str,
    soak: Soak | None,
    proxies: Mapping[str, Any],
) -> str:
    """The whole text; `targets` is the Targets section (bench/targets.py)."""
    out = [
        "# mcp-gateway benchmark",
        "",
        f"- date: {machine.get('date')}; python {machine.get('python')}; "
        f"cpus: {machine.get('cpu_count')} ({machine.get('cpu_model')}); "
        f"uvloop: {'on' if machine.get('uvloop') else 'off'} (gateway: "
        f"{_on_off(machine.get('gateway_uvloop'))})",
        f"- command: {machine.get('command')}",
    ]
    if machine.get("smoke"):
        out.append("- SMOKE RUN: request counts are tiny, the numbers and targets mean nothing")
    top = ceiling(rows)
    if top is not None:
        out.append(
            f"- load generator ceiling (load.py -> echo, HTTP, tools/call, "
            f"{top.concurrency} clients; the 'direct' row): {num(top.rps, 0)} rps, "
            f"p50 {num(top.p50_ms, 3)} ms"
        )
    out.append(
        "- each subject ran interleaved with the direct path (direct, subject, ...); numbers are "
        "medians over rounds; '+p50' and 'x direct' compare with the direct run of the same round"
    )
    if proxies:
        status = ", ".join(f"{k}: {_proxy_status(v)}" for k, v in proxies.items())
        out.append(f"- other proxies: {status}")
    out += ["", rows_table(rows)]
    notes = subject_notes(rows)
    if notes:
        out += ["", "Notes:", *(f"- {n}" for n in notes)]
    out += ["", targets]
    if soak is not None:
        out += ["", "## Soak (memory flat?)", "", soak_text(soak)]
    return "\n".join(out) + "\n"


def _on_off(value: Any) -> str:
    return "?" if value is None else "on" if value else "off"


def _proxy_status(value: Any) -> str:
    if isinstance(value, Mapping) and "version" in value:
        return f"{value.get('name', '')} {value['version']}".strip()
    if isinstance(value, Mapping) and "error" in value:
        return f"not installed ({value['error']})"
    return str(value)


# --- JSON -------------------------------------------------------------------------------------


def results_document(
    machine: Mapping[str, Any],
    series: Sequence[Series],
    rows: Sequence[Row],
    checks: Sequence[Check],
    soak: Soak | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    return {
        "machine": dict(machine),
        "rows": [asdict(r) for r in rows],
        "raw": [asdict(s) for s in series],
        "targets": [asdict(c) for c in checks],
        "soak": asdict(soak) if soak is not None else None,
        **extra,
    }


def _nan_to_none(value: Any) -> Any:
    # JSON has no NaN; a missing number is null.
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nan_to_none(v) for v in value]
    return value


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    data = orjson.dumps(
        _nan_to_none(dict(document)), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    )
    path.write_bytes(data + b"\n")


# --- chart ------------------------------------------------------------------------------------


Bar = tuple[str, float | None, float | None]  # label, rps, CPU ms per 1000 requests


def chart_data(rows: Sequence[Row], method: str = "tools/call") -> dict[str, tuple[int, list[Bar]]]:
    """Per pairing: the highest measured concurrency and (label, rps, cpu ms/1k) per subject;
    None where a subject was not measured (or nothing of ours runs, for CPU on the direct path)."""
    out: dict[str, tuple[int, list[Bar]]] = {}
    for pairing in PAIRINGS:
        mine = [r for r in rows if r.pairing == pairing and r.method == method]
        if not mine:
            continue
        conc = max(r.concurrency for r in mine)
        bars: list[Bar] = [
            (_label(r), r.rps if r.rps == r.rps else None, r.cpu_ms_per_1k)
            for r in mine
            if r.concurrency == conc
        ]
        out[pairing] = (conc, bars)
    return out


def _label(row: Row) -> str:
    name = row.subject if row.era == "modern" else f"{row.subject} ({row.era})"
    if row.telemetry != NO_TELEMETRY:
        return f"{name}\ntel {row.telemetry}"
    return name


def write_chart(path: Path, rows: Sequence[Row], method: str = "tools/call") -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display: render straight to the file
    import matplotlib.pyplot as plt

    data = chart_data(rows, method)
    cols = max(1, len(data))
    fig, axes = plt.subplots(2, cols, figsize=(5.5 * cols, 8), squeeze=False)
    if not data:
        axes[0][0].text(0.5, 0.5, "no data", ha="center", va="center")
    for col, (pairing, (conc, bars)) in enumerate(data.items()):
        top, bottom = axes[0][col], axes[1][col]
        top.set_title(f"{pairing.upper()} {method}, {conc} clients")
        top.set_ylabel("requests/s, log scale (higher is better)")
        bottom.set_ylabel("CPU ms per 1000 requests, log scale (lower is better)")
        labels = [b[0] for b in bars]
        _log_bars(top, labels, [b[1] for b in bars])
        _log_bars(bottom, labels, [b[2] for b in bars])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log_bars(ax: Any, labels: Sequence[str], values: Sequence[float | None]) -> None:
    # A log scale: the direct path and the slowest proxies differ by three orders of magnitude.
    xs = list(range(len(labels)))
    shown: list[tuple[int, float, str]] = [
        (x, v, _color(label)) for x, v, label in zip(xs, values, labels, strict=True) if v
    ]
    if shown:
        heights = [v for _, v, _ in shown]
        drawn = ax.bar([x for x, _, _ in shown], heights, color=[c for _, _, c in shown])
        ax.bar_label(drawn, labels=[f"{v:.0f}" for v in heights], fontsize=7)
        ax.set_yscale("log")
        # Bars start at a whole decade below the smallest, so no bar is a sliver.
        ax.set_ylim(10 ** math.floor(math.log10(min(heights) * 0.99)), max(heights) * 2)
    for x, v in zip(xs, values, strict=True):
        if not v:
            where = ax.get_xaxis_transform()  # x in data, y in axes fraction
            ax.text(x, 0.02, "n/a", ha="center", va="bottom", fontsize=7, transform=where)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(labels) - 0.4)
    ax.grid(axis="y", alpha=0.3)


def _color(label: str) -> str:
    if label.startswith(DIRECT):
        return "#999999"
    if label.startswith(GATEWAY):
        return "#1f77b4" if "off" in label else "#6baed6"
    if label.startswith("passthrough"):
        return "#2ca02c"
    return "#d62728"
