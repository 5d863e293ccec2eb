"""A stdio backend that misbehaves, next to a healthy one, behind a gateway run as a process.

Each fault of tests/backends/faults/stdio_fault_server.py is put to the gateway as a backend `bad`
beside a healthy `good` (its tools reach clients as `bad_poke` and `good_poke`). Whatever `bad`
does, a call to it is answered promptly (well under the default timeouts) with a JSON-RPC error
of the gateway's own codes whose message names the backend, `good` is still served, the
gateway's log has no traceback, and a huge line costs bounded memory (basic/transports/stdio:
newline-delimited UTF-8 JSON-RPC on stdout; basic/index, Error Codes; basic/lifecycle, Shutdown
for the stdio transport).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.backends import stdio as stdio_module
from gateway.config import ConfigInvalid, parse
from gateway.config.model import DEFAULT_START_TIMEOUT
from gateway.protocol import codes
from tests.support import (
    BOUND,
    PYTHON,
    Proc,
    call,
    gone,
    messages,
    mirrored_headers,
    start_gateway_http,
    write_config,
)

Message = dict[str, Any]
SERVER = str(Path(__file__).with_name("stdio_fault_server.py"))
# An answer this soon is prompt: far under the default connect (30 s), start (60 s) and request
# (300 s) timeouts, and under what each fault cost before it was handled.
PROMPT = 2.0
MiB = 1024 * 1024


def fault_backend(fault: str, *args: str, **extra: object) -> dict[str, object]:
    return {"stdio": {"command": PYTHON, "args": [SERVER, fault, *args]}, **extra}


class Gateway:
    """A gateway process with the backends `bad` and `good`, and a client for it."""

    def __init__(self, proc: Proc, url: str, session: aiohttp.ClientSession) -> None:
        self.proc = proc
        self.url = url
        self.session = session

    async def post(self, msg: Message) -> Message:
        """The reply to `msg` (notifications on the way are skipped), bounded."""
        with anyio.fail_after(BOUND + 5):
            async with self.session.post(
                self.url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
            ) as resp:
                async for item in messages(resp):
                    if "method" not in item:
                        assert item.get("id") == msg["id"], item
                        return item
        raise AssertionError(f"no reply to {msg['id']!r}")

    async def timed(self, msg: Message) -> tuple[Message, float]:
        started = time.monotonic()
        reply = await self.post(msg)
        return reply, time.monotonic() - started

    async def good_is_served(self) -> None:
        reply = await self.post(call("good", "good_poke"))
        assert reply["result"]["content"][0]["text"].startswith("poked "), reply

    def log(self) -> str:
        return "\n".join(self.proc.lines["stderr"])

    def pids(self, backend: str) -> list[int]:
        """The pids the gateway has started for `backend`, oldest first (from its log)."""
        pattern = re.compile(rf"backend {backend}: started pid (\d+)")
        lines = self.proc.lines["stderr"]
        return [int(m.group(1)) for line in lines if (m := pattern.search(line))]

    def memory(self, field: str) -> int:
        """VmRSS (now) or VmHWM (the peak) of the gateway process, in bytes."""
        status = Path(f"/proc/{self.proc.popen.pid}/status").read_text()
        match = re.search(rf"^{field}:\s+(\d+) kB$", status, re.MULTILINE)
        assert match is not None, status
        return int(match.group(1)) * 1024


@asynccontextmanager
async def gateway(tmp_path: Path, bad: dict[str, object]) -> AsyncIterator[Gateway]:
    backends = {"bad": bad, "good": fault_backend("none")}
    proc, url = start_gateway_http(write_config(tmp_path, backends, http=True))
    try:
        async with aiohttp.ClientSession() as session:
            gw = Gateway(proc, url, session)
            # Both catalogs loaded (a backend broken from its start has none: then only good).
            proc.wait_for(r"catalog of good: 1 tools")
            yield gw
            await gw.good_is_served()
    finally:
        proc.stop()
    log = "\n".join(proc.lines["stderr"])
    assert "Traceback" not in log, log


def assert_error(reply: Message, code: int, took: float, within: float = PROMPT) -> None:
    assert reply.get("error", {}).get("code") == code, reply
    assert "'bad'" in reply["error"]["message"], reply
    assert took < within, (took, reply)


# --- start_timeout ----------------------------------------------------------------------------


def backends_config(**backends: dict[str, object]) -> str:
    return yaml.safe_dump({"listen": {"http": {"port": 0}}, "backends": backends})


def test_start_timeout_has_a_default_and_is_for_stdio_backends_only() -> None:
    default, set_ = parse(
        backends_config(a=fault_backend("none"), b=fault_backend("none", start_timeout=5))
    ).backends
    assert default.start_timeout == DEFAULT_START_TIMEOUT == 60.0
    assert set_.start_timeout == 5.0
    web = {"http": {"url": "http://127.0.0.1:1/mcp"}, "start_timeout": 5}
    with pytest.raises(ConfigInvalid) as caught:
        parse(backends_config(web=web), "gw.yaml")
    (problem,) = caught.value.problems
    assert "backends.web.start_timeout:" in problem, problem


# --- faults -------------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_child_that_exits_at_start_fails_calls_at_once(tmp_path: Path) -> None:
    """The child that served crashes mid-call, and each one started after it exits before it
    answers anything: the backend is down, its calls fail at once (-31001)."""
    bad = fault_backend("crash", "--after", str(tmp_path / "served"))
    async with gateway(tmp_path, bad) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        for rid in (2, 3):
            reply, took = await gw.timed(call(rid, "bad_poke"))
            assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        await gw.good_is_served()


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_child_that_never_answers_its_opening_is_down_after_start_timeout(
    tmp_path: Path,
) -> None:
    """The restarted child reads its opening (the era probe) and answers nothing: after
    start_timeout it is stopped and down (-31001), not waited for until connect_timeout and
    then request_timeout have passed."""
    bad = fault_backend("silent", "--after", str(tmp_path / "served"), start_timeout=1)
    async with gateway(tmp_path, bad) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(1, "bad_poke"))  # the crash mid-call
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        reply, took = await gw.timed(call(2, "bad_poke"))  # waits for the silent opening
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took, within=1 + PROMPT)
        reply, took = await gw.timed(call(3, "bad_poke"))  # down: at once
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        silent = gw.pids("bad")[1]
        await gone(silent)
        await gw.good_is_served()


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_reply_that_is_not_json_rpc_fails_its_call_at_once(tmp_path: Path) -> None:
    """A line that is not JSON is dropped (one log line); a JSON object with the call's id that
    is not JSON-RPC fails that call at once (-31003) without a restart."""
    async with gateway(tmp_path, fault_backend("garbage")) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        for rid in (1, 2):
            reply, took = await gw.timed(call(rid, "bad_poke"))
            assert_error(reply, codes.BACKEND_PROTOCOL_ERROR, took)
        assert len(gw.pids("bad")) == 1


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_huge_line_stops_the_child_with_bounded_memory(tmp_path: Path) -> None:
    """A line past the stdio line limit (64 MiB, stdio.MAX_LINE_BYTES) stops the child: the
    call fails (-31001) once the limit is passed, and the gateway never held much more than
    the limit, nor spent time in its square."""
    limit = stdio_module.MAX_LINE_BYTES
    size = limit + 16 * MiB
    async with gateway(tmp_path, fault_backend("huge", "--size", str(size))) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        before = gw.memory("VmRSS")
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took, within=BOUND)
        assert gw.memory("VmHWM") - before < limit + limit // 2
        await gw.good_is_served()


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_reply_under_a_wrong_id_is_dropped_and_the_call_times_out(
    tmp_path: Path,
) -> None:
    """An answer under an id the gateway never sent belongs to no call: dropped, and the call
    ends at its request_timeout (-31002), never with another call's answer."""
    async with gateway(tmp_path, fault_backend("wrong_id", request_timeout=1)) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert_error(reply, codes.BACKEND_TIMEOUT, took, within=1 + PROMPT)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_child_that_answers_twice_has_its_first_answer_delivered(
    tmp_path: Path,
) -> None:
    """basic/index, Responses: one response per request. The child writes a result, then an
    error for the same id in the same write: the result is delivered, the error dropped (and
    logged), and no later call is given it."""
    async with gateway(tmp_path, fault_backend("twice")) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        for rid in range(1, 6):
            reply = await gw.post(call(rid, "bad_poke"))
            assert "result" in reply, reply
        assert "dropped a second reply" in gw.log()


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_child_that_closes_its_stdout_is_stopped_and_restarted(tmp_path: Path) -> None:
    """basic/transports/stdio: a child whose stdout is closed can answer nothing more. Its call
    fails at once (-31001); the child, still running, is stopped (stdin closed, then SIGTERM)
    and a new one started."""
    async with gateway(tmp_path, fault_backend("closed_stdout")) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        first = gw.pids("bad")[0]
        await gone(first)
        gw.proc.wait_lines(lambda lines: len(gw.pids("bad")) == 2)
        gw.proc.wait_for(r"catalog of bad: 1 tools")


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_reply_that_is_not_utf8_fails_its_call_at_once(tmp_path: Path) -> None:
    """basic/transports/stdio: messages are UTF-8. A reply with other bytes fails its call at
    once with -31003 (as over HTTP), its id read past the bad bytes."""
    async with gateway(tmp_path, fault_backend("bad_utf8")) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert_error(reply, codes.BACKEND_PROTOCOL_ERROR, took)


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_reply_with_a_lone_surrogate_is_answered_at_once(tmp_path: Path) -> None:
    """A lone surrogate escaped in a reply's string (valid JSON that strict parsers refuse):
    the call is answered at once with the reply, the escape as the child wrote it (values the
    gateway does not read pass unchanged: README, Values pass unchanged)."""
    async with gateway(tmp_path, fault_backend("surrogate")) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        msg = call(1, "bad_poke")
        started = time.monotonic()
        with anyio.fail_after(BOUND):
            async with gw.session.post(
                gw.url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
            ) as resp:
                body = await resp.read()
        assert time.monotonic() - started < PROMPT
        assert b'"text":"\\ud800"' in body, body
        assert b'"error"' not in body


