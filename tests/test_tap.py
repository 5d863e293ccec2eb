"""The traffic tap: what a recording holds, redaction, truncation, rotation, the summary and CLI."""

from __future__ import annotations

import copy
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import TapConfig
from gateway.telemetry.tap import REDACTED, Tap, follow, format_summary, summarize
from tests.support import BOUND, PYTHON, ROOT, START_BOUND, Proc, call

Message = dict[str, Any]


def tap_config(path: Path, **extra: Any) -> TapConfig:
    return TapConfig(path=str(path), **extra)


def records(path: Path) -> list[Message]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def reply(rid: int | str, **result: Any) -> Message:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def failure(rid: int | str | None, code: int) -> Message:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": "no"}}


def test_both_hops_are_recorded_with_time_direction_backend_and_headers(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    request = call(1, "echo", text="hi")
    with Tap(tap_config(path)) as tap:
        tap.record("frontend", "in", request, headers={"Content-Type": "application/json"})
        tap.record("backend", "out", request, backend="demo")
        tap.record("backend", "in", reply(1, ok=True), backend="demo")
        tap.record("frontend", "out", reply(1, ok=True))
    front_in, back_out, back_in, front_out = records(path)
    assert front_in["ts"].endswith("Z") and len(front_in["ts"]) == len(
        "2026-01-01T00:00:00.000000Z"
    )
    assert (front_in["hop"], front_in["dir"], front_in["msg"]) == ("frontend", "in", request)
    assert front_in["headers"] == {"Content-Type": "application/json"}
    assert "backend" not in front_in and "headers" not in back_out
    assert (back_out["hop"], back_out["dir"], back_out["backend"]) == ("backend", "out", "demo")
    assert back_in["msg"] == reply(1, ok=True) and back_in["dir"] == "in"
    assert (front_out["hop"], front_out["dir"]) == ("frontend", "out")
    assert list(front_in) == ["ts", "hop", "dir", "headers", "msg"]


def test_redaction_by_path_wildcard_and_header_never_touches_the_callers_message(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tap.jsonl"
    config = tap_config(
        path,
        redact=("params.arguments.password", "result.structuredContent", "params.secrets.*"),
        redact_headers=("X-Api-Key",),
    )
    request = call(7, "login", user="ann", password="hunter2")
    request["params"]["secrets"] = {"a": 1, "b": [2]}
    response = reply(7, structuredContent={"token": "t"}, content=[])
    headers = {"AUTHORIZATION": "Bearer x", "cookie": "c=1", "x-api-key": "k", "Accept": "a"}
    before = copy.deepcopy((request, response, headers))
    with Tap(config) as tap:
        tap.record("frontend", "in", request, headers=headers)
        tap.record("frontend", "out", response)
        tap.record("frontend", "in", call(8, "other"))  # no such paths: nothing is added
    assert (request, response, headers) == before
    rec_in, rec_out, other = records(path)
    args = rec_in["msg"]["params"]["arguments"]
    assert args == {"user": "ann", "password": REDACTED}
    assert rec_in["msg"]["params"]["secrets"] == {"a": REDACTED, "b": REDACTED}
    assert rec_in["headers"] == {
        "AUTHORIZATION": REDACTED,
        "cookie": REDACTED,
        "x-api-key": REDACTED,
        "Accept": "a",
    }
    assert rec_out["msg"]["result"] == {"structuredContent": REDACTED, "content": []}
    assert other["msg"] == call(8, "other")


def test_authorization_is_redacted_without_any_rule(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    with Tap(tap_config(path)) as tap:
        tap.record(
            "backend", "out", call(1, "x"), headers={"Authorization": "Bearer s3"}, backend="b"
        )
    assert records(path)[0]["headers"] == {"Authorization": REDACTED}
    assert b"s3" not in path.read_bytes()


def test_wildcards_reach_into_lists(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    message = reply(1, content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    with Tap(tap_config(path, redact=("result.content.*.text",))) as tap:
        tap.record("frontend", "out", message)
    assert records(path)[0]["msg"]["result"]["content"] == [
        {"type": "text", "text": REDACTED},
        {"type": "text", "text": REDACTED},
    ]
    assert message["result"]["content"][0]["text"] == "a"


def test_a_message_over_the_size_cap_is_recorded_as_its_size(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    big = call(3, "upload", blob="x" * 5000)
    with Tap(tap_config(path, max_message_bytes=1000)) as tap:
        tap.record("frontend", "in", big)
        tap.record("frontend", "out", reply(3, ok=True))
    rec_big, rec_small = records(path)
    assert rec_big["msg"] == {
        "truncated": True,
        "bytes": len(orjson.dumps(big)),
        "method": "tools/call",
        "id": 3,
    }
    assert rec_small["msg"] == reply(3, ok=True)


def test_rotation_keeps_the_configured_number_of_backups(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    with Tap(tap_config(path, max_bytes=2000, backups=2)) as tap:
        for i in range(100):
            tap.record("frontend", "in", call(i, "echo", text="x" * 100))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["tap.jsonl", "tap.jsonl.1", "tap.jsonl.2"]
    for file in tmp_path.iterdir():
        assert 0 < file.stat().st_size <= 2000
        assert all(r["msg"]["method"] == "tools/call" for r in records(file))
    # The newest records are in the live file, the ones before them in .1, then .2.
    ids = [[r["msg"]["id"] for r in records(tmp_path / n)] for n in reversed(names)]
    flat = [i for part in ids for i in part]
    assert flat == sorted(flat) and flat[-1] == 99


def test_without_backups_the_file_starts_afresh(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    with Tap(tap_config(path, max_bytes=1000, backups=0)) as tap:
        for i in range(30):
            tap.record("frontend", "in", call(i, "echo"))
    assert [p.name for p in tmp_path.iterdir()] == ["tap.jsonl"]
    assert path.stat().st_size <= 1000 and records(path)[-1]["msg"]["id"] == 29


def test_an_existing_recording_is_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    for rid in (1, 2):
        with Tap(tap_config(path)) as tap:
            tap.record("frontend", "in", call(rid, "echo"))
    assert [r["msg"]["id"] for r in records(path)] == [1, 2]


def record_session(path: Path) -> None:
    """Three client calls, one an error, one fanned out to two backends, one unanswered."""
    with Tap(tap_config(path)) as tap:
        tap.record("frontend", "in", call(1, "demo_echo", text="a"))
        tap.record("backend", "out", call(901, "echo", text="a"), backend="demo")
        tap.record("backend", "in", reply(901, content=[]), backend="demo")
        tap.record("frontend", "out", reply(1, content=[]))
        tap.record("frontend", "in", call(2, "demo_echo", text="b"))
        tap.record("frontend", "out", failure(2, -32602))
        listing = {"jsonrpc": "2.0", "id": "L", "method": "tools/list", "params": {}}
        tap.record("frontend", "in", listing)
        tap.record("backend", "out", listing, backend="demo")
        tap.record("backend", "out", listing, backend="time")
        tap.record("backend", "in", reply("L", tools=[]), backend="time")
        tap.record("backend", "in", reply("L", tools=[]), backend="demo")
        tap.record("frontend", "out", reply("L", tools=[]))
        tap.record("frontend", "out", failure(None, -32700))  # garbage from a client: no request
        tap.record("frontend", "in", {"jsonrpc": "2.0", "method": "notifications/cancelled"})
        tap.record("frontend", "in", call(3, "demo_sleep", seconds=60))


def test_summary_pairs_calls_and_counts_methods_names_errors(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    record_session(path)
    summary = summarize([*path.read_bytes().splitlines(), b"not json", b'{"hop": 1}', ""], top=2)
    assert summary.records == 15 and summary.malformed == 2
    assert summary.methods == {"tools/call": 3, "tools/list": 1}
    assert summary.names == {"tools/call demo_echo": 2, "tools/call demo_sleep": 1}
    assert summary.errors == {-32602: 1, -32700: 1}
    assert summary.backend_calls == {
        "demo tools/call": 1,
        "demo tools/list": 1,
        "time tools/list": 1,
    }
    assert summary.unanswered == 1
    assert len(summary.slowest) == 2
    assert summary.slowest[0].ms >= summary.slowest[1].ms >= 0
    assert {c.id for c in summary.slowest} <= {1, 2, "L"}
    text = format_summary(summary)
    for expected in ("tools/call demo_echo", "-32602", "demo tools/list", "2 malformed", "Slowest"):
        assert expected in text, text


def test_summary_reads_text_lines_too(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    record_session(path)
    as_text = summarize(path.read_text().splitlines())
    assert as_text == summarize(path.read_bytes().splitlines())
    assert len(as_text.slowest) == 3


def test_follow_reads_on_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    path.write_bytes(b"a\nb\n")
    lines = follow(path, offset=2)
    assert next(lines) == b"b"
    with path.open("ab") as old:
        old.write(b"c\n")
    path.rename(tmp_path / "tap.jsonl.1")
    path.write_bytes(b"d\n")
    assert (next(lines), next(lines)) == (b"c", b"d")
    lines.close()


def run_tap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "gateway", "tap", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=START_BOUND,
        check=False,
    )


@pytest.mark.slow
def test_tap_command_prints_the_summary_and_counts_malformed_lines(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    record_session(path)
    with path.open("ab") as f:
        f.write(b"{broken\n")
    done = run_tap(str(path), "--top", "1")
    assert done.returncode == 0, done.stderr
    assert re.search(r"tools/call demo_echo +2\n", done.stdout), done.stdout
    assert "-32602" in done.stdout and "1 malformed" in done.stdout
    assert "Slowest 1 " in done.stdout


@pytest.mark.slow
def test_tap_command_on_a_missing_file_exits_2(tmp_path: Path) -> None:
    done = run_tap(str(tmp_path / "absent.jsonl"))
    assert done.returncode == 2
    assert "absent.jsonl" in done.stderr and "No such file" in done.stderr


@pytest.mark.slow
def test_tap_command_explains_itself() -> None:
    done = run_tap("--help")
    assert done.returncode == 0 and "--follow" in done.stdout and "--top" in done.stdout


@pytest.mark.slow
def test_tap_follow_prints_each_call_as_it_completes(tmp_path: Path) -> None:
    path = tmp_path / "tap.jsonl"
    record_session(path)
    proc = Proc([PYTHON, "-m", "gateway", "tap", "--follow", str(path)])
    try:
        proc.wait_for(r"following .*Ctrl-C")
        with Tap(tap_config(path)) as tap:
            tap.record("frontend", "in", call(42, "demo_add", a=1, b=2))
            tap.record("frontend", "out", reply(42, content=[]))
        line = proc.wait_for(r"tools/call demo_add\s+id=42\s+\S+ ms\s+ok", "stdout", BOUND)
        assert line.group(0)
        # An unanswered call from before following that completes now is shown too.
        with Tap(tap_config(path)) as tap:
            tap.record("frontend", "out", failure(3, -31002))
        proc.wait_for(r"tools/call demo_sleep\s+id=3\s.*error -31002", "stdout", BOUND)
        # Ctrl-C ends following with the summary once more (now counting the new call).
        proc.popen.send_signal(signal.SIGINT)
        assert proc.popen.wait(BOUND) == 0
        proc.wait_for(r"^\s+tools/call demo_add\s+1$", "stdout", BOUND)
    finally:
        proc.stop()
