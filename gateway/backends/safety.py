"""Which requests may be sent again after a failure that may have let them run (pure).

A request may be repeated only if running it twice cannot have an effect: reading lists,
resources, discovery, completions, ping; and a tools/call only of a tool its server declares
both read-only and idempotent (`annotations.readOnlyHint` and `idempotentHint`: the schema's
`ToolAnnotations`), as learnt from the tools/list results that passed through the backend's hop.
Both, not read-only alone: the schema calls `idempotentHint` meaningful only for tools that are
not read-only, so a server setting both leaves no doubt. Annotations are hints: a server whose
hints are false can only make its own tools run twice (the operator configured it; no other
backend or client is affected); a tool not seen in a list is never repeated.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from gateway.protocol.jsonrpc import Message

# Methods that read and change nothing on the server.
WITHOUT_EFFECTS = frozenset(
    {
        "ping",
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
        "prompts/get",
        "completion/complete",
    }
)
# Tools one backend's hop remembers as safe to repeat; a backend listing more forgets the
# oldest first (so at worst a safe call is not repeated).
MAX_SAFE_TOOLS = 10_000


def may_repeat(msg: Message, safe_tools: Collection[str] = ()) -> bool:
    """Whether `msg` may be sent again (to the same or another replica) after a failure that
    may have let it run: `safe_tools` names the tools declared read-only and idempotent."""
    method = msg.get("method")
    if method in WITHOUT_EFFECTS:
        return True
    if method != "tools/call" or not safe_tools:
        return False
    params = msg.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return isinstance(name, str) and name in safe_tools


def repeatable_tool(tool: Any) -> bool:
    """A tools/list entry whose annotations declare it read-only and idempotent."""
    annotations = tool.get("annotations") if isinstance(tool, dict) else None
    return (
        isinstance(annotations, dict)
        and annotations.get("readOnlyHint") is True
        and annotations.get("idempotentHint") is True
    )


class SafeTools:
    """The names of one backend's tools that may be repeated, learnt from tools/list replies."""

    def __init__(self, limit: int = MAX_SAFE_TOOLS) -> None:
        self.names: dict[str, None] = {}
        self._limit = limit

    def learn(self, reply: Message) -> None:
        result = reply.get("result")
        tools = result.get("tools") if isinstance(result, dict) else None
        if isinstance(tools, list):
            self._learn(tools)

    def _learn(self, tools: Iterable[Any]) -> None:
        names = self.names
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                continue
            names.pop(name, None)  # (a tool listed again is learnt afresh: hints may change)
            if repeatable_tool(tool):
                if len(names) >= self._limit:
                    del names[next(iter(names))]
                names[name] = None
