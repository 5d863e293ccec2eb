"""The stdio front end of a real gateway process, spoken to in raw lines (basic/transports/stdio):
framing errors, stdout hygiene, cancellation (basic/patterns/cancellation), progress tokens and
shutdown by closing stdin.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import (
    BOUND,
    RUDE_SERVER,
    START_BOUND,
    Proc,
    call,
    dead_url,
    gateway_command,
    http_backend,
    request,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.slow]

Message = dict[str, Any]


def text_of(reply: Message) -> str:
    assert "result" in reply, reply
    text: str = reply["result"]["content"][0]["text"]
    return text


class StdioGateway:
    """A gateway process with a stdio front end; requests use string ids, so each reply line is
    found by its `"id":"..."` text (orjson writes compact JSON)."""

    def __init__(self, config: Path) -> None:
        self.proc = Proc(gateway_command(config), stdin=True)
        self.answered_once = False

    def send_raw(self, line: bytes) -> None:
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.write(line + b"\n")
        stdin.flush()

    def send(self, msg: Message) -> None:
        self.send_raw(orjson.dumps(msg))

    def wait_line(self, pattern: str, timeout: float = BOUND) -> Message:
        """The first stdout line matching `pattern`, parsed."""
        if not self.answered_once:
            timeout = START_BOUND  # the first reply also waits for both processes to start
        line = self.proc.wait_for(pattern, stream="stdout", timeout=timeout).string
        self.answered_once = True
        msg: Message = orjson.loads(line)
        return msg

    def reply(self, rid: str, timeout: float = BOUND) -> Message:
        msg = self.wait_line(f'"id":{re.escape(orjson.dumps(rid).decode())}[,}}]', timeout)
        assert msg.get("id") == rid, msg
        return msg

    def ask(self, msg: Message) -> Message:
        self.send(msg)
        return self.reply(msg["id"])

    def stdout(self) -> list[Message]:
        """Every stdout line so far, parsed."""
        return [orjson.loads(line) for line in list(self.proc.lines["stdout"])]

    def close_stdin(self) -> int:
        """Close stdin; the gateway must exit by itself within the bound."""
        stdin = self.proc.popen.stdin
        assert stdin is not None
        stdin.close()
        try:
            return self.proc.popen.wait(BOUND)
        except subprocess.TimeoutExpired:
            raise AssertionError("the gateway did not exit after stdin closed") from None


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[list[str]], StdioGateway]]:
    procs: list[StdioGateway] = []

    def starter(command: list[str]) -> StdioGateway:
        config = write_config(tmp_path, {"b": stdio_backend(command)}, http=False, stdio=True)
        gw = StdioGateway(config)
        procs.append(gw)
        return gw

    yield starter
    for gw in procs:
        gw.proc.stop()


def rude_command(tmp_path: Path) -> tuple[list[str], Path, Path]:
    notes, requests = tmp_path / "notes.jsonl", tmp_path / "requests.jsonl"
    return [sys.executable, RUDE_SERVER, str(notes), str(requests)], notes, requests


def read_json_lines(path: Path) -> list[Message]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_malformed_lines_get_errors_without_id_and_serving_continues(
    start: Callable[[list[str]], StdioGateway],
) -> None:
    gw = start(sdk_stdio_command())
    gw.send_raw(b'{"jsonrpc": "2.0", "id": "broken", "method": ')
    parse_error = gw.wait_line(r"-32700")
    assert parse_error["jsonrpc"] == "2.0"
    assert parse_error["error"]["code"] == -32700
    assert "id" not in parse_error

    gw.send_raw(orjson.dumps([request("in-batch", "tools/list")]))
    batch_error = gw.wait_line(r"-32600")
    assert batch_error["error"]["code"] == -32600
    assert "id" not in batch_error

    assert text_of(gw.ask(call("after-garbage", "echo", text="still here"))) == "still here"
    # Exactly the two error lines and the reply: nothing for the ids inside the bad lines.
    assert [m.get("id") for m in gw.stdout()] == [None, None, "after-garbage"]


def test_a_request_carrying_a_result_or_error_is_refused_and_not_forwarded(
    start: Callable[[list[str]], StdioGateway], tmp_path: Path
) -> None:
    """basic/index, Requests and Responses: a message is a request or a response, not both. A
    `tools/call` that also carries a `result` (or an `error`) is answered -32600 under its id
    and never reaches the backend (the rude server records every request it gets)."""
    command, _, requests = rude_command(tmp_path)
    gw = start(command)
    extras: dict[str, dict[str, Any]] = {
        "with-result": {"result": {}},
        "with-error": {"error": {"code": -1, "message": "x"}},
    }
    for rid, extra in extras.items():
        refused = gw.ask({**call(rid, "ok"), **extra})
        assert refused["error"]["code"] == -32600
    assert text_of(gw.ask(call("after", "ok"))) == "ok"
    calls = [m for m in read_json_lines(requests) if m["method"] == "tools/call"]
    assert len(calls) == 1 and calls[0]["params"]["name"] == "ok"


def test_stdout_carries_only_jsonrpc_and_logs_go_to_stderr(
    start: Callable[[list[str]], StdioGateway],
) -> None:
    gw = start(sdk_stdio_command())
    assert text_of(gw.ask(call("echo-1", "echo", text="hi"))) == "hi"
    logged = call("log-1", "log", text="to the log")
    logged["params"]["_meta"]["io.modelcontextprotocol/logLevel"] = "debug"
    assert text_of(gw.ask(logged)) == "logged"
    assert text_of(gw.ask(call("slow-1", "slow", token="tok", seconds=0.2, steps=2))) == "done"
    gw.send_raw(b"not json at all")
    gw.wait_line(r"-32700")
    assert gw.ask(call("boom-1", "boom"))["result"]["isError"] is True
    assert gw.close_stdin() == 0

    lines = gw.proc.lines["stdout"]
    assert lines, "nothing on stdout"
    for line in lines:
        msg = orjson.loads(line)
        assert isinstance(msg, dict), line
        assert msg.get("jsonrpc") == "2.0", line
    ids = [m["id"] for m in gw.stdout() if "id" in m]
    assert ids == ["echo-1", "log-1", "slow-1", "boom-1"]
    assert any(m.get("method") == "notifications/progress" for m in gw.stdout())
    # --log-level debug: the gateway's own log lines are on stderr.
    assert gw.proc.lines["stderr"]
    assert any("gateway" in line for line in gw.proc.lines["stderr"])


def test_cancelled_request_gets_no_reply(start: Callable[[list[str]], StdioGateway]) -> None:
    gw = start(sdk_stdio_command())
    gw.send(call("to-cancel", "slow", token="tok-cancel", seconds=30, steps=300))
    gw.wait_line(r'"progressToken":"tok-cancel"')  # the call is running in the backend
    gw.send(
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "to-cancel", "reason": "test"},
        }
    )
    assert text_of(gw.ask(call("after-cancel", "echo", text="next"))) == "next"
    seen = gw.stdout()
    assert "to-cancel" not in [m.get("id") for m in seen]

    # Nothing more for the cancelled call ever, and the gateway still exits cleanly (it has
    # no request left to drain).
    assert gw.close_stdin() == 0
    everything = gw.stdout()
    assert "to-cancel" not in [m.get("id") for m in everything]
    after = everything[[m.get("id") for m in everything].index("after-cancel") + 1 :]
    assert not [m for m in after if m.get("method") == "notifications/progress"], after


def test_cancellation_reaches_the_backend_with_its_own_id(
    start: Callable[[list[str]], StdioGateway], tmp_path: Path
) -> None:
    command, notes, requests = rude_command(tmp_path)
    gw = start(command)
    gw.send(call("client-hang", "hang"))
    backend_id = int(
        gw.proc.wait_for(r"rude: request id=(\d+) method=tools/call tool=hang", "stderr").group(1)
    )
    gw.send(
        {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": "client-hang", "reason": "test"},
        }
    )
    gw.proc.wait_for(r"rude: notification notifications/cancelled", "stderr", BOUND)
    assert text_of(gw.ask(call("after-cancel", "ok"))) == "ok"

    hung = [m for m in read_json_lines(requests) if m["params"].get("name") == "hang"]
    assert [m["id"] for m in hung] == [backend_id]
    cancels = [m for m in read_json_lines(notes) if m["method"] == "notifications/cancelled"]
    # One cancellation, in the backend's id space, not the client's notification passed along.
    assert [c["params"]["requestId"] for c in cancels] == [backend_id]
    assert "client-hang" not in [m.get("id") for m in gw.stdout()]
    assert gw.close_stdin() == 0
    assert "client-hang" not in [m.get("id") for m in gw.stdout()]


def test_concurrent_progress_carries_each_clients_token(
    start: Callable[[list[str]], StdioGateway],
) -> None:
    gw = start(sdk_stdio_command())
    gw.ask(call("warm-up", "echo", text="x"))  # both processes up before timing matters
    # Token 1 could be confused with a gateway-side id; the step counts tell the calls apart.
    gw.send(call("two-a", "slow", token="tok-a", seconds=0.6, steps=2))
    gw.send(call("two-b", "slow", token=1, seconds=0.6, steps=3))
    assert text_of(gw.reply("two-a")) == "done"
    assert text_of(gw.reply("two-b")) == "done"

    out = gw.stdout()
    position = {m["id"]: i for i, m in enumerate(out) if "id" in m}
    progress = [
        (i, m["params"]) for i, m in enumerate(out) if m.get("method") == "notifications/progress"
    ]
    assert {p["progressToken"] for _, p in progress} == {"tok-a", 1}
    for token, rid, steps in (("tok-a", "two-a", 2), (1, "two-b", 3)):
        mine = [(i, p) for i, p in progress if p["progressToken"] == token]
        assert [p["progress"] for _, p in mine] == list(range(1, steps + 1)), mine
        assert all(p["total"] == steps for _, p in mine), mine
        assert all(i < position[rid] for i, _ in mine), "progress after the reply"
    # Both were in flight at once: each got progress before the other's reply.
    first = {
        token: min(i for i, p in progress if p["progressToken"] == token) for token in ("tok-a", 1)
    }
    assert first["tok-a"] < position["two-b"]
    assert first[1] < position["two-a"]


def test_closing_stdin_exits_zero_and_stops_the_backend(
    start: Callable[[list[str]], StdioGateway],
) -> None:
    gw = start(sdk_stdio_command())
    pid = int(text_of(gw.ask(call("who", "whoami"))))
    os.kill(pid, 0)  # alive while the gateway runs
    assert gw.close_stdin() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_notification_to_an_unreachable_http_backend_does_not_stop_the_gateway(
    tmp_path: Path,
) -> None:
    backend = http_backend(dead_url(), connect_timeout=0.5)
    config = write_config(tmp_path, {"b": backend}, http=False, stdio=True)
    gw = StdioGateway(config)
    try:
        gw.send({"jsonrpc": "2.0", "method": "notifications/roots/list_changed"})
        reply = gw.ask(request("after-note", "tools/list"))
        assert reply["error"]["code"] == -31001, reply
        assert gw.close_stdin() == 0
    finally:
        gw.proc.stop()
