"""The replicas' shared state (cluster.redis): the shared rate-limit buckets, the bus, the
legacy sessions' records and the backends' shared logins.

The Redis adapters (gateway/cluster/, with redis-py and cryptography under them, ~15 MB and
~100 ms) are imported by the function that makes each, once it knows there is a cluster: a
replica alone never loads them (docs/decisions/0064-lazy-imports.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.backend_auth.shared import PURPOSE as LOGINS_PURPOSE
from gateway.config import Config
from gateway.core.changes import ClusterChanges
from gateway.core.dispatcher import Dispatcher
from gateway.telemetry.api import Stats

if TYPE_CHECKING:
    from gateway.backend_auth.desk import LoginDesk
    from gateway.cluster.buckets import RedisBuckets
    from gateway.cluster.bus import RedisBus
    from gateway.cluster.logins import RedisLogins
    from gateway.cluster.pins import RedisPins
    from gateway.cluster.sessions import RedisSessions


def shared_buckets(config: Config, stats: Stats) -> RedisBuckets | None:
    """The replicas' shared buckets (cluster.redis), when there are limits to share."""
    cluster = config.cluster
    if config.rate_limits is None or cluster is None or cluster.redis is None:
        return None
    from gateway.cluster.buckets import RedisBuckets

    return RedisBuckets(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, stats)


def cluster_bus(config: Config, stats: Stats) -> RedisBus | None:
    """The replicas' messages to each other (cluster.redis); None: this replica is alone."""
    cluster = config.cluster
    if cluster is None or cluster.redis is None:
        return None
    from gateway.cluster.bus import RedisBus

    return RedisBus(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, stats)


def shared_pins(config: Config) -> RedisPins | None:
    """The cluster's pins (`pins:` with cluster.redis): the pin file's text in Redis."""
    cluster = config.cluster
    if config.pins is None or cluster is None or cluster.redis is None:
        return None
    from gateway.cluster.pins import RedisPins

    return RedisPins(cluster.redis, cluster.redis_timeout)


# The bus topic on which a replica (or `pins approve`) says the cluster's pins changed.
PINS_TOPIC = "pins"


async def share_pins(config: Config, text: bytes) -> bool | None:
    """`pins record|approve` with cluster.redis: the new pin file's text into Redis, and every
    replica told; None without a cluster (nothing to share), else whether Redis took it."""
    shared = shared_pins(config)
    if shared is None:
        return None
    from gateway.cluster.bus import RedisBus

    cluster = config.cluster
    assert cluster is not None and cluster.redis is not None
    bus = RedisBus(cluster.redis, cluster.redis_timeout, cluster.redis_retry_interval, Stats())
    try:
        return await shared.write(text) and await bus.publish(PINS_TOPIC, {"changed": True})
    finally:
        await shared.close()
        await bus.close()


def session_records(config: Config, stats: Stats) -> RedisSessions | None:
    """Legacy sessions' records in Redis (cluster.redis, with an HTTP listener), so that any
    replica serves any request of a session; None: each process keeps its own."""
    cluster = config.cluster
    listen = config.listen.http
    if cluster is None or cluster.redis is None or listen is None:
        return None
    from gateway.cluster.sessions import RedisSessions

    return RedisSessions(
        cluster.redis,
        listen.session_idle_timeout,
        cluster.redis_timeout,
        cluster.redis_retry_interval,
        stats,
    )


def cluster_changes(bus: RedisBus | None, dispatcher: Dispatcher) -> ClusterChanges | None:
    """List changes and resource updates across replicas (core/changes.py). Its topics
    (changes, and the replicas' resource interests: core/interest.py) are named on the bus
    when it is made, before the bus runs."""
    if bus is None:
        return None
    return ClusterChanges(bus, dispatcher.subscriptions, dispatcher.catalogs, ready=bus.ready)


# --- cluster: the backends' logins, shared by the replicas (cluster.redis) ------------------
# (backend_auth/shared.py, cluster/logins.py; docs/decisions/0013-backend-logins-in-a-cluster.md)

# Each operation on the shared logins waits this long for Redis at most (or redis_timeout, if
# longer). Not the rate limits' 0.1 s: these run once per login step, per renewal, and per
# request of a caller this replica holds no token for, never on every request, and a request
# that needs one would otherwise fail outright; 1 s is far beyond a healthy Redis's answer yet
# well inside the request's own wait for a token (connect_timeout, 10 s by default).
SHARED_LOGINS_TIMEOUT = 1.0
# The bus topic on which a replica says that a login ended (its id's digest, and the failure).
LOGIN_TOPIC = "oauth-login"


def shared_logins(config: Config) -> RedisLogins | None:
    """The replicas' store of backend logins (tokens, registrations, per-user logins in
    progress), sealed with keys from cluster.secrets; None without cluster.redis (then tokens
    are the file store's and logins in progress the desk's memory). Made whenever the cluster
    has Redis: its client connects on first use, and a reload may add a backend with auth:."""
    cluster = config.cluster
    if cluster is None or cluster.redis is None:
        return None
    from gateway.cluster.logins import RedisLogins

    timeout = max(cluster.redis_timeout, SHARED_LOGINS_TIMEOUT)
    return RedisLogins(cluster.redis, cluster.keys(LOGINS_PURPOSE), timeout)


def login_notices(desk: LoginDesk | None, bus: RedisBus | None) -> None:
    """A login finished by one replica ends another's wait for it (the operator's login, whose
    link every replica logs) over the bus. At most once: a lost notice costs that replica its
    wait, and its next request finds the token in the shared store anyway."""
    if desk is None or bus is None:
        return

    async def announce(digest: str, failure: str | None) -> None:
        await bus.publish(LOGIN_TOPIC, {"login": digest, "failure": failure})

    async def heard(sender: str, body: dict[str, Any]) -> None:
        login, failure = body.get("login"), body.get("failure")
        if isinstance(login, str):
            await desk.heard(login, failure if isinstance(failure, str) else None)

    desk.announce = announce
    bus.on(LOGIN_TOPIC, heard)


# --- end of the shared logins' block ------------------------------------------------------
