"""How a gateway with a stdio front end ends when its client is done with it
(basic/transports/stdio; basic/lifecycle, Shutdown): at the end of stdin every reply is written
whole before the gateway exits, however slowly the client reads, bounded only against a client
that stops reading; and a client that closes the gateway's stdout ends the gateway at once,
children stopped, with one log line. Real gateway processes over real pipes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway.config import ConfigInvalid, parse
from gateway.frontends.stdio import DRAIN_TIMEOUT
from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    call,
    gateway_command,
    sdk_stdio_command,
    stdio_backend,
)

pytestmark = [pytest.mark.slow]

Message = dict[str, Any]
# The echoed text: its reply carries it twice (content and structured result), ~8 MB in all.
ECHO_BYTES = 4 * 1024 * 1024
# The client's pace: a read of this size, then this pause (~1.3 MB/s). The reply takes longer
# to read than the stdio drain (DRAIN_TIMEOUT), which once cut it.
READ_CHUNK = 64 * 1024
READ_PAUSE = 0.05
# The stall bound the tests configure (shutdown.stdout_stall_timeout).
STALL = 1.0


def _config(tmp_path: Path, shutdown: dict[str, object] | None = None) -> Path:
    doc: dict[str, object] = {
        "listen": {"stdio": True},
        "backends": {"sdk": stdio_backend(sdk_stdio_command())},
    }
    if shutdown is not None:
        doc["shutdown"] = shutdown
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _start(config: Path, stderr: Path, uvloop: bool = True) -> subprocess.Popen[bytes]:
    """The gateway, its stderr to a file (read once it has exited: nothing fills a pipe)."""
    with stderr.open("wb") as err:
        return subprocess.Popen(
            gateway_command(config),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
            env={**os.environ, "MCP_GATEWAY_UVLOOP": "1" if uvloop else "0"},
        )


def _finish(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(BOUND)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


def _send(proc: subprocess.Popen[bytes], msg: Message) -> None:
    assert proc.stdin is not None
    proc.stdin.write(orjson.dumps(msg) + b"\n")
    proc.stdin.flush()


def _read_line(proc: subprocess.Popen[bytes]) -> Message:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # (bounded by the test timeout: the gateway answers first)
    msg: Message = orjson.loads(line)
    return msg


LOOPS = pytest.mark.parametrize("uvloop", [True, False], ids=["uvloop", "asyncio"])


@LOOPS
def test_end_of_input_writes_a_large_reply_whole_to_a_slow_reader(
    tmp_path: Path, uvloop: bool
) -> None:
    """stdin closes while a multi-MB reply is still being read, slowly: the reply arrives whole
    and the gateway exits 0 once it is read, even past the drain (the slow read is the input
    under test, so the test paces its reads)."""
    stderr = tmp_path / "stderr.log"
    proc = _start(_config(tmp_path), stderr, uvloop)
    try:
        text = "x" * ECHO_BYTES
        _send(proc, call("big", "echo", text=text))
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        data = bytearray()
        started = time.monotonic()
        while chunk := os.read(fd, READ_CHUNK):
            data += chunk
            time.sleep(READ_PAUSE)
        took = time.monotonic() - started
        assert proc.wait(BOUND) == 0, stderr.read_text()
        lines = bytes(data).splitlines()
        assert len(lines) == 1, (len(data), took)
        reply = orjson.loads(lines[0])
        assert reply["id"] == "big"
        assert reply["result"]["content"][0]["text"] == text
        assert took > DRAIN_TIMEOUT  # (the reading did outlast the drain)
        assert "Traceback" not in stderr.read_text()
    finally:
        _finish(proc)


@LOOPS
def test_a_client_that_stops_reading_is_given_up_after_the_stall_bound(
    tmp_path: Path, uvloop: bool
) -> None:
    """Nothing of stdout read after the end of stdin: the gateway gives up after
    shutdown.stdout_stall_timeout with one log line and a non-zero status."""
    stderr = tmp_path / "stderr.log"
    proc = _start(_config(tmp_path, {"stdout_stall_timeout": STALL}), stderr, uvloop)
    try:
        _send(proc, call("big", "echo", text="x" * ECHO_BYTES))
        assert proc.stdin is not None
        proc.stdin.close()
        status = proc.wait(START_BOUND + STALL + BOUND)
        log = stderr.read_text()
        assert status == 1, log
        stalled = [line for line in log.splitlines() if "stdout_stall_timeout" in line]
        assert len(stalled) == 1, log
        assert "Traceback" not in log
    finally:
        _finish(proc)


@LOOPS
def test_a_closed_stdout_ends_the_gateway_with_one_line(tmp_path: Path, uvloop: bool) -> None:
    """The client closes its end of the gateway's stdout and sends more: one log line, the
    child stopped, exit 0, no traceback."""
    stderr = tmp_path / "stderr.log"
    proc = _start(_config(tmp_path), stderr, uvloop)
    try:
        _send(proc, call("pid", "whoami"))
        child = int(_read_line(proc)["result"]["content"][0]["text"])
        assert proc.stdout is not None
        proc.stdout.close()
        for n in range(3):
            with contextlib.suppress(BrokenPipeError):  # (it may have gone already)
                _send(proc, call(f"after-{n}", "echo", text="to nobody"))
        assert proc.wait(BOUND + 2 * 2.0) == 0, stderr.read_text()  # (+ the child's stop)
        log = stderr.read_text()
        assert "Traceback" not in log
        assert len([line for line in log.splitlines() if "stdout was closed" in line]) == 1, log
        with pytest.raises(ProcessLookupError):
            os.kill(child, 0)
    finally:
        _finish(proc)


def test_the_stall_bound_is_a_config_key() -> None:
    """shutdown.stdout_stall_timeout: a positive number of seconds, default 10."""
    base: dict[str, object] = {
        "listen": {"stdio": True},
        "backends": {"b": stdio_backend([PYTHON])},
    }
    assert parse(yaml.safe_dump(base)).shutdown.stdout_stall_timeout == 10.0
    doc = {**base, "shutdown": {"stdout_stall_timeout": 2.5}}
    assert parse(yaml.safe_dump(doc)).shutdown.stdout_stall_timeout == 2.5
    with pytest.raises(ConfigInvalid):
        parse(yaml.safe_dump({**base, "shutdown": {"stdout_stall_timeout": 0}}))
