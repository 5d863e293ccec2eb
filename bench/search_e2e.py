"""Tool search through a started gateway (README "Tool search", bench/README.md): a stdio backend
serving the generated catalog of 1,000 tools (`python -m bench.echo --stdio --tools 1000`) behind
a virtual server with `tool_search: {mode: "on"}` at `/mcp/s`, driven over HTTP.

    python -m bench.search_e2e [--rounds N] [--calls N] [--smoke] [--json PATH]

Three figures:

- **latency**: one client, `_search_tools` calls (the generated phrasings) and plain `tools/call`s
  of the same backend's `echo`, in alternating batches; p50/p99 of each and what a search adds,
  and the gateway's CPU per call (the backend's excluded, as bench.load counts it);
- **index memory**: the gateway's RSS before and after the first search, which builds the index
  (the catalog itself is loaded at start);
- **reindex**: 8 clients of plain calls, in alternating calm and churn phases; in a churn phase a
  churner has the backend change its list (`relist`: a description changes and it sends
  `notifications/tools/list_changed`), so the gateway loads the 1,000 tools again and rebuilds
  the index, and polls `_describe_tool` until the index shows the change. The calls' p99 and
  slowest in each phase say whether a reindex holds requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench import run as bench_run
from bench.load import META, MODERN, cpu_ticks, status_mb
from bench.load import cpu_ms as cpu_between
from bench.run import LISTENING, PY, ROOT, START_BOUND, Procs, base_env, gateway_argv, start_proc
from bench.search import generated, generated_phrasings

SERVER = "s"
CATALOG_SIZE = 1000
CLIENTS = 8
# A list change every so often in a churn phase; with search on, `_describe_tool` is polled this
# often until the index holds it (so the index's delay is seen, at a small load of its own).
CHANGE_EVERY = 0.25
POLL_EVERY = 0.01
TIMEOUT = 10.0
perf = time.perf_counter


def config(size: int, search: str = "on") -> dict[str, Any]:
    backend = {"command": PY, "args": ["-m", "bench.echo", "--stdio", "--tools", str(size)]}
    return {
        "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
        "backends": {"cat": {"stdio": backend | {"cwd": str(ROOT)}}},
        "servers": {SERVER: {"backends": {"cat": {}}, "tool_search": {"mode": search}}},
    }


class Client:
    """Modern-era tools/calls over one pooled session, each timed as the client sees it."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url
        self._ids = 0

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        self._ids += 1
        params = {"name": name, "arguments": arguments, "_meta": META}
        msg = {"jsonrpc": "2.0", "id": self._ids, "method": "tools/call", "params": params}
        body = orjson.dumps(msg)
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        }
        start = perf()
        async with self.session.post(self.url, data=body, headers=headers) as resp:
            raw = await resp.read()
        took = (perf() - start) * 1000
        reply: dict[str, Any] = orjson.loads(raw)
        if "result" not in reply:
            raise RuntimeError(f"{name}: {reply}")
        return took, reply["result"]


