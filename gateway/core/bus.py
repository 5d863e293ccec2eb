"""What the replicas tell each other (`cluster.redis`), as the data path sees it.

A `Bus` carries small JSON objects on named topics to every other replica of the cluster; a
replica never hears its own. Delivery is at most once and only to replicas listening at the
time: what is sent while Redis is away is lost, so nothing may depend on a message arriving
(a session's record, the catalogs' refresh on a miss) except what is only ever a shortcut.

`gateway/cluster/bus.py` implements it over Redis pub/sub; `gateway/app/` wires it. Without
`cluster.redis` there is no bus, and each replica is alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

# (the sending replica's id, the message's body)
Handler = Callable[[str, dict[str, Any]], Awaitable[None]]


class Bus(Protocol):
    # This replica's id: random per process, so a restarted replica is another one.
    replica: str

    def on(self, topic: str, handler: Handler) -> None:
        """Hand every message on `topic` from another replica to `handler`, in order. Topics
        are named before the bus runs."""

    async def publish(self, topic: str, body: dict[str, Any]) -> bool:
        """Send to every other replica listening now; False when Redis did not take it
        (logged once per change of state, never raised)."""
