"""TLS to HTTP backends (backends.NAME.http.tls: ca_file, cert_file, key_file, verify), with
certificates made per run by trustme and a real aiohttp server on 127.0.0.1.

A backend whose certificate the gateway does not trust, or that refuses the gateway's (missing)
client certificate, is unavailable (-31001): nothing was sent. Errors by code only.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from gateway import errors
from gateway.backends.base import GATEWAY_CALL
from gateway.backends.http import HttpBackend
from gateway.config import ConfigInvalid
from gateway.protocol import codes
from tests.support import (
    both_event_loops,  # noqa: F401  (the anyio_backend fixture)
    call,
)
from tests.support.backend import backend_config, ignore, json_rpc_server, running

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The files a config names: the CA, a client certificate and key, another CA."""
    where = tmp_path_factory.mktemp("pki")
    client = ca.issue_cert("gateway.client.test")
    files = {
        "ca": where / "ca.pem",
        "other_ca": where / "other-ca.pem",
        "client_cert": where / "client.pem",
        "client_key": where / "client.key",
        "client_both": where / "client-both.pem",
    }
    ca.cert_pem.write_to_path(files["ca"])
    trustme.CA().cert_pem.write_to_path(files["other_ca"])
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    client.private_key_and_cert_chain_pem.write_to_path(files["client_both"])
    return files


def server_context(
    ca: trustme.CA, *, client_certificates: bool = False, tls12: bool = False
) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if tls12:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    ca.issue_cert("127.0.0.1").configure_cert(context)
    if client_certificates:
        context.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(context)
    return context


async def outcome(backend: HttpBackend) -> int | None:
    """None when the call was served, else the error's code."""
    try:
        reply = await backend.request(call(1, "t"), ignore, GATEWAY_CALL)
    except errors.BackendError as exc:
        return exc.code
    assert reply["id"] == 1
    return None


async def test_a_backend_certified_by_the_configured_ca_is_served(
    ca: trustme.CA, pki: dict[str, Path]
) -> None:
    async with (
        json_rpc_server(server_context(ca)) as (url, seen),
        running(backend_config(url, tls={"ca_file": str(pki["ca"])})) as backend,
    ):
        assert await outcome(backend) is None
    assert len(seen) == 1


@pytest.mark.parametrize("trust", ["system", "other_ca"])
async def test_a_backend_certificate_not_trusted_is_unavailable(
    ca: trustme.CA, pki: dict[str, Path], trust: str
) -> None:
    """Without `ca_file` the system's trust store is used, which does not know the test CA; with
    another CA's file, only that CA is trusted."""
    tls = {} if trust == "system" else {"ca_file": str(pki["other_ca"])}
    async with (
        json_rpc_server(server_context(ca)) as (url, seen),
        running(backend_config(url, tls=tls)) as backend,
    ):
        assert await outcome(backend) == codes.BACKEND_UNAVAILABLE
        assert not backend.up
    assert seen == []


async def test_verify_false_accepts_any_certificate(ca: trustme.CA) -> None:
    async with (
        json_rpc_server(server_context(ca)) as (url, _),
        running(backend_config(url, tls={"verify": False})) as backend,
    ):
        assert await outcome(backend) is None


@pytest.mark.parametrize("files", ["cert-and-key", "one-file"])
async def test_a_client_certificate_is_presented_when_configured(
    ca: trustme.CA, pki: dict[str, Path], files: str
) -> None:
    tls = {"ca_file": str(pki["ca"])}
    if files == "cert-and-key":
        tls |= {"cert_file": str(pki["client_cert"]), "key_file": str(pki["client_key"])}
    else:
        tls |= {"cert_file": str(pki["client_both"])}
    async with (
        json_rpc_server(server_context(ca, client_certificates=True)) as (url, seen),
        running(backend_config(url, tls=tls)) as backend,
    ):
        assert await outcome(backend) is None
        assert await outcome(backend) is None  # and the connection is kept
    assert len(seen) == 2


@pytest.mark.parametrize("version", ["tls1.2", "tls1.3"])
async def test_a_server_requiring_a_client_certificate_refuses_the_gateway_without_one(
    ca: trustme.CA, pki: dict[str, Path], version: str
) -> None:
    """TLS 1.2 refuses in the handshake: unavailable, nothing was sent. TLS 1.3 refuses after
    the client's half of the handshake, when the request may already be on its way; the server
    never reads it, but the gateway cannot tell that from a connection lost after sending when
    the refusal comes as a reset rather than an alert (it does with aiohttp's own server)."""
    context = server_context(ca, client_certificates=True, tls12=version == "tls1.2")
    async with (
        json_rpc_server(context) as (url, seen),
        running(backend_config(url, tls={"ca_file": str(pki["ca"])})) as backend,
    ):
        code = await outcome(backend)
    if version == "tls1.2":
        assert code == codes.BACKEND_UNAVAILABLE
    else:
        assert code in (codes.BACKEND_UNAVAILABLE, codes.BACKEND_CONNECTION_LOST)
    assert seen == []


def test_files_that_are_not_what_they_should_be_are_a_config_error(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """A CA file or key that cannot be loaded stops the gateway at start-up with the config key
    named, not at the first request."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    for tls in (
        {"ca_file": str(garbage)},
        {"cert_file": str(pki["client_cert"]), "key_file": str(garbage)},
        {"cert_file": str(pki["client_cert"]), "key_file": str(pki["other_ca"])},
    ):
        with pytest.raises(ConfigInvalid) as caught:
            HttpBackend(backend_config("https://127.0.0.1:1/mcp", tls=tls))
        assert any("backends.b.http.tls" in problem for problem in caught.value.problems)
