"""JSON-RPC 2.0 framing: decode one message, classify it, build replies.

Messages stay the dicts orjson gives us; only the fields routing needs are read. A message from
a backend can also remember the bytes it came from, so that a reply forwarded unchanged goes out
as the very bytes that came in, never re-encoded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.protocol import codes

Message = dict[str, Any]
RequestId = str | int


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


def decode(raw: bytes | str, *, keep: bool = False) -> Message | Invalid:
    """Parse one JSON-RPC message; never raises. With `keep`, the message remembers `raw`.

    Client messages are not kept: what a backend receives is then exactly what the gateway
    checked and routed, even if the client's bytes could parse differently elsewhere (a
    duplicated member, say)."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Invalid(codes.PARSE_ERROR, f"Parse error: {exc}")
    # (orjson gives exact types: `type(...) is` checks suffice, and a bool is not an int)
    if type(value) is not dict:
        if type(value) is list:
            return Invalid(codes.INVALID_REQUEST, "Batch requests are not supported")
        return Invalid(codes.INVALID_REQUEST, "A JSON-RPC message must be an object")
    problem = _shape_problem(value)
    if problem is not None:
        raw_id = value.get("id")
        return Invalid(codes.INVALID_REQUEST, problem, raw_id if _is_id(raw_id) else None)
    if keep:
        received = Received(value)
        received.raw = raw.encode() if isinstance(raw, str) else raw
        return received
    return value


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
