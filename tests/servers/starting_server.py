"""A hand-written modern stdio MCP server (stdlib + orjson, no SDK) for start-up tests.

Usage:
    python tests/servers/starting_server.py serve [--delay SECONDS] [--stderr LINE ...]
    python tests/servers/starting_server.py exit CODE [STDERR_LINE ...]

`serve` waits SECONDS before it reads anything (a first `npx`/`uvx` run, a loaded machine),
then serves: `server/discover`, one tool `hello` (answers "hello from PID"), and `initialize`
refused with UnsupportedProtocolVersionError naming its versions, as a modern-only server
does (basic/versioning, Backward Compatibility with Initialization-Based Versions).
With `--stderr`, it first writes each LINE to stderr (the lines may hold any character but
a newline), as servers log. `exit` writes its lines to stderr and exits with CODE at once,
reading nothing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import orjson

VERSION = "2026-07-28"
TOOLS = [{"name": "hello", "description": "Says hello.", "inputSchema": {"type": "object"}}]


def answer(msg: dict[str, Any]) -> dict[str, Any]:
    method = msg.get("method")
    if method == "initialize":
        error = {
            "code": -32022,
            "message": "Unsupported protocol version",
            "data": {"supported": [VERSION], "requested": "2025-11-25"},
        }
        return {"jsonrpc": "2.0", "id": msg["id"], "error": error}
    if method == "server/discover":
        result: dict[str, Any] = {
            "supportedVersions": [VERSION],
            "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "starting", "version": "1"}},
        }
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": f"hello from {os.getpid()}"}]}
    else:
        error = {"code": -32601, "message": f"Method not found: {method}"}
        return {"jsonrpc": "2.0", "id": msg["id"], "error": error}
    return {"jsonrpc": "2.0", "id": msg["id"], "result": {"resultType": "complete", **result}}


def serve(delay: float, stderr: list[str]) -> None:
    for text in stderr:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()
    time.sleep(delay)  # the slow start itself: nothing is read meanwhile
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = orjson.loads(line)
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue  # notifications (cancellations of a probe it was slow to read) included
        out.write(orjson.dumps(answer(msg)) + b"\n")
        out.flush()


def main(argv: list[str]) -> None:
    if argv[1] == "exit":
        for text in argv[3:]:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()
        sys.exit(int(argv[2]))
    delay, stderr, rest = 0.0, [], argv[2:]
    while rest:
        flag, value, *rest = rest
        if flag == "--delay":
            delay = float(value)
        elif flag == "--stderr":
            stderr.append(value)
    serve(delay, stderr)


if __name__ == "__main__":
    main(sys.argv)
