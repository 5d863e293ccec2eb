"""A reply's relay on the hot path: each HTTP request makes one, so it must be freed as soon as
the request is done, by reference counting alone (bench/README.md, issue 32: a relay that kept
its JSON-window timer made a reference cycle per request, 6% of HTTP->HTTP throughput)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import cast

import pytest
from aiohttp import web

from gateway.frontends.replies import Relay
from gateway.telemetry.api import Stats
from gateway.timers import wheel

pytestmark = pytest.mark.anyio


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@pytest.mark.usefixtures("no_cyclic_collector")
async def test_a_relay_is_freed_once_its_window_is_closed() -> None:
    """The common path of `Endpoint._answer`: a relay, its window armed and then cancelled."""
    relay = Relay(cast(web.BaseRequest, object()), Stats())
    timer = relay.open_window(wheel())
    gone = weakref.ref(relay)
    timer.cancel()
    del relay, timer
    assert gone() is None
