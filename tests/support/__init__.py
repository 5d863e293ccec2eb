"""Real processes for tests: start, wait for a line with a bound, stop without leaks."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import aiohttp
import anyio
import orjson
import pytest
import yaml
from aiohttp import web
from mcp import Client

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SDK_SERVER = str(ROOT / "tests" / "servers" / "sdk_server.py")
RUDE_SERVER = str(ROOT / "tests" / "servers" / "rude_server.py")
VERSION = "2026-07-28"
# The per-request `_meta` every modern request carries (basic/index, `_meta`).
META: dict[str, Any] = {
    "io.modelcontextprotocol/protocolVersion": VERSION,
    "io.modelcontextprotocol/clientCapabilities": {},
}
Message = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Every wait in the suite is bounded by this; nothing sleeps.
BOUND = 5.0
# CI sets CI=true: there a component the tests need must be present (.ci/run installs it).
IN_CI = os.environ.get("CI") == "true"


def missing(component: str, install: str) -> NoReturn:
    """A component a test needs is not here: skip saying which (outside CI), fail in CI."""
    reason = f"{component} is missing ({install})"
    if IN_CI:
        pytest.fail(reason + "; CI must have it", pytrace=False)
    pytest.skip(reason)


async def gone(pid: int) -> None:
    """Wait, bounded, for a process to exit: its pidfd becomes readable then (an event, not a
    poll; a zombie has exited)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        with anyio.fail_after(BOUND):
            await anyio.wait_readable(fd)
    finally:
        os.close(fd)


# Process start-up (interpreter + imports) is slower than a wait on an event; still bounded.
START_BOUND = 20.0


async def until(
    ready: Callable[[], bool],
    *,
    within: float = BOUND,
    wake: Callable[[], Awaitable[object]] | None = None,
    every: float = 0.0,
) -> None:
    """The suite's one bounded wait for a state: returns once `ready()` holds, TimeoutError
    after `within` seconds. Between looks it awaits `wake()`, an event of the thing looked at;
    a state with no event of its own is looked at again after `every` seconds (0: after a
    yield to the loop, for one in this process; some ms for one another process changes)."""
    with anyio.fail_after(within):
        while not ready():
            if wake is not None:
                await wake()
            elif every:
                await anyio.sleep(every)
            else:
                await anyio.lowlevel.checkpoint()


