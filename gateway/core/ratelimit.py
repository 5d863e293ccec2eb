"""Rate limits: token buckets per caller, per caller and tool, and overall (`rate_limits:`).

A bucket holds up to `burst` tokens and gains `rate` a second; a request takes one token from
every bucket that applies to it, or from none: when one of them is empty the request is refused
with the time until all of them have a token again, and takes nothing (a refused request costs
its caller nothing more, so a client that waits as told is served). Time comes from an injected
clock, so the buckets are plain arithmetic and tests need no sleeps.

Memory is bounded per limit: a bucket idle long enough to be full again is the same as a new
one and is forgotten, and past `max_keys` buckets the least recently used goes (that caller
starts again with a full bucket, which is logged once: raise the bound).

Replicas share their buckets through `SharedRateLimiter` (`cluster.redis`): the same limits,
taken from a `SharedBuckets` store that core sees only through that protocol (the Redis one is
`gateway/cluster/buckets.py`). When the store cannot answer, this replica's own buckets decide.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.config import Rate, RateLimits
from gateway.errors import RateLimited
from gateway.origin import Origin
from gateway.protocol.jsonrpc import Message
from gateway.routing.fold import fold

log = logging.getLogger("gateway")

Clock = Callable[[], float]
# The limits' names, as the rate-limited metric labels them.
IDENTITY = "identity"
TOOL = "tool"
OVERALL = "overall"
# Requests no bucket applies to. A listen stream is opened once per client and lives on (a
# legacy session's change watch is one, started by the gateway in the session's name).
EXEMPT = frozenset({"subscriptions/listen"})
# Requests about a task, counted as calls of the tool that created it (core/tasks.py).
TASK_METHODS = frozenset({"tasks/get", "tasks/update", "tasks/cancel"})
# Idle buckets looked at per new bucket, so forgetting full ones costs a bounded amount.
SWEEP = 2


class Buckets:
    """One limit's buckets by key, least recently used first."""

    def __init__(self, limit: Rate, max_keys: int, name: str) -> None:
        self.rate = limit.rate
        self.burst = float(limit.burst)
        self.max_keys = max_keys
        self.name = name
        self._full_after = self.burst / self.rate  # seconds an empty bucket takes to fill
        # key -> [tokens, when they were counted]
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()
        self._warned = False

    def __len__(self) -> int:
        return len(self._buckets)

    def level(self, key: Hashable, now: float) -> list[float]:
        """The key's bucket, refilled up to `now` (a new key gets a full one)."""
        bucket = self._buckets.get(key)
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[key] = [self.burst, now]
            return bucket
        self._buckets.move_to_end(key)
        tokens, then = bucket
        bucket[0] = min(self.burst, tokens + (now - then) * self.rate)
        bucket[1] = now
        return bucket

    def wait(self, bucket: list[float]) -> float:
        """Seconds until the bucket has a token (0: it has one)."""
        return 0.0 if bucket[0] >= 1.0 else (1.0 - bucket[0]) / self.rate

    def _make_room(self, now: float) -> None:
        buckets = self._buckets
        for _ in range(SWEEP):
            if not buckets:
                return
            oldest = next(iter(buckets.values()))
            if now - oldest[1] < self._full_after:
                break
            buckets.popitem(last=False)  # full again: the same as a new bucket
        if len(buckets) >= self.max_keys:
            buckets.popitem(last=False)
            if not self._warned:
                self._warned = True
                log.warning(
                    "rate limit %s: more than %d callers at once; the least recent start again"
                    " with a full bucket (raise rate_limits.max_keys)",
                    self.name,
                    self.max_keys,
                )


@dataclass(frozen=True, slots=True)
class Want:
    """One bucket a request takes a token from, for a store outside the process."""

    limit: str  # IDENTITY, TOOL or OVERALL
    key: str  # the bucket within that limit: the caller, caller and tool, or "" overall
    rate: float
    burst: float


class SharedBuckets(Protocol):
    """Buckets kept outside the process and shared by replicas (`gateway/cluster/buckets.py`)."""

    async def take(self, wants: Sequence[Want]) -> Sequence[float] | None:
        """Take a token from every bucket in `wants` or from none, atomically: per bucket the
        seconds until it has a token (all 0: taken). None: the store did not answer in time,
        and the caller decides by itself."""
        ...


