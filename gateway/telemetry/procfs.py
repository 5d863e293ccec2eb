"""The CPU time and resident memory of a backend's child processes, read from /proc when
/metrics is scraped (nothing per request). Linux only: elsewhere `usage` answers None and the
per-child metrics are absent."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
AVAILABLE = (PROC / "self" / "stat").exists()
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if AVAILABLE else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if AVAILABLE else 4096
# Fields of /proc/<pid>/stat after the command (which may hold spaces and parentheses): the
# state is field 3, utime 14, stime 15, cutime 16, cstime 17, rss 24 (pages) (proc(5)).
_UTIME, _CSTIME, _RSS = 14 - 3, 17 - 3, 24 - 3


@dataclass(frozen=True)
class Usage:
    cpu_seconds: float  # user + system, the reaped children's included (cutime, cstime)
    resident_bytes: int


def usage(pids: Iterable[int]) -> Usage | None:
    """CPU and RSS summed over `pids`; a pid that is gone counts nothing. None without /proc."""
    if not AVAILABLE:
        return None
    ticks = 0
    pages = 0
    for pid in pids:
        try:
            raw = (PROC / str(pid) / "stat").read_bytes()
        except OSError:  # exited (and reaped) since its pid was read
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()
        ticks += sum(int(f) for f in fields[_UTIME : _CSTIME + 1])
        pages += int(fields[_RSS])
    return Usage(ticks / CLOCK_TICKS, pages * PAGE_SIZE)
