"""The reference server-filesystem from npm behind the gateway, given no directory argument:
its allowed directories come from the roots it asks for at start-up (client/roots), which the
gateway answers with the backend's configured `roots:`.

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

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# Pinned: the roots behaviour (ask at start-up when the client has roots, replace the allowed
# directories with them) is this release's; a newer one must be tried before it is taken.
PACKAGE = "@modelcontextprotocol/server-filesystem@2026.8.31"
# A first run downloads the package; later ones start from npm's cache.
INSTALL_BOUND = 240.0
UPDATED = "Updated allowed directories from MCP roots"


@pytest.fixture(scope="module")
def npx() -> str:
    """npx with the package in npm's cache; a skip (not under CI) when either is missing."""
    found = shutil.which("npx")
    reason = "npx is not on PATH"
    if found is not None:
        try:
            # With no directory and stdin closed the server starts, says so and exits.
            done = subprocess.run(
                [found, "-y", PACKAGE],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=INSTALL_BOUND,
            )
            if b"running on stdio" in done.stderr:
                return found
            reason = f"npx {PACKAGE} failed: {done.stderr.decode(errors='replace')[-500:]}"
        except subprocess.TimeoutExpired:
            reason = f"npx {PACKAGE} did not start within {INSTALL_BOUND:g}s"
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


async def test_server_filesystem_serves_the_configured_root(npx: str, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("hello from a root\n")
    (tmp_path / "outside.txt").write_text("not in any root\n")
    child_log = logging.getLogger("gateway.backend.b")
    seen = _Seen(UPDATED)
    level = child_log.level
    child_log.setLevel(logging.INFO)
    child_log.addHandler(seen)
    backend = stdio_backend(
        [npx, "-y", PACKAGE], roots=[{"uri": shared.as_uri(), "name": "shared"}]
    )
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
