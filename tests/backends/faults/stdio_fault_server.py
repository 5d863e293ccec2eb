"""A hand-written modern stdio MCP server (stdlib + orjson, no SDK) that misbehaves on demand.

Usage:
    python tests/backends/faults/stdio_fault_server.py FAULT [--size BYTES] [--after FILE]

It answers `server/discover`, `tools/list` (one tool, `poke`) and the `tools/call` of `poke`
("poked PID") like any modern server, except for what FAULT makes it do:

- `none`: nothing wrong (the healthy neighbour of a faulty backend);
- `crash`: writes one stderr line and exits with code 3 before reading anything;
- `silent`: reads every line and answers none, its opening included;
- `flap`: answers its first request (the era probe), then exits (it opens, then crashes);
- `stderr_flood`: first writes BYTES (default 80 MiB) to stderr without a newline, then serves;
- and at each `tools/call`, instead of the reply:
  - `garbage`: a line that is not JSON, then a JSON object with the call's id that is not
    JSON-RPC;
  - `huge`: a line of BYTES (default 80 MiB) with no end, then it sleeps on;
  - `wrong_id`: the reply, under an id it was never sent;
  - `twice`: the reply (a result), then an error for the same id, in one write;
  - `closed_stdout`: nothing; it closes its stdout and keeps running (stdin's end and SIGTERM
    aside, which end it as usual);
  - `bad_utf8`: the reply, with bytes in a string that are not UTF-8;
  - `surrogate`: the reply, with a lone surrogate (`\\ud800`) escaped in a string.

With `--after FILE`, the fault waits for a restart: while FILE does not exist the server is
healthy, and its first `tools/call` creates FILE and exits (a crash mid-call); the children
started after that have the fault (`crash`, `silent` and `flap` then strike a child that had
served).

Every request's method is announced on stderr (`fault: METHOD`), so a test can wait for it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

VERSION = "2026-07-28"
TOOLS = [{"name": "poke", "description": "Answers poked PID.", "inputSchema": {"type": "object"}}]
CALL_FAULTS = (
    "garbage",
    "huge",
    "wrong_id",
    "twice",
    "closed_stdout",
    "bad_utf8",
    "surrogate",
)
FAULTS = ("none", "crash", "silent", "flap", "stderr_flood", *CALL_FAULTS)
MiB = 1024 * 1024


def say(text: str) -> None:
    sys.stderr.write(f"fault: {text}\n")
    sys.stderr.flush()


def result(id_: object, value: dict[str, Any]) -> bytes:
    reply = {"jsonrpc": "2.0", "id": id_, "result": {"resultType": "complete", **value}}
    return orjson.dumps(reply) + b"\n"


def answer(msg: dict[str, Any]) -> bytes:
    method = msg.get("method")
    if method == "server/discover":
        info = {"io.modelcontextprotocol/serverInfo": {"name": "fault", "version": "1"}}
        return result(
            msg["id"],
            {"supportedVersions": [VERSION], "capabilities": {"tools": {}}, "_meta": info},
        )
    if method == "tools/list":
        return result(msg["id"], {"tools": TOOLS})
    if method == "tools/call":
        return result(msg["id"], {"content": [{"type": "text", "text": f"poked {os.getpid()}"}]})
    error = {"code": -32601, "message": f"Method not found: {method}"}
    return orjson.dumps({"jsonrpc": "2.0", "id": msg["id"], "error": error}) + b"\n"


def misbehave(fault: str, msg: dict[str, Any], size: int) -> bytes | None:
    """What the child writes for a `tools/call` under `fault` (None: nothing, it has stopped)."""
    id_ = msg["id"]
    text = orjson.dumps(id_)
    if fault == "garbage":
        return b"\x00\x01 this is not json\n" + b'{"id": ' + text + b', "answer": "not JSON-RPC"}\n'
    if fault == "huge":
        out = sys.stdout.buffer
        block = b"x" * MiB
        for _ in range(size // MiB):
            out.write(block)
        out.flush()
        time.sleep(3600)
        return None
    if fault == "wrong_id":
        return result(f"wrong-{id_}", {"content": []})
    if fault == "twice":
        error = {"code": -32603, "message": "a second answer"}
        second = orjson.dumps({"jsonrpc": "2.0", "id": id_, "error": error}) + b"\n"
        return answer(msg) + second
    if fault == "closed_stdout":
        sys.stdout.flush()
        os.close(1)
        time.sleep(3600)  # still running, its stdout closed
        return None
    if fault == "bad_utf8":
        return raw_reply(text, b"\xff\xfe")
    assert fault == "surrogate"
    return raw_reply(text, b"\\ud800")


def raw_reply(id_: bytes, text: bytes) -> bytes:
    """A reply whose one text is `text` as it is, written as JSON but not checked by orjson."""
    content = b'{"content":[{"type":"text","text":"' + text + b'"}]}'
    return b'{"jsonrpc":"2.0","id":' + id_ + b',"result":' + content + b"}\n"


def serve(fault: str, size: int, after: Path | None) -> None:
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = orjson.loads(line)
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue  # notifications
        say(str(msg["method"]))
        if after is not None and msg["method"] == "tools/call":
            after.touch()
            sys.exit(1)
        if fault == "silent":
            continue
        if fault in CALL_FAULTS and msg["method"] == "tools/call":
            reply = misbehave(fault, msg, size)
        else:
            reply = answer(msg)
        if reply is not None:
            out.write(reply)
            out.flush()
        if fault == "flap":
            sys.exit(2)


def main(argv: list[str]) -> None:
    fault = argv[1]
    if fault not in FAULTS:
        raise SystemExit(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")
    options = dict(zip(argv[2::2], argv[3::2], strict=True))
    size = int(options.get("--size", 0))
    after = Path(options["--after"]) if "--after" in options else None
    if after is not None and not after.exists():
        serve("none", 0, after)
        return
    if fault == "crash":
        say("crashing at start")
        sys.exit(3)
    if fault == "stderr_flood":
        sys.stderr.buffer.write(b"e" * (size or 80 * MiB))
        sys.stderr.flush()
    serve(fault, size or 80 * MiB, None)


if __name__ == "__main__":
    main(sys.argv)
