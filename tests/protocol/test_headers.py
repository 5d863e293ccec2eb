"""Mirrored request headers (transports/streamable-http, Request Metadata): pure functions."""

from __future__ import annotations

from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.protocol import headers, jsonrpc
from gateway.protocol.headers import ParamHeader

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def call(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments or {}, "_meta": META}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        ("us-west1", "us-west1"),
        ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
        (" padded ", "=?base64?IHBhZGRlZCA=?="),
        ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
        ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
    ],
)
def test_value_encoding_follows_the_spec_examples(value: str, encoded: str) -> None:
    """Value Encoding: plain ASCII as is, everything else in the base64 sentinel."""
    assert headers.encode_value(value) == encoded
    assert headers.decode_value(encoded) == value


def test_invalid_sentinel_and_control_characters_do_not_decode() -> None:
    assert headers.decode_value("=?base64?not base64!?=") is None
    assert headers.decode_value("a\x01b") is None


def test_param_headers_found_on_nested_properties() -> None:
    schema = {
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "opts": {
                "type": "object",
                "properties": {"dry": {"type": "boolean", "x-mcp-header": "Dry-Run"}},
            },
        },
    }
    assert headers.param_headers(schema) == (
        ParamHeader("Region", ("region",)),
        ParamHeader("Dry-Run", ("opts", "dry")),
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"properties": {"a": {"type": "number", "x-mcp-header": "A"}}},
        {"properties": {"a": {"type": "string", "x-mcp-header": "bad name"}}},
        {"properties": {"a": {"type": "string", "x-mcp-header": ""}}},
        {
            "properties": {
                "a": {"type": "string", "x-mcp-header": "Dup"},
                "b": {"type": "string", "x-mcp-header": "dup"},
            }
        },
        {"properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}},
        {"properties": {"a": {"oneOf": [{"type": "string", "x-mcp-header": "A"}]}}},
    ],
    ids=["number", "not-a-token", "empty", "duplicate", "under-items", "under-oneOf"],
)
def test_invalid_annotations_make_the_tool_invalid(schema: dict[str, Any]) -> None:
    """Schema Extension: constraints on x-mcp-header values."""
    assert isinstance(headers.param_headers(schema), str)


def test_derive_mirrors_method_name_and_params() -> None:
    spec = (
        ParamHeader("Region", ("region",)),
        ParamHeader("N", ("n",), integer=True),
        ParamHeader("X", ("x",)),
    )
    derived = headers.derive(call("café", {"region": "eu", "n": 42, "x": None}), spec)
    assert derived == {
        "Mcp-Method": "tools/call",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Name": "=?base64?Y2Fmw6k=?=",
        "Mcp-Param-Region": "eu",
        "Mcp-Param-N": "42",
    }


def getter(sent: dict[str, list[str]]) -> CIMultiDict[str]:
    """The fields as a request carries them: names without case, repeats kept."""
    return CIMultiDict((name, value) for name, values in sent.items() for value in values)


BASE = {"MCP-Protocol-Version": ["2026-07-28"], "Mcp-Method": ["tools/call"]}


def test_matching_headers_pass_including_an_encoded_name() -> None:
    sent = {**BASE, "Mcp-Name": ["=?base64?Y2Fmw6k=?="]}
    assert headers.check(getter(sent), call("café")) is None


@pytest.mark.parametrize(
    "sent",
    [
        {"Mcp-Method": ["tools/call"], "Mcp-Name": ["echo"]},
        {**BASE, "Mcp-Name": ["other"]},
        {**BASE},
        {**BASE, "Mcp-Name": ["echo", "echo"]},
        {**BASE, "Mcp-Method": ["tools/list"], "Mcp-Name": ["echo"]},
        {**BASE, "MCP-Protocol-Version": ["2025-11-25"], "Mcp-Name": ["echo"]},
    ],
    ids=["no-version", "other-name", "no-name", "duplicate", "other-method", "other-version"],
)
def test_mismatches_are_reported(sent: dict[str, list[str]]) -> None:
    """Server Validation: missing, different or duplicated routing headers."""
    assert headers.check(getter(sent), call("echo")) is not None


def test_param_headers_checked_against_arguments() -> None:
    spec = (ParamHeader("Region", ("region",)), ParamHeader("N", ("n",), integer=True))
    msg = call("q", {"region": "eu", "n": 42})
    ok = {**BASE, "Mcp-Name": ["q"], "Mcp-Param-Region": ["eu"], "Mcp-Param-N": ["42.0"]}
    assert headers.check(getter(ok), msg, spec) is None
    missing = {**BASE, "Mcp-Name": ["q"], "Mcp-Param-N": ["42"]}
    assert headers.check(getter(missing), msg, spec) is not None
    unexpected = {**ok, "Mcp-Param-Region": ["eu"]}
    assert headers.check(getter(unexpected), call("q", {"n": 42}), spec) is not None


