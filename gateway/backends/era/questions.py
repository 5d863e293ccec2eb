"""What the gateway itself answers when a legacy backend asks something (a server-to-client
request) that no client can be asked: `ping`, and `roots/list` with the backend's configured
`roots:` (client/roots). Elicitation and sampling need a person or a model, which only a client
has: the callers refuse those.

Pure: the callers send the answer.
"""

from __future__ import annotations

from typing import Any

from gateway.config import Root
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message


def roots_result(roots: tuple[Root, ...]) -> dict[str, Any]:
    return {"roots": [root.as_wire() for root in roots]}


def unattended(msg: Message, roots: tuple[Root, ...]) -> Message | None:
    """The gateway's own answer to a backend's request that belongs to no client (or to one
    without the capability), or None for a question only a client could answer."""
    method = msg.get("method")
    if method == "ping":
        return jsonrpc.result(msg["id"], {})
    if method == "roots/list":
        return jsonrpc.result(msg["id"], roots_result(roots))
    return None


def refuse_unattended(msg: Message, roots: tuple[Root, ...], refusal: str) -> Message:
    """`unattended`'s answer, or -32601 with `refusal` (client/roots, Error Handling: what a
    client without the capability answers)."""
    answer = unattended(msg, roots)
    return answer or jsonrpc.error(msg["id"], codes.METHOD_NOT_FOUND, refusal)
