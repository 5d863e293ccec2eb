"""The gateway's pagination cursor (pure): where every backend of a merged list left off.

Opaque to clients and signed, so a forged or mangled cursor is recognised and refused (-32602)
instead of being passed to a backend. The keys are the caller's to give: one process's own, or
derived from `cluster.secrets` (PURPOSE), so that a page from one replica continues on another.
It is signed with the first key and accepted with any, so the secrets can rotate.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

from gateway.protocol import jsonrpc

# (backend name, that backend's own cursor or None for its first page), in config order.
Position = tuple[str, str | None]
_VERSION = 1
# What a key derived from a cluster secret for cursors is derived with (config.ClusterConfig.keys):
# a key for cursors signs nothing else.
PURPOSE = b"mcp-gateway cursor v1"


def encode(positions: list[Position], key: bytes, scope: str) -> str:
    # (a backend's cursor is any string: one with a lone surrogate is written as its escape)
    payload = jsonrpc.dumps({"v": _VERSION, "s": scope, "p": positions})
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{body}.{_sign(body, key)}"


def decode(cursor: object, keys: Sequence[bytes], scope: str) -> list[Position] | None:
    """The positions in a cursor signed with one of `keys` for this list, or None if it is
    not one (`keys`: the signing key first, then those still accepted)."""
    if not isinstance(cursor, str):
        return None
    if not cursor.isascii():
        return None  # every cursor this gateway issues is ASCII
    body, dot, signature = cursor.rpartition(".")
    if not dot or not any(hmac.compare_digest(signature, _sign(body, k)) for k in keys):
        return None
    try:
        data = jsonrpc.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not isinstance(data, dict) or data.get("v") != _VERSION or data.get("s") != scope:
        return None
    positions = data.get("p")
    if not isinstance(positions, list) or not all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], str)
        and isinstance(p[1], (str, type(None)))
        for p in positions
    ):
        return None
    return [(p[0], p[1]) for p in positions]


def _sign(body: str, key: bytes) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]
