"""A second Ctrl-C (or SIGTERM) while the gateway drains: it stops at once, yet every request in
flight is answered with GATEWAY_SHUTTING_DOWN (basic/transports/streamable-http and stdio: each
request gets its response; basic/patterns/cancellation: the backend's call is cancelled), with
no traceback; the children are stopped and the exit status is non-zero (128 + the signal's
number). Real gateway processes, over Streamable HTTP and over stdio.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.app import HTTP_SHUTDOWN_GRACE
from gateway.frontends.stdio import DRAIN_TIMEOUT
from gateway.protocol import codes
from tests.support import (
    BOUND,
    DEMO_BACKEND,
    START_BOUND,
    Message,
    Proc,
    call,
    gateway_command,
    messages,
    mirrored_headers,
    run_cli,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)
from tests.system.test_drain import interrupt, stdio_gateway, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# A stdio child is stopped within its exit and TERM graces (backends/stdio.py), 2 s each.
CHILD_STOP = 4.0


def assert_stopped_at_once(proc: Proc, child: int, second: float) -> None:
    status = proc.popen.wait(BOUND + CHILD_STOP)
    assert status == 128 + signal.SIGINT, proc.output()
    assert time.monotonic() - second < min(DRAIN_TIMEOUT, HTTP_SHUTDOWN_GRACE) + CHILD_STOP
    assert not any("Traceback" in line for line in proc.lines["stderr"]), proc.output()
    assert any("during the shutdown: stopping at once" in line for line in proc.lines["stderr"])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


async def test_a_second_sigint_over_http_answers_the_call_in_flight(tmp_path: Path) -> None:
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
            replies: dict[str, Message] = {}
            running = anyio.Event()

            async def keep(msg: Message) -> None:
                replies[msg["id"]] = await post(msg, running)

            with anyio.fail_after(START_BOUND):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(keep, call("hold", "hold", token="h", key="second"))
                    await running.wait()
                    first = time.monotonic()
                    interrupt(proc)
                    await anyio.to_thread.run_sync(
                        proc.wait_for, r"received SIGINT, shutting down", "stderr", BOUND
                    )
                    interrupt(proc)
                    second = time.monotonic()
        assert replies["hold"]["error"]["code"] == codes.GATEWAY_SHUTTING_DOWN
        assert time.monotonic() - first < HTTP_SHUTDOWN_GRACE  # not at the grace's end
        assert_stopped_at_once(proc, child, second)
    finally:
        proc.stop()


def test_a_second_sigint_over_stdio_answers_the_call_in_flight(tmp_path: Path) -> None:
    proc, send, line = stdio_gateway(tmp_path)
    try:
        send(call("pid", "whoami"))
        child = int(text_of(line(r'"id":"pid"', START_BOUND)))
        send(call("hold", "hold", token="hold-token", key="second"))
        line(r'"progressToken":"hold-token"')
        first = time.monotonic()
        interrupt(proc)
        proc.wait_for(r"received SIGINT, shutting down", "stderr", BOUND)
        interrupt(proc)
        second = time.monotonic()
        cut = line(r'"id":"hold"', BOUND)
        assert cut["error"]["code"] == codes.GATEWAY_SHUTTING_DOWN
        assert time.monotonic() - first < DRAIN_TIMEOUT  # not at the drain's end
        assert_stopped_at_once(proc, child, second)
    finally:
        proc.stop()


def test_an_error_before_serving_is_still_one_line_and_exit_2(tmp_path: Path) -> None:
    """The signals are watched from the start of serving to the end, around the gateway: an
    error of its start (an address already taken) still ends `run` with its one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = {"http": {"host": "127.0.0.1", "port": taken.getsockname()[1]}}
        config = tmp_path / "gateway.yaml"
        config.write_text(yaml.safe_dump({"listen": listen, "backends": {"demo": DEMO_BACKEND}}))
        done = run_cli("run", "--config", str(config))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: listen.http:"), done.stderr
