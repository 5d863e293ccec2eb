"""The JSON-RPC shape check, done inside `jsonrpc.decode` (issue 34: in its frame, twice a
request): each case against the rules as they were written on their own before (JSON-RPC 2.0,
4 Request object, 5 Response object; basic/index, Messages)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.protocol import codes, jsonrpc

pytestmark = pytest.mark.fast


def reference(msg: dict[str, Any]) -> str | None:
    """The shape rules, one return each, as `_shape_problem` had them."""
    if msg.get("jsonrpc") != "2.0":
        return 'The "jsonrpc" member must be exactly "2.0"'
    if "id" in msg and not (type(msg["id"]) is str or type(msg["id"]) is int):
        return 'The "id" member must be a string or an integer'
    if "method" in msg:
        if type(msg["method"]) is not str:
            return 'The "method" member must be a string'
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


CASES: list[dict[str, Any]] = [
    {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {}},
    {"jsonrpc": "2.0", "method": "notifications/x"},
    {"jsonrpc": "2.0", "id": "a", "result": {}},
    {"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "m"}},
    {"jsonrpc": "1.0", "id": 1, "method": "m"},
    {"id": 1, "method": "m"},
    {"jsonrpc": "2.0", "id": True, "method": "m"},
    {"jsonrpc": "2.0", "id": 1.5, "method": "m"},
    {"jsonrpc": "2.0", "id": None, "method": "m"},
    {"jsonrpc": "2.0", "id": 1, "method": 5},
    {"jsonrpc": "2.0", "id": 1, "method": "m", "result": {}},
    {"jsonrpc": "2.0", "id": 1, "method": "m", "error": {}},
    {"jsonrpc": "2.0", "id": 1, "method": "m", "params": []},
    {"jsonrpc": "2.0", "id": 1, "method": "m", "params": None},
    {"jsonrpc": "2.0", "result": {}},
    {"jsonrpc": "2.0", "id": 1},
    {"jsonrpc": "2.0", "id": 1, "result": {}, "error": {}},
    {"jsonrpc": "2.0", "id": [1], "result": {}},
]


@pytest.mark.parametrize("msg", CASES)
def test_decode_finds_the_problem_the_rules_name(msg: dict[str, Any]) -> None:
    got = jsonrpc.decode(orjson.dumps(msg))
    problem = reference(msg)
    if problem is None:
        assert got == msg
        return
    assert isinstance(got, jsonrpc.Invalid)
    assert got.code == codes.INVALID_REQUEST
    assert got.message == problem  # (the same words as before: clients see them)
