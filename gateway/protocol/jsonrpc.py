"""JSON-RPC 2.0 framing: decode one message, classify it, build replies.

Messages stay the dicts orjson gives us; only the fields routing needs are read. A message from
a backend can also remember the bytes it came from, so that a reply forwarded unchanged goes out
as the very bytes that came in, never re-encoded.

JSON allows a string escape of a lone surrogate (`"\\ud800"`); orjson refuses it both ways. The
gateway passes such strings on rather than refusing a message it only forwards: when orjson
cannot parse a text that holds such an escape, the stdlib parser reads it (its strictest
settings otherwise: strict UTF-8, no NaN, numbers kept exact as `numbers` keeps them), and when
orjson cannot write a value holding such a string, `dumps` writes those strings as escapes
itself. Both only after orjson failed: the hot path is orjson alone.
"""

from __future__ import annotations

import contextlib
import enum
import json  # noqa: TID251  (only the fallback for lone surrogates orjson refuses: `_lenient`)
import os
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import codes, numbers

Message = dict[str, Any]
RequestId = str | int

# orjson writes at most 254 nested levels (it reads 1024): a message nested deeper could be
# received but never sent on. The gateway puts a message it received up to a few levels deeper
# (a backend's question inside an `input_required` result), so the bound leaves room for that.
MAX_DEPTH = 240
_ENCODER_DEPTH = 254  # orjson.dumps: "Recursion limit reached" past this (orjson 3.x)
_DECODER_DEPTH = 1024  # orjson.loads: "depth limit exceeded" past this

# The escape of a surrogate code point (high or low): what a text orjson refuses must hold for
# the stdlib parser to be tried. (Raw UTF-8 cannot hold a surrogate: such bytes are not UTF-8.)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("([\ud800-\udfff])")
# A string `dumps` set aside: a control character (always escaped by orjson) and a per-process
# random part, so no string a peer sends can pass for one.
_SET_ASIDE = "\x00" + os.urandom(8).hex() + ":"
_SET_ASIDE_JSON = re.compile(b'"\\\\u0000' + _SET_ASIDE[1:].encode() + b'([0-9]+)"')


class Received(dict[str, Any]):
    """A decoded message and, while it is unchanged, its original bytes.

    Changing a top-level member forgets the bytes by itself; code that changes a nested value in
    place must call `changed(msg)`. Building a new dict (`{**msg, ...}`) gives a plain Message."""

    __slots__ = ("raw",)
    raw: bytes | None  # set right after construction (dict's own __init__ copies the members)

    def __setitem__(self, key: str, value: Any) -> None:
        self.raw = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.raw = None
        super().__delitem__(key)

    def pop(self, *args: Any) -> Any:
        self.raw = None
        return super().pop(*args)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.raw = None
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.raw = None
        super().update(*args, **kwargs)

    def clear(self) -> None:
        self.raw = None
        super().clear()

    def popitem(self) -> tuple[str, Any]:
        self.raw = None
        return super().popitem()


def changed(msg: Message) -> None:
    """Note that something inside `msg` was changed in place: it must be encoded afresh."""
    if isinstance(msg, Received):
        msg.raw = None


