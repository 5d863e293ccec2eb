"""Tool-definition pinning wired (`pins:`; docs/trusting-tools/pinning.md): the pin file read at
start, watched while running (an approval written by `pins approve` is taken up within
`pins.poll_interval`, and at every config reload), and what a change is told to (the audit log).

With `cluster.redis` the pins in force are the cluster's (gateway/cluster/pins.py): the first
replica seeds them from its file; a replica whose file changes (an approval made on its host)
writes them, as `pins approve` does, and tells the others on the bus, which read them at once.
While Redis is away a replica keeps the pins it has, and its file's changes are its own.

The file is polled, not watched with inotify: one `stat` a second (the default) costs nothing,
works on every file system (a ConfigMap's symlink swap included) and needs no dependency. A file
that cannot be read or is not a pin file keeps the pins in force (logged once per version of
the file).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread

from gateway.app.cluster import PINS_TOPIC, shared_pins
from gateway.app.errors import StartupError
from gateway.config import Config
from gateway.core import pins as p
from gateway.core.bus import Bus
from gateway.core.catalog import Catalogs
from gateway.core.pinning import PinEvent, Pinning
from gateway.telemetry.api import Stats, Telemetry

if TYPE_CHECKING:
    from gateway.telemetry.audit import AuditLog

log = logging.getLogger("gateway.pins")


class SharedPins(Protocol):
    """The cluster's pins (gateway/cluster/pins.py): each call says whether Redis answered."""

    async def read(self) -> tuple[bool, bytes | None]: ...

    async def seed(self, text: bytes) -> bool: ...

    async def write(self, text: bytes) -> bool: ...

    async def close(self) -> None: ...


# What identifies a version of the file: (inode, size, mtime in ns); None: there is none.
Signature = tuple[int, int, int] | None


def modes(config: Config) -> dict[str, str]:
    """Each pinned backend's on_change."""
    out: dict[str, str] = {}
    for backend in config.backends:
        mode = config.pin_mode(backend)
        if mode is not None:
            out[backend.name] = mode
    return out


def signature(path: str) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read(path: str) -> dict[str, dict[str, dict[str, p.Pin]]]:
    """The pin file's pins; a missing file is no pins (every definition is new). Raises
    PinFileInvalid (OSError included, as its text)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise p.PinFileInvalid(f"{path}: {exc.strerror}") from None
    return p.parse(data, path)


def audit_event(audit: AuditLog) -> Callable[[PinEvent], None]:
    def told(event: PinEvent) -> None:
        audit.event(
            {
                "event": "pin_change",
                "backend": event.backend,
                "kind": event.kind,
                "name": event.name,
                "status": event.status,
                "outcome": event.outcome,
                "digest": event.digest,
                "pinned_digest": event.pinned,
            }
        )

    return told


def watch(
    config: Config,
    catalogs: Catalogs,
    telemetry: Telemetry,
    audit: AuditLog | None,
    bus: Bus | None = None,
) -> PinWatch | None:
    """The gateway's pins (None without `pins:`); a pin file that is not one stops the start.
    With a bus (cluster.redis), the cluster's pins: its topic is named now, before it runs."""
    if config.pins is None:
        return None
    try:
        made = PinWatch(config, catalogs, telemetry.stats, audit, bus)
    except p.PinFileInvalid as exc:
        raise StartupError(f"pins: {exc}") from None
    if bus is not None:
        made.shared = shared_pins(config)
    return made


class PinWatch:
    """The pins of one gateway: made at start (the file read then; a file that is not a pin
    file stops the start), then kept in step with the file."""

    def __init__(
        self,
        config: Config,
        catalogs: Catalogs,
        stats: Stats,
        audit: AuditLog | None,
        bus: Bus | None = None,
    ) -> None:
        assert config.pins is not None
        self.path = config.pins.file
        self.interval = config.pins.poll_interval  # (fixed while the process runs, as `pins:`)
        self._catalogs = catalogs
        self._seen = signature(self.path)
        pinned = read(self.path)  # (PinFileInvalid: the caller's to report)
        if self._seen is None:
            log.warning(
                "pins: %s does not exist: every definition is new until approved "
                "(mcp-transparent-gateway pins record)",
                self.path,
            )
        told = audit_event(audit) if audit is not None else None
        self.pinning = Pinning(modes(config), pinned, stats, told, config.pins.notify_wait)
        catalogs.pinning = self.pinning
        self._complained: Signature = None
        # The cluster's pins, once joined (None: this replica is alone, or has not reached
        # Redis yet). Made by the composition root: `shared_pins`.
        self.shared: SharedPins | None = None
        self._bus = bus
        self.joined = anyio.Event()
        if bus is not None:
            bus.on(PINS_TOPIC, self._heard)

    async def run(self) -> None:
        """Join the cluster's pins (if any), then look at the file every `interval` and take
        up a new version."""
        try:
            while True:
                if self.shared is not None and not self.joined.is_set():
                    await self._join(self.shared)
                await anyio.sleep(self.interval)
                await self.check()
        finally:
            if self.shared is not None:
                with anyio.CancelScope(shield=True):
                    await self.shared.close()

    async def _join(self, shared: SharedPins) -> None:
        """The cluster's pins in force: its own, or (a fresh cluster) this replica's file's."""
        # (a replica without a file seeds nothing: the file is the source of a fresh cluster)
        if self._seen is not None and not await shared.seed(p.dump(self.pinning.pinned)):
            return  # (Redis away: tried again after the next interval)
        if await self._take_shared(shared):
            self.joined.set()

    async def _take_shared(self, shared: SharedPins) -> bool:
        reached, text = await shared.read()
        if not reached or text is None:
            return False
        try:
            pinned = p.parse(text, "the cluster's pins (redis)")
        except p.PinFileInvalid as exc:
            log.error("pins: %s; the pins read before stay in force", exc)
            return True
        self.take(pinned)
        return True

    async def _heard(self, sender: str, body: dict[str, Any]) -> None:
        """Another replica (or `pins approve`) changed the cluster's pins: read them now."""
        if self.shared is not None:
            await self._take_shared(self.shared)

    async def _share(self) -> None:
        """This replica's file changed (an approval on its host): the cluster's pins too."""
        if self.shared is None or self._bus is None:
            return
        if await self.shared.write(p.dump(self.pinning.pinned)):
            await self._bus.publish(PINS_TOPIC, {"changed": True})

    async def check(self) -> bool:
        """Take up the file if it changed since last read; whether the pins changed."""
        seen = signature(self.path)
        if seen == self._seen:
            return False
        try:
            pinned = await anyio.to_thread.run_sync(read, self.path)
        except p.PinFileInvalid as exc:
            if seen != self._complained:
                self._complained = seen
                log.error("pins: %s; the pins read before stay in force", exc)
            return False
        self._seen = seen
        changed = self.take(pinned)
        if changed:
            await self._share()
        return changed

    def take(self, pinned: p.PinSet) -> bool:
        """New pins in force: the catalogs judged again; whether any backend's changed."""
        changed = self.pinning.replace(pinned)
        if changed:
            log.info("pins: new pins for %s", ", ".join(changed))
            self._catalogs.repin()
        return bool(changed)

    async def reload(self, new: Config, running: Config) -> None:
        """A config reload: the backends' own modes (the top-level `pins:` is the running
        process's: changing it needs a restart), and the file read again."""
        self.pinning.reconfigure(modes(replace(new, pins=running.pins)))
        self._seen = None  # (read whatever is there now)
        await self.check()
