"""Header values that are not UTF-8 (RFC 9110 5.5: a field value is octets; aiohttp hands them
over with each bad byte as a lone surrogate). Where the gateway keeps a digest of one (the
credentials that own a legacy session, a session id, a token), the digest is of the bytes as
sent: the request is answered as any other, never a 500 with a traceback."""

from __future__ import annotations

import logging

import orjson
import pytest

from tests.frontends.test_legacy_sessions import initialize
from tests.support import META
from tests.support.listener import Serving, gateway, mcp_request, port_of, request

pytestmark = pytest.mark.anyio

BAD_CREDENTIALS = b"Authorization: Bearer \xff\xfe-not-utf-8"
PLACEHOLDER = b"X-Placeholder: 1"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def with_bad_header(data: bytes, header: bytes = BAD_CREDENTIALS) -> bytes:
    return data.replace(PLACEHOLDER, header, 1)


async def test_credentials_that_are_not_utf8_own_a_session_like_any_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """2025-11-25 basic/transports, Session Management: `initialize` with such credentials
    opens a session (owned by a digest of those bytes); the session's next request with the
    same bytes is served, with other credentials it is not found (404)."""
    caplog.set_level(logging.DEBUG)
    async with gateway() as gw:
        assert gw.http_url is not None
        serving = Serving(port_of(gw.http_url))
        opening = request(
            orjson.dumps(initialize()),
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            PLACEHOLDER.decode(),
        )
        opened = await serving.exchange(with_bad_header(opening))
        assert opened.status == 200, opened.body
        session = opened.get("Mcp-Session-Id")
        assert session is not None
        ping = request(
            b'{"jsonrpc":"2.0","id":2,"method":"ping"}',
            "Content-Type: application/json",
            "Accept: application/json, text/event-stream",
            f"Mcp-Session-Id: {session}",
            PLACEHOLDER.decode(),
        )
        mine = await serving.exchange(with_bad_header(ping))
        assert mine.status == 200 and mine.json()["result"] == {}
        other = b"Authorization: Bearer \xfe\xff-not-utf-8"
        theirs = await serving.exchange(with_bad_header(ping, other))
        assert theirs.status == 404
    assert "Traceback" not in caplog.text


async def test_a_modern_request_with_such_credentials_or_session_id_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """2026-07-28: a modern request ignores a session header; its credentials' digest (whose
    child, whose sealed state) is taken of the bytes."""
    caplog.set_level(logging.DEBUG)
    async with gateway() as gw:
        assert gw.http_url is not None
        serving = Serving(port_of(gw.http_url))
        call = mcp_request(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": META}},
            PLACEHOLDER.decode(),
        )
        for header in (BAD_CREDENTIALS, b"Mcp-Session-Id: \xff\xfe"):
            reply = await serving.exchange(with_bad_header(call, header))
            assert reply.status == 200, reply.body
            assert "tools" in reply.json()["result"]
    assert "Traceback" not in caplog.text