class Proc:
    """A child process whose stdout/stderr lines are collected by threads, so pipes never fill."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        own_group: bool = False,
    ):
        """`own_group`: the process leads a process group of its own, which a test can signal
        as a terminal signals its foreground group (os.killpg) without reaching pytest."""
        self.args = list(args)
        self.popen = subprocess.Popen(
            self.args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            process_group=0 if own_group else None,
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._changed = threading.Condition()
        self._closed = 0
        for name in ("stdout", "stderr"):
            stream = getattr(self.popen, name)
            threading.Thread(target=self._pump, args=(name, stream), daemon=True).start()

    def _pump(self, name: str, stream: object) -> None:
        for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
            with self._changed:
                self.lines[name].append(raw.decode(errors="replace").rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._closed += 1
            self._changed.notify_all()

    def wait_for(
        self, pattern: str, stream: str = "stderr", timeout: float = START_BOUND
    ) -> re.Match[str]:
        regex = re.compile(pattern)
        with self._changed:
            end = time.monotonic() + timeout
            while True:
                for line in self.lines[stream]:
                    if m := regex.search(line):
                        return m
                left = end - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and self._drained()):
                    raise AssertionError(
                        f"{pattern!r} not seen on {stream} of {self.args}:\n" + self.output()
                    )
                self._changed.wait(min(left, 0.5))

    def wait_lines(
        self, done: Callable[[list[str]], bool], stream: str = "stderr", timeout: float = BOUND
    ) -> list[str]:
        """The lines of `stream` once `done(lines)` holds (e.g. a count reached), bounded."""
        with self._changed:
            end = time.monotonic() + timeout
            while not done(self.lines[stream]):
                left = end - time.monotonic()
                if left <= 0 or (self.popen.poll() is not None and self._drained()):
                    raise AssertionError(f"not seen on {stream} of {self.args}:\n{self.output()}")
                self._changed.wait(min(left, 0.5))
            return list(self.lines[stream])

    def _drained(self) -> bool:
        return self._closed == 2

    def output(self) -> str:
        return "\n".join(self.lines["stdout"] + ["--- stderr ---"] + self.lines["stderr"])

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(BOUND)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(BOUND)
        for stream in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            if stream is not None:
                stream.close()
        return self.popen.returncode


def start_sdk_http(*extra: str) -> tuple[Proc, str]:
    proc = Proc([PYTHON, SDK_SERVER, "http", "--port", "0", *extra])
    port = proc.wait_for(r"READY (\d+)", stream="stdout").group(1)
    return proc, f"http://127.0.0.1:{port}/mcp"


def sdk_stdio_command(*extra: str) -> list[str]:
    return [PYTHON, SDK_SERVER, "stdio", *extra]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGS` to its end, at the default log level (what a newcomer sees)."""
    return subprocess.run(
        [PYTHON, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=START_BOUND,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's only stderr line: exit status 2, no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# The bundled demo server as a stdio backend, run by the gateway's own interpreter.
DEMO_BACKEND: dict[str, object] = {
    "stdio": {"command": "${MCP_GATEWAY_PYTHON}", "args": ["-m", "gateway.demo.server"]}
}


def stdio_backend(command: Sequence[str], **extra: object) -> dict[str, object]:
    return {"stdio": {"command": command[0], "args": list(command[1:])}, **extra}


# The demo server as a backend of an in-process gateway (no ${MCP_GATEWAY_PYTHON}: only the CLI
# sets it).
DEMO_STDIO = stdio_backend([PYTHON, "-m", "gateway.demo.server"])


async def tool_names(client: Client) -> list[str]:
    """Every tool name a client is shown, page after page."""
    names: list[str] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        names += [t.name for t in page.tools]
        if (cursor := page.next_cursor) is None:
            return names


def http_backend(url: str, **extra: object) -> dict[str, object]:
    return {"http": {"url": url}, **extra}


def write_config(
    directory: Path,
    backends: dict[str, dict[str, object]],
    *,
    http: bool,
    stdio: bool = False,
    http_extra: dict[str, object] | None = None,
) -> Path:
    listen: dict[str, object] = {}
    if http:
        listen["http"] = {"host": "127.0.0.1", "port": 0, "path": "/mcp", **(http_extra or {})}
    if stdio:
        listen["stdio"] = True
    path = directory / f"gateway-{len(list(directory.glob('gateway-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({"listen": listen, "backends": backends}))
    return path


def gateway_command(config: Path, *extra: str) -> list[str]:
    return [PYTHON, "-m", "gateway", "run", "--config", str(config), "--log-level", "debug", *extra]


def start_gateway_http(config: Path) -> tuple[Proc, str]:
    proc = Proc(gateway_command(config))
    url = proc.wait_for(r"listening on (http://\S+)").group(1)
    return proc, url


def request(
    rid: int | str, method: str, params: dict[str, Any] | None = None, token: object = None
) -> Message:
    """A modern request; `token` becomes `_meta.progressToken`."""
    req_meta = dict(META)
    if token is not None:
        req_meta["progressToken"] = token
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "method": method,
        "params": {**(params or {}), "_meta": req_meta},
    }


def call(rid: int | str, tool: str, token: object = None, **arguments: Any) -> Message:
    return request(rid, "tools/call", {"name": tool, "arguments": arguments}, token)


def mirrored_headers(msg: Message) -> dict[str, str]:
    """The headers a Streamable HTTP client sends with `msg` (streamable-http, Request Metadata)."""
    out = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": msg["method"],
    }
    source = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}.get(
        msg["method"]
    )
    if source is not None:
        out["Mcp-Name"] = msg["params"][source]
    return out


@asynccontextmanager
async def serve_http(handler: Handler, path: str = "/mcp") -> AsyncIterator[str]:
    """A tiny HTTP server on 127.0.0.1 answering `path` with `handler`; yields its base URL.
    Handlers are cancelled when their client disconnects, as a real server's work would be."""
    app = web.Application()
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        with anyio.CancelScope(shield=True):
            await runner.cleanup()


async def messages(resp: aiohttp.ClientResponse) -> AsyncIterator[Message]:
    """Every JSON-RPC message of a response: one JSON body, or each SSE event until the body
    ends (comments and `event:` lines carry no message)."""
    if resp.content_type == "application/json":
        yield orjson.loads(await resp.read())
        return
    assert resp.status == 200, resp.status
    assert resp.content_type == "text/event-stream", resp.content_type
    data: list[bytes] = []
    async for raw in resp.content:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield orjson.loads(b"\n".join(data))
                data = []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
    assert not data, f"the stream ended inside an event: {data!r}"


def dead_url() -> str:
    """An MCP URL on a loopback port where nothing listens (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"


@pytest.fixture(
    name="anyio_backend",
    scope="module",
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ],
)
def both_event_loops(request: pytest.FixtureRequest) -> object:
    """Import into a test module to run its async tests on asyncio and on uvloop, whose
    transports differ from asyncio's own (the gateway runs on uvloop when installed)."""
    param: object = request.param
    return param
