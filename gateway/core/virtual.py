"""A virtual server's engine: a dispatcher of its own over the shared backends.

A virtual server (`servers:` in the config) is an MCP server of its own made of a selection of
the gateway's backends: its own exposures (selections, renames, namespaces), route table,
serverInfo and instructions, policy, rate limits, cursors, task ids and listens. It is the
merged server's `Dispatcher` with these differences, and nothing else:

- its catalogs are the merged server's (core/catalog.py `shared`): one load per backend;
- everything it signs is signed with keys of its own (`scoped_keys`), so a cursor or task id
  of another server's is refused as a forged one, and a `requestState` it hands out (in any
  reply) is wrapped in a tag of its own (`wrap_state`), so a retry elsewhere is refused before
  any backend sees it;
- it never forwards a name its catalogs lack on a guess (as under a policy): what a server does
  not list, it does not offer;
- its discovery and listens leave out the capabilities it selects nothing of.

The merged server's dispatcher is untouched: a config without `servers:` runs exactly as before.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.backends.base import Call, NotificationSink
from gateway.caller_auth.identity import Identity
from gateway.core.catalog import Catalogs
from gateway.core.dispatcher import Dispatcher
from gateway.errors import Refused
from gateway.protocol import codes, jsonrpc
from gateway.protocol.jsonrpc import Message

# What a server's keys are derived with, from the keys of the merged server's use.
PURPOSE = b"mcp-gateway virtual server v1 "
STATE = "requestState"
_TAG = 22  # characters of a wrapped requestState's tag: 128 bits of HMAC-SHA256, base64url


def scoped_keys(keys: Sequence[bytes], server: str) -> tuple[bytes, ...]:
    """One key per key, for one server: HMAC(key, PURPOSE + name). A key is worth nothing for
    another server, so what one server signed, another refuses."""
    label = PURPOSE + server.encode()
    return tuple(hmac.new(k, label, hashlib.sha256).digest() for k in keys)


def scoped_loader(load: Callable[[], bytes], server: str) -> Callable[[], bytes]:
    """`scoped_keys` for a key that is loaded when first needed (a task key file)."""
    return lambda: scoped_keys((load(),), server)[0]


def _tag(state: str, key: bytes) -> str:
    digest = hmac.new(key, state.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode()[:_TAG]


def wrap_state(state: str, key: bytes) -> str:
    return f"{_tag(state, key)}.{state}"


def unwrap_state(value: object, keys: Sequence[bytes]) -> str | None:
    """The backend's requestState inside one this server wrapped; None if it is not one."""
    if not isinstance(value, str) or len(value) <= _TAG or value[_TAG] != ".":
        return None
    tag, state = value[:_TAG], value[_TAG + 1 :]
    ok = any(hmac.compare_digest(tag, _tag(state, k)) for k in keys)
    return state if ok else None


@dataclass(frozen=True)
class Scope:
    """What makes a dispatcher a virtual server's."""

    name: str
    shared: Catalogs  # the merged server's catalogs
    instructions: str | None = None
    # By backend, the capabilities the server selects nothing of (a selection of []).
    unselected: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)


class VirtualDispatcher(Dispatcher):
    def __init__(self, *args: Any, scope: Scope, own_limits: bool, **kwargs: Any) -> None:
        """`own_limits`: the limiters given are the server's own (its `rate_limits:`), not the
        merged server's, whose task ids only it can read (core/tasks.py `attach`)."""
        limiter, shared = kwargs.pop("limiter", None), kwargs.pop("shared_limiter", None)
        kwargs["shared_catalogs"] = scope.shared
        super().__init__(*args, **kwargs)
        self.tasks.attaches = own_limits
        self.limiter, self.shared_limiter = limiter, shared
        self.tasks.attach(limiter, shared)
        self.scope = scope
        self.tasks.always_seal = True
        self._state_keys = self.cursor_keys  # (the server's own: scoped, or random)
        self.rescope(scope)

    def rescope(self, scope: Scope) -> None:
        """A reload changed the server's own settings (its backends: `reconfigure`)."""
        self.scope = scope
        self.fan_out.own_server = True
        self.fan_out.instructions = scope.instructions
        self.fan_out.unselected = scope.unselected

    def leave(self) -> None:
        """The server is gone (a reload): its catalogs no longer follow the shared loads, nor
        its search index its catalogs, and its open listens end."""
        self.catalogs.leave()
        if self.search is not None:
            self.search.close()
        self.close_streams()

    @property
    def _guarded(self) -> bool:
        return True  # a name the server does not list is not forwarded on a guess

    async def _dispatch(self, msg: Message, sink: NotificationSink, call: Call) -> Message:
        """The merged server's dispatch, with its `requestState` tags checked on the way in
        and added on the way out."""
        params = msg.get("params")
        if isinstance(params, dict) and STATE in params:
            state = unwrap_state(params[STATE], self._state_keys)
            if state is None:
                raise Refused(codes.INVALID_PARAMS, "requestState is unknown here")
            msg = {**msg, "params": {**params, STATE: state}}
        reply = await super()._dispatch(msg, sink, call)
        result = reply.get("result")
        if isinstance(result, dict) and isinstance(result.get(STATE), str):
            result[STATE] = wrap_state(result[STATE], self._state_keys[0])
            jsonrpc.changed(reply)
        return reply

    def _judge(
        self, identity: Identity | None
    ) -> tuple[Callable[[str, str], bool] | None, Callable[[str], frozenset[str]] | None]:
        readable, hidden = super()._judge(identity)
        unselected = self.scope.unselected
        if not unselected:
            return readable, hidden
        return readable, functools.partial(_hidden, unselected, hidden)


def _hidden(
    unselected: Mapping[str, frozenset[str]],
    policy: Callable[[str], frozenset[str]] | None,
    backend: str,
) -> frozenset[str]:
    """What a listen is not told of a backend's lists: what the server selects nothing of, and
    what the policy hides from the caller."""
    none = unselected.get(backend, frozenset())
    return none | policy(backend) if policy is not None else none
