"""The HTTP listener's routes for per-user backend logins (`per_user: true`): the link a caller
is sent (`/oauth/login?id=...`, a redirect to the authorization server) and the redirect back
(`/oauth/callback`). Plain pages for a browser; no bearer token is asked, since the link and the
flow's one-time `state` are what bind a login to its caller (gateway/backend_auth/desk.py)."""

from __future__ import annotations

import html
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.backend_auth.seam import CALLBACK_PATH, LOGIN_PATH, DeskError

if TYPE_CHECKING:
    from gateway.backend_auth.desk import LoginDesk

log = logging.getLogger("gateway.backend_auth")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# The pages say nothing the browser's user did not already know; no caching of either.
_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


def page(status: int, text: str) -> web.Response:
    body = f"<!doctype html><title>mcp-gateway</title><p>{html.escape(text)}</p>"
    return web.Response(status=status, text=body, content_type="text/html", headers=_HEADERS)


def routes(desk: LoginDesk) -> dict[str, Handler]:
    async def login(request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "GET":
            return page(405, "GET only.")
        try:
            where = await desk.begin(request.query.get("id", ""))
        except DeskError as exc:
            return page(exc.status, str(exc))
        return web.Response(status=302, headers={"Location": where, **_HEADERS})

    async def callback(request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "GET":
            return page(405, "GET only.")
        try:
            onward, said = await desk.complete({k: v for k, v in request.query.items()})
        except DeskError as exc:
            return page(exc.status, str(exc))
        if onward is not None:  # signed in: on to the backend's own login
            return web.Response(status=302, headers={"Location": onward, **_HEADERS})
        return page(200, said)

    return {LOGIN_PATH: login, CALLBACK_PATH: callback}