class Kind(enum.Enum):
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why bytes could not become a usable message; `id` is set when it was readable."""

    code: int
    message: str
    id: RequestId | None = None
    # A response whose id was readable: whoever waits on that id gets an error instead.
    response: bool = False


def decode(raw: bytes | str, *, keep: bool = False) -> Message | Invalid:
    """Parse one JSON-RPC message; never raises. With `keep`, the message remembers `raw`.

    Numbers orjson would change (see `numbers`) come back as Fragments of their own text, so
    they are written back as they came. Client messages are not kept: what a backend receives
    is then exactly what the gateway checked and routed, even if the client's bytes could parse
    differently elsewhere (a duplicated member, say)."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        value = numbers.loads(data) if numbers.suspect(data) else orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:  # (a number past a double's range, which only the exact path carries)
            value = numbers.loads(data)
        except (orjson.JSONDecodeError, numbers.NotJson):
            value = _lenient(data)
            if value is _UNPARSED:
                return _unparsed(data, exc)
    except numbers.NotJson as exc:
        return _unparsed(data, exc)
    # (orjson gives exact types: `type(...) is` checks suffice, and a bool is not an int)
    if type(value) is not dict:
        if type(value) is list:
            return Invalid(codes.INVALID_REQUEST, "Batch requests are not supported")
        return Invalid(codes.INVALID_REQUEST, "A JSON-RPC message must be an object")
    # The shape (JSON-RPC 2.0, 4 and 5), checked in this frame: twice a request (it and its
    # reply). `type(...) is` for the id: a bool is not an int.
    problem: str | None = None
    if value.get("jsonrpc") != "2.0":
        problem = 'The "jsonrpc" member must be exactly "2.0"'
    elif "id" in value and type(i := value["id"]) is not str and type(i) is not int:
        problem = 'The "id" member must be a string or an integer'
    elif "method" in value:
        if type(value["method"]) is not str:
            problem = 'The "method" member must be a string'
        # A request or a response, not both: serving it as a request would drop what it
        # answers (JSON-RPC 2.0, 4 and 5).
        elif "result" in value or "error" in value:
            problem = 'A message with a "method" carries no "result" or "error"'
        elif (given := value.get("params")) is not None and type(given) is not dict:
            problem = 'The "params" member must be an object'
    elif "id" not in value:
        problem = "A message needs a method or an id"
    elif ("result" in value) == ("error" in value):
        problem = "A response carries exactly one of result and error"
    # Depth: a message shorter than two brackets a level, or with fewer brackets than the bound,
    # cannot pass it (cheap checks first).
    if (
        problem is None
        and len(data) > 2 * MAX_DEPTH
        and data.count(b"{") + data.count(b"[") > MAX_DEPTH
        and _too_deep(value)
    ):
        problem = f"The message is nested deeper than {MAX_DEPTH} levels"
    if problem is not None:
        raw_id = value.get("id")
        readable = _is_id(raw_id)
        return Invalid(
            codes.INVALID_REQUEST,
            problem,
            raw_id if readable else None,
            response=readable and "method" not in value,
        )
    if keep:
        received = Received(value)
        received.raw = data
        return received
    return value


_UNPARSED = object()


def _lenient(data: bytes) -> Any:
    """The value of a text orjson refused, read by the stdlib parser when the text escapes a
    surrogate (a lone one is valid JSON, RFC 8259 8.2); _UNPARSED otherwise or when it is not
    JSON either. Bytes that are not UTF-8 stay refused (decoded strictly here: the stdlib would
    let encoded surrogates through), as do NaN and Infinity; numbers orjson would change come
    back as Fragments, as `numbers` gives them."""
    if _SURROGATE_ESCAPE.search(data) is None:
        return _UNPARSED
    try:
        return json.loads(
            data.decode(), parse_int=_exact, parse_float=_exact, parse_constant=_not_json
        )
    except (ValueError, RecursionError):  # (UnicodeDecodeError and JSONDecodeError among them)
        return _UNPARSED


def _exact(token: str) -> Any:
    text = token.encode()
    if not numbers.carried(text):
        return orjson.Fragment(text)
    return int(token) if text.isdigit() or text[1:].isdigit() else float(token)


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _unparsed(data: bytes, exc: Exception) -> Invalid:
    """The error for bytes orjson refused: past its depth limit, said so with the message's id
    when readable (a backend's reply then fails its caller at once)."""
    if data.count(b"{") + data.count(b"[") > _DECODER_DEPTH:
        outline, deepest = numbers.outline(data)
        if deepest > _DECODER_DEPTH:
            with contextlib.suppress(orjson.JSONDecodeError):
                top = orjson.loads(outline)
                if type(top) is dict:
                    raw_id = top.get("id")
                    readable = _is_id(raw_id)
                    return Invalid(
                        codes.INVALID_REQUEST,
                        f"The message is nested deeper than {MAX_DEPTH} levels",
                        raw_id if readable else None,
                        response=readable and "method" not in top,
                    )
    return Invalid(codes.PARSE_ERROR, f"Parse error: {exc}")


