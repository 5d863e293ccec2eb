"""JSON-RPC 2.0 framing: decode one message, classify it, build replies.

Messages stay the dicts orjson gives us; only the fields routing needs are read. A message from
a backend can also remember the bytes it came from, so that a reply forwarded unchanged goes out
as the very bytes that came in, never re-encoded.
"""

from __future__ import annotations

import contextlib
import enum
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
            return _unparsed(data, exc)
    except numbers.NotJson as exc:
        return _unparsed(data, exc)
    # (orjson gives exact types: `type(...) is` checks suffice, and a bool is not an int)
    if type(value) is not dict:
        if type(value) is list:
            return Invalid(codes.INVALID_REQUEST, "Batch requests are not supported")
        return Invalid(codes.INVALID_REQUEST, "A JSON-RPC message must be an object")
    problem = _shape_problem(value)
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
        return True
    return False


def _is_id(value: object) -> bool:
    return type(value) is str or type(value) is int


def _shape_problem(msg: Message) -> str | None:
    if msg.get("jsonrpc") != "2.0":
        return 'The "jsonrpc" member must be exactly "2.0"'
    if "id" in msg and not _is_id(msg["id"]):
        return 'The "id" member must be a string or an integer'
    if "method" in msg:
        if type(msg["method"]) is not str:
            return 'The "method" member must be a string'
        # A request or a response, not both: serving it as a request would drop what it
        # answers (JSON-RPC 2.0, 4 and 5).
        if "result" in msg or "error" in msg:
            return 'A message with a "method" carries no "result" or "error"'
        params = msg.get("params")
        if params is not None and type(params) is not dict:
            return 'The "params" member must be an object'
        return None
    if "id" not in msg:
        return "A message needs a method or an id"
    if ("result" in msg) == ("error" in msg):
        return "A response carries exactly one of result and error"
    return None


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
    return orjson.dumps(msg)


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
