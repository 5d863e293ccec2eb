"""Ctrl-C in a terminal (SIGINT to the gateway's whole process group): stdio children run in a
process group of their own, so they keep serving while the gateway drains; a request that ends
within the drain gets its result, and one still running when the drain ends gets a
GATEWAY_SHUTTING_DOWN error before the gateway exits 0 (basic/patterns/cancellation: the
backend's call is cancelled; basic/transports/stdio and streamable-http: every request is
answered). Over the stdio front end and over Streamable HTTP, each a real gateway process.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.app import HTTP_SHUTDOWN_GRACE, Gateway
from gateway.backends import stdio
from gateway.config import parse
from gateway.frontends.stdio import DRAIN_TIMEOUT
from gateway.protocol import codes
from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    Message,
    Proc,
    call,
    gateway_command,
    gone,
    messages,
    mirrored_headers,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# The slow call ends within the drain, well after the signal.
SLOW_SECONDS = 2.0


def stdio_gateway(
    tmp_path: Path,
) -> tuple[Proc, Callable[[Message], None], Callable[..., Message]]:
    """A gateway process with a stdio front end in front of the SDK server; `send` writes a
    message line to its stdin, `line` waits (bounded) for a stdout line matching a pattern."""
    config = write_config(
        tmp_path, {"sdk": stdio_backend(sdk_stdio_command())}, http=False, stdio=True
    )
    proc = Proc(gateway_command(config), stdin=True, own_group=True)
    stdin = proc.popen.stdin
    assert stdin is not None

    def send(msg: Message) -> None:
        stdin.write(orjson.dumps(msg) + b"\n")
        stdin.flush()

    def line(pattern: str, timeout: float = BOUND) -> Message:
        found: Message = orjson.loads(proc.wait_for(pattern, "stdout", timeout).string)
        return found

    return proc, send, line


def text_of(reply: Message) -> str:
    assert "result" in reply, reply
    text: str = reply["result"]["content"][0]["text"]
    return text


def interrupt(proc: Proc) -> None:
    """What a terminal's Ctrl-C does: SIGINT to every process of the foreground group."""
    os.killpg(os.getpgid(proc.popen.pid), signal.SIGINT)


def assert_child_in_its_own_group(proc: Proc, child_pid: int) -> None:
    assert os.getpgid(child_pid) != os.getpgid(proc.popen.pid)


def test_stdio_front_end_drains_on_sigint_and_answers_what_the_drain_cuts(
    tmp_path: Path,
) -> None:
    proc, send, line = stdio_gateway(tmp_path)
    try:
        send(call("pid", "whoami"))
        child = int(text_of(line(r'"id":"pid"', START_BOUND)))
        assert_child_in_its_own_group(proc, child)
        send(call("slow", "slow", token="slow-token", seconds=SLOW_SECONDS, steps=2))
        send(call("hold", "hold", token="hold-token", key="cut"))
        line(r'"progressToken":"slow-token"')  # both calls are running in the child
        line(r'"progressToken":"hold-token"')
        interrupt(proc)
        slow = line(r'"id":"slow"', SLOW_SECONDS + BOUND)
        assert text_of(slow) == "done"  # the child survived the signal and finished it
        cut = line(r'"id":"hold"', DRAIN_TIMEOUT + BOUND)
        assert cut["error"]["code"] == codes.GATEWAY_SHUTTING_DOWN
        assert proc.popen.wait(BOUND) == 0, proc.output()
    finally:
        proc.stop()


async def test_http_front_end_drains_on_sigint_and_answers_what_the_grace_cuts(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path, {"sdk": stdio_backend(sdk_stdio_command())}, http=True)
    proc = Proc(gateway_command(config), own_group=True)
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        async with aiohttp.ClientSession() as client:

            async def post(msg: Message, running: anyio.Event | None = None) -> Message:
                async with client.post(
                    url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
                ) as resp:
                    async for got in messages(resp):
                        if got.get("method") == "notifications/progress" and running:
                            running.set()
                        elif got.get("id") == msg["id"]:
                            return got
                raise AssertionError(f"no reply to {msg['id']}")

            child = int(text_of(await post(call("pid", "whoami"))))
            assert_child_in_its_own_group(proc, child)
            replies: dict[str, Any] = {}
            slow_running, hold_running = anyio.Event(), anyio.Event()

            async def keep(msg: Message, running: anyio.Event) -> None:
                replies[msg["id"]] = await post(msg, running)

            with anyio.fail_after(SLOW_SECONDS + HTTP_SHUTDOWN_GRACE + 2 * BOUND):
                async with anyio.create_task_group() as tg:
                    slow = call("slow", "slow", token="s", seconds=SLOW_SECONDS, steps=2)
                    tg.start_soon(keep, slow, slow_running)
                    tg.start_soon(keep, call("hold", "hold", token="h", key="cut"), hold_running)
                    await slow_running.wait()
                    await hold_running.wait()
                    interrupt(proc)
        assert text_of(replies["slow"]) == "done"
        assert replies["hold"]["error"]["code"] == codes.GATEWAY_SHUTTING_DOWN
        assert proc.popen.wait(BOUND) == 0, proc.output()
    finally:
        proc.stop()


class _Grandchild(logging.Handler):
    """The pid the stubborn child reports on stderr (which the gateway logs)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.pid = 0
        self.seen = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        words = record.getMessage().split()
        if words[:1] == ["grandchild"]:
            self.pid = int(words[1])
            self.seen.set()


async def test_shutdown_signals_reach_what_the_child_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child that ignores the end of stdin and SIGTERM, and has started a process of its own
    (npx runs node so): SIGTERM and then SIGKILL go to the child's process group, so nothing it
    started outlives the gateway (basic/transports/stdio, Shutdown)."""
    monkeypatch.setattr(stdio, "EXIT_GRACE", 0.2)
    monkeypatch.setattr(stdio, "TERM_GRACE", 0.2)
    command = [PYTHON, str(ROOT / "tests" / "servers" / "stubborn_server.py")]
    config = {
        "listen": {"http": {"host": "127.0.0.1", "port": 0}},
        "backends": {"stubborn": {**stdio_backend(command), "era": "modern"}},
    }
    child_log = logging.getLogger("gateway.backend.stubborn")
    report = _Grandchild()
    child_log.addHandler(report)
    level = child_log.level
    child_log.setLevel(logging.INFO)
    try:
        async with Gateway(parse(yaml.safe_dump(config))):
            with anyio.fail_after(START_BOUND):
                await report.seen.wait()
            pidfd = os.pidfd_open(report.pid)  # (held: the pid cannot be reused meanwhile)
    finally:
        child_log.removeHandler(report)
        child_log.setLevel(level)
    try:
        await gone(report.pid)
    finally:
        os.close(pidfd)
