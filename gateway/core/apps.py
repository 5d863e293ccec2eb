"""MCP Apps through the merged server (docs/behaviour/protocol.md, MCP Apps): the calls an app
view makes by its own server's tool names, and the app-only tools a client without the
extension is not shown.

A view rendered for a tool of backend `alpha` calls `alpha`'s tools as `alpha` names them
(`refresh`), not as the merged server shows them (`alpha_refresh`). Such a call is rewritten to
the client-visible name before anything judges it, so rate limits, the policy and routing see
exactly the call the prefixed name would be. Only exact own names of offered tools of backends
with a UI qualify (routing/table.py `_own_tools`), never a guess: a name missing from the
catalog is still refused by core/unknown.py's rules. An own name two backends share is refused
(-32602) naming the client-visible names the caller may use; the ones the policy hides from the
caller are not named, nor counted, so a refusal tells nothing of them.
"""

from __future__ import annotations

from typing import Any

from gateway.caller_auth.identity import Identity
from gateway.core.policy import TOOL, Policy, View
from gateway.errors import Refused
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.routing import apps
from gateway.routing.table import RouteTable


class AmbiguousName(Refused):
    """An own tool name several backends' views may call: the caller must pick one."""

    def __init__(self, name: str, candidates: tuple[str, ...]) -> None:
        super().__init__(
            codes.INVALID_PARAMS,
            f"Ambiguous tool: {name} is offered as {', '.join(candidates)}",
            "ambiguous_name",
        )
        self.candidates = candidates

    def data(self) -> dict[str, Any]:
        return {"candidates": list(self.candidates)}


def by_visible_name(
    table: RouteTable, msg: Message, policy: Policy | None, identity: Identity | None
) -> Message:
    """A `tools/call` under the client-visible name of the tool its name is the own name of;
    any other request as it is. The policy is asked only when an own name is shared; the
    common case is a dict lookup."""
    params = msg.get("params")
    name = params.get("name") if type(params) is dict else None
    if not isinstance(name, str) or name in table.tools:
        return msg
    candidates = table.own_tools.get(name)
    if candidates is None:
        return msg
    if len(candidates) > 1:
        if policy is not None:
            view = policy.view(identity)
            candidates = tuple(c for c in candidates if _visible(table, view, c))
        if len(candidates) > 1:
            raise AmbiguousName(name, candidates)
        if not candidates:
            return msg  # nothing of it is the caller's to call: unknown, as any other name
    assert type(params) is dict
    return {**msg, "params": {**params, "name": candidates[0]}}


def _visible(table: RouteTable, view: View, name: str) -> bool:
    route = table.tools[name]
    return view.visible(TOOL, route.backend, route.name)


def hides_app_only(msg: Message, transparent: bool) -> bool:
    """Whether this tools/list leaves out app-only tools: the spec has hosts keep them from the
    model, and a client that does not declare the ui extension renders no app and would show
    them to its model. A transparent gateway (one unprefixed backend) leaves that to the backend,
    which sees the same client capabilities."""
    return not transparent and not apps.client_declares(msg)
