"""Composition root: builds backends, the dispatcher and the front ends from a config, owns the
root task group and shuts everything down in order. The only module that wires concrete parts.
"""

from __future__ import annotations

import logging
import signal
from types import TracebackType

import anyio
import anyio.abc
from aiohttp import web

from gateway import __version__
from gateway.backends.base import Backend
from gateway.backends.http import HttpBackend
from gateway.backends.stdio import StdioBackend
from gateway.config import BackendConfig, Config, StdioTarget
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.frontends import http as http_frontend
from gateway.frontends.stdio import StdioFrontend, open_process_stdio
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.table import Exposure

log = logging.getLogger("gateway")

INFO = GatewayInfo(name="mcp-gateway", version=__version__)
# Time given to open HTTP responses to finish when the gateway stops.
HTTP_SHUTDOWN_GRACE = 5.0


class StartupError(Exception):
    """The configured backends cannot be served together (e.g. a name collision under `never`)."""


def make_backend(config: BackendConfig) -> Backend:
    if isinstance(config.target, StdioTarget):
        return StdioBackend(config)
    return HttpBackend(config)


def make_exposure(config: BackendConfig) -> Exposure:
    return Exposure(
        backend=config.name,
        namespace=config.effective_namespace,
        allow=config.allow_tools,
        deny=config.deny_tools,
        rename=dict(config.rename_tools),
        strict_headers=not isinstance(config.target, StdioTarget),
    )


def make_naming(config: Config) -> Naming:
    n = config.namespacing
    return Naming(
        mode=PrefixMode(n.prefix),
        separator=n.separator,
        max_length=n.max_name_length,
        backends=len(config.backends),
    )


class Gateway:
    """The running gateway: `async with Gateway(config) as gw:` starts backends and the HTTP
    listener (if configured); `serve_stdio` runs the stdio front end on given streams."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.backends = [make_backend(b) for b in config.backends]
        self.dispatcher = Dispatcher(
            self.backends,
            [make_exposure(b) for b in config.backends],
            make_naming(config),
            INFO,
            config.on_backend_failure,
        )
        for backend in self.backends:
            if isinstance(backend, StdioBackend):
                backend.on_notification = self.dispatcher.backend_notification
        self._runner: web.AppRunner | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.http_url: str | None = None

    async def __aenter__(self) -> Gateway:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for backend in self.backends:
            self._tg.start_soon(backend.run, name=f"backend {backend.name}")
        try:
            await self._load_catalogs()
            if self.config.listen.http is not None:
                await self._start_http()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _load_catalogs(self) -> None:
        """Learn every backend's catalog before serving, so the first requests route and a
        collision under prefix mode `never` stops the start with both backends named."""
        await self.dispatcher.catalogs.load_all()
        collisions = self.dispatcher.catalogs.table.collisions
        if collisions and self.config.namespacing.prefix == "never":
            raise StartupError("; ".join(collisions))

    async def _start_http(self) -> None:
        listen = self.config.listen.http
        assert listen is not None
        app = http_frontend.make_app(self.dispatcher, listen)
        # handler_cancellation: a client that drops its connection cancels its request.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=HTTP_SHUTDOWN_GRACE
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, listen.host, listen.port)
        await site.start()
        port = self._runner.addresses[0][1]
        host = f"[{listen.host}]" if ":" in listen.host else listen.host
        self.http_url = f"http://{host}:{port}{listen.path}"
        log.info("listening on %s", self.http_url)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.dispatcher.close_streams()
        if self._runner is not None:
            with anyio.CancelScope(shield=True):
                await self._runner.cleanup()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(exc_type, exc, tb)

    async def serve_stdio(
        self, inbound: anyio.abc.ByteReceiveStream, outbound: anyio.abc.ByteSendStream
    ) -> None:
        await StdioFrontend(self.dispatcher, inbound, outbound).serve()


async def run(config: Config) -> None:
    """Run until SIGINT/SIGTERM, or (with a stdio front end) until stdin closes. Either way open
    listen streams end with their completion result and in-flight requests get time to finish."""
    async with Gateway(config) as gateway, anyio.create_task_group() as tg:
        stdio: StdioFrontend | None = None
        if config.listen.stdio:
            inbound, outbound = await open_process_stdio()
            stdio = StdioFrontend(gateway.dispatcher, inbound, outbound)

            async def serve_stdio(frontend: StdioFrontend) -> None:
                await frontend.serve()
                log.info("stdin closed, shutting down")
                tg.cancel_scope.cancel()

            tg.start_soon(serve_stdio, stdio)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("received %s, shutting down", signal.Signals(signum).name)
                break
        gateway.dispatcher.close_streams()
        if stdio is not None:
            stdio.stop()  # serve_stdio drains, then cancels the group
        else:
            tg.cancel_scope.cancel()
