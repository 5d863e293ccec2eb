"""A gateway process as an orchestrator sees it: started from a config file, asked on its
health routes, sent an MCP request, signalled. Plain urllib without proxies: only loopback."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson

from tests.support import BOUND, PYTHON, Proc, mirrored_headers

# No proxy from the environment between the test and the gateway on loopback.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Started:
    """The process and its addresses, once every backend's catalog is loaded (so /readyz can
    be 200: ready means every backend reachable)."""

    def __init__(self, proc: Proc, admin: str, mcp: str) -> None:
        self.proc = proc
        self.admin = admin  # http://127.0.0.1:PORT
        self.mcp = mcp  # http://127.0.0.1:PORT/mcp


def start(config: Path, *args: str, env: dict[str, str] | None = None) -> Started:
    """`run --config CONFIG ARGS` (e.g. --watch), waited for until its backends are loaded;
    the caller stops it (`proc.stop()`)."""
    command = [PYTHON, "-m", "gateway", "run", "--config", str(config), "--log-level", "debug"]
    proc = Proc([*command, *args], env=env)
    try:
        admin = proc.wait_for(r"admin listener .* on (http://\S+)").group(1)
        mcp = proc.wait_for(r"listening on (http://\S+)").group(1)
        proc.wait_for(r"catalog of \S+: \d+ tools")
    except BaseException:
        proc.stop()
        raise
    return Started(proc, admin, mcp)


def status(url: str) -> int:
    """The status of a GET (an error status too)."""
    try:
        with DIRECT.open(url, timeout=BOUND) as resp:
            code: int = resp.status
            return code
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def post(
    url: str, message: dict[str, Any], extra: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """A Streamable HTTP POST (with `extra` headers): its status and the JSON-RPC reply (JSON,
    or the last event of an SSE reply)."""
    data = orjson.dumps(message)
    headers = {**mirrored_headers(message), **(extra or {})}
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with DIRECT.open(req, timeout=BOUND) as resp:
            code, kind, body = resp.status, resp.headers.get_content_type(), resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, orjson.loads(exc.read())
    if kind == "text/event-stream":
        body = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")][-1]
    reply = orjson.loads(body)
    assert isinstance(reply, dict)
    return code, reply