def test_only_integer_params_compare_by_value() -> None:
    """Server Validation: integers numerically; strings exactly."""
    spec = (ParamHeader("S", ("s",)),)
    for sent in ("1e3", "1000.0", "1_000"):
        headers_sent = {**BASE, "Mcp-Name": ["q"], "Mcp-Param-S": [sent]}
        assert headers.check(getter(headers_sent), call("q", {"s": "1000"}), spec) is not None
    integer = (ParamHeader("N", ("n",), integer=True),)
    assert (
        headers.check(
            getter({**BASE, "Mcp-Name": ["q"], "Mcp-Param-N": ["1_000"]}),
            call("q", {"n": 1000}),
            integer,
        )
        is not None
    )


@pytest.mark.parametrize("padding", [" ", "  ", "\t", " \t"])
def test_values_are_compared_without_surrounding_whitespace(padding: str) -> None:
    """RFC 9110 5.5: OWS around a field value is not part of it (Server Validation compares the
    value): `Mcp-Name: tool  ` matches "tool", an encoded name too; whitespace inside stays."""
    sent = {
        "MCP-Protocol-Version": [f"2026-07-28{padding}"],
        "Mcp-Method": [f"{padding}tools/call{padding}"],
        "Mcp-Name": [f"tool{padding}"],
    }
    assert headers.check(getter(sent), call("tool")) is None
    encoded = {**sent, "Mcp-Name": [f"{padding}=?base64?Y2Fmw6k=?={padding}"]}
    assert headers.check(getter(encoded), call("café")) is None
    spec = (ParamHeader("Region", ("region",)),)
    params = {**sent, "Mcp-Param-Region": [f"eu{padding}"]}
    assert headers.check(getter(params), call("tool", {"region": "eu"}), spec) is None
    inside = {**sent, "Mcp-Name": ["to ol"]}
    assert headers.check(getter(inside), call("tool")) is not None


def notification(meta: bool = True) -> dict[str, Any]:
    params: dict[str, Any] = {"requestId": 1}
    if meta:
        params["_meta"] = META
    return {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}


@pytest.mark.parametrize(
    ("sent", "mismatch"),
    [
        (
            {"MCP-Protocol-Version": ["2026-07-28"], "Mcp-Method": ["notifications/cancelled"]},
            False,
        ),
        ({"MCP-Protocol-Version": ["2026-07-28"]}, False),
        ({"MCP-Protocol-Version": ["2026-07-28"], "Mcp-Method": ["tools/call"]}, True),
        ({"MCP-Protocol-Version": ["2025-11-25"]}, True),
        ({"Mcp-Method": ["notifications/cancelled"]}, True),
        ({"MCP-Protocol-Version": ["2026-07-28", "2026-07-28"]}, True),
    ],
    ids=["both", "version-only", "other-method", "other-version", "no-version", "repeated"],
)
def test_a_notification_is_checked_as_a_request_is(
    sent: dict[str, list[str]], mismatch: bool
) -> None:
    """Protocol Version Header (every POST carries it) and Server Validation: a notification's
    headers must match its body where they mirror something; Mcp-Method is required only of
    requests."""
    assert (headers.check(getter(sent), notification()) is not None) is mismatch


def test_a_response_has_no_method_to_mirror() -> None:
    response = {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert headers.check(getter({"MCP-Protocol-Version": ["2026-07-28"]}), response) is None
    assert headers.check(getter({}), response) is not None
    with_method = {"MCP-Protocol-Version": ["2026-07-28"], "Mcp-Method": ["tools/call"]}
    assert headers.check(getter(with_method), response) is not None


def test_an_integer_kept_exactly_is_mirrored_with_its_digits() -> None:
    """A big integer decoded as its own text (numbers the gateway carries exactly) is still a
    primitive integer argument: its header holds the digits, and the check accepts them."""
    big = jsonrpc.decode(
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t",'
        b'"arguments":{"n":123456789012345678901234567890,"z":-0,"f":1.00000000000000000001}}}'
    )
    assert isinstance(big, dict)
    spec = (
        ParamHeader("N", ("n",), integer=True),
        ParamHeader("Z", ("z",), integer=True),
        ParamHeader("F", ("f",)),
    )
    derived = headers.derive_params(big, spec)
    assert derived == {"Mcp-Param-N": "123456789012345678901234567890", "Mcp-Param-Z": "0"}


class PlainFields:
    """A `HeaderFields` that is not a multidict: names compared as they are spelled here."""

    def __init__(self, sent: dict[str, list[str]]) -> None:
        self.sent = sent

    def getall(self, key: str, default: list[str], /) -> list[str]:
        return self.sent.get(key, default)


def test_names_are_matched_without_case_and_any_header_fields_serve() -> None:
    """Header names are case-insensitive (RFC 9110 5.1): the check looks the mirrored headers
    up by names that fold case in aiohttp's fields, and by their spelling in any others."""
    lower = {"mcp-protocol-version": ["2026-07-28"], "mcp-method": ["tools/call"]}
    assert headers.check(getter({**lower, "MCP-NAME": ["echo"]}), call("echo")) is None
    assert headers.check(getter({**lower, "MCP-NAME": ["other"]}), call("echo")) is not None
    assert headers.check(PlainFields({**BASE, "Mcp-Name": ["echo"]}), call("echo")) is None
    assert headers.check(PlainFields({**BASE, "Mcp-Name": ["other"]}), call("echo")) is not None
    assert headers.check(PlainFields(BASE), call("echo")) is not None
