"""The loopback redirect listener of one authorization-code flow (RFC 8252 7.3): an aiohttp
server on 127.0.0.1 that lives only for the flow, and the browser opened on the authorization
URL with Python's `webbrowser` (so `BROWSER` chooses the program), in a worker thread so that
a browser command that blocks never blocks the event loop."""

from __future__ import annotations

import asyncio
import logging
import webbrowser

import anyio
from aiohttp import web

log = logging.getLogger("gateway.backend_auth")

CALLBACK_PATH = "/callback"
HOST = "127.0.0.1"
_DONE_PAGE = (
    "<!doctype html><title>mcp-gateway</title><p>Login received: you can close this window.</p>"
)
_FAILED_PAGE = (
    "<!doctype html><title>mcp-gateway</title>"
    "<p>The login did not succeed; see the gateway's log.</p>"
)


class RedirectListener:
    """Waits for the one redirect that carries this flow's `state`; anything else gets 404
    and changes nothing, so another page cannot end or steer the flow."""

    def __init__(self, state: str) -> None:
        self._state = state
        self._answer: asyncio.Future[dict[str, str]] | None = None
        self._runner: web.ServerRunner | None = None
        self.redirect_uri = ""

    async def start(self, port: int) -> str:
        self._answer = asyncio.get_running_loop().create_future()
        server = web.Server(self._handle, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, port)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.redirect_uri = f"http://{HOST}:{bound}{CALLBACK_PATH}"
        return self.redirect_uri

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        params = {k: v for k, v in request.query.items()}
        if request.path != CALLBACK_PATH or params.get("state") != self._state:
            return web.Response(status=404, text="not found")
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_result(params)
        ok = "code" in params and "error" not in params
        return web.Response(
            status=200 if ok else 400,
            text=_DONE_PAGE if ok else _FAILED_PAGE,
            content_type="text/html",
        )

    async def wait(self) -> dict[str, str]:
        assert self._answer is not None
        return await asyncio.shield(self._answer)

    async def close(self) -> None:
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()


async def open_browser(url: str) -> None:
    """Ask the user's browser to open `url`; a browser that cannot be started is logged (the
    URL is on stderr anyway)."""
    try:
        opened = await anyio.to_thread.run_sync(webbrowser.open, url, abandon_on_cancel=True)
    except Exception as exc:  # webbrowser raises what its browser command raises
        log.warning("could not open a browser: %s", type(exc).__name__)
        return
    if not opened:
        log.warning("no browser could be opened; open the URL above by hand")
