"""The stdio front end when stdin or stdout is a regular file or /dev/null, not a pipe
(basic/transports/stdio): `mcp-transparent-gateway run < requests.jsonl > replies.jsonl` answers
every request and exits 0 at the end of input, on uvloop and on asyncio's own loop.

Those descriptors cannot be watched by epoll; uvloop used to hand them to libuv, which aborted
the process (SIGABRT, exit 134) before a single line was read.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import (
    START_BOUND,
    call,
    gateway_command,
    request,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.slow]

LOOPS = [pytest.param("1", id="uvloop"), pytest.param("0", id="asyncio")]


@pytest.fixture(name="config")
def _config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path, {"sdk": stdio_backend(sdk_stdio_command())}, http=False, stdio=True
    )


def run_gateway(
    config: Path, stdin: Any, stdout: Any, uvloop: str
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        gateway_command(config),
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env={**os.environ, "MCP_GATEWAY_UVLOOP": uvloop},
        timeout=START_BOUND,
        check=False,
    )


@pytest.mark.parametrize("uvloop", LOOPS)
def test_requests_from_a_file_get_every_reply_in_a_file(
    config: Path, tmp_path: Path, uvloop: str
) -> None:
    """basic/transports/stdio: every request line read from a file is answered on stdout (a
    file), including a call still running when the input ends; then the gateway exits 0."""
    requests = [
        request("list", "tools/list"),
        call("echo", "echo", text="from a file"),
        call("slow", "slow", seconds=0.3, steps=1),
    ]
    source = tmp_path / "requests.jsonl"
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in requests))
    target = tmp_path / "replies.jsonl"
    with source.open("rb") as stdin, target.open("wb") as stdout:
        done = run_gateway(config, stdin, stdout, uvloop)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    replies = {msg["id"]: msg for msg in map(orjson.loads, target.read_bytes().splitlines())}
    assert set(replies) == {"list", "echo", "slow"}
    assert any(t["name"] == "echo" for t in replies["list"]["result"]["tools"])
    assert replies["echo"]["result"]["content"][0]["text"] == "from a file"
    assert replies["slow"]["result"]["content"][0]["text"] == "done"


@pytest.mark.parametrize("uvloop", LOOPS)
def test_stdin_from_dev_null_exits_zero(config: Path, tmp_path: Path, uvloop: str) -> None:
    """basic/transports/stdio: an input that is empty from the start (/dev/null) is the end of
    the client's input, a clean shutdown with nothing written to stdout."""
    target = tmp_path / "replies.jsonl"
    with target.open("wb") as stdout:
        done = run_gateway(config, subprocess.DEVNULL, stdout, uvloop)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert target.read_bytes() == b""


@pytest.mark.parametrize("uvloop", LOOPS)
def test_stdout_to_dev_null_serves_and_exits_zero(
    config: Path, tmp_path: Path, uvloop: str
) -> None:
    """basic/transports/stdio: replies written to /dev/null (a character device, not a
    terminal) go nowhere, and the gateway serves the input and exits 0."""
    source = tmp_path / "requests.jsonl"
    source.write_bytes(orjson.dumps(call("echo", "echo", text="lost")) + b"\n")
    with source.open("rb") as stdin:
        done = run_gateway(config, stdin, subprocess.DEVNULL, uvloop)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"stdin closed, shutting down" in done.stderr
