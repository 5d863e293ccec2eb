"""What the era probe learns from a backend's answers, and a discovery result for a modern
backend that does not serve `server/discover` (basic/versioning, Backward Compatibility with
Initialization-Based Versions: a recognised modern error identifies a modern server, and
`server/discover` is optional for the client to call).

The gateway needs a discovery result for every backend: its catalog asks only for the lists
the backend's capabilities name, and the merged `server/discover` shows the union of them. A
modern server that answers `server/discover` with "method not found" (or HTTP 404) but
`initialize` with a modern error has no result to give, so one is made from what the server
does answer: each list method it answers with a result is a capability it has. Nothing is
guessed: a capability it does not answer for is left out, and serverInfo, instructions and
the `listChanged`/`subscribe` flags, which only its own discovery could tell, stay absent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.protocol import codes, meta
from gateway.protocol.jsonrpc import Message

# Modern errors a legacy server does not send: the MCP-reserved codes of the modern revision
# (basic/index, Error Codes). -32022 counts only with the versions it supports, as the
# UnsupportedProtocolVersionError of the schema carries them.
MODERN_ERROR_CODES = frozenset({codes.HEADER_MISMATCH, codes.MISSING_REQUIRED_CLIENT_CAPABILITY})
# The list methods whose answer shows a capability (resources/list also stands for templates).
CAPABILITY_PROBES = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
}

Ask = Callable[[Message], Awaitable[Message]]


def is_discover_result(reply: Message) -> bool:
    result = reply.get("result")
    return isinstance(result, dict) and isinstance(result.get("supportedVersions"), list)


def supported_versions(reply: Message) -> list[str] | None:
    """The versions an UnsupportedProtocolVersionError names, if `reply` is one."""
    error = reply.get("error")
    if not isinstance(error, dict) or error.get("code") != codes.UNSUPPORTED_PROTOCOL_VERSION:
        return None
    data = error.get("data")
    supported = data.get("supported") if isinstance(data, dict) else None
    if not isinstance(supported, list):
        return None
    return [v for v in supported if isinstance(v, str)]


def is_modern_error(reply: Message) -> bool:
    """A JSON-RPC error only a modern server sends (to `server/discover` or `initialize`)."""
    if supported_versions(reply) is not None:
        return True
    error = reply.get("error")
    return isinstance(error, dict) and error.get("code") in MODERN_ERROR_CODES


def capabilities(replies: dict[str, Message]) -> dict[str, Any]:
    """The capabilities shown by the answers to CAPABILITY_PROBES (method -> reply)."""
    return {
        CAPABILITY_PROBES[method]: {}
        for method, reply in replies.items()
        if method in CAPABILITY_PROBES and isinstance(reply.get("result"), dict)
    }


def synthetic_result(caps: dict[str, Any], versions: list[str] | None) -> dict[str, Any]:
    return {
        "resultType": "complete",
        "supportedVersions": versions or [meta.MODERN_VERSION],
        "capabilities": caps,
    }


async def synthesise(
    ask: Ask, client_info: dict[str, Any], versions: list[str] | None
) -> dict[str, Any]:
    """A discovery result for a modern backend without `server/discover`, from its answers
    to the list methods (asked at once; a failure to answer is the caller's error)."""
    methods = list(CAPABILITY_PROBES)
    replies = await asyncio.gather(*(ask(_request(m, client_info)) for m in methods))
    return synthetic_result(capabilities(dict(zip(methods, replies, strict=True))), versions)


def _request(method: str, client_info: dict[str, Any]) -> Message:
    return {
        "jsonrpc": "2.0",
        "id": f"gateway-probe-{method}",
        "method": method,
        "params": {"_meta": meta.gateway_meta(client_info)},
    }
