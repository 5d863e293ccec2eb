"""What the gateway has learnt of a backend's tools: the `x-mcp-header` annotations of each.

The HTTP hop needs them to mirror tool arguments into `Mcp-Param-*` headers, and the HTTP front
end needs them to check the headers a client sent.
"""

from __future__ import annotations

import logging
from typing import Any

from gateway.protocol import headers
from gateway.protocol.headers import ParamHeader
from gateway.protocol.jsonrpc import Message

log = logging.getLogger("gateway.catalog")


class ToolHeaders:
    def __init__(self) -> None:
        self._by_tool: dict[str, tuple[ParamHeader, ...]] = {}
        self.loaded = False

    def get(self, tool: str) -> tuple[ParamHeader, ...] | None:
        return self._by_tool.get(tool)

    def learn(self, backend: str, reply: Message, *, drop_invalid: bool) -> None:
        """Record the annotations of a `tools/list` page; optionally remove invalid tools.

        A Streamable HTTP client must leave out tools whose annotations break the rules
        (streamable-http, Schema Extension), so the list is rewritten only in that case.
        """
        result = reply.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return
        kept: list[Any] = []
        for tool in result["tools"]:
            name = tool.get("name") if isinstance(tool, dict) else None
            if not isinstance(name, str):
                kept.append(tool)
                continue
            spec = headers.param_headers(tool.get("inputSchema"))
            if isinstance(spec, str):
                log.warning("backend %s: tool %r left out: %s", backend, name, spec)
                if drop_invalid:
                    continue
                spec = ()
            self._by_tool[name] = spec
            kept.append(tool)
        if len(kept) != len(result["tools"]):
            result["tools"] = kept
