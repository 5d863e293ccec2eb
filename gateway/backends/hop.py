"""What the HTTP backend derives from a message for the headers of its hop (pure).

Every value comes from the body the gateway sends, never from the client's own headers, and
every value that came from a client's body is checked before it can become a header line:
the method and version must be plain visible ASCII (else the request is refused), trace context
must be well-formed W3C trace context (else it travels in `_meta` only), names and parameters are
sentinel-encoded when not plain (protocol/headers.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gateway.protocol import headers, jsonrpc
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context, traceparent: version-traceid-parentid-flags in lowercase hex; version ff is
# invalid, as are an all-zero trace id or parent id.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
# W3C Trace Context, tracestate: list members key=value (a key, optionally tenant@system; a value
# of printable ASCII without ',' or '=', not ending in a space), empty members allowed.
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][a-z0-9_\-*/]{0,255}|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}(?<! )"
)
# W3C: at most 32 list members. Header length: 512 is what the spec asks every vendor to
# propagate; longer states are dropped rather than truncated (a truncated member is corrupt).
MAX_TRACESTATE_MEMBERS = 32
MAX_TRACESTATE_BYTES = 512
# Visible ASCII with inner spaces: what a raw (never sentinel-encoded) header value may carry.
_PLAIN = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
# Tools whose `x-mcp-header` annotations one backend's hop remembers; a backend listing more is
# not served Mcp-Param-* for the excess (the oldest are forgotten first).
MAX_LEARNED_TOOLS = 10_000
# tools/list pages already learnt from, by their bytes' hash: a page seen before (the usual
# case, lists rarely change) costs a hash instead of a walk of every schema in it.
MAX_KNOWN_PAGES = 256
_RESULT = b'"result"'


def plain(value: str) -> bool:
    """Whether `value` can be sent as a header value as it is (no control characters, no
    non-ASCII, no leading or trailing whitespace)."""
    return _PLAIN.fullmatch(value) is not None


def mirrored(method: str, version: str | None, name: str | None) -> dict[str, str]:
    """Mcp-Method, MCP-Protocol-Version and Mcp-Name for one request; ValueError when the method
    or version cannot be a header value (it would need encoding the spec does not define)."""
    if not plain(method):
        raise ValueError("the method cannot be sent as an Mcp-Method header")
    if version is not None and not plain(version):
        raise ValueError("the protocol version cannot be sent as a header")
    return headers.derive_base(method, version, name)


def trace_headers(msg: Message) -> list[tuple[str, str]]:
    """`_meta.traceparent` and `_meta.tracestate` as headers, each only when well-formed."""
    fields = jsonrpc.meta(msg)
    if TRACEPARENT not in fields and TRACESTATE not in fields:
        return []
    parent = fields.get(TRACEPARENT)
    if not isinstance(parent, str) or not valid_traceparent(parent):
        return []  # tracestate means nothing without its traceparent
    out = [(TRACEPARENT, parent)]
    state = fields.get(TRACESTATE)
    if isinstance(state, str) and valid_tracestate(state):
        out.append((TRACESTATE, state))
    return out


def valid_traceparent(value: str) -> bool:
    return _TRACEPARENT.fullmatch(value) is not None


def valid_tracestate(value: str) -> bool:
    if len(value) > MAX_TRACESTATE_BYTES or not value.isascii():
        return False
    members = value.split(",")
    if len(members) > MAX_TRACESTATE_MEMBERS:
        return False
    return all(
        not member.strip(" \t") or _TRACESTATE_MEMBER.fullmatch(member.strip(" \t"))
        for member in members
    )


class ToolHeaders:
    """The `x-mcp-header` annotations of one backend's tools, learnt from the tools/list results
    that pass through its hop (streamable-http, Custom Headers from Tool Parameters): the
    backend hop derives Mcp-Param-* itself, so nothing HTTP travels through the engine."""

    def __init__(self, limit: int = MAX_LEARNED_TOOLS) -> None:
        self._specs: dict[str, tuple[ParamHeader, ...]] = {}
        self._limit = limit
        self._pages: dict[int, None] = {}

    def learn(self, reply: Message) -> None:
        """Take in one tools/list page (a reply; anything else is ignored)."""
        page = _page_key(reply)
        if page is not None and page in self._pages:
            return
        result = reply.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        if isinstance(tools, list):
            self._learn(tools)
        if page is not None:
            if len(self._pages) >= MAX_KNOWN_PAGES:
                del self._pages[next(iter(self._pages))]
            self._pages[page] = None

    def _learn(self, tools: Iterable[Any]) -> None:
        specs = self._specs
        for tool in tools:
            if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
                continue
            found = headers.param_headers(tool.get("inputSchema"))
            name: str = tool["name"]
            specs.pop(name, None)
            # An invalid annotation (a str) mirrors nothing: the backend says what it expects.
            if isinstance(found, tuple) and found:
                if len(specs) >= self._limit:
                    del specs[next(iter(specs))]
                specs[name] = found

    def params(self, msg: Message, tool: str | None) -> list[tuple[str, str]]:
        """Mcp-Param-* for a tools/call of `tool` (its own name on this backend)."""
        spec = self._specs.get(tool) if tool is not None and self._specs else None
        if not spec:
            return []
        return list(headers.derive_params(msg, spec).items())

    def __len__(self) -> int:
        return len(self._specs)


def _page_key(reply: Message) -> int | None:
    """The hash of a reply's bytes from its first `"result"` on: everything before it is
    `jsonrpc` and the request's own `id`, which differ per request; whatever comes after holds
    the whole result, so equal keys mean equal results (hash collisions aside)."""
    raw = reply.raw if isinstance(reply, jsonrpc.Received) else None
    if raw is None:
        return None
    at = raw.find(_RESULT)
    return hash(raw[at:]) if at >= 0 else None
