"""Reference servers from npm that ask for roots (client/roots) behind the gateway, which
answers a question asked outside any client's request with the backend's configured `roots:`:
server-filesystem, given no directory argument, serves the configured root it asked for at
start-up; server-everything shows it in its `get-roots-list` tool.

The servers are the pinned ones of tests/npm/package.json (`make npm-deps`). Outside CI a
machine without them skips with the reason; under CI (CI=true) the test fails instead.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import anyio
import pytest

from tests.backends.test_legacy_backends import gateway, post, text_of
from tests.support import START_BOUND, call, stdio_backend
from tests.support.conformance import npm_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# What each prints on start-up.
UPDATED = "Updated allowed directories from MCP roots"


class _Seen(logging.Handler):
    """Sets an event when the child's stderr (logged by the gateway) shows `text`."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_server_filesystem_serves_the_configured_root(tmp_path: Path) -> None:
    command = npm_server("server-filesystem")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("hello from a root\n")
    (tmp_path / "outside.txt").write_text("not in any root\n")
    child_log = logging.getLogger("gateway.backend.b")
    seen = _Seen(UPDATED)
    level = child_log.level
    child_log.setLevel(logging.INFO)
    child_log.addHandler(seen)
    backend = stdio_backend(command, roots=[{"uri": shared.as_uri(), "name": "shared"}])
    try:
        async with gateway({**backend, "connect_timeout": 60}) as (_, url):
            with anyio.fail_after(START_BOUND):
                await seen.event.wait()  # it asked at start-up and took the answer
                listed = await post(url, call(1, "list_allowed_directories"))
                inside = await post(url, call(2, "read_text_file", path=str(shared / "hello.txt")))
                outside = await post(
                    url, call(3, "read_text_file", path=str(tmp_path / "outside.txt"))
                )
    finally:
        child_log.removeHandler(seen)
        child_log.setLevel(level)
    assert str(shared.resolve()) in text_of(listed)
    assert text_of(inside) == "hello from a root\n"
    assert outside["result"]["isError"] is True  # outside every root: refused by the server


async def test_server_everything_lists_the_configured_roots(tmp_path: Path) -> None:
    command = [*npm_server("server-everything"), "stdio"]
    backend = stdio_backend(command, roots=[{"uri": tmp_path.as_uri(), "name": "work"}])
    async with gateway({**backend, "connect_timeout": 60}) as (_, url):
        with anyio.fail_after(START_BOUND):
            listed = await post(url, call(1, "get-roots-list"))
    assert f"1. work\n   URI: {tmp_path.as_uri()}" in text_of(listed)
