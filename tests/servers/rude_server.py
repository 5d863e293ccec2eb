"""A hand-written, badly behaved stdio MCP server (stdlib + orjson, no SDK) for fault tests.

Usage:
    python tests/servers/rude_server.py NOTES_FILE [REQUESTS_FILE]

For every request it first writes a line that is not JSON and a JSON object that is not
JSON-RPC, then the proper reply. `tools/call` of the tool `hang` is never answered.
Every notification received is appended as one JSON line to NOTES_FILE, every request to
REQUESTS_FILE (when given), and both are announced on stderr (`rude: ...`), so a test can wait
for a log line instead of polling a file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

GARBAGE = b"this is not json\n"
NOT_JSONRPC = b'{"hello": "world", "note": "an object that is not JSON-RPC"}\n'
TOOLS = [
    {"name": "ok", "description": "Answers ok.", "inputSchema": {"type": "object"}},
    {"name": "hang", "description": "Never answers.", "inputSchema": {"type": "object"}},
]


def _append(path: Path | None, msg: dict[str, Any]) -> None:
    if path is None:
        return
    with path.open("ab") as f:
        f.write(orjson.dumps(msg) + b"\n")


def _say(text: str) -> None:
    sys.stderr.write(f"rude: {text}\n")
    sys.stderr.flush()


def _result(msg: dict[str, Any]) -> dict[str, Any]:
    if msg.get("method") == "tools/list":
        return {"resultType": "complete", "tools": TOOLS}
    if msg.get("method") == "server/discover":  # a modern server, if a rude one
        return {
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
        }
    return {"resultType": "complete", "content": [{"type": "text", "text": "ok"}]}


def main(argv: list[str]) -> None:
    notes = Path(argv[1])
    requests = Path(argv[2]) if len(argv) > 2 else None
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        try:
            msg = orjson.loads(line)
        except orjson.JSONDecodeError:
            _say("received a line that is not JSON")
            continue
        if not isinstance(msg, dict) or "method" not in msg:
            continue
        if "id" not in msg:
            _append(notes, msg)
            _say(f"notification {msg['method']} {orjson.dumps(msg.get('params')).decode()}")
            continue
        _append(requests, msg)
        params = msg.get("params")
        tool = params.get("name") if isinstance(params, dict) else None
        _say(f"request id={orjson.dumps(msg['id']).decode()} method={msg['method']} tool={tool}")
        if msg["method"] == "tools/call" and tool == "hang":
            continue
        reply = {"jsonrpc": "2.0", "id": msg["id"], "result": _result(msg)}
        out.write(GARBAGE)
        out.write(NOT_JSONRPC)
        out.write(orjson.dumps(reply) + b"\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv)
