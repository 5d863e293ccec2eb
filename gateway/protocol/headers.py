"""Mirrored request headers of Streamable HTTP (transports/streamable-http, Request Metadata).

Pure: the frontend checks what a client sent against the body, the backend derives the headers
for the body it actually sends, and both use the same value encoding.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson
from multidict import istr

from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message

PROTOCOL_VERSION = "MCP-Protocol-Version"
METHOD = "Mcp-Method"
NAME = "Mcp-Name"
PARAM_PREFIX = "Mcp-Param-"

# Methods whose Mcp-Name is required, and the params field it mirrors.
NAME_SOURCE: Mapping[str, str] = {
    "tools/call": "name",
    "prompts/get": "name",
    "resources/read": "uri",
    # Tasks extension, Streamable HTTP: Routing Headers (a load balancer routes on the task).
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}

_SENTINEL_PREFIX = "=?base64?"
_SENTINEL_SUFFIX = "?="
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_SAFE_VALUE = re.compile(r"^[\x20-\x7e\t]*$")
# Optional whitespace around a field value, which is not part of it (RFC 9110 5.5).
_OWS = " \t"
_NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")
# JavaScript's safe integer range bounds integer parameters mirrored into headers.
_MAX_SAFE_INT = 2**53 - 1


@dataclass(frozen=True, slots=True)
class ParamHeader:
    """One `x-mcp-header` annotation: the header's name part and the argument path it mirrors."""

    name: str
    path: tuple[str, ...]
    integer: bool = False


def encode_value(value: str) -> str:
    plain = (
        _SAFE_VALUE.match(value) is not None
        and value == value.strip(" \t")
        and not _is_sentinel(value)
    )
    if plain:
        return value
    # (a lone surrogate, which JSON allows and UTF-8 cannot hold, as its WTF-8 bytes: what
    # passes unchanged in the body must not make its header fail)
    data = value.encode("utf-8", "surrogatepass")
    return _SENTINEL_PREFIX + base64.b64encode(data).decode("ascii") + _SENTINEL_SUFFIX


def decode_value(header: str) -> str | None:
    """The value a header carries, or None when it is not a valid header value."""
    if _SAFE_VALUE.match(header) is None:
        return None
    if not _is_sentinel(header):
        return header
    body = header[len(_SENTINEL_PREFIX) : -len(_SENTINEL_SUFFIX)]
    try:
        return base64.b64decode(body, validate=True).decode("utf-8", "surrogatepass")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _is_sentinel(value: str) -> bool:
    return (
        value.startswith(_SENTINEL_PREFIX)
        and value.endswith(_SENTINEL_SUFFIX)
        and len(value) >= len(_SENTINEL_PREFIX) + len(_SENTINEL_SUFFIX)
    )


def param_text(value: object) -> str | None:
    """A primitive argument as header text; None for values that are not mirrored."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, str):
        return value
    if type(value) is orjson.Fragment:
        # A number kept as its own text (protocol/numbers.py): an integer is mirrored with its
        # digits, as a client holding it exactly would write it; `-0` is the integer 0.
        text = orjson.dumps(value).decode()
        if _INTEGER.fullmatch(text):
            return "0" if text == "-0" else text
    return None


_INTEGER = re.compile(r"-?[0-9]+")


def param_headers(input_schema: object) -> tuple[ParamHeader, ...] | str:
    """The `x-mcp-header` annotations of a tool's inputSchema, or why the tool is invalid."""
    annotations = _count_annotations(input_schema)
    if not annotations:
        return ()  # (most tools: one walk of the schema, not two)
    found: list[ParamHeader] = []
    problem = _collect(input_schema, (), found)
    if problem:
        return problem
    if annotations != len(found):
        return "x-mcp-header is only allowed on properties reachable through 'properties' alone"
    seen: set[str] = set()
    for header in found:
        if header.name.lower() in seen:
            return f"x-mcp-header {header.name!r} is not unique"
        seen.add(header.name.lower())
    return tuple(found)


def _collect(schema: object, path: tuple[str, ...], found: list[ParamHeader]) -> str | None:
    if not isinstance(schema, dict):
        return None
    if "x-mcp-header" in schema and path:
        name = schema["x-mcp-header"]
        if not isinstance(name, str) or _TOKEN.match(name) is None:
            return f"x-mcp-header at {'.'.join(path)} is not an HTTP token"
        kind = schema.get("type")
        if kind not in ("string", "integer", "boolean"):
            return f"x-mcp-header at {'.'.join(path)} is not on a string, integer or boolean"
        found.append(ParamHeader(name, path, integer=kind == "integer"))
    props = schema.get("properties")
    if isinstance(props, dict):
        for key, sub in props.items():
            problem = _collect(sub, (*path, key), found)
            if problem:
                return problem
    return None


def _count_annotations(node: object) -> int:
    # (a loop over a stack: a route table's build walks every tool's schema, and recursion
    # through generators cost most of it)
    count = 0
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            count += "x-mcp-header" in item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _at_path(arguments: object, path: Iterable[str]) -> object:
    node = arguments
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def derive(msg: Message, params_spec: Iterable[ParamHeader] = ()) -> dict[str, str]:
    """The mirrored headers for a request body, as a client must send them."""
    out = derive_base(*mirrored_fields(msg))
    out.update(derive_params(msg, params_spec))
    return out


