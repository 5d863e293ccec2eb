"""A stdio backend's child is reaped and its pipes closed on every way its gateway stops it:
cancelled as it starts, and a refused second (legacy) child still stopping when the backend
stops (basic/transports/stdio, Shutdown). A child left running, or a pipe left open, is not
only a leak: it fails whichever later test happens to collect it (warnings are errors)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import warnings
from typing import Any, cast

import anyio
import pytest
import uvloop

from gateway.backends import child
from gateway.backends.base import Call, NotificationSink
from gateway.backends.era.dual import Lanes
from gateway.backends.era.link import Link
from gateway.errors import BackendError
from gateway.origin import LegacyClient, Origin
from gateway.protocol.jsonrpc import Message
from tests.support import BOUND, both_event_loops  # noqa: F401  (the fixture: both loops)

pytestmark = pytest.mark.anyio

# Waits for its stdin to end: it would outlive a gateway that forgot it.
WAITING = [sys.executable, "-c", "import sys; sys.stdin.read()"]


def leaked_resources() -> list[str]:
    """What a full collection now finds unclosed or unreaped."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def record_popens(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """The processes started from now on (child.py calls subprocess.Popen)."""
    started: list[subprocess.Popen[bytes]] = []

    class Recorded(subprocess.Popen[bytes]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(subprocess, "Popen", Recorded)
    return started


@pytest.mark.parametrize("turns", [1, 2, 3])
async def test_a_child_cancelled_as_its_pipes_are_connected_is_reaped_and_closed(
    turns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled after `turns` turns of the loop into the start (each pipe's connection takes
    one): the child is killed and reaped, and each of its pipes closed, none left to a
    collection (uvloop hands a pipe's file object to its transport only once connected)."""
    started = record_popens(monkeypatch)
    starting = asyncio.get_running_loop().create_task(
        child.spawn(WAITING, env={}, cwd=None, limit=65536)
    )
    for _ in range(turns):
        await asyncio.sleep(0)  # (one turn: the start gets as far as that many connections)
    assert started and not starting.done()
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    # The connection it was cut off from finishes, then the child is stopped.
    with anyio.fail_after(BOUND):
        await asyncio.gather(*child._abandoned)
        await asyncio.sleep(0)  # (the done callback that stops it)
    (popen,) = started
    assert popen.returncode is not None
    for _ in range(3):
        await asyncio.sleep(0)  # (the transports close their pipes soon after close())
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    assert popen.stdin.closed and popen.stdout.closed and popen.stderr.closed
    del popen, started[:]
    assert leaked_resources() == []


@pytest.mark.parametrize("turns", [1, 2, 3])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_closing_as_a_child_starts_leaves_it_reaped_and_closed(
    turns: int, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop closing while a child's pipes connect (a gateway's process ending as a child
    restarts) cancels the connection itself: still nothing left open or running."""
    started = record_popens(monkeypatch)

    async def main() -> None:
        asyncio.get_running_loop().create_task(child.spawn(WAITING, env={}, cwd=None, limit=9))
        for _ in range(turns):
            await asyncio.sleep(0)
        assert started  # (returning, the loop cancels the start and closes)

    run = uvloop.run if loop == "uvloop" else asyncio.run
    run(main())
    (popen,) = started
    assert popen.returncode is not None
    assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
    assert popen.stdin.closed and popen.stdout.closed and popen.stderr.closed
    del popen, started[:]
    assert leaked_resources() == []


class SlowToStop:
    """A shared lane (the second child) whose shielded stop, as StdioBackend's (stdin closed,
    SIGTERM, SIGKILL, reaped), lasts until `release` is set; `stopped`: it got to the end."""

    def __init__(self) -> None:
        self.inner = cast(Link, type("Up", (), {"up": True})())
        self.stopping = asyncio.Event()
        self.release = asyncio.Event()
        self.stopped = False

    async def run(self) -> None:
        try:
            await anyio.sleep_forever()
        finally:
            with anyio.CancelScope(shield=True):
                self.stopping.set()
                await self.release.wait()
                self.stopped = True

    async def open_legacy(self) -> None:
        await asyncio.sleep(0)  # (its transport has started)
        raise BackendError("b", "initialize refused: modern only")

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        raise AssertionError("a refused lane serves nothing")

    async def close(self) -> None:
        pass


async def test_a_refused_second_child_still_stopping_is_not_cut_off_by_the_backends_stop() -> None:
    """A modern-only server refuses the legacy handshake on the second child, which is then
    stopped; the backend stopping meanwhile waits for that stop to end rather than cancel it a
    second time (which would abandon the child running, its process never reaped)."""
    lane = SlowToStop()
    lanes = Lanes("b", lambda: lane, shared=True, within=BOUND)
    client = LegacyClient()
    legacy = Call(Origin("http", legacy=client))
    msg: Message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    async def ignore(note: Message) -> None:
        pass

    assert await lanes.serve(client, msg, ignore, legacy, False) is None
    assert lanes.dual is False
    with anyio.fail_after(BOUND):
        await lane.stopping.wait()
        closing = asyncio.get_running_loop().create_task(lanes.close())
        await asyncio.sleep(0)  # (close has begun: it waits for the lane's transport)
        assert not closing.done()
        lane.release.set()
        await closing
    assert lane.stopped
