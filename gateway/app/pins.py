"""Tool-definition pinning wired (`pins:`; docs/trusting-tools/pinning.md): the pin file read at
start, watched while running (an approval written by `pins approve` is taken up within
`WATCH_INTERVAL`, and at every config reload), and what a change is told to (the audit log).

The file is polled, not watched with inotify: one `stat` a second costs nothing, works on every
file system (a ConfigMap's symlink swap included) and needs no dependency. A file that cannot be
read or is not a pin file keeps the pins in force (logged once per version of the file).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from gateway.app.errors import StartupError
from gateway.config import Config
from gateway.core import pins as p
from gateway.core.catalog import Catalogs
from gateway.core.pinning import PinEvent, Pinning
from gateway.telemetry.api import Stats

if TYPE_CHECKING:
    from gateway.telemetry.audit import AuditLog

log = logging.getLogger("gateway.pins")

# How often the pin file is looked at for a change (an approval).
WATCH_INTERVAL = 1.0

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
    config: Config, catalogs: Catalogs, stats: Stats, audit: AuditLog | None
) -> PinWatch | None:
    """The gateway's pins (None without `pins:`); a pin file that is not one stops the start."""
    if config.pins is None:
        return None
    try:
        return PinWatch(config, catalogs, stats, audit)
    except p.PinFileInvalid as exc:
        raise StartupError(f"pins: {exc}") from None


class PinWatch:
    """The pins of one gateway: made at start (the file read then; a file that is not a pin
    file stops the start), then kept in step with the file."""

    def __init__(
        self, config: Config, catalogs: Catalogs, stats: Stats, audit: AuditLog | None
    ) -> None:
        assert config.pins is not None
        self.path = config.pins.file
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
        self.pinning = Pinning(modes(config), pinned, stats, told)
        catalogs.pinning = self.pinning
        self._complained: Signature = None

    async def run(self) -> None:
        """Look at the file every WATCH_INTERVAL; take up a new version."""
        while True:
            await anyio.sleep(WATCH_INTERVAL)
            await self.check()

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
        return self.take(pinned)

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
