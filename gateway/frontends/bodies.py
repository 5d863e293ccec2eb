"""Request bodies in a content coding (RFC 9110 8.4): which codings are read, and decoding one
within the body limit. Pure: the listener reads the bytes, this decides what they are.

Bodies are decoded here rather than by aiohttp, whose decoder takes a gzip body cut short of
its trailer (the CRC and length that prove it whole) as if it were complete.
"""

from __future__ import annotations

import zlib

# Content codings a request body may use; anything else is refused with 415 (RFC 9110 15.5.16).
# "x-gzip" is gzip (RFC 9110 8.4.1.3).
CODINGS = frozenset({"gzip", "x-gzip", "deflate"})
_GZIP_WBITS = 16 + zlib.MAX_WBITS
REASON = "content_encoding"  # the rejection metric's reason for a coding refused or broken


class BodyError(Exception):
    """A request body the gateway will not hand on: its status, metric reason and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def too_big(limit: int) -> BodyError:
    return BodyError(413, "size", f"Body over {limit} bytes")


def body_coding(field: str | None) -> str | None:
    """The content coding a Content-Encoding value names: None for none, BodyError (415) for one
    that is not read (stacked codings included)."""
    if field is None:
        return None
    coding = field.strip(" \t").lower()
    if coding == "identity":
        return None
    if coding not in CODINGS:
        raise BodyError(415, REASON, f"Content-Encoding {field!r} is not supported")
    return coding


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """`body` decoded: BodyError 413 when it decodes to more than `limit` bytes (a small body can
    inflate to gigabytes; no more than limit + 1 bytes are ever produced), 400 when it is not
    whole and valid."""
    if not body:
        return body
    if coding == "deflate":
        # zlib-wrapped by RFC 9110 8.4.1.2, raw in the wild: a zlib header (RFC 1950 2.2: method
        # 8, and a check making the first two bytes a multiple of 31) tells them apart.
        wrapped = len(body) > 1 and body[0] & 0x0F == 8 and (body[0] << 8 | body[1]) % 31 == 0
        decoder = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        out = _decode(decoder, body, limit, coding)
        if decoder.unused_data:
            raise BodyError(400, REASON, "The body goes on after its deflate data")
        return out
    pieces: list[bytes] = []
    size = 0
    rest = body
    while rest:  # several gzip members make one body (RFC 1952 2.2)
        decoder = zlib.decompressobj(_GZIP_WBITS)
        piece = _decode(decoder, rest, limit - size, coding)
        size += len(piece)
        pieces.append(piece)
        rest = decoder.unused_data
    return b"".join(pieces)


def _decode(decoder: zlib._Decompress, data: bytes, limit: int, coding: str) -> bytes:
    try:
        out = decoder.decompress(data, limit + 1)
    except zlib.error:
        raise BodyError(400, REASON, f"The body is not valid {coding}") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise BodyError(413, "size", f"Body over its limit once decoded from {coding}")
    if not decoder.eof:
        raise BodyError(400, REASON, f"The {coding} body is cut short")
    return out