class RateLimiter:
    """The configured limits; `admit` takes a request's tokens or raises RateLimited."""

    def __init__(
        self, config: RateLimits, counts: Counter[str], clock: Clock = time.monotonic
    ) -> None:
        self._clock = clock
        self._counts = counts  # Stats.rate_limited, by limit
        bound = config.max_keys
        self.identity = _buckets(config.per_identity, bound, IDENTITY)
        self.tool = _buckets(config.per_tool, bound, TOOL)
        self.overall = _buckets(config.overall, bound, OVERALL)
        self.tools = {name: Buckets(r, bound, TOOL) for name, r in config.tools.items()}
        # The tools with a limit of their own as a lenient server reads their names: another
        # spelling of one is not forwarded on a guess (core/unknown.py), or it would have a
        # bucket of its own.
        self.folded_tools: dict[str, set[str]] = {}
        for name in config.tools:
            self.folded_tools.setdefault(fold(name), set()).add(name)
        # The tool a task method's task was created by (set by core/tasks.py; None: no tasks).
        self.task_tool: Callable[[Message], str | None] | None = None

    def carry_over(self, before: RateLimiter) -> None:
        """A reload: each limit whose rate, burst and bound did not change keeps its buckets,
        so re-reading the config refills nobody's budget (a changed limit starts full)."""
        self.identity = _kept(self.identity, before.identity)
        self.tool = _kept(self.tool, before.tool)
        self.overall = _kept(self.overall, before.overall)
        self.tools = {name: _kept(b, before.tools.get(name)) or b for name, b in self.tools.items()}

    def admit(self, msg: Message, origin: Origin) -> None:
        method = msg["method"]
        if method in EXEMPT:
            return
        now = self._clock()
        caller = caller_key(origin)
        found: list[tuple[Buckets, list[float]]] = []
        if self.identity is not None:
            found.append((self.identity, self.identity.level(caller, now)))
        name = self._tool(method, msg)
        if name is not None:
            per_tool = self.tools.get(name, self.tool)
            if per_tool is not None:
                found.append((per_tool, per_tool.level((caller, name), now)))
        if self.overall is not None:
            found.append((self.overall, self.overall.level(None, now)))
        self.refuse([(buckets.wait(bucket), buckets.name) for buckets, bucket in found])
        for _, bucket in found:
            bucket[0] -= 1.0

    def wants(self, msg: Message, origin: Origin) -> list[Want]:
        """The buckets `admit` would take from, named for a shared store."""
        method = msg["method"]
        if method in EXEMPT:
            return []
        caller = caller_key(origin)
        found: list[Want] = []
        if self.identity is not None:
            found.append(_want(self.identity, caller))
        name = self._tool(method, msg)
        if name is not None:
            per_tool = self.tools.get(name, self.tool)
            if per_tool is not None:
                # A NUL cannot occur in a caller key or a tool name: no two pairs meet.
                found.append(_want(per_tool, f"{caller}\0{name}"))
        if self.overall is not None:
            found.append(_want(self.overall, ""))
        return found

    def _tool(self, method: str, msg: Message) -> str | None:
        """The tool a request is a call of: a tools/call's, or a task method's creator's."""
        if method == "tools/call":
            name = _params(msg).get("name")
            return name if isinstance(name, str) else None
        if method in TASK_METHODS and self.task_tool is not None:
            return self.task_tool(msg)
        return None

    def refuse(self, waits: Sequence[tuple[float, str]]) -> None:
        """Raise RateLimited for the longest of (wait, limit), if any is not 0."""
        longest, limit = max(waits, default=(0.0, ""), key=lambda w: w[0])
        if longest > 0:
            self._counts[limit] += 1
            delay = math.ceil(longest * 1000) / 1000  # ms, rounded up: retrying then succeeds
            raise RateLimited(delay, f"Rate limit exceeded ({limit}); retry after {delay:g} s")


class SharedRateLimiter:
    """The configured limits over buckets the replicas share; this replica's own (`local`)
    decide whenever the store does not answer, so a request never fails for it."""

    def __init__(self, local: RateLimiter, shared: SharedBuckets) -> None:
        self.local = local
        self.shared = shared

    async def admit(self, msg: Message, origin: Origin) -> None:
        wants = self.local.wants(msg, origin)
        if not wants:
            return
        waits = await self.shared.take(wants)
        if waits is None:
            self.local.admit(msg, origin)
            return
        self.local.refuse([(w, want.limit) for w, want in zip(waits, wants, strict=True)])


def caller_key(origin: Origin) -> str:
    """Whose bucket: the caller's identity when one was established, else the front end and
    the peer's address (stdio has one caller, its parent process). Not the credentials: without
    authentication they are whatever a client sends, so a new header would be a new bucket."""
    if origin.identity is not None:
        return origin.identity.key()
    return f"{origin.frontend}:{origin.peer or ''}"


def retry_after_header(seconds: float) -> str:
    """HTTP Retry-After (RFC 9110 10.2.3): whole seconds, rounded up, at least one."""
    return str(max(1, math.ceil(seconds)))


def _buckets(limit: Rate | None, bound: int, name: str) -> Buckets | None:
    return None if limit is None else Buckets(limit, bound, name)


def _kept(new: Buckets | None, old: Buckets | None) -> Buckets | None:
    if new is None or old is None:
        return new
    same = (old.rate, old.burst, old.max_keys) == (new.rate, new.burst, new.max_keys)
    return old if same else new


def _want(buckets: Buckets, key: str) -> Want:
    return Want(buckets.name, key, buckets.rate, buckets.burst)


def _params(msg: Message) -> dict[str, Any]:
    params = msg.get("params")
    return params if isinstance(params, dict) else {}
