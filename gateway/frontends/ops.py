"""Operator endpoints: `/metrics`, `/healthz`, `/readyz`, on the MCP listener and on the optional
admin listener (so a stdio-only gateway can be scraped); the status page (`/status`,
`/status.json`) on the admin listener only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import hdrs, web

from gateway.frontends import guard, status_page
from gateway.frontends.listener import Handler
from gateway.protocol import codes, jsonrpc

JSON = "application/json"
READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class Operations:
    # Accept header -> (exposition body, content type)
    metrics: Callable[[str], tuple[bytes, str]]
    # backend name -> reachable now
    backends: Callable[[], Mapping[str, bool]]
    # the front ends are listening (the admin listener starts before them)
    serving: Callable[[], bool]
    # shutdown has begun: requests in flight drain, and a load balancer should send no more
    draining: Callable[[], bool] = lambda: False
    # the status page's data (`/status.json`, telemetry/status.py); None: no status page
    status: Callable[[], Mapping[str, Any]] | None = None


def _error(status: int, message: str, **extra: str) -> web.Response:
    body = jsonrpc.encode(jsonrpc.error(None, codes.INVALID_REQUEST, message))
    return web.Response(status=status, body=body, content_type=JSON, headers=extra)


def _not_allowed() -> web.Response:
    return _error(405, "Operator endpoints take GET or HEAD", Allow="GET, HEAD")


def operation_routes(ops: Operations) -> dict[str, Handler]:
    async def metrics(request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            return _not_allowed()
        body, content_type = ops.metrics(request.headers.get(hdrs.ACCEPT) or "")
        return web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})

    async def healthz(request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            return _not_allowed()
        return web.Response(body=b'{"status":"ok"}', content_type=JSON)

    async def readyz(request: web.BaseRequest) -> web.StreamResponse:
        """Ready when the front ends listen, shutdown has not begun and every backend is
        reachable; the body says which."""
        if request.method not in READ_METHODS:
            return _not_allowed()
        backends = dict(ops.backends())
        serving = ops.serving()
        draining = ops.draining()
        ready = serving and not draining and all(backends.values())
        status = "ready" if ready else "not ready"
        body = {"status": status, "serving": serving, "draining": draining, "backends": backends}
        return web.Response(
            status=200 if ready else 503, body=orjson.dumps(body), content_type=JSON
        )

    return {"/metrics": metrics, "/healthz": healthz, "/readyz": readyz}


def status_routes(status: Callable[[], Mapping[str, Any]]) -> dict[str, Handler]:
    """The status page and its data: read-only, never cached, the page limited by its CSP to
    its own inline script and style and to fetching from its own origin."""

    async def page(request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            return _not_allowed()
        return web.Response(
            body=status_page.PAGE, content_type="text/html", charset="utf-8",
            headers=status_page.HEADERS,
        )  # fmt: skip

    async def data(request: web.BaseRequest) -> web.StreamResponse:
        if request.method not in READ_METHODS:
            return _not_allowed()
        return web.Response(
            body=orjson.dumps(status()),
            content_type=JSON,
            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
        )

    return {"/status": page, "/status.json": data}


def admin_handler(ops: Operations, *, loopback: bool) -> Handler:
    """The admin listener's one handler: the operator routes, behind the same DNS-rebinding
    guard as the MCP listener (on loopback, a rebound name could read the metrics too). It has
    no allowed lists of its own: only loopback origins, and on loopback only loopback hosts.
    The status page is served here only (not on the MCP listener, whose clients are not its
    operators)."""
    routes = operation_routes(ops)
    if ops.status is not None:
        routes |= status_routes(ops.status)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        fields = request.headers
        target = request.raw_path
        origins = fields.getall(hdrs.ORIGIN, ())
        why = guard.refusal(
            guard.one_field(origins) if origins else None,
            fields.get(hdrs.HOST, ""),
            None if target.startswith("/") else guard.target_authority(target),
            allowed_origins=(),
            allowed_hosts=(),
            check_host=loopback,
        )
        if why is not None:
            return _error(403, f"The request's {why.capitalize()} is not allowed")
        route = routes.get(request.path)
        if route is None:
            return _error(404, "Not Found")
        return await route(request)

    return handle
