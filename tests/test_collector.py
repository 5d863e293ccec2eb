"""A full collection soon after long-lived state ends (gateway/collector.py): a legacy client
session's objects are mostly in reference cycles by the time it ends, and would otherwise wait
for the collector's rare full collection (issue 34: RSS grew ~2 MB for every 64 sessions)."""

from __future__ import annotations

import gc

import anyio
import pytest

from gateway import collector
from gateway.origin import LegacyClient
from tests.support import BOUND

pytestmark = pytest.mark.anyio


class Collections:
    """The full collections made (gc.collect stands in: counted, not run)."""

    def __init__(self) -> None:
        self.made = 0
        self.event = anyio.Event()

    def collect(self, *_: object) -> int:
        self.made += 1
        self.event.set()
        return 0

    async def first(self) -> int:
        with anyio.fail_after(BOUND):
            await self.event.wait()
        return self.made


@pytest.fixture
def collections(monkeypatch: pytest.MonkeyPatch) -> Collections:
    made = Collections()
    monkeypatch.setattr(gc, "collect", made.collect)
    return made


async def test_a_batch_of_ends_is_collected_at_the_next_turn(
    collections: Collections, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector, "DELAY", 3600.0)
    for _ in range(collector.BATCH):
        collector.collect_soon()
    assert collections.made == 0  # (never inside the caller's own turn)
    assert await collections.first() == 1  # one for the whole batch, long before the delay


async def test_a_single_end_is_collected_within_the_delay(
    collections: Collections, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collector, "DELAY", 0.01)
    collector.collect_soon()
    collector.collect_soon()
    assert await collections.first() == 1


async def test_a_legacy_session_s_end_asks_for_one(
    collections: Collections, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ends a legacy client session (DELETE, idle timeout, the transport closing) ends its
    `LegacyClient`, whose closers have run by then; its end counts towards a collection."""
    monkeypatch.setattr(collector, "DELAY", 3600.0)
    closed: list[str] = []
    session = LegacyClient()
    session.on_close(lambda: closed.append("lane"))
    for _ in range(collector.BATCH - 1):
        collector.collect_soon()
    session.close()
    session.close()  # (a second close is no second end)
    assert closed == ["lane"]
    assert await collections.first() == 1  # (the batch filled by the session's end)


def test_nothing_is_asked_outside_a_running_loop(collections: Collections) -> None:
    collector.collect_soon()  # (a session closed at exit, after the loop: nothing to schedule)
    assert collections.made == 0
