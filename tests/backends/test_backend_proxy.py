"""HTTP backends behind a forward proxy named by the environment (HTTP_PROXY, HTTPS_PROXY,
NO_PROXY), through a real proxy on 127.0.0.1 (tests/servers/forward_proxy.py) that records
every request head it is given: plain HTTP goes through it in absolute form, HTTPS through a
CONNECT tunnel; a host NO_PROXY names is reached directly.
"""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import aiohttp
import anyio
import orjson
import pytest
import trustme

from gateway import errors
from gateway.backends.base import GATEWAY_CALL
from gateway.protocol import codes
from tests.servers.forward_proxy import ForwardProxy
from tests.support import (
    BOUND,
    Proc,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
    gateway_command,
    mirrored_headers,
    write_config,
)
from tests.support.backend import (
    Server,
    answer,
    backend_config,
    free_port,
    ignore,
    json_rpc_server,
    modern,
    running,
)

pytestmark = pytest.mark.anyio

PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


def proxy_env(http: str = "", https: str = "", no: str = "") -> dict[str, str]:
    """Both spellings of each variable (the lowercase one wins where both are set)."""
    values = {"http_proxy": http, "https_proxy": https, "no_proxy": no, "all_proxy": ""}
    return {**values, **{name.upper(): value for name, value in values.items()}}


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The proxy variables cleared, to be set by the test."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def set_env(monkeypatch: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in proxy_env(**values).items():
        monkeypatch.setenv(name, value)


async def test_an_http_backend_is_reached_through_http_proxy(
    environ: pytest.MonkeyPatch,
) -> None:
    async with ForwardProxy() as proxy, Server(answer) as server:
        set_env(environ, http=proxy.url)
        async with running(backend_config(server.url())) as backend:
            for rid in (1, 2):
                assert (await backend.request(call(rid, "t"), ignore, GATEWAY_CALL))["id"] == rid
    assert proxy.seen[0].request_line == f"POST {server.url()} HTTP/1.1"
    assert proxy.seen[0].headers["mcp-method"] == "tools/call"
    # Passed on in origin form (later requests on the joined connection pass as they are).
    assert server.requests[0].request_line == b"POST /mcp HTTP/1.1"
    assert len(server.requests) == 2
    assert len(server.peers) == 1  # kept alive through the proxy


async def test_proxy_credentials_come_from_the_proxy_url(environ: pytest.MonkeyPatch) -> None:
    """Credentials in HTTP_PROXY go to the proxy (Proxy-Authorization), not to the backend."""
    async with ForwardProxy() as proxy, Server(answer) as server:
        set_env(environ, http=f"http://user:s%40cret@127.0.0.1:{proxy.port}")
        async with running(backend_config(server.url())) as backend:
            assert (await backend.request(call(1, "t"), ignore, GATEWAY_CALL))["id"] == 1
    expected = "Basic " + base64.b64encode(b"user:s@cret").decode()
    assert proxy.seen[0].headers["proxy-authorization"] == expected
    assert "proxy-authorization" not in server.requests[0].headers()


@pytest.mark.parametrize("listed", ["127.0.0.1", "localhost,127.0.0.1", "*"])
async def test_a_host_no_proxy_names_is_reached_directly(
    environ: pytest.MonkeyPatch, listed: str
) -> None:
    async with ForwardProxy() as proxy, Server(answer) as server:
        set_env(environ, http=proxy.url, no=listed)
        async with running(backend_config(server.url())) as backend:
            assert (await backend.request(call(1, "t"), ignore, GATEWAY_CALL))["id"] == 1
    assert proxy.seen == []
    assert len(server.requests) == 1


async def test_an_https_backend_is_reached_through_a_connect_tunnel(
    environ: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(tmp_path / "ca.pem")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    async with ForwardProxy() as proxy, json_rpc_server(context) as (url, seen):
        set_env(environ, https=proxy.url)
        config = backend_config(url, tls={"ca_file": str(tmp_path / "ca.pem")})
        async with running(config) as backend:
            assert (await backend.request(call(1, "t"), ignore, GATEWAY_CALL))["id"] == 1
    port = url.split(":")[2].split("/")[0]
    assert [s.request_line for s in proxy.seen] == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]
    assert seen[0]["Mcp-Method"] == "tools/call"  # the request itself went through the tunnel


async def test_a_proxy_that_cannot_be_reached_makes_the_backend_unavailable(
    environ: pytest.MonkeyPatch,
) -> None:
    async with Server(answer) as server:
        set_env(environ, http=f"http://127.0.0.1:{free_port()}")
        async with running(backend_config(server.url())) as backend:
            with anyio.fail_after(BOUND), pytest.raises(errors.BackendError) as caught:
                await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    assert caught.value.code == codes.BACKEND_UNAVAILABLE
    assert server.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # a real process; not about the loop
async def test_the_gateway_process_honours_the_proxy_environment(
    environ: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`mcp-transparent-gateway run` as a real process: its HTTP backend is reached through
    HTTP_PROXY, and directly once NO_PROXY names the backend's host."""
    async with ForwardProxy() as proxy, Server(modern) as server:
        config = write_config(tmp_path, {"b": {"http": {"url": server.url()}}}, http=True)
        for no_proxy, through in (("", True), ("127.0.0.1", False)):
            before = len(proxy.seen)
            proc = Proc(gateway_command(config), env=proxy_env(http=proxy.url, no=no_proxy))
            try:
                match = await anyio.to_thread.run_sync(proc.wait_for, r"listening on (http://\S+)")
                msg = call(1, "t")
                async with (
                    aiohttp.ClientSession() as session,
                    session.post(
                        match.group(1), data=orjson.dumps(msg), headers=mirrored_headers(msg)
                    ) as resp,
                ):
                    reply = orjson.loads(await resp.read())
                assert reply["id"] == 1 and "result" in reply, reply
            finally:
                await anyio.to_thread.run_sync(proc.stop)
            assert (len(proxy.seen) > before) is through
