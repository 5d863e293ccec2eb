"""Numbers carried exactly: what orjson would round is parsed into `orjson.Fragment`s of its text.

orjson reads an integer past 64 bits, or a decimal with more digits than a double holds, as the
nearest double, an out-of-range exponent as 0 (or refuses it), and `-0` as 0: the gateway would
change values it only forwards. A cheap scan of the raw text finds a number token that *could*
be such a one; only then is the text tokenized, each number orjson cannot carry is swapped for
a marker string before parsing, and the marker is replaced by a Fragment holding the original
text, which orjson writes back verbatim whenever the message is encoded.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import orjson

# The cheap check: one C-speed translation of the raw text to a small alphabet (digits and
# points to "0", "-" and "e" kept, a number's possible ends to ",", the rest to "x"), then
# substring searches in it for what a number orjson changes must contain: 16 digits and points
# in a row (a double is exact to 15 digits; a 64-bit integer has at most 20), a one-digit
# negative integer (minus zero among them), or a negative three-digit exponent (subnormals,
# underflow to 0). A positive one overflows, which orjson refuses: `decode` then tries the
# exact path. A hit elsewhere (inside a string, `-5`) only costs the exact path. (Regexes with
# a character class, or one search per pattern on the raw text, cost three to ten times more.)
_ALPHABET = bytes(
    0x30
    if chr(c) in "0123456789."
    else c
    if chr(c) in "-e"
    else 0x65
    if chr(c) == "E"
    else 0x2C
    if chr(c) in ",]} \t\r\n"
    else 0x78
    for c in range(256)
)
_RUN = b"0" * 16
_ONE_DIGIT_NEGATIVE = b"-0,"
_TINY = b"e-000"
# What the exact path passes over in one C-speed match: text outside strings and numbers,
# whole strings (escapes included), and numbers short enough to be carried for sure (at most
# 15 digits and a two-digit exponent, and not an integer minus zero). It stops at any other
# number, so the Python loop below runs once per number that needs a closer look.
_SKIP = re.compile(
    rb'(?:[^"0-9\-]++|"(?:[^"\\]++|\\.)*+"'
    rb"|(?!-0(?![0-9.eE]))-?[0-9.]{1,15}+(?![0-9.])(?:[eE][+-]?[0-9]{1,2}+(?![0-9]))?+(?![eE]))*+"
)
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
# Integers orjson reads as integers: i64 and u64.
_INT_MIN = -(2**63)
_INT_END = 2**64
# The marker's prefix: a control character (never unescaped in JSON text) and a per-process
# random part, so no string a peer sends can pass for a marker.
_MARK = "\x00" + os.urandom(8).hex() + ":"
_MARK_JSON = b'"\\u0000' + _MARK[1:].encode()


class NotJson(ValueError):
    """The text is not JSON (a number where a member name belongs)."""


def suspect(raw: bytes) -> bool:
    """Whether `raw` may hold a number orjson would not carry exactly (the cheap check)."""
    text = raw.translate(_ALPHABET)
    # (`find`, not `in`: bytes' `in` first takes its operand for an integer, and the TypeError
    # it makes and clears costs more than the search; a one-byte search runs at memchr's speed,
    # the three-byte ones are slower)
    if text.find(_RUN) >= 0:
        return True
    return raw.find(b"-") >= 0 and (text.find(_ONE_DIGIT_NEGATIVE) >= 0 or text.find(_TINY) >= 0)


def carried(token: bytes) -> bool:
    """Whether orjson reads the number `token` and writes it back as the same value."""
    if b"." not in token and b"e" not in token and b"E" not in token:
        # (more than 20 digits is past 64 bits; and int() refuses over 4300 digits)
        digits = len(token) - token.startswith(b"-")
        return token != b"-0" and digits <= 20 and _INT_MIN <= int(token) < _INT_END
    value = float(token)
    if math.isinf(value):
        return False
    # A float keeps the sign of zero; orjson writes the shortest text that reads back, as repr.
    return _exact(token.decode()) == _exact(repr(value))


_DECIMAL = re.compile(r"(-?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")


def _exact(text: str) -> tuple[bool, str, int]:
    """A decimal number's exact value as (negative, significant digits, exponent of the last
    one): equal for equal values, whatever their spelling (`1.50` and `15e-1`); every zero is
    one value, as in `decimal` (which this spares every process from loading)."""
    found = _DECIMAL.fullmatch(text)
    assert found is not None  # (a JSON number token, or a float's repr)
    sign, whole, fraction, exponent = found.groups()
    fraction = fraction or ""
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return (False, "", 0)
    significant = digits.rstrip("0")
    return (
        sign == "-",
        significant,
        int(exponent or 0) - len(fraction) + len(digits) - len(significant),
    )


def loads(raw: bytes) -> Any:
    """`orjson.loads(raw)`, but every number it would change comes back as a Fragment of its
    text. Raises orjson.JSONDecodeError or NotJson as parsing would."""
    pieces: list[bytes] = []
    texts: list[bytes] = []
    start = position = 0
    while True:
        position = _SKIP.match(raw, position).end()  # type: ignore[union-attr]
        number = _NUMBER.match(raw, position)
        if number is None:  # the end, or not JSON (orjson will say so)
            break
        position = number.end()
        token = number.group()
        if carried(token):
            continue
        pieces += (raw[start : number.start()], _MARK_JSON, b"%d" % len(texts), b'"')
        texts.append(token)
        start = position
    if not texts:
        return orjson.loads(raw)
    pieces.append(raw[start:])
    value = orjson.loads(b"".join(pieces))
    _restore(value, texts)
    return value


def _restore(value: Any, texts: list[bytes]) -> None:
    """Replace each marker in `value` by a Fragment of its number text (iteratively: the depth
    is not checked yet)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for key, item in node.items():
                if key.startswith(_MARK):
                    raise NotJson("a number where a member name belongs")
                if type(item) is str:
                    if item.startswith(_MARK):
                        node[key] = orjson.Fragment(texts[int(item[len(_MARK) :])])
                elif type(item) is dict or type(item) is list:
                    stack.append(item)
        elif type(node) is list:
            for index, item in enumerate(node):
                if type(item) is str:
                    if item.startswith(_MARK):
                        node[index] = orjson.Fragment(texts[int(item[len(_MARK) :])])
                elif type(item) is dict or type(item) is list:
                    stack.append(item)


# Strings (skipped whole) and brackets, for reading past orjson's depth limit.
_STRUCTURE = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')


def outline(raw: bytes) -> tuple[bytes, int]:
    """`raw` with every container below the top-level members cut to `null`, and the depth
    `raw` reaches: the id and method of a message too deep to parse can still be read."""
    pieces: list[bytes] = []
    depth = deepest = 0
    start = 0
    for match in _STRUCTURE.finditer(raw):
        char = raw[match.start()]
        if char == 0x22:  # '"': a string, its brackets are text
            continue
        if char in b"[{":
            depth += 1
            deepest = max(deepest, depth)
            if depth == 2:
                pieces += (raw[start : match.start()], b"null")
        else:
            depth -= 1
            if depth == 1:
                start = match.end()
    pieces.append(raw[start:])
    return b"".join(pieces), deepest
