"""A hand-written stdio MCP server (stdlib + orjson, no SDK) that matches names and URIs
leniently, as hand-written servers often do, for the policy bypass tests (THREAT_MODEL.md,
Policy bypass).

Usage:
    python tests/servers/lenient_server.py RECORD_FILE

A modern server (server/discover). Names are compared ignoring case, compatibility and width
forms (NFKC), zero-width and soft-hyphen characters, surrounding spaces and Cyrillic letters that
look Latin; URIs with the scheme in any case, every percent-encoding decoded (an encoded slash
too) and dot segments resolved. Whatever it runs, and every notification it gets, is appended as
one JSON line to RECORD_FILE ({"method", "asked", "ran"}), so a test can tell what reached it.

Tools: `secret_read`, `echo` (answers its `text`), `hidden_tool` and `old_name` (for filters
and renames), `admin_tool` (for a `require`). Prompt: `secret_prompt`, `greeting`. Resources:
file:///secret/key, file:///public/readme and the template file:///public/{name}.
"""

from __future__ import annotations

import posixpath
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import orjson

TOOLS = ["secret_read", "echo", "hidden_tool", "old_name", "admin_tool"]
PROMPTS = ["secret_prompt", "greeting"]
RESOURCES = {"file:///secret/key": "THE SECRET", "file:///public/readme": "public text"}
TEMPLATE = "file:///public/{name}"
_INVISIBLE = re.compile("[\u00ad\u200b-\u200f\u2060\ufeff]")
_LOOKALIKES = str.maketrans(
    "\u0430\u0435\u043e\u0440\u0441\u0445\u0410\u0415\u041e\u0420\u0421\u0425", "aeopcxAEOPCX"
)  # Cyrillic that looks Latin
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def lenient(name: str) -> str:
    plain = unicodedata.normalize("NFKC", _INVISIBLE.sub("", name)).translate(_LOOKALIKES)
    return plain.casefold().strip()


def lenient_uri(uri: str) -> str:
    text = unquote(_SCHEME.sub(lambda m: m.group(1).lower() + ":", uri.strip()))
    scheme, sep, rest = text.partition(":///")
    return f"{scheme}{sep}{posixpath.normpath('/' + rest).lstrip('/')}" if sep else text


def find(name: object, names: list[str]) -> str | None:
    if not isinstance(name, str):
        return None
    return next((n for n in names if lenient(n) == lenient(name)), None)


def record(path: Path, method: str, asked: object, ran: object) -> None:
    with path.open("ab") as f:
        f.write(orjson.dumps({"method": method, "asked": asked, "ran": ran}) + b"\n")


def answer(msg: dict[str, Any], path: Path) -> dict[str, Any]:
    method = msg.get("method")
    params = msg.get("params") if isinstance(msg.get("params"), dict) else {}
    assert isinstance(params, dict)
    if method == "server/discover":
        caps: dict[str, Any] = {"tools": {}, "prompts": {}, "resources": {}}
        return {"supportedVersions": ["2026-07-28"], "capabilities": caps}
    if method == "tools/list":
        return {"tools": [{"name": t, "inputSchema": {"type": "object"}} for t in TOOLS]}
    if method == "prompts/list":
        return {"prompts": [{"name": p} for p in PROMPTS]}
    if method == "resources/list":
        return {"resources": [{"uri": u, "name": u} for u in RESOURCES]}
    if method == "resources/templates/list":
        return {"resourceTemplates": [{"uriTemplate": TEMPLATE, "name": "public"}]}
    if method == "tools/call":
        ran = find(params.get("name"), TOOLS)
        record(path, method, params.get("name"), ran)
        arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
        text = f"ran {ran}: {(arguments or {}).get('text', '')}"
        return {"content": [{"type": "text", "text": text}], "isError": ran is None}
    if method == "prompts/get":
        ran = find(params.get("name"), PROMPTS)
        record(path, method, params.get("name"), ran)
        content = {"type": "text", "text": f"prompt {ran}"}
        return {"messages": [{"role": "user", "content": content}]}
    if method == "resources/read":
        uri = params.get("uri")
        ran = lenient_uri(uri) if isinstance(uri, str) else None
        record(path, method, uri, ran)
        text = RESOURCES.get(ran or "", "public text")
        return {"contents": [{"uri": uri, "text": text}]}
    raise LookupError(method)


def main(argv: list[str]) -> None:
    path = Path(argv[1])
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = orjson.loads(line)
        if "id" not in msg:
            record(path, str(msg.get("method")), msg.get("params"), "notification")
            continue
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        try:
            reply["result"] = {"resultType": "complete", **answer(msg, path)}
        except LookupError:
            reply["error"] = {"code": -32601, "message": f"Method not found: {msg.get('method')}"}
        out.write(orjson.dumps(reply) + b"\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv)
