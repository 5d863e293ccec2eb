"""The gateway's own JSON-RPC ids on an HTTP backend's hop (pure).

Each request goes to the backend under an id the gateway made (and, when it asks for progress,
under a progress token the gateway made), so that what comes back can only be matched to the
request it answers: a backend that answers twice, or with an id it was never sent, reaches no
other caller, and two clients both using id 1 never meet on a shared backend session.

The reply's own bytes are kept (they are forwarded as they came): the client's id is put back
by replacing the text of the gateway's id where it is certainly the top-level `id` member,
never by encoding the reply again, unless the backend wrote it where that cannot be told.
"""

from __future__ import annotations

import re

from gateway.protocol import jsonrpc, meta
from gateway.protocol.jsonrpc import Message

PREFIX = "gw-"
# Where a top-level member sits for certain without parsing: first (or second, after
# `"jsonrpc":"2.0"`), or last (or last but `"jsonrpc":"2.0"`). A nested member cannot be
# there: an object's first member follows its opening brace, its last precedes the closing one.
_WS = rb"[ \t\r\n]*"  # (JSON's whitespace)
_FIRST_ID = re.compile(_WS + rb'\{%s(?:"jsonrpc"%s:%s"2\.0"%s,%s)?"id"%s:%s' % ((_WS,) * 7))
_BEFORE_LAST_ID = re.compile(rb'[{,]%s"id"%s:%s\Z' % ((_WS,) * 3))
_AFTER_LAST_ID = re.compile(rb'%s(?:,%s"jsonrpc"%s:%s"2\.0"%s)?\}%s\Z' % ((_WS,) * 6))
_COMPACT_FIRST = b'{"jsonrpc":"2.0","id":'
_COMPACT_LAST = b',"id":'
_CLOSE = ord("}")
# How far before the gateway's id its member's name is looked for (whitespace included).
_NAME_REACH = 64


class Sent:
    """One request as it went to the backend: the ids on both sides of the hop."""

    __slots__ = ("client_id", "client_token", "token", "wire")

    def __init__(self, wire: str, client_id: jsonrpc.RequestId, client_token: object) -> None:
        self.wire = wire
        self.token = b'"%s"' % wire.encode()  # as JSON text (ours: nothing to escape)
        self.client_id = client_id
        self.client_token = client_token  # None: the request asked for no progress


def outbound(msg: Message, wire: str) -> tuple[Message, Sent]:
    """The request to send in place of `msg`, under the id `wire` (its progress token too)."""
    out = msg.copy()
    out["id"] = wire
    params = msg.get("params")
    fields = params.get("_meta") if type(params) is dict else None
    token = fields.get(meta.PROGRESS_TOKEN) if type(fields) is dict else None
    if token is not None:
        assert params is not None and fields is not None
        out["params"] = {**params, "_meta": {**fields, meta.PROGRESS_TOKEN: wire}}
    return out, Sent(wire, msg["id"], token)


def answers(reply: Message, sent: Sent) -> bool:
    """Whether a response is the one to `sent` (an error without an id counts: the backend
    refused the request before it could read the id)."""
    id_ = reply.get("id")
    return id_ == sent.wire or (id_ is None and "error" in reply)


def restore(reply: Message, sent: Sent) -> Message:
    """The reply (one that `answers`) under the client's id, its bytes kept where possible."""
    if isinstance(reply, jsonrpc.Received) and reply.raw is not None:
        raw = reply.raw
        at = _top_level_id(raw, sent.token)  # (-1 for an error without an id)
        if at >= 0:
            dict.__setitem__(reply, "id", sent.client_id)  # (keeps the bytes, changed here:)
            reply.raw = b"".join(
                (raw[:at], jsonrpc.dumps(sent.client_id), raw[at + len(sent.token) :])
            )
            return reply
    reply["id"] = sent.client_id  # (encoded afresh)
    return reply


def _top_level_id(raw: bytes, token: bytes) -> int:
    """Where the text `token` is the value of the top-level `id` member of `raw`, else -1.

    `token` must appear exactly once, so that no other member (a duplicate `id` above all, of
    which a parser keeps the last) can hold it too. The compact forms SDKs write are tried
    before the patterns that allow whitespace."""
    at = raw.find(token)
    if at < 0:
        return -1
    end = at + len(token)
    if raw.find(token, end) >= 0:
        return -1
    if at == len(_COMPACT_FIRST) and raw.startswith(_COMPACT_FIRST):
        return at
    if len(raw) == end + 1 and raw[end] == _CLOSE and raw.startswith(_COMPACT_LAST, at - 6):
        return at
    head = _FIRST_ID.match(raw)
    if head is not None and head.end() == at:
        return at
    before = raw[max(0, at - _NAME_REACH) : at]
    if _BEFORE_LAST_ID.search(before) and _AFTER_LAST_ID.match(raw, end):
        return at
    return -1


def progress(note: Message, sent: Sent) -> Message | None:
    """A progress notification on the request's own stream, under the client's token; None
    when it names another token (another request's progress: not this client's to see)."""
    params = jsonrpc.params(note)
    if sent.client_token is None or params.get(meta.PROGRESS_TOKEN) != sent.wire:
        return None
    note["params"] = {**params, meta.PROGRESS_TOKEN: sent.client_token}
    return note
