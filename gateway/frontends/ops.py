"""Operator endpoints: `/metrics`, `/healthz`, `/readyz`, on the MCP listener and on the optional
admin listener (so a stdio-only gateway can be scraped)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import orjson
from aiohttp import web


@dataclass(frozen=True)
class Operations:
    # Accept header -> (exposition body, content type)
    metrics: Callable[[str], tuple[bytes, str]]
    # backend name -> reachable now
    backends: Callable[[], Mapping[str, bool]]
    # the front ends are listening (the admin listener starts before them)
    serving: Callable[[], bool]


OPS = web.AppKey("ops", Operations)


def add_operations(app: web.Application, ops: Operations) -> None:
    app[OPS] = ops
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)


def make_admin_app(ops: Operations) -> web.Application:
    app = web.Application()
    add_operations(app, ops)
    return app


async def _metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[OPS].metrics(request.headers.get("Accept", ""))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def _healthz(_: web.Request) -> web.Response:
    return web.Response(body=b'{"status":"ok"}', content_type="application/json")


async def _readyz(request: web.Request) -> web.Response:
    """Ready when the front ends listen and every backend is reachable; the body says which."""
    ops = request.app[OPS]
    backends = dict(ops.backends())
    serving = ops.serving()
    ready = serving and all(backends.values())
    body = {"status": "ready" if ready else "not ready", "serving": serving, "backends": backends}
    return web.Response(
        status=200 if ready else 503, body=orjson.dumps(body), content_type="application/json"
    )
