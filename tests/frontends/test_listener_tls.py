"""TLS on the HTTP listener (`listen.http.tls: {cert_file, key_file}`), with certificates made
for each run by trustme: a client trusting the CA is served over https, a plain-http client on
the same port is not, and a handshake that fails costs no traceback."""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import anyio
import pytest
import trustme

from gateway.app import Gateway, StartupError
from gateway.config import parse
from tests.support import (
    BOUND,
    START_BOUND,
    both_event_loops,  # noqa: F401  (the anyio_backend fixture: uvloop's TLS differs)
)
from tests.support.listener import (
    Serving,
    echo_call,
    gateway,
    gateway_config,
    mcp_request,
    port_of,
    served,
)

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def cert_files(
    ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    directory = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain, key = directory / "chain.pem", directory / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(chain))
    cert.private_key_pem.write_to_path(str(key))
    yield {"cert_file": str(chain), "key_file": str(key)}


@pytest.fixture(scope="module")
async def tls_gateway(cert_files: dict[str, str]) -> AsyncIterator[Gateway]:
    async with gateway({"tls": cert_files}) as running:
        yield running


def client_context(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def test_a_client_trusting_the_ca_is_served_over_https(
    tls_gateway: Gateway, ca: trustme.CA
) -> None:
    """The gateway's URL says https, and an aiohttp client that trusts the CA gets its call
    answered over TLS (HTTP/1.1, offered by ALPN)."""
    url = tls_gateway.http_url
    assert url is not None and url.startswith("https://127.0.0.1:")
    with anyio.fail_after(START_BOUND):
        await served(url, "secure", ssl_context=client_context(ca))
    srv = Serving(port_of(url), tls=client_context(ca))
    try:
        client = await srv.connect()
        await client.send(mcp_request(echo_call("raw tls")))
        resp = await client.response()
        assert resp.json()["result"]["content"][0]["text"] == "raw tls"
        ssl_object = client.writer.get_extra_info("ssl_object")
        assert ssl_object.selected_alpn_protocol() in ("http/1.1", None)
    finally:
        srv.abort_all()


async def test_a_client_not_trusting_the_ca_is_refused(tls_gateway: Gateway) -> None:
    url = tls_gateway.http_url
    assert url is not None
    with anyio.fail_after(BOUND), pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with aiohttp.ClientSession() as session:
            await session.post(url, data=b"{}")


async def test_plain_http_on_the_tls_port_is_not_served(
    tls_gateway: Gateway, ca: trustme.CA, caplog: pytest.LogCaptureFixture
) -> None:
    """Plain HTTP sent to the TLS port is not served (no response comes back in the clear),
    costs no traceback in the log, and the gateway goes on serving TLS clients."""
    caplog.set_level(logging.DEBUG)
    url = tls_gateway.http_url
    assert url is not None
    plain = url.replace("https://", "http://")
    with anyio.fail_after(BOUND), pytest.raises(aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await session.post(plain, data=b"{}")
    srv = Serving(port_of(url))
    try:
        client = await srv.connect()
        await client.send(mcp_request(echo_call("in the clear")))
        assert b"HTTP/1.1" not in await client.rest()
    finally:
        srv.abort_all()
    await served(url, "still secure", ssl_context=client_context(ca))
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


async def test_a_key_that_does_not_match_its_certificate_stops_the_start(
    ca: trustme.CA, cert_files: dict[str, str], tmp_path: Path
) -> None:
    """A listener that cannot use its certificate does not start half-way: the start fails
    with a StartupError naming listen.http.tls (not a traceback from deep in ssl)."""
    other = ca.issue_cert("127.0.0.1")
    key = tmp_path / "other-key.pem"
    other.private_key_pem.write_to_path(str(key))
    config = parse(gateway_config({"tls": {**cert_files, "key_file": str(key)}}))
    with anyio.fail_after(START_BOUND), pytest.raises(StartupError, match=r"listen\.http\.tls"):
        async with Gateway(config):
            pass
