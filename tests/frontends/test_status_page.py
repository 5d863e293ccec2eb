"""The status page on the admin listener (`/status`, `/status.json`), against a real gateway in
this process: the demo server over stdio and a backend that cannot start, read over the real
admin listener."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import orjson
import pytest

from gateway import __version__
from gateway.app import Gateway
from gateway.frontends import status_page
from tests.support import BOUND
from tests.support.listener import Serving, port_of, request
from tests.support.status import BACKENDS, BROKEN_COMMAND, MARKUP, call_echo, status_gateway

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def gw() -> AsyncIterator[Gateway]:
    async with status_gateway() as running:
        yield running


@pytest.fixture
async def admin(gw: Gateway) -> AsyncIterator[Serving]:
    assert gw.admin_url is not None
    serving = Serving(port_of(gw.admin_url))
    yield serving
    serving.abort_all()


async def status_json(gw: Gateway) -> dict[str, Any]:
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{gw.admin_url}/status.json") as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Cache-Control"] == "no-store"
            body: dict[str, Any] = orjson.loads(await resp.read())
            assert resp.content_type == "application/json"
            return body


async def test_status_json_describes_the_gateway_and_each_backend(gw: Gateway) -> None:
    data = await status_json(gw)
    top = data["gateway"]
    assert top["version"] == __version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", top["started"])
    assert top["uptime_seconds"] >= 0
    assert (top["serving"], top["draining"]) == (True, False)
    assert top["listeners"] == {"mcp_http": gw.http_url, "mcp_stdio": None, "admin": gw.admin_url}
    assert data["slot_seconds"] == 10
    demo, broken = data["backends"]
    assert (demo["name"], broken["name"]) == BACKENDS
    assert (demo["transport"], demo["era"], demo["health"]) == ("stdio", "modern", "up")
    assert demo["catalog"] == {"tools": 4, "prompts": 1, "resources": 1, "templates": 1}
    assert demo["requests"] >= 1  # its catalog was loaded through the same path
    assert demo["p50_ms"] is not None and demo["p99_ms"] >= demo["p50_ms"]
    assert len(demo["series"]) == 60
    assert set(demo["series"][-1]) == {"t", "requests", "errors", "p50_ms", "p99_ms"}
    assert broken["health"] == "down"
    assert broken["catalog"] is None
    assert BROKEN_COMMAND in broken["down_reason"]
    assert broken["last_error"]["backend"] == "broken"
    codes = {(e["backend"], e["code"]) for e in data["recent_errors"]}
    assert ("broken", "down") in codes
    down = next(e for e in data["recent_errors"] if e["code"] == "down")
    assert MARKUP in down["message"]  # data, as it was: the page shows it as text


async def test_a_request_through_the_gateway_moves_the_numbers(gw: Gateway) -> None:
    before = (await status_json(gw))["backends"][0]
    assert gw.http_url is not None
    await call_echo(gw.http_url, "counted")
    after = (await status_json(gw))["backends"][0]
    assert after["requests"] == before["requests"] + 1
    assert after["series"][-1]["requests"] >= 1


async def test_the_page_is_self_contained_and_carries_no_data(admin: Serving) -> None:
    resp = await admin.exchange(request(None, method="GET", target="/status"))
    assert resp.status == 200
    assert resp.get("Content-Type") == "text/html; charset=utf-8"
    assert resp.get("Cache-Control") == "no-store"
    assert resp.get("X-Content-Type-Options") == "nosniff"
    csp = resp.get("Content-Security-Policy") or ""
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    page = resp.body.decode()
    # Nothing from elsewhere: no URL in the page at all but the SVG namespace's name.
    assert re.findall(r"https?://[^\s'\"]+", page) == ["http://www.w3.org/2000/svg"]
    assert "<link" not in page and "src=" not in page
    # The backends' names and errors come only through status.json, never as HTML.
    assert "broken" not in page and "onerror" not in page
    assert "innerHTML" not in page and "insertAdjacentHTML" not in page
    assert page.count("<script>") == 1 and page.count("<style>") == 1


async def test_the_csp_hashes_are_those_of_the_inline_script_and_style() -> None:
    """A browser runs the inline script and style only if their hashes are in the policy (the
    browser test shows it runs them without a console error)."""
    assert status_page.PAGE.decode().count(status_page.SCRIPT) == 1
    assert status_page._hash(status_page.SCRIPT) in status_page.CSP
    assert status_page._hash(status_page.STYLE) in status_page.CSP


@pytest.mark.parametrize("path", ["/status", "/status.json"])
async def test_head_answers_and_other_methods_get_405(admin: Serving, path: str) -> None:
    head = await admin.exchange(request(None, method="HEAD", target=path), method="HEAD")
    assert head.status == 200
    for method in ("POST", "PUT", "DELETE"):
        resp = await admin.exchange(request(b"{}", method=method, target=path))
        assert resp.status == 405
        assert resp.get("Allow") == "GET, HEAD"
        assert resp.json()["error"]["code"] == -32600


@pytest.mark.parametrize("path", ["/status", "/status.json"])
@pytest.mark.parametrize(
    "field",
    ["Host: evil.example", "Host: evil.example@127.0.0.1", "Origin: http://evil.example"],
)
async def test_a_rebound_name_cannot_read_the_status(admin: Serving, path: str, field: str) -> None:
    name, _, value = field.partition(": ")
    host = value if name == "Host" else "127.0.0.1"
    extra = (field,) if name == "Origin" else ()
    resp = await admin.exchange(request(None, *extra, method="GET", target=path, host=host))
    assert resp.status == 403
    assert resp.json()["error"]["code"] == -32600


@pytest.mark.parametrize("path", ["/status", "/status.json"])
async def test_the_mcp_listener_has_no_status_page(gw: Gateway, path: str) -> None:
    """Its clients are not its operators: the page is on the admin listener only."""
    assert gw.http_url is not None
    origin = gw.http_url.rsplit("/", 1)[0]
    with anyio.fail_after(BOUND):
        async with aiohttp.ClientSession() as session, session.get(origin + path) as resp:
            assert resp.status == 404