def pct(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


@dataclass
class Latency:
    calls: int = 0
    plain_p50_ms: float = 0.0
    plain_p99_ms: float = 0.0
    search_p50_ms: float = 0.0
    search_p99_ms: float = 0.0
    search_max_ms: float = 0.0
    added_p50_ms: float = 0.0
    added_p99_ms: float = 0.0
    plain_cpu_ms_per_call: float = 0.0
    search_cpu_ms_per_call: float = 0.0


@dataclass
class Phase:
    calls: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0


@dataclass
class Reindex:
    relists: int = 0
    seen: int = 0  # list changes the index was seen to hold
    to_index_p50_ms: float = 0.0  # from the relist's reply to the index showing it
    to_index_max_ms: float = 0.0
    calm: Phase = field(default_factory=Phase)
    churn: Phase = field(default_factory=Phase)


@dataclass
class Figures:
    tools: int
    search: str
    rss_before_mb: float | None
    rss_after_mb: float | None
    latency: Latency
    reindex: Reindex


async def latency(client: Client, pid: int, queries: list[str], rounds: int, calls: int) -> Latency:
    plain: list[float] = []
    found: list[float] = []
    cpu = {"plain": 0.0, "search": 0.0}
    echo = ("echo", {"text": "hello"})
    for rnd in range(rounds):
        # Alternating batches: slow drifts of a shared machine hit both alike.
        for kind in ("plain", "search") if rnd % 2 == 0 else ("search", "plain"):
            before = cpu_ticks([pid])
            for i in range(calls):
                if kind == "plain":
                    plain.append((await client.call(*echo))[0])
                else:
                    query = {"query": queries[(rnd * calls + i) % len(queries)]}
                    found.append((await client.call("_search_tools", query))[0])
            cpu[kind] += cpu_between(before, cpu_ticks([pid]))
    total = rounds * calls
    return Latency(
        calls=total,
        plain_p50_ms=statistics.median(plain),
        plain_p99_ms=pct(plain, 0.99),
        search_p50_ms=statistics.median(found),
        search_p99_ms=pct(found, 0.99),
        search_max_ms=max(found),
        added_p50_ms=statistics.median(found) - statistics.median(plain),
        added_p99_ms=pct(found, 0.99) - pct(plain, 0.99),
        plain_cpu_ms_per_call=cpu["plain"] / total,
        search_cpu_ms_per_call=cpu["search"] / total,
    )


async def reindex(
    client: Client, changed: str, rounds: int, seconds: float, search: bool
) -> Reindex:
    """Calm and churn phases of `seconds` each, `rounds` times, under CLIENTS plain callers."""
    calls: dict[str, list[float]] = {"calm": [], "churn": []}
    phase = ["calm"]
    stop = asyncio.Event()
    out = Reindex()
    delays: list[float] = []

    async def caller() -> None:
        while not stop.is_set():
            now = phase[0]
            took, _ = await client.call("echo", {"text": "hello"})
            if phase[0] == now:  # (a call straddling a phase change counts for neither)
                calls[now].append(took)

    async def churn() -> None:
        while phase[0] == "churn":
            changed_at = perf()
            await client.call("relist", {})
            out.relists += 1
            if search:
                await seen_in_index(changed_at)
            await asyncio.sleep(max(0.0, changed_at + CHANGE_EVERY - perf()))

    async def seen_in_index(changed_at: float) -> None:
        before = await described(client, changed)
        while phase[0] == "churn":
            await asyncio.sleep(POLL_EVERY)
            if await described(client, changed) != before:
                delays.append((perf() - changed_at) * 1000)
                out.seen += 1
                return

    callers = [asyncio.create_task(caller()) for _ in range(CLIENTS)]
    try:
        for _ in range(rounds):
            phase[0] = "calm"
            await asyncio.sleep(seconds)
            phase[0] = "churn"
            churner = asyncio.create_task(churn())
            await asyncio.sleep(seconds)
            phase[0] = "calm"
            await churner
    finally:
        stop.set()
        await asyncio.gather(*callers)
    for name in ("calm", "churn"):
        times = calls[name]
        median = statistics.median(times)
        setattr(out, name, Phase(len(times), median, pct(times, 0.99), max(times)))
    if delays:
        out.to_index_p50_ms, out.to_index_max_ms = statistics.median(delays), max(delays)
    return out


async def described(client: Client, name: str) -> str:
    _, result = await client.call("_describe_tool", {"name": name})
    text: str = result["content"][0]["text"]
    return text


async def measure(
    rounds: int, calls: int, churn_seconds: float, size: int, search: str = "on"
) -> Figures:
    tools = generated(size)
    queries = [q for q, _ in generated_phrasings(tools)]
    last_service = list(tools)[-1]
    changed = f"{last_service}_{tools[last_service][-1]['name']}"  # what `relist` redescribes
    async with Procs() as procs:
        with tempfile.TemporaryDirectory(prefix="bench-search-") as tmp:
            path = Path(tmp) / "gateway.yaml"
            path.write_bytes(orjson.dumps(config(size, search)))  # JSON is YAML
            gw = await start_proc(procs, "gateway", gateway_argv(path, "info"), base_env())
            base = (await gw.wait_line("stderr", LISTENING, START_BOUND)).group(1)
            loaded = f"catalog of cat: {size + 4} tools"
            await gw.wait_line("stderr", _literal(loaded), START_BOUND)
            connector = aiohttp.TCPConnector(limit=0)
            timeout = aiohttp.ClientTimeout(total=TIMEOUT)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                client = Client(session, f"{base}/{SERVER}")
                for _ in range(50):  # connections and the plain path warm
                    await client.call("echo", {"text": "hello"})
                on = search == "on"
                rss_before = rss_after = None
                lat = Latency()
                if on:
                    await asyncio.sleep(0.5)
                    rss_before = status_mb(gw.pid, b"VmRSS")
                    await client.call("_search_tools", {"query": queries[0]})  # builds the index
                    await asyncio.sleep(0.5)
                    rss_after = status_mb(gw.pid, b"VmRSS")
                    lat = await latency(client, gw.pid, queries, rounds, calls)
                phases = max(1, rounds // 2)
                churned = await reindex(client, changed, phases, churn_seconds, on)
    return Figures(size, search, rss_before, rss_after, lat, churned)


def _literal(text: str) -> re.Pattern[str]:
    return re.compile(re.escape(text))


def render(f: Figures) -> str:
    lat, ri = f.latency, f.reindex
    before, after = f.rss_before_mb, f.rss_after_mb
    grew = (
        f"{after - before:+.2f} MB ({before:.1f} -> {after:.1f})"
        if before is not None and after is not None
        else "-"
    )
    head = [
        f"tool search through the gateway: {f.tools} generated tools, virtual server "
        f"/mcp/{SERVER}, tool_search {f.search}, stdio backend, HTTP client",
    ]
    if f.search == "on":
        head += [
            f"  latency ({lat.calls} calls each, 1 client, alternating batches)",
            f"    plain tools/call  p50 {lat.plain_p50_ms:.3f} ms  p99 {lat.plain_p99_ms:.3f} ms"
            f"  cpu {lat.plain_cpu_ms_per_call * 1000:.0f} us/call",
            f"    _search_tools     p50 {lat.search_p50_ms:.3f} ms  p99 {lat.search_p99_ms:.3f} ms"
            f"  max {lat.search_max_ms:.3f} ms"
            f"  cpu {lat.search_cpu_ms_per_call * 1000:.0f} us/call",
            f"    search adds       p50 {lat.added_p50_ms:+.3f} ms  p99 {lat.added_p99_ms:+.3f} ms",
            f"  index memory: gateway RSS over the first search (the index build) {grew}",
        ]
    seen = (
        f", {ri.seen} seen in the index, p50 {ri.to_index_p50_ms:.1f} ms / "
        f"max {ri.to_index_max_ms:.1f} ms after the change"
        if f.search == "on"
        else ""
    )
    return "\n".join(
        [
            *head,
            f"  list changes ({CLIENTS} clients of plain calls; {ri.relists} changes{seen})",
            _phase("calm ", ri.calm),
            _phase("churn", ri.churn),
        ]
    )


def _phase(label: str, p: Phase) -> str:
    return (
        f"    {label}  {p.calls} calls  p50 {p.p50_ms:.3f} ms  p99 {p.p99_ms:.3f} ms"
        f"  max {p.max_ms:.3f} ms"
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.search_e2e", description=__doc__)
    ap.add_argument("--rounds", type=int, default=6, help="latency batches of each kind")
    ap.add_argument("--calls", type=int, default=500, help="calls per latency batch")
    ap.add_argument("--churn-seconds", type=float, default=3.0, help="each calm/churn phase")
    ap.add_argument("--tools", type=int, default=CATALOG_SIZE)
    ap.add_argument(
        "--search",
        choices=("on", "off"),
        default="on",
        help="off: the same list changes without tool search (what the catalog reload costs)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny counts: proves it runs")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ns = ap.parse_args(argv)
    rounds, calls, churn = (2, 20, 2.0) if ns.smoke else (ns.rounds, ns.calls, ns.churn_seconds)
    try:
        figures = bench_run(measure(rounds, calls, churn, ns.tools, ns.search))
    except Exception as exc:  # a gateway that would not start: say why, exit 1
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(render(figures))
    if ns.json is not None:
        with contextlib.suppress(OSError):
            ns.json.write_bytes(orjson.dumps(asdict(figures), option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
