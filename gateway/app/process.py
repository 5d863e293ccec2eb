"""The gateway as a process: signals (graceful stop, second signal, SIGHUP reload), `--watch`,
the pid file and the garbage collector's settings once started.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import anyio.abc

from gateway.app.gateway import Gateway
from gateway.app.reach import MustReach
from gateway.app.wiring import stdio_origin
from gateway.config import Config
from gateway.frontends.stdio import End, StdioFrontend, open_process_stdio
from gateway.protocol import codes

log = logging.getLogger("gateway")


# Allocations between young-generation collections (CPython's default is 700).
GC_YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """Once started: what exists now (modules, config, catalogs) lives as long as the process,
    so it leaves the collector's scans; and young collections run less often, since every
    request allocates a few dozen short-lived containers (the default made one every few
    requests). Cycles are still collected."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


# How often `--watch` looks at the config file's modification time: a stat a second is
# nothing, and an edit is picked up about as fast as an operator could send SIGHUP.
WATCH_INTERVAL = 1.0


async def run(
    config: Config,
    load: Callable[[], Config] | None = None,
    *,
    pid_file: Path | None = None,
    watch: Path | None = None,
    stdio_server: str | None = None,
    must_reach: bool = False,
    serving: Callable[[], None] | None = None,
) -> int:
    """Run until SIGINT/SIGTERM, or (with a stdio front end) until stdin closes or the client
    closes stdout. Either way open listen streams end with their completion result and
    in-flight requests get time to finish; a second signal cuts that short. With `load`,
    SIGHUP (and, with `watch`, a change to that file) reloads the config. Returns the exit
    status: 0, or non-zero as `Stopping` says. `must_reach`: a backend down at start stops it
    (`Unreachable`, app/reach.py). `serving` is called once the gateway serves."""
    # The file as it was loaded (near enough: just after), so an edit made while the gateway
    # starts is a change too.
    stamp = await _stamp(watch) if watch is not None else None
    stopping = Stopping()
    # SIGHUP is taken before anything starts: its default action would end the process.
    # SIGINT and SIGTERM, once taken, are held to the very end (`held`), watched by a task that
    # outlives the gateway's own shutdown (a task group around the gateway would wrap its
    # start-up errors in an exception group).
    with anyio.open_signal_receiver(signal.SIGHUP) as hangups, contextlib.ExitStack() as held:
        try:
            served = (MustReach if must_reach else Gateway)(config, stdio_server=stdio_server)
            async with served as gateway, anyio.create_task_group() as tg:
                settle_gc()
                stdio = await _start_stdio(gateway, stopping, tg) if config.listen.stdio else None
                tg.start_soon(_reload_on_sighup, gateway, load, hangups)
                if load is not None and watch is not None:
                    tg.start_soon(_reload_on_change, gateway, load, watch, stamp)
                signals = held.enter_context(
                    anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM)
                )
                stopping.watch(gateway, stdio, signals)
                if serving is not None:
                    serving()  # (signals are held: whoever reads its lines may send one)
                if pid_file is not None:
                    # Written once SIGHUP reloads: whoever reads it may signal at once.
                    await anyio.Path(pid_file).write_text(f"{os.getpid()}\n")
                try:
                    await stopping.requested.wait()
                finally:
                    if pid_file is not None:
                        _remove(pid_file)
                if stdio is not None:
                    stdio.stop()  # serve_stdio drains, then cancels the group
                else:
                    tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await stopping.close()
    return stopping.status


async def _start_stdio(
    gateway: Gateway, stopping: Stopping, tg: anyio.abc.TaskGroup
) -> StdioFrontend:
    """The stdio front end on the process's stdin and stdout. Its end (stdin closed, or the
    client no longer reading) ends the run, which `tg` holds."""
    config = gateway.config
    inbound, outbound = await open_process_stdio()
    stdio = StdioFrontend(
        gateway.stdio_dispatcher,
        inbound,
        outbound,
        stdio_origin(config),
        config.shutdown.stdout_stall_timeout,
    )

    async def serve_stdio(frontend: StdioFrontend) -> None:
        end = await frontend.serve()
        if end is End.INPUT:
            log.info("stdin closed, shutting down")
        elif end is End.STALLED:
            stopping.fail(STALLED_STATUS)
        tg.cancel_scope.cancel()

    tg.start_soon(serve_stdio, stdio)
    return stdio


