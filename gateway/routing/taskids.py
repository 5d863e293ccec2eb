"""The gateway's task ids (pure): a backend's task id as clients of a merged gateway see it.

A backend's `taskId` (Tasks extension) is replaced by one that carries everything a later
`tasks/get|update|cancel` needs to be routed and judged: the backend, the backend's own id, the
tool call that created it (client-visible name, and the backend's own name when it differs) and,
when the caller had an identity, a digest binding the task to that caller. Nothing is kept in
memory, so a task outlives a gateway restart and is served by any replica holding the keys.

Signed (HMAC-SHA256) like cursors (cursor.py), so a forged or altered id is refused as an
unknown one. Not encrypted: what it carries is the caller's own (the backend id it would see
through a transparent gateway) and a keyed digest that says nothing of who the caller is.
It is signed with the first key and accepted with any, so the keys can rotate.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.protocol import jsonrpc

# What a key derived from a cluster secret for task ids is derived with (ClusterConfig.keys).
PURPOSE = b"mcp-gateway task v1"
# The longest task id accepted from a client: longer ones are refused before any decoding.
MAX_ID = 4096
# The longest task id accepted from a backend: what it seals into stays under MAX_ID (tool
# names are at most 128 characters, backend names short).
MAX_BACKEND_ID = 1024
_VERSION = 1
_MARK = "gt1."  # tells a sealed id apart at a glance (logs); the signature decides


@dataclass(frozen=True, slots=True)
class TaskRef:
    """What a sealed id carries."""

    backend: str
    task_id: str  # the backend's own
    tool: str  # as the client called it (rate limits key by it)
    own_tool: str  # as the backend knows it (policy rules are written on it)
    caller: str | None  # keyed digest of the creator's identity key; None: no identity


def seal(ref: TaskRef, key: bytes) -> str:
    """The client's id for a task. `ref.caller` must come from `caller_digest` with `key`."""
    own = None if ref.own_tool == ref.tool else ref.own_tool
    payload = jsonrpc.dumps([_VERSION, ref.backend, ref.task_id, ref.tool, own, ref.caller])
    body = base64.urlsafe_b64encode(payload).decode().rstrip("=")
    return f"{_MARK}{body}.{_sign(body, key)}"


def unseal(task_id: object, keys: Sequence[bytes]) -> tuple[TaskRef, bytes] | None:
    """The reference in an id signed with one of `keys`, and that key; None if it is not one
    this gateway issued (too long, not signed, altered, another version)."""
    if not isinstance(task_id, str) or len(task_id) > MAX_ID or not task_id.startswith(_MARK):
        return None
    if not task_id.isascii():
        return None  # every id this gateway issues is ASCII
    body, dot, signature = task_id[len(_MARK) :].rpartition(".")
    if not dot:
        return None
    key = next((k for k in keys if hmac.compare_digest(signature, _sign(body, k))), None)
    if key is None:
        return None
    try:
        data = jsonrpc.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError):
        return None
    if not (
        isinstance(data, list)
        and len(data) == 6
        and data[0] == _VERSION
        and all(isinstance(v, str) for v in data[1:4])
        and all(v is None or isinstance(v, str) for v in data[4:6])
    ):
        return None
    _, backend, own_id, tool, own_tool, caller = data
    return TaskRef(backend, own_id, tool, own_tool if own_tool is not None else tool, caller), key


def caller_digest(identity_key: str | None, key: bytes) -> str | None:
    """Whose task it is, keyed so the id tells nothing of the caller to anyone else."""
    if identity_key is None:
        return None
    return hmac.new(key, b"caller\0" + identity_key.encode(), hashlib.sha256).hexdigest()[:32]


def _sign(body: str, key: bytes) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]
