"""Request bodies in a content coding (gateway/frontends/bodies.py): pure decoding within the
body limit (RFC 9110 8.4; RFC 1950-1952)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from gateway.frontends.bodies import BodyError, body_coding, inflate


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(
    ("field", "coding"),
    [(None, None), ("identity", None), ("gzip", "gzip"), (" GZip\t", "gzip"), ("x-gzip", "x-gzip")]
    + [("deflate", "deflate")],
)
def test_the_codings_read(field: str | None, coding: str | None) -> None:
    assert body_coding(field) == coding


@pytest.mark.parametrize("field", ["br", "zstd", "gzip, deflate", "gzip,identity", "", "x"])
def test_other_codings_are_415(field: str) -> None:
    with pytest.raises(BodyError) as refused:
        body_coding(field)
    assert refused.value.status == 415


DATA = bytes(range(256)) * 40


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        ("gzip", gzip.compress(DATA)),
        ("gzip", gzip.compress(DATA[:100]) + gzip.compress(DATA[100:])),
        ("deflate", zlib.compress(DATA)),
        ("deflate", raw_deflate(DATA)),
    ],
    ids=["gzip", "gzip-members", "deflate-zlib", "deflate-raw"],
)
def test_a_whole_body_decodes(coding: str, encoded: bytes) -> None:
    assert inflate(encoded, coding, len(DATA)) == DATA


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        ("gzip", gzip.compress(DATA)),
        ("gzip", gzip.compress(DATA[:100]) + gzip.compress(DATA[100:])),
        ("deflate", zlib.compress(DATA)),
    ],
    ids=["gzip", "gzip-members", "deflate"],
)
def test_one_byte_over_the_limit_once_decoded_is_413(coding: str, encoded: bytes) -> None:
    with pytest.raises(BodyError) as refused:
        inflate(encoded, coding, len(DATA) - 1)
    assert refused.value.status == 413


@pytest.mark.slow
def test_a_bomb_is_refused_without_inflating_it() -> None:
    """A gigabyte of zeros in a megabyte of gzip: refused at the limit, never inflated whole."""
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    bomb = b"".join(compressor.compress(b"\0" * (1 << 20)) for _ in range(1024))
    bomb += compressor.flush()
    with pytest.raises(BodyError) as refused:
        inflate(bomb, "gzip", 4 << 20)
    assert refused.value.status == 413


@pytest.mark.parametrize(
    ("coding", "encoded"),
    [
        ("gzip", b"not gzip"),
        ("gzip", gzip.compress(DATA)[:-8]),  # no CRC and length: aiohttp would take it whole
        ("gzip", gzip.compress(DATA)[:-1]),
        ("gzip", gzip.compress(DATA) + b"junk"),
        ("deflate", zlib.compress(DATA)[:-20]),
        ("deflate", zlib.compress(DATA) + b"junk"),
        ("deflate", b"\xff\xff garbage"),
    ],
    ids=["garbage", "no-trailer", "short-trailer", "junk-after", "deflate-cut", "deflate-junk"]
    + ["deflate-garbage"],
)
def test_a_corrupt_body_is_400(coding: str, encoded: bytes) -> None:
    with pytest.raises(BodyError) as refused:
        inflate(encoded, coding, 1 << 20)
    assert refused.value.status == 400


def test_an_empty_body_stays_empty() -> None:
    assert inflate(b"", "gzip", 10) == b""
