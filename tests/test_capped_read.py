"""The one capped read of a reply's body (gateway/capped.py), used by the HTTP backend
(limits.max_reply_bytes), the authorization server's client (auth.max_response_bytes) and the
OAuth client: against a real aiohttp server on 127.0.0.1, a body over the cap is refused
whether its length is declared or not, and a compressed body is counted as inflated, so a small
coded reply cannot grow past the cap in a session that inflates."""

from __future__ import annotations

import gzip

import aiohttp
import anyio
import pytest
from aiohttp import web

from gateway.capped import TooLarge, read_capped
from tests.support import BOUND, serve_http

pytestmark = pytest.mark.anyio

CAP = 1000


async def body(request: web.Request) -> web.StreamResponse:
    size = int(request.query["size"])
    data = b"x" * size
    if request.query.get("coded"):
        return web.Response(body=gzip.compress(data), headers={"Content-Encoding": "gzip"})
    if request.query.get("chunked"):
        reply = web.StreamResponse()
        reply.enable_chunked_encoding()
        await reply.prepare(request)
        for at in range(0, size, 100):
            await reply.write(data[at : at + 100])
        await reply.write_eof()
        return reply
    return web.Response(body=data)


async def read(url: str, *, auto_decompress: bool = True) -> bytes:
    with anyio.fail_after(BOUND):
        async with (
            aiohttp.ClientSession(auto_decompress=auto_decompress) as session,
            session.get(url) as reply,
        ):
            return await read_capped(reply, CAP)


@pytest.mark.parametrize("framing", ["", "&chunked=1"])
async def test_a_body_within_the_cap_is_read_whole_and_one_over_it_is_refused(
    framing: str,
) -> None:
    async with serve_http(body, "/") as base:
        assert await read(f"{base}/?size={CAP}{framing}") == b"x" * CAP
        with pytest.raises(TooLarge) as refused:
            await read(f"{base}/?size={CAP + 1}{framing}")
    assert refused.value.limit == CAP


async def test_a_coded_body_is_counted_as_inflated_when_the_session_inflates() -> None:
    """gzip of 100 kB is a few hundred bytes on the wire, under the declared-length check."""
    async with serve_http(body, "/") as base:
        with pytest.raises(TooLarge):
            await read(f"{base}/?size=100000&coded=1")
        # Not inflated (the backends' sessions): the coded bytes themselves, within the cap.
        raw = await read(f"{base}/?size=100000&coded=1", auto_decompress=False)
    assert gzip.decompress(raw) == b"x" * 100000
