"""The admin listener (`listen.admin`): the operator routes on a port of their own, on the same
aiohttp listener as the MCP endpoint, behind the same DNS-rebinding guard."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from gateway.app import Gateway
from tests.support import START_BOUND
from tests.support.listener import Serving, gateway, port_of, request

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def admin() -> AsyncIterator[Serving]:
    running: Gateway
    async with gateway(admin={"host": "127.0.0.1", "port": 0}) as running:
        assert running.admin_url is not None
        with anyio.fail_after(START_BOUND):
            await running.catalogs_loaded.wait()  # ready: /readyz answers 200 from here on
        serving = Serving(port_of(running.admin_url))
        yield serving
        serving.abort_all()


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz"])
async def test_the_operator_routes_answer_get_and_head(admin: Serving, path: str) -> None:
    resp = await admin.exchange(request(None, method="GET", target=path))
    assert resp.status == 200
    head = await admin.exchange(request(None, method="HEAD", target=path), method="HEAD")
    assert head.status == 200


async def test_other_methods_get_405_with_allow(admin: Serving) -> None:
    resp = await admin.exchange(request(b"{}", target="/metrics"))
    assert resp.status == 405
    assert resp.get("Allow") == "GET, HEAD"
    assert resp.json()["error"]["code"] == -32600


async def test_an_unknown_path_is_404(admin: Serving) -> None:
    resp = await admin.exchange(request(None, method="GET", target="/mcp"))
    assert resp.status == 404
    assert resp.json()["error"]["code"] == -32600


@pytest.mark.parametrize(
    "field",
    ["Host: evil.example", "Host: evil.example@127.0.0.1", "Origin: http://evil.example"],
)
async def test_a_rebound_name_cannot_read_the_metrics(admin: Serving, field: str) -> None:
    """On loopback, a page on a rebound name could read the admin port as it could /metrics of
    the MCP listener: foreign Host and Origin get 403 here too."""
    name, _, value = field.partition(": ")
    host = value if name == "Host" else "127.0.0.1"
    extra = (field,) if name == "Origin" else ()
    resp = await admin.exchange(request(None, *extra, method="GET", target="/metrics", host=host))
    assert resp.status == 403
