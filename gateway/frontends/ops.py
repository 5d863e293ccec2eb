"""Operator endpoints: `/metrics`, `/healthz`, `/readyz`, on the MCP listener and on the optional
admin listener (so a stdio-only gateway can be scraped)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson

from gateway.frontends.server import Handler, Reply, Request

JSON = "application/json"
READ_METHODS = frozenset({"GET", "HEAD"})
NOT_ALLOWED = Reply(405, headers=(("Allow", "GET, HEAD"),))


@dataclass(frozen=True)
class Operations:
    # Accept header -> (exposition body, content type)
    metrics: Callable[[str], tuple[bytes, str]]
    # backend name -> reachable now
    backends: Callable[[], Mapping[str, bool]]
    # the front ends are listening (the admin listener starts before them)
    serving: Callable[[], bool]


def operation_routes(ops: Operations) -> dict[str, Handler]:
    async def metrics(request: Request) -> Reply:
        if request.method not in READ_METHODS:
            return NOT_ALLOWED
        body, content_type = ops.metrics(request.headers.get("Accept") or "")
        return Reply(200, body, content_type)

    async def healthz(request: Request) -> Reply:
        if request.method not in READ_METHODS:
            return NOT_ALLOWED
        return Reply(200, b'{"status":"ok"}', JSON)

    async def readyz(request: Request) -> Reply:
        """Ready when the front ends listen and every backend is reachable; the body says which."""
        if request.method not in READ_METHODS:
            return NOT_ALLOWED
        backends = dict(ops.backends())
        serving = ops.serving()
        ready = serving and all(backends.values())
        status = "ready" if ready else "not ready"
        body = {"status": status, "serving": serving, "backends": backends}
        return Reply(200 if ready else 503, orjson.dumps(body), JSON)

    return {"/metrics": metrics, "/healthz": healthz, "/readyz": readyz}
