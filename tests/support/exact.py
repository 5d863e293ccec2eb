"""A gateway process with both front ends (HTTP and stdio) in front of
tests/servers/exact_server.py, spoken to in raw bytes: what the client sent and received is
compared as text."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    VERSION,
    Proc,
    gateway_command,
    http_backend,
    stdio_backend,
    write_config,
)

EXACT_SERVER = str(ROOT / "tests" / "servers" / "exact_server.py")
META = (
    b'{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
    b'"io.modelcontextprotocol/clientCapabilities":{}'
)
# Strings (skipped whole) and numbers, in document order.
_TOKENS = re.compile(rb'"(?:[^"\\]++|\\.)*+"|-?[0-9][0-9.eE+-]*')


def numbers_of(text: bytes) -> list[bytes]:
    """The number tokens of a JSON text, outside its strings, as written."""
    return [t.group() for t in _TOKENS.finditer(text) if t.group()[:1] != b'"']


def tool_call(rid: str, tool: str, arguments: bytes, token: str | None = None) -> bytes:
    meta = META + (b',"progressToken":"' + token.encode() + b'"' if token else b"") + b"}"
    return (
        b'{"jsonrpc":"2.0","id":"'
        + rid.encode()
        + b'","method":"tools/call","params":{"name":"'
        + tool.encode()
        + b'","arguments":'
        + arguments
        + b',"_meta":'
        + meta
        + b"}}"
    )


class Gateway:
    """One gateway process listening on HTTP and on its stdin at once."""

    def __init__(self, config: Path) -> None:
        self.proc = Proc(gateway_command(config), stdin=True)
        self.url = self.proc.wait_for(r"listening on (http://\S+)").group(1)

    def send_line(self, line: bytes) -> None:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(line + b"\n")
        stdin.flush()

    def stdout_line(self, pattern: str, timeout: float = START_BOUND) -> bytes:
        """The first stdout line matching `pattern`, as its bytes."""
        return self.proc.wait_for(pattern, stream="stdout", timeout=timeout).string.encode()

    def reply_line(self, rid: str) -> bytes:
        return self.stdout_line(f'"id":"{re.escape(rid)}"[,}}]')

    def log(self) -> str:
        return "\n".join(self.proc.lines["stderr"])


async def post(
    url: str, body: bytes, tool: str, extra: Mapping[str, str] | None = None
) -> tuple[int, list[bytes]]:
    """POST one request (with `extra` headers); the HTTP status and each JSON-RPC message's
    bytes (a JSON body or each SSE event's data)."""
    headers = {
        **(extra or {}),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    timeout = aiohttp.ClientTimeout(total=BOUND)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, data=body, headers=headers) as resp,
    ):
        data = await resp.read()
        if resp.content_type != "text/event-stream":
            return resp.status, [data]
    events = [
        line[5:].strip() for line in data.split(b"\n") if line.startswith(b"data:") and line[5:]
    ]
    return resp.status, events


@contextmanager
def exact_http(*extra: str, transport: str = "http") -> Iterator[str]:
    proc = Proc([PYTHON, EXACT_SERVER, transport, "--port", "0", *extra])
    try:
        port = proc.wait_for(r"READY (\d+)", stream="stdout").group(1)
        yield f"http://127.0.0.1:{port}/" + ("sse" if transport == "sse" else "mcp")
    finally:
        proc.stop()


BACKENDS = ("stdio", "http", "legacy_stdio", "legacy_http", "sse")


@contextmanager
def gateways(directory: Path) -> Iterator[dict[str, Gateway]]:
    """A gateway for each backend transport of the exact server (BACKENDS: stdio, HTTP, and
    both again speaking the legacy era, and the 2024-11-05 HTTP+SSE transport)."""
    with (
        exact_http() as url,
        exact_http("--legacy") as legacy_url,
        exact_http(transport="sse") as sse_url,
    ):
        backends: dict[str, dict[str, object]] = {
            "stdio": stdio_backend([PYTHON, EXACT_SERVER, "stdio"]),
            "http": http_backend(url),
            "legacy_stdio": stdio_backend([PYTHON, EXACT_SERVER, "stdio", "--legacy"]),
            "legacy_http": http_backend(legacy_url),
            "sse": {"sse": {"url": sse_url}},
        }
        started: dict[str, Gateway] = {}
        try:
            for back, backend in backends.items():
                config = write_config(directory, {"exact": backend}, http=True, stdio=True)
                started[back] = Gateway(config)
            yield started
        finally:
            for gateway in started.values():
                gateway.proc.stop()
