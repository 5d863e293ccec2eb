"""A hand-written legacy stdio MCP server (stdlib + orjson, no SDK) that asks for roots.

Usage:
    python tests/servers/roots_server.py

It speaks only the legacy era (`initialize`; anything else it does not know, `server/discover`
among them, gets -32601). Once initialised by a client declaring roots, it asks `roots/list` at
once, as server-filesystem does (client/roots, Listing Roots). Its tools say what it was told:

- `startup_roots`: the answer to the start-up question (waits for it if it has not come yet);
- `ask_roots`: asks `roots/list` inside the call and returns the answer; afterwards every
  `park` call in flight is answered too;
- `park`: sends one progress notification (when the call has a progress token) and then waits
  for the next `ask_roots` to be answered, so a test can hold a request in flight;
- `level_roots`: the answer to the question it asks before answering `logging/setLevel`.

Each answer is the JSON text of `{"result": ...}` or `{"error": ...}`, as the server got it.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
TOOLS = [
    {"name": name, "description": text, "inputSchema": {"type": "object"}}
    for name, text in (
        ("startup_roots", "The roots the server was given at start-up."),
        ("ask_roots", "Asks roots/list inside the call."),
        ("park", "Waits for the next ask_roots."),
        ("level_roots", "The roots the server was given while setting the log level."),
    )
]


class RootsServer:
    def __init__(self) -> None:
        self.out = sys.stdout.buffer
        self.client_capabilities: dict[str, Any] = {}
        self.startup: dict[str, Any] | None = None
        self.waiting_for_startup: list[object] = []  # call ids
        self.asked: dict[str, object] = {}  # our question's id -> the call it is for
        self.parked: list[object] = []
        self.questions = 0
        self.level_asked: object = None  # the logging/setLevel waiting for its question
        self.level_roots: dict[str, Any] = {"error": "logging/setLevel was never asked"}

    def write(self, msg: dict[str, Any]) -> None:
        self.out.write(orjson.dumps({"jsonrpc": "2.0", **msg}) + b"\n")
        self.out.flush()

    def text(self, call_id: object, answer: dict[str, Any]) -> None:
        content = [{"type": "text", "text": orjson.dumps(answer).decode()}]
        self.write({"id": call_id, "result": {"content": content}})

    def ask(self, for_call: object) -> None:
        self.questions += 1
        qid = f"roots-{self.questions}"
        self.asked[qid] = for_call
        self.write({"id": qid, "method": "roots/list"})

    def on_request(self, msg: dict[str, Any]) -> None:
        method, rid = msg["method"], msg["id"]
        raw = msg.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if method == "initialize":
            caps = params.get("capabilities")
            self.client_capabilities = caps if isinstance(caps, dict) else {}
            asked = params.get("protocolVersion")
            version = asked if asked in LEGACY_VERSIONS else LEGACY_VERSIONS[0]
            result: dict[str, Any] = {
                "protocolVersion": version,
                "capabilities": {"tools": {}, "logging": {}},
                "serverInfo": {"name": "roots-test-server", "version": "1"},
            }
            self.write({"id": rid, "result": result})
        elif method == "tools/list":
            self.write({"id": rid, "result": {"tools": TOOLS}})
        elif method == "tools/call":
            self.on_call(rid, params)
        elif method == "logging/setLevel":
            self.level_asked = rid
            self.write({"id": "roots-setlevel", "method": "roots/list"})
        elif method == "ping":
            self.write({"id": rid, "result": {}})
        else:
            error = {"code": -32601, "message": f"Method not found: {method}"}
            self.write({"id": rid, "error": error})

    def on_call(self, rid: object, params: dict[str, Any]) -> None:
        tool = params.get("name")
        if tool == "startup_roots":
            if self.startup is None:
                self.waiting_for_startup.append(rid)
            else:
                self.text(rid, self.startup)
        elif tool == "ask_roots":
            self.ask(rid)
        elif tool == "level_roots":
            self.text(rid, self.level_roots)
        elif tool == "park":
            meta = params.get("_meta")
            token = meta.get("progressToken") if isinstance(meta, dict) else None
            if token is not None:
                note = {"progressToken": token, "progress": 1, "message": "parked"}
                self.write({"method": "notifications/progress", "params": note})
            self.parked.append(rid)
        else:
            error = {"code": -32602, "message": f"Unknown tool: {tool}"}
            self.write({"id": rid, "error": error})

    def on_response(self, msg: dict[str, Any]) -> None:
        answer: dict[str, Any] = {k: msg[k] for k in ("result", "error") if k in msg}
        if msg["id"] == "roots-startup":
            self.startup = answer
            for rid in self.waiting_for_startup:
                self.text(rid, answer)
            self.waiting_for_startup.clear()
            return
        if msg["id"] == "roots-setlevel":
            self.level_roots = answer
            self.write({"id": self.level_asked, "result": {}})
            return
        call_id = self.asked.pop(str(msg["id"]), None)
        if call_id is None:
            return
        self.text(call_id, answer)
        for parked in self.parked:
            self.text(parked, {"released": True})
        self.parked.clear()

    def on_notification(self, msg: dict[str, Any]) -> None:
        if msg["method"] == "notifications/initialized" and "roots" in self.client_capabilities:
            self.write({"id": "roots-startup", "method": "roots/list"})

    def serve(self) -> None:
        for line in sys.stdin.buffer:
            if not line.strip():
                continue
            msg = orjson.loads(line)
            if "method" not in msg:
                self.on_response(msg)
            elif "id" in msg:
                self.on_request(msg)
            else:
                self.on_notification(msg)


if __name__ == "__main__":
    RootsServer().serve()
