"""A stateful stdio backend on the official `mcp` SDK (dual era, MCPServer): what it answers
depends on what this process was asked before, as with servers that keep state per client.

Usage:
    python tests/servers/counter_server.py

Tools:
- `count`: how many times `count` was called in this process, with the process's pid
  (structured: {"pid": N, "count": M}).
"""

from __future__ import annotations

import os
import warnings

from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPDeprecationWarning

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)


def build_server() -> MCPServer:
    mcp = MCPServer("counter", version="1.0.0", log_level="WARNING")
    calls = {"count": 0}

    @mcp.tool()
    def count() -> dict[str, int]:
        """How many times this process was asked, and its pid."""
        calls["count"] += 1
        return {"pid": os.getpid(), "count": calls["count"]}

    return mcp


if __name__ == "__main__":
    build_server().run("stdio")
