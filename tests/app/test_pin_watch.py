"""The pin file watched while the gateway runs (gateway/app/pins.py): looked at every
`pins.poll_interval` and each new version taken up, and `pins.notify_wait` handed to what holds
list changes back (core/listen.py). In memory: a real file, an in-memory backend."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
import yaml

from gateway.app.pins import PinWatch
from gateway.config import load
from gateway.core import pins as p
from gateway.core.catalog import Catalogs
from gateway.routing.names import Naming
from gateway.routing.table import Exposure
from gateway.telemetry.api import Stats
from tests.support import until
from tests.support.memory_backend import MemoryBackend

pytestmark = pytest.mark.anyio

TOOL = {"name": "echo", "description": "Says it back.", "inputSchema": {"type": "object"}}


def watch_of(tmp_path: Path, **pins: object) -> PinWatch:
    path = tmp_path / "gateway.yaml"
    doc = {"listen": {"stdio": True}, "backends": {"mem": {"stdio": {"command": "x"}}}}
    path.write_text(yaml.safe_dump({**doc, "pins": {"file": "pins.json", **pins}}))
    config = load(path, {})
    catalogs = Catalogs([MemoryBackend()], [Exposure(backend="mem", namespace="mem")], Naming(), {})
    return PinWatch(config, catalogs, Stats(), None)


async def test_an_approval_is_taken_up_within_the_poll_interval(tmp_path: Path) -> None:
    watch = watch_of(tmp_path, poll_interval=0.05, notify_wait=0.5)
    assert watch.pinning.notify_wait == 0.5
    assert watch.pinning.pinned == {}
    approved = {"mem": p.current({"tools": [TOOL]})}
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch.run)
        (tmp_path / "pins.json").write_bytes(p.dump(approved))
        # Bounded below the 1 s default: the configured interval, not the default, is used.
        await until(lambda: watch.pinning.pinned == approved, within=0.9, every=0.01)
        tg.cancel_scope.cancel()


async def test_the_defaults(tmp_path: Path) -> None:
    watch = watch_of(tmp_path)
    assert (watch.interval, watch.pinning.notify_wait) == (1.0, 5.0)
