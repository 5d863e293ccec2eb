"""Token buckets in Redis, shared by the replicas (`cluster.redis`).

One Lua script (EVALSHA through redis-py's `register_script`, which loads it again after a
Redis restart) refills and takes a token from every bucket of a request, or from none, in one
atomic step, on Redis's clock (`TIME`): replicas' clocks may disagree, Redis's is one. The
semantics are `core/ratelimit.py`'s: a bucket holds up to `burst` tokens and gains `rate` a
second, a refused request takes nothing, and a bucket idle long enough to be full again is the
same as none, so its key expires then.

Redis is an optimisation of the limits, never a condition of service: a check that fails or
takes longer than `redis_timeout` returns None and the replica's own buckets decide; for
`redis_retry_interval` after that Redis is not asked at all (a Redis that is down costs no
request a timeout), then one check tries it again. Each change of state is logged once and
shown by `mcp_gateway_redis_up`; every check decided alone counts in
`mcp_gateway_rate_limit_fallbacks_total`.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence

from gateway.cluster.connection import connect
from gateway.cluster.outage import FAILURES, Breaker, RedisDown
from gateway.core.ratelimit import Want
from gateway.telemetry.api import Stats

# Every key the gateway writes starts with this, so its keys are recognisable (and deletable)
# in a Redis that holds other things; replicas of different gateways use different databases.
PREFIX = "mcp-gateway:ratelimit:"

# KEYS: the buckets; ARGV: rate and burst per bucket, in KEYS' order. Each bucket is a hash of
# its tokens and the Redis time they were counted at (seconds and microseconds, kept as Redis
# gives them so no precision is lost). Replies with one wait per bucket, in microseconds
# rounded up (Lua numbers reach the client as integers): all 0 means every token was taken.
TAKE = """
local t = redis.call('TIME')
local s, us = tonumber(t[1]), tonumber(t[2])
local levels, waits, refused = {}, {}, false
for i = 1, #KEYS do
  local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local b = redis.call('HMGET', KEYS[i], 'tokens', 's', 'us')
  local tokens = burst
  if b[1] then
    local elapsed = (s - tonumber(b[2])) + (us - tonumber(b[3])) / 1000000
    tokens = math.min(burst, tonumber(b[1]) + math.max(0, elapsed) * rate)
  end
  levels[i] = tokens
  if tokens < 1 then
    refused = true
    waits[i] = math.ceil((1 - tokens) / rate * 1000000)
  else
    waits[i] = 0
  end
end
if not refused then
  for i = 1, #KEYS do
    local rate, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
    redis.call('HSET', KEYS[i], 'tokens', string.format('%.17g', levels[i] - 1),
      's', t[1], 'us', t[2])
    -- Full again after this long: then it is the same as no key.
    redis.call('PEXPIRE', KEYS[i], math.ceil(burst / rate * 1000) + 1000)
  end
end
return waits
"""

Clock = Callable[[], float]


class RedisBuckets:
    """`core.ratelimit.SharedBuckets` in Redis."""

    def __init__(
        self,
        url: str,
        timeout: float,
        retry_interval: float,
        stats: Stats,
        clock: Clock = time.monotonic,
    ) -> None:
        # No retries inside redis-py: a failed check falls back at once, and the next one
        # (after `retry_interval`) takes a fresh connection from the pool, which reconnects.
        self._client = connect(url, timeout)
        self._take = self._client.register_script(TAKE)
        self._stats = stats
        self._breaker = Breaker(
            timeout,
            down="redis: rate-limit check failed (%s); rate limits are per replica until it"
            f" answers (tried again every {retry_interval:g} s)",
            back="redis: reachable again; rate limits are shared by the replicas",
            retry_interval=retry_interval,
            show=self._show,
            failures=(*FAILURES, ValueError),  # (ValueError: a reply of the wrong shape)
            clock=clock,
            up=stats.redis_up,
        )

    async def take(self, wants: Sequence[Want]) -> Sequence[float] | None:
        keys = [bucket_key(w) for w in wants]
        args: list[float] = []
        for w in wants:
            args += (w.rate, w.burst)

        async def check() -> list[float]:
            return waits_from(await self._take(keys=keys, args=args), wants)

        try:
            return await self._breaker.call(check)
        except RedisDown:
            self._stats.rate_limit_fallbacks += 1
            return None

    def _show(self, up: bool) -> None:
        self._stats.redis_up = up

    async def close(self) -> None:
        await self._client.aclose()


def bucket_key(want: Want) -> str:
    """The bucket's Redis key: the limit and a digest of the caller (and tool), so keys have
    a bounded length and Redis holds no identity or tool name in clear."""
    digest = hashlib.sha256(want.key.encode()).hexdigest()[:32]
    return f"{PREFIX}{want.limit}:{digest}"


def waits_from(reply: object, wants: Sequence[Want]) -> list[float]:
    """The script's reply as seconds per bucket. What Redis answers is an input: a reply of
    the wrong shape is a failure, and no wait is longer than an empty bucket's (1 / rate), so
    a hostile Redis can refuse a request but cannot make a client wait longer than that."""
    if not isinstance(reply, list) or len(reply) != len(wants):
        raise ValueError("unexpected reply to the rate-limit script")
    waits = []
    for value, want in zip(reply, wants, strict=True):
        if not isinstance(value, int) or value < 0:
            raise ValueError("unexpected reply to the rate-limit script")
        waits.append(min(value / 1_000_000, math.ceil(1_000_000 / want.rate) / 1_000_000))
    return waits
