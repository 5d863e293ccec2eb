"""Reference servers from npm that ask for roots (client/roots) behind the gateway, which
answers a question asked outside any client's request with the backend's configured `roots:`:
server-filesystem, given no directory argument, serves the configured root it asked for at
start-up; server-everything shows it in its `get-roots-list` tool.

Needs npx and the npm registry (or npm's cache). Outside CI a machine without them skips with
the reason; under CI (CI=true) the test never skips.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest

from tests.support import START_BOUND, call, stdio_backend
from tests.test_legacy_backends import gateway, post, text_of

# A first run downloads the package; later ones start from npm's cache.
INSTALL_BOUND = 240.0
# The suite's per-test timeout (60 s) leaves too little for a first download.
pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(INSTALL_BOUND + 60)]

# Pinned: the roots behaviour (ask at start-up when the client has roots; server-filesystem
# replaces its allowed directories with them) is these releases'; a newer one must be tried
# before it is taken.
FILESYSTEM = "@modelcontextprotocol/server-filesystem@2026.8.31"
EVERYTHING = "@modelcontextprotocol/server-everything@2026.8.31"
# What each prints on start-up when run with no argument and stdin closed.
STARTED = {FILESYSTEM: b"running on stdio", EVERYTHING: b"STDIO"}
UPDATED = "Updated allowed directories from MCP roots"


def npx(package: str) -> str:
    """npx, with `package` in npm's cache; a skip (not under CI) when either is missing."""
    found = shutil.which("npx")
    reason = "npx is not on PATH"
    if found is not None:
        try:
            # Started with stdin closed, the server says it runs and exits.
            done = subprocess.run(
                [found, "-y", package],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=INSTALL_BOUND,
            )
            if STARTED[package] in done.stdout + done.stderr:
                return found
            reason = f"npx {package} failed: {done.stderr.decode(errors='replace')[-500:]}"
        except subprocess.TimeoutExpired:
            reason = f"npx {package} did not start within {INSTALL_BOUND:g}s"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must run this test)")
    pytest.skip(reason)


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
    command = [npx(FILESYSTEM), "-y", FILESYSTEM]
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
    command = [npx(EVERYTHING), "-y", EVERYTHING, "stdio"]
    backend = stdio_backend(command, roots=[{"uri": tmp_path.as_uri(), "name": "work"}])
    async with gateway({**backend, "connect_timeout": 60}) as (_, url):
        with anyio.fail_after(START_BOUND):
            listed = await post(url, call(1, "get-roots-list"))
    assert f"1. work\n   URI: {tmp_path.as_uri()}" in text_of(listed)
