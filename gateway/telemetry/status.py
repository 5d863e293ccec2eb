"""The status page's data: per-backend request series over the last minutes, recent errors, and
the assembly of `/status.json` from facts the composition root hands over (frontends/ops.py
serves it, with the page that draws it).

Fed from the end of each CLIENT observation (otel.py): one dict lookup, one clock read, one
bisect and a few integer adds into a preallocated ring; nothing allocated per request except a
recent error's tuple. Memory is bounded: SLOTS slots of LATENCY_BOUNDS+1 counters per backend
(backends are configured names, never caller input), and RECENT_ERRORS error records.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.protocol.jsonrpc import Message

# One slot per SLOT_SECONDS; the ring covers SLOTS of them (the chart), the headline numbers
# the last WINDOW_SLOTS.
SLOT_SECONDS = 10
SLOTS = 60  # 10 minutes
WINDOW_SLOTS = 30  # 5 minutes
RECENT_ERRORS = 50
MESSAGE_CHARS = 200
# Latency buckets for the percentiles: a factor of 1.25 apart from 50 us to 300 s, so a
# percentile read from them is within 12% of the true one (the geometric middle of its bucket).
_FACTOR = 1.25
LATENCY_BOUNDS: tuple[float, ...] = tuple(
    bound for i in range(80) if (bound := 5e-5 * _FACTOR**i) <= 300.0
)
NO_REPLY = "no_reply"
TOOL_ERROR = "tool_error"


class _Slot:
    __slots__ = ("counts", "epoch", "errors", "requests")

    def __init__(self, buckets: int) -> None:
        self.epoch = -1  # the slot number (monotonic seconds // SLOT_SECONDS) it holds
        self.requests = 0
        self.errors = 0
        self.counts = [0] * buckets


def _percentile(counts: Sequence[int], total: int, q: float) -> float | None:
    """The q-quantile (0..1) of a latency histogram, in seconds: the geometric middle of the
    bucket it falls in (the last bucket, past the bounds, reads as its lower bound)."""
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank and count:
            if index >= len(LATENCY_BOUNDS):
                return LATENCY_BOUNDS[-1]
            upper = LATENCY_BOUNDS[index]
            return upper / _FACTOR**0.5 if index else upper / 2
    return LATENCY_BOUNDS[-1]


class Series:
    """One backend's requests, errors and latency histogram per slot, in a ring of SLOTS."""

    __slots__ = ("_ring",)

    def __init__(self) -> None:
        self._ring = [_Slot(len(LATENCY_BOUNDS) + 1) for _ in range(SLOTS)]

    def observe(self, now: float, seconds: float, error: bool) -> None:
        epoch = int(now // SLOT_SECONDS)
        slot = self._ring[epoch % SLOTS]
        if slot.epoch != epoch:  # rolled over: the slot held a minute-and-more-old epoch
            slot.epoch = epoch
            slot.requests = slot.errors = 0
            counts = slot.counts
            for i in range(len(counts)):
                counts[i] = 0
        slot.requests += 1
        if error:
            slot.errors += 1
        slot.counts[bisect_left(LATENCY_BOUNDS, seconds)] += 1

    def _live(self, now: float, slots: int) -> list[_Slot | None]:
        """The last `slots` slots, oldest first; None for one that holds an older epoch."""
        current = int(now // SLOT_SECONDS)
        out: list[_Slot | None] = []
        for epoch in range(current - slots + 1, current + 1):
            slot = self._ring[epoch % SLOTS]
            out.append(slot if slot.epoch == epoch else None)
        return out

    def summary(self, now: float, covered: float) -> dict[str, Any]:
        """Requests per second, error share and p50/p99 (ms) over the last WINDOW_SLOTS, of
        which `covered` seconds were lived (the rate of a gateway up for 20 s is over 20 s)."""
        requests = errors = 0
        counts = [0] * (len(LATENCY_BOUNDS) + 1)
        for slot in self._live(now, WINDOW_SLOTS):
            if slot is None:
                continue
            requests += slot.requests
            errors += slot.errors
            for i, c in enumerate(slot.counts):
                counts[i] += c
        seconds = max(1.0, min(covered, WINDOW_SLOTS * SLOT_SECONDS))
        return {
            "window_seconds": WINDOW_SLOTS * SLOT_SECONDS,
            "requests": requests,
            "errors": errors,
            "rate_per_second": round(requests / seconds, 3),
            "p50_ms": _ms(_percentile(counts, requests, 0.50)),
            "p99_ms": _ms(_percentile(counts, requests, 0.99)),
        }

    def points(self, now: float, wall: float) -> list[dict[str, Any]]:
        """The chart: one point per slot over the ring, oldest first; `t` is the slot's start
        (Unix seconds, from `wall`, the wall clock read with `now`)."""
        current = int(now // SLOT_SECONDS)
        out = []
        for offset, slot in enumerate(self._live(now, SLOTS)):
            epoch = current - SLOTS + 1 + offset
            start = wall - (now - epoch * SLOT_SECONDS)
            if slot is None:
                out.append({"t": round(start, 3), "requests": 0, "errors": 0, "p50_ms": None,
                            "p99_ms": None})  # fmt: skip
                continue
            out.append(
                {
                    "t": round(start, 3),
                    "requests": slot.requests,
                    "errors": slot.errors,
                    "p50_ms": _ms(_percentile(slot.counts, slot.requests, 0.50)),
                    "p99_ms": _ms(_percentile(slot.counts, slot.requests, 0.99)),
                }
            )
        return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 1] + "…"


def _utc(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


@dataclass(frozen=True)
class ErrorRecord:
    time: float  # Unix seconds
    backend: str
    method: str
    code: str  # the JSON-RPC error code, TOOL_ERROR, NO_REPLY, or "down"
    message: str  # at most MESSAGE_CHARS: the error's own message, never params or results

    def json(self) -> dict[str, Any]:
        return {
            "time": _utc(self.time),
            "backend": self.backend,
            "method": self.method,
            "code": self.code,
            "message": self.message,
        }


class StatusBoard:
    """What the status page knows beyond the gateway's state: the series and recent errors.
    Written from the event loop only (like the metrics), read when the page asks."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self.started = clock()
        self.started_wall = wall()
        self._series: dict[str, Series] = {}
        self.errors: deque[ErrorRecord] = deque(maxlen=RECENT_ERRORS)
        self.last_error: dict[str, ErrorRecord] = {}

    def series(self, backend: str) -> Series:
        found = self._series.get(backend)
        if found is None:
            found = self._series[backend] = Series()
        return found

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the series of backends no longer configured (after a reload)."""
        kept = set(keep)
        for name in [n for n in self._series if n not in kept]:
            del self._series[name]
            self.last_error.pop(name, None)

    def client(
        self,
        backend: str,
        msg: Message,
        reply: Message | None,
        seconds: float,
        *,
        timed: bool = True,
    ) -> None:
        """One request to a backend ended (its reply, None when it got none; a cancelled one
        is not told). One not `timed` (a listen stream, as long as its client wants) is kept
        out of the series: only its error, if it ends in one, is recorded."""
        series = self._series.get(backend)
        if series is None:
            series = self.series(backend)
        if reply is not None:
            error = reply.get("error")
            if error is None:
                result = reply.get("result")
                if not (isinstance(result, dict) and result.get("isError") is True):
                    if timed:
                        series.observe(self._clock(), seconds, False)
                    return
                code, message = TOOL_ERROR, "the tool reported an error (isError)"
            elif isinstance(error, dict):
                code = str(error.get("code", "error"))
                text = error.get("message")
                message = _short(text) if isinstance(text, str) else ""
            else:
                code, message = "error", ""
        else:
            code, message = NO_REPLY, "no reply (the backend failed or timed out)"
        if timed:
            series.observe(self._clock(), seconds, True)
        self._error(backend, str(msg.get("method", "")), code, message)

    def down(self, backend: str, reason: str | None) -> None:
        """The backend went down (its Health): an error of its own."""
        self._error(backend, "", "down", _short(reason or "unreachable"))

    def _error(self, backend: str, method: str, code: str, message: str) -> None:
        record = ErrorRecord(self._wall(), backend, method, code, message)
        self.errors.append(record)
        self.last_error[backend] = record

    def uptime(self) -> float:
        return self._clock() - self.started


@dataclass(frozen=True)
class BackendFacts:
    """One backend as the composition root sees it when the page asks."""

    name: str
    transport: str
    era: str
    health: str  # up, down, starting
    reason: str | None  # why it is down
    in_flight: int
    restarts: int
    catalog: Mapping[str, int] | None  # tools, prompts, resources, templates; None: not loaded
    breaker: str | None = None  # its circuit breaker: closed, open, half_open; None: none


@dataclass(frozen=True)
class ServerFacts:
    """One server the gateway serves (the merged one, `default`; or a virtual one): what its
    lists hold and the tokens showing them costs a model (core/budget.py), by kind."""

    name: str
    items: Mapping[str, int]  # tools, prompts, resources, templates
    tokens: Mapping[str, int]  # the same kinds
    backend_tokens: Mapping[str, int]  # each loaded backend's part of the total


def snapshot(
    board: StatusBoard,
    *,
    version: str,
    listeners: Mapping[str, Any],
    backends: Sequence[BackendFacts],
    servers: Sequence[ServerFacts] = (),
    serving: bool,
    draining: bool,
    held: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """`/status.json`: everything the page shows (and nothing it does not). `held`: with
    `pins:`, each backend's definitions awaiting approval (core/pinning.py `Held`)."""
    now, wall = board._clock(), board._wall()
    uptime = now - board.started
    out_backends = []
    for facts in backends:
        series = board.series(facts.name)
        last = board.last_error.get(facts.name)
        out_backends.append(
            {
                "name": facts.name,
                "transport": facts.transport,
                "era": facts.era,
                "health": facts.health,
                "down_reason": _short(facts.reason) if facts.reason else None,
                "last_error": last.json() if last is not None else None,
                "in_flight": facts.in_flight,
                "breaker": facts.breaker,
                "restarts": facts.restarts,
                "catalog": dict(facts.catalog) if facts.catalog is not None else None,
                **series.summary(now, uptime),
                "series": series.points(now, wall),
            }
        )
    return {
        "gateway": {
            "version": version,
            "started": _utc(board.started_wall),
            "uptime_seconds": round(uptime, 1),
            "now": _utc(wall),
            "serving": serving,
            "draining": draining,
            "listeners": dict(listeners),
        },
        "slot_seconds": SLOT_SECONDS,
        "backends": out_backends,
        "servers": [
            {
                "name": s.name,
                "items": dict(s.items),
                "tokens": dict(s.tokens),
                "total_tokens": sum(s.tokens.values()),
                "backend_tokens": dict(s.backend_tokens),
            }
            for s in servers
        ],
        "recent_errors": [e.json() for e in reversed(board.errors)],
        **({} if held is None else {"awaiting_approval": _held(held)}),
    }


def _held(held: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    return [
        {
            "backend": backend,
            "kind": h.kind,
            "name": h.name,
            "status": h.status,
            "served": h.served,
            "digest": h.digest,
        }
        for backend, items in held.items()
        for h in items
    ]
