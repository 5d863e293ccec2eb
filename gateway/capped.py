"""A reply's body read whole, refused past a size: the one capped read of the gateway's HTTP
clients (towards its backends, its authorization server, and the servers it logs in to).

A top-level module because both directions' clients read replies and may import neither each
other nor the transports (tests/test_layers.py); it imports nothing of the package.
"""

from __future__ import annotations

import aiohttp


class TooLarge(Exception):
    """The body is, or grew, larger than the cap; each caller says so in its own error."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


async def read_capped(reply: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body, `TooLarge` past `limit` bytes: refused before reading when its declared
    length says so; read with one await when that length bounds what is read (no content
    coding to inflate); otherwise counted chunk by chunk as it arrives (inflated, if the
    session inflates)."""
    length = reply.content_length
    if length is not None and length > limit:
        raise TooLarge(limit)
    if length is not None and reply.headers.get("Content-Encoding", "identity") == "identity":
        # aiohttp's parser reads no more than the declared length.
        return await reply.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in reply.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