def _too_deep(value: Message) -> bool:
    """Whether `value` is nested deeper than MAX_DEPTH: orjson's own encoder measures it, with
    the value put as deep as the spare levels (no recursion of ours)."""
    wrapped: Any = value
    for _ in range(_ENCODER_DEPTH - MAX_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        # (a lone surrogate fails the encoder too: only the depth counts here)
        return _depth(value) > MAX_DEPTH
    return False


def _depth(value: Any) -> int:
    """How deep containers nest in `value` (iteratively: the depth is not checked yet)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        items = node.values() if type(node) is dict else node
        stack.extend((item, level + 1) for item in items if type(item) in (dict, list))
    return deepest


def _is_id(value: object) -> bool:
    return type(value) is str or type(value) is int


def kind(msg: Message) -> Kind:
    if "method" in msg:
        return Kind.REQUEST if "id" in msg else Kind.NOTIFICATION
    return Kind.RESPONSE


def params(msg: Message) -> dict[str, Any]:
    value = msg.get("params")
    return value if isinstance(value, dict) else {}


def meta(msg: Message) -> dict[str, Any]:
    value = params(msg).get("_meta")
    return value if isinstance(value, dict) else {}


def encode(msg: Message) -> bytes:
    if type(msg) is Received and msg.raw is not None:
        return msg.raw
    return dumps(msg)


def loads(data: bytes) -> Any:
    """`orjson.loads(data)`, lone surrogate escapes read as `decode` reads them. Raises
    orjson.JSONDecodeError for what is not JSON."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        value = _lenient(data)
        if value is _UNPARSED:
            raise
        return value


def dumps(value: Any) -> bytes:
    """`orjson.dumps(value)`; a value holding a string with a lone surrogate (which orjson
    refuses to write) is written with each such surrogate as its `\\uXXXX` escape, the rest as
    orjson writes it. Raises orjson.JSONEncodeError for what is not JSON at all."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        texts: list[str] = []
        try:
            swapped = _set_aside(value, texts, 0)
        except RecursionError:
            raise exc from None
        if not texts:
            raise
        encoded = orjson.dumps(swapped)
    return _SET_ASIDE_JSON.sub(lambda m: _escaped(texts[int(m.group(1))]), encoded)


def _set_aside(value: Any, texts: list[str], depth: int) -> Any:
    """A copy of `value` with each string holding a lone surrogate (member names too) replaced
    by a marker naming its place in `texts`."""
    if depth > _ENCODER_DEPTH:
        raise RecursionError  # (orjson would refuse it anyway)
    if isinstance(value, str):
        if _LONE_SURROGATE.search(value) is None:
            return value
        texts.append(value)
        return f"{_SET_ASIDE}{len(texts) - 1}"
    if isinstance(value, dict):
        return {
            _set_aside(k, texts, depth): _set_aside(v, texts, depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_set_aside(item, texts, depth + 1) for item in value]
    return value


def _escaped(text: str) -> bytes:
    """`text` as a JSON string: its surrogates escaped, every other run as orjson writes it."""
    parts = _LONE_SURROGATE.split(text)  # (odd places: the surrogates)
    out = [b'"']
    for index, part in enumerate(parts):
        if index % 2:
            out.append(b"\\u%04x" % ord(part))
        elif part:
            out.append(orjson.dumps(part)[1:-1])
    out.append(b'"')
    return b"".join(out)


def error(id_: RequestId | None, code: int, message: str, data: Any = None) -> Message:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    reply: Message = {"jsonrpc": "2.0", "error": err}
    if id_ is not None:
        reply["id"] = id_
    return reply


def result(id_: RequestId, value: dict[str, Any]) -> Message:
    return {"jsonrpc": "2.0", "id": id_, "result": value}


def error_code(msg: Message) -> int | None:
    err = msg.get("error")
    if isinstance(err, dict) and isinstance(err.get("code"), int):
        code: int = err["code"]
        return code
    return None