@pytest.mark.anyio
@pytest.mark.slow
async def test_an_endless_stderr_line_is_read_in_linear_time(tmp_path: Path) -> None:
    """A child writes 80 MiB to stderr without a newline before it serves: the gateway reads it
    as it comes (in time linear in its length, keeping only its head), so the child is never
    blocked on a full pipe and answers at once; the line is logged cut."""
    async with gateway(tmp_path, fault_backend("stderr_flood", "--size", str(80 * MiB))) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools", timeout=BOUND)
        reply, took = await gw.timed(call(1, "bad_poke"))
        assert "result" in reply, reply
        assert took < PROMPT
        assert re.search(r"e{100}\.\.\. \(\d+ more bytes\)", gw.log())


@pytest.mark.anyio
@pytest.mark.slow
async def test_calls_do_not_wait_out_the_backoff_of_a_child_that_keeps_crashing(
    tmp_path: Path,
) -> None:
    """Each child answers its opening, then exits: it served, so it is restarted with a backoff
    that doubles (to 10 s). A call waits for a restart only a second away (RESTART_WAIT); past
    that it fails at once (-31001) instead of waiting out the backoff."""
    bad = fault_backend("flap", "--after", str(tmp_path / "served"))
    async with gateway(tmp_path, bad) as gw:
        gw.proc.wait_for(r"catalog of bad: 1 tools")
        reply, took = await gw.timed(call(0, "bad_poke"))  # the crash mid-call
        assert_error(reply, codes.BACKEND_UNAVAILABLE, took)
        # Past the first restarts (50 ms doubling), the backoff grows over 3 s: calls made
        # meanwhile are answered at once all the same.
        gw.proc.wait_for(r"restarting in [3-9]\.\d+s")
        for rid in range(1, 4):
            reply, took = await gw.timed(call(rid, "bad_poke"))
            assert_error(
                reply, codes.BACKEND_UNAVAILABLE, took, within=stdio_module.RESTART_WAIT + 1
            )