def mirrored_fields(msg: Message) -> tuple[str, str | None, str | None]:
    """What Mcp-Method, MCP-Protocol-Version and Mcp-Name mirror: the method, the version in
    `_meta`, and the name or URI (None where absent or not a string). Few distinct triples occur,
    so callers can cache what they derive from one."""
    method = str(msg.get("method", ""))
    params = p if isinstance(p := msg.get("params"), dict) else {}  # (jsonrpc.params inlined)
    found = params.get("_meta")
    version = found.get(meta.PROTOCOL_VERSION) if isinstance(found, dict) else None
    source = NAME_SOURCE.get(method)
    name = params.get(source) if source is not None else None
    return (
        method,
        version if isinstance(version, str) else None,
        name if isinstance(name, str) else None,
    )


def derive_base(method: str, version: str | None, name: str | None) -> dict[str, str]:
    out = {METHOD: method}
    if version is not None:
        out[PROTOCOL_VERSION] = version
    if name is not None and method in NAME_SOURCE:
        out[NAME] = encode_value(name)
    return out


def derive_params(msg: Message, params_spec: Iterable[ParamHeader]) -> dict[str, str]:
    """The Mcp-Param-* headers of a tool call."""
    out: dict[str, str] = {}
    arguments = jsonrpc.params(msg).get("arguments")
    for spec in params_spec:
        text = param_text(_at_path(arguments, spec.path))
        if text is not None:
            out[PARAM_PREFIX + spec.name] = encode_value(text)
    return out


class HeaderFields(Protocol):
    """A request's header fields: `getall(name, default)` gives every value of a field
    (names compared without case), so duplicates show; a multidict is one."""

    def getall(self, key: str, default: list[str], /) -> list[str]: ...


NO_VALUES: list[str] = []  # what an absent field has (shared: never changed)
# The mirrored headers' names as multidict's case-insensitive strings: a lookup in aiohttp's
# header fields then skips folding the name's case (about 500 instructions a lookup; a `str`
# still, for any other `HeaderFields`).
_VERSION_KEY, _METHOD_KEY, _NAME_KEY = istr(PROTOCOL_VERSION), istr(METHOD), istr(NAME)


def check(
    fields: HeaderFields, msg: Message, params_spec: Iterable[ParamHeader] | None = None
) -> str | None:
    """Compare a client's mirrored headers with its body; the mismatch described, or None.

    `params_spec` is None when the tool's schema is unknown: Mcp-Param-* are then not checked.
    Values are compared with their surrounding whitespace (RFC 9110 5.5 OWS) removed.

    Requests need MCP-Protocol-Version, Mcp-Method and (for named methods) Mcp-Name. Every POST
    carries MCP-Protocol-Version (streamable-http, Protocol Version Header), notifications and
    responses too; their other mirrored headers are optional, but must match when sent: a
    notification's Mcp-Method its method, while a response has no method to mirror.
    """
    # (`mirrored_fields` inlined: on every request)
    method = str(msg.get("method", ""))
    params = p if isinstance(p := msg.get("params"), dict) else {}
    found = params.get("_meta")
    version = found.get(meta.PROTOCOL_VERSION) if isinstance(found, dict) else None
    if not isinstance(version, str):
        version = None
    source = NAME_SOURCE.get(method)
    named = source is not None
    name = params.get(source) if named else None
    if not isinstance(name, str):
        name = None
    get_all = fields.getall
    versions, methods = get_all(_VERSION_KEY, NO_VALUES), get_all(_METHOD_KEY, NO_VALUES)
    if (
        # The common case, decided with a few comparisons: each header once, equal to its
        # field, which needs no encoding (the equalities rule out absent fields).
        versions == [version]
        and methods == [method]
        and (not named or get_all(_NAME_KEY, NO_VALUES) == [name])
        and _plain((version, method, name))
    ):
        problem = None
    else:
        problem = _compare(versions, PROTOCOL_VERSION, version, raw=True)
        if "id" in msg and "method" in msg:  # a request
            problem = problem or _compare(methods, METHOD, method, raw=True)
        elif methods:
            body_method = method if "method" in msg else None
            problem = problem or _compare(methods, METHOD, body_method, raw=True)
        if named:
            problem = problem or _compare(get_all(NAME, NO_VALUES), NAME, name, required=True)
    if problem or params_spec is None:
        return problem
    arguments = jsonrpc.params(msg).get("arguments")
    for spec in params_spec:
        header = PARAM_PREFIX + spec.name
        body = param_text(_at_path(arguments, spec.path))
        values = get_all(header, NO_VALUES)
        problem = _compare(values, header, body, required=False, integer=spec.integer)
        if problem:
            return problem
    return None


@functools.lru_cache(maxsize=1024)
def _plain(values: tuple[str | None, ...]) -> bool:
    """Whether each value goes into a header as itself (no sentinel encoding)."""
    return all(value is None or encode_value(value) == value for value in values)


def _compare(
    values: list[str],
    name: str,
    body: str | None,
    *,
    raw: bool = False,
    required: bool = True,
    integer: bool = False,
) -> str | None:
    if len(values) > 1:
        return f"{name} header appears more than once"
    if not values:
        return f"{name} header is missing" if required or body is not None else None
    value = values[0].strip(_OWS)
    header = value if raw and _SAFE_VALUE.match(value) else decode_value(value)
    if header is None:
        return f"{name} header value is not a valid header value"
    if body is None:
        # The body lacks the field entirely; the `_meta` check reports that with its own code.
        return None if name == PROTOCOL_VERSION else f"{name} header has no counterpart in the body"
    if header != body and not (integer and _same_integer(header, body)):
        return f"{name} header value {header!r} does not match body value {body!r}"
    return None


def _same_integer(header: str, body: str) -> bool:
    """Integer parameters compare by value (`42.0` equals `42`), within JavaScript's safe range."""
    if not _NUMBER.match(header):
        return False
    value = float(header)
    return value.is_integer() and abs(value) <= _MAX_SAFE_INT and str(int(value)) == body
