"""The status page in a real browser: Debian's chromium, headless, driven by playwright-core
(tests/servers/status_page.mjs), pointed at the admin listener of a real gateway in this
process (the demo server and a backend that cannot start, whose error text is markup).

With STATUS_SCREENSHOT=PATH the test also writes the page's screenshot there (README's
docs/status-page.png:
`STATUS_SCREENSHOT=docs/status-page.png pytest tests/frontends/test_status_browser.py`).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from gateway.frontends import status_page
from tests.support.conformance import NODE
from tests.support.oidc import require_browser
from tests.support.status import BACKENDS, MARKUP, call_echo, status_gateway

pytestmark = pytest.mark.anyio

SCRIPT = Path(__file__).resolve().parents[1] / "servers" / "status_page.mjs"
# status_page.mjs gives up after 30 s; this bounds each of its lines.
LINE_BOUND = 35.0
MAX_LINE = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def read_json(stdout: BufferedByteReceiveStream, proc: anyio.abc.Process) -> Any:
    with anyio.fail_after(LINE_BOUND):
        try:
            line = await stdout.receive_until(b"\n", MAX_LINE)
        except anyio.EndOfStream:
            assert proc.stderr is not None
            stderr = await proc.stderr.receive() if proc.returncode is None else b""
            raise AssertionError(f"the browser driver ended: {stderr.decode()}") from None
    return orjson.loads(line)


async def test_the_page_renders_the_backends_and_refreshes_itself(tmp_path: Path) -> None:
    require_browser()
    screenshot = os.environ.get("STATUS_SCREENSHOT") or str(tmp_path / "status.png")
    async with status_gateway() as gw:
        assert gw.admin_url is not None and gw.http_url is not None
        await call_echo(gw.http_url, "before the page")
        command = [str(NODE), str(SCRIPT), f"{gw.admin_url}/status"]
        for name in BACKENDS:
            command += ["--expect", name]
        command += ["--shows", MARKUP, "--screenshot", screenshot]
        proc = await anyio.open_process(command, stdin=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            stdout = BufferedByteReceiveStream(proc.stdout)
            rendered = await read_json(stdout, proc)
            assert rendered["rendered"] is True
            # A request through the gateway while the page is open: its next refresh shows it.
            for i in range(3):
                await call_echo(gw.http_url, f"while the page is open {i}")
            at_least = rendered["requests"] + 3
            await proc.stdin.send(orjson.dumps({"at_least": at_least}) + b"\n")
            report = (await read_json(stdout, proc))["report"]
            with anyio.fail_after(LINE_BOUND):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                with anyio.CancelScope(shield=True), anyio.move_on_after(LINE_BOUND):
                    await proc.wait()
            await proc.aclose()
    assert report["status"] == 200
    assert report["csp"] == status_page.CSP
    # The page ran its own script and style under that policy, and nothing complained.
    assert report["consoleErrors"] == [] and report["pageErrors"] == []
    # Nothing but its own origin was asked for, and every request succeeded.
    assert report["foreign"] == [] and report["failed"] == []
    # The backends' rows and charts (and the markup in an error shown as text, never run).
    assert report["rows"] == len(BACKENDS) and report["charts"] == len(BACKENDS)
    assert report["pwned"] is None
    # It refreshed itself: the same document fetched status.json again and shows the calls.
    assert report["reloads"] == 0
    assert report["statusJsonFetches"] >= 2 and report["refreshes"] >= 2
    assert report["requestsAfter"] >= at_least
    assert (await anyio.Path(screenshot).read_bytes())[:8] == b"\x89PNG\r\n\x1a\n"