# The exit status when the stdio client stopped reading its last replies (some were lost).
STALLED_STATUS = 1


class Stopping:
    """SIGINT and SIGTERM from the start of serving to the process's end. The first begins the
    graceful shutdown (after `shutdown.pre_stop_delay`, for SIGTERM); the next (or the first,
    once the end of stdin began the shutdown) stops at once: requests in flight are cut, each
    answered with GATEWAY_SHUTTING_DOWN, and the exit status is 128 + the signal's number, as
    for a process the signal ended. Held to the end, so a signal never lands as a
    KeyboardInterrupt in whatever the loop is running."""

    def __init__(self) -> None:
        self.requested = anyio.Event()  # the graceful shutdown is asked for
        self.status = 0
        self._hurried = False
        self._watcher: asyncio.Task[None] | None = None

    def fail(self, status: int) -> None:
        self.status = self.status or status

    def watch(
        self, gateway: Gateway, stdio: StdioFrontend | None, signals: AsyncIterator[int]
    ) -> None:
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(gateway, stdio, signals), name="signals"
        )

    async def close(self) -> None:
        """The process is ending: signals are no longer watched (once their receiver is
        closed, the next SIGINT is a KeyboardInterrupt again, which the CLI takes)."""
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)

    async def _watch(
        self, gateway: Gateway, stdio: StdioFrontend | None, signals: AsyncIterator[int]
    ) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if not self.requested.is_set() and not (stdio is not None and stdio.ending):
                await _pre_stop(gateway, signum, signals)
                # Unready before the line is logged: whoever sees the line sees 503.
                gateway.drain()
                log.info("received %s, shutting down", name)
                self.requested.set()
            elif not self._hurried:
                self._hurried = True
                log.warning(
                    "received %s during the shutdown: stopping at once; requests in flight "
                    "are answered with %d",
                    name,
                    codes.GATEWAY_SHUTTING_DOWN,
                )
                self.fail(128 + signum)
                gateway.hurry()
                if stdio is not None:
                    stdio.hurry()


async def _pre_stop(gateway: Gateway, signum: int, signals: AsyncIterator[int]) -> None:
    """`shutdown.pre_stop_delay` after SIGTERM: unready (/readyz 503) at once, yet serving as
    before, so a load balancer that has not yet heard (a Service's endpoints take seconds to
    reach every node) sends nothing into a closed port. SIGINT is someone at a terminal: no
    wait; a second signal ends the wait."""
    delay = gateway.config.shutdown.pre_stop_delay
    if signum != signal.SIGTERM or delay <= 0:
        return
    gateway.draining = True
    log.info("received SIGTERM: unready, serving %g s more (shutdown.pre_stop_delay)", delay)
    with anyio.move_on_after(delay):
        async for _ in signals:
            return


async def _reload_on_sighup(
    gateway: Gateway, load: Callable[[], Config] | None, hangups: AsyncIterator[int]
) -> None:
    async for _ in hangups:
        if load is None:
            log.warning("received SIGHUP: this gateway has no config file to reload")
            continue
        log.info("received SIGHUP, reloading the config")
        await gateway.reload(load)


async def _reload_on_change(
    gateway: Gateway, load: Callable[[], Config], path: Path, seen: tuple[int, int] | None
) -> None:
    """`--watch`: a stat of the file every WATCH_INTERVAL, a reload when its modification time
    or size changed (a poll, not inotify: portable, and one stat a second costs nothing)."""
    log.info("watching %s for changes", path)
    while True:
        await anyio.sleep(WATCH_INTERVAL)
        stamp = await _stamp(path)
        if stamp != seen:
            seen = stamp
            log.info("%s changed, reloading the config", path)
            await gateway.reload(load)


def _remove(pid_file: Path) -> None:
    # One unlink, synchronous: it runs in a `finally` that cancellation may be passing through,
    # where an await would not run.
    pid_file.unlink(missing_ok=True)


async def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        found = await anyio.Path(path).stat()
    except OSError:
        return None  # (being replaced: the next look sees the new file)
    return found.st_mtime_ns, found.st_size
