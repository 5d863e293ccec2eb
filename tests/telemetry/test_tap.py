"""The traffic tap: what a recording holds, redaction, truncation, rotation, the summary and CLI."""

from __future__ import annotations

import copy
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import yaml
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp_types import ElicitRequestParams, ElicitResult

from gateway.app import Gateway
from gateway.config import TapConfig, parse
from gateway.telemetry.tap import (
    REDACTED,
    Tap,
    follow,
    format_call,
    format_summary,
    summarize,
)
from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    START_BOUND,
    Proc,
    call,
    sdk_stdio_command,
    stdio_backend,
)

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


def test_redact_secrets_applies_the_redact_hooks_table_to_every_string(tmp_path: Path) -> None:
    """`tap.redact_secrets`: the redact hook's patterns (gateway/sensitive.py, one table for
    both) over what is recorded; off by default, a recording keeps what was said."""
    path = tmp_path / "tap.jsonl"
    said = reply(3, content=[{"type": "text", "text": "mail ann@example.com, 4111111111111112"}])
    with Tap(tap_config(path, redact_secrets=True)) as tap:
        tap.record("frontend", "out", said)
    with Tap(tap_config(tmp_path / "plain.jsonl")) as tap:
        tap.record("frontend", "out", said)
    (redacted,) = records(path)
    assert redacted["msg"]["result"]["content"][0]["text"] == (
        "mail [redacted:email], 4111111111111112"
    )
    (plain,) = records(tmp_path / "plain.jsonl")
    assert plain["msg"] == said


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


def test_a_result_with_is_error_is_summarised_as_an_error_not_ok(tmp_path: Path) -> None:
    """A tool's own failure (server/tools, Error Handling: `isError` in the result) is a result,
    not a JSON-RPC error: the summary and the follow line must still not call it `ok`."""
    path = tmp_path / "tap.jsonl"
    with Tap(tap_config(path)) as tap:
        tap.record("frontend", "in", call(1, "demo_echo", text="a"))
        tap.record("frontend", "out", reply(1, content=[], isError=True))
        tap.record("frontend", "in", call(2, "demo_echo", text="b"))
        tap.record("frontend", "out", reply(2, content=[], isError=False))
    summary = summarize(path.read_bytes().splitlines())
    assert summary.tool_errors == 1 and summary.errors == {}
    outcomes = {c.id: c.outcome for c in summary.slowest}
    assert outcomes == {1: "error (isError)", 2: "ok"}
    assert format_call(summary.slowest[0]).endswith(summary.slowest[0].outcome)
    text = format_summary(summary)
    assert "1 results with isError" in text and "error (isError)" in text


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


# --- end to end: what each hop carried, legacy clients and backends included ------------------

MODERN_KEY = "io.modelcontextprotocol/"
SECRET = "tap-secret-text"
CONFIGURED_SECRET = "tap-configured-key"


def modern_keys(msg: Message) -> list[str]:
    params = msg.get("params")
    fields = params.get("_meta") if isinstance(params, dict) else None
    return [k for k in fields or {} if k.startswith(MODERN_KEY)]


def on_hop(lines: list[Message], hop: str, backend: str | None = None) -> list[Message]:
    return [e for e in lines if e["hop"] == hop and e.get("backend") == backend]


def methods(entries: list[Message], direction: str) -> list[str]:
    return [e["msg"]["method"] for e in entries if e["dir"] == direction and "method" in e["msg"]]


def calls_of(entries: list[Message], tool: str) -> list[Message]:
    return [
        e
        for e in entries
        if e["msg"].get("method") == "tools/call" and e["msg"].get("params", {}).get("name") == tool
    ]


def answer_to(entries: list[Message], direction: str, rid: object) -> Message:
    (found,) = [
        e
        for e in entries
        if e["dir"] == direction and "method" not in e["msg"]
        if e["msg"].get("id") == rid
    ]
    return found


@asynccontextmanager
async def tapped_gateway(path: Path, legacy_http: str, sse: str) -> AsyncIterator[str]:
    """A gateway with the tap on in front of a legacy stdio child (`old`), a legacy HTTP server
    (`web`), an HTTP+SSE server (`sse`) and a modern stdio child (`new`)."""
    tap = {
        "path": str(path),
        "redact": ["params.arguments.text", "result.content", "result.structuredContent"],
        "max_message_bytes": 8192,
    }
    backends = {
        "old": stdio_backend(sdk_stdio_command("--legacy-only")),
        "web": {"http": {"url": legacy_http, "headers": {"X-Api-Key": CONFIGURED_SECRET}}},
        "sse": {"sse": {"url": sse}},
        # (pinned: a child slow to start on a busy machine would miss the probe's window)
        "new": stdio_backend(sdk_stdio_command(), era="modern"),
    }
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    text = yaml.safe_dump({"listen": listen, "backends": backends, "tap": tap})
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw:
            assert gw.http_url is not None
            yield gw.http_url


async def accept(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    return ElicitResult(action="accept", content={"answer": "42"})


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_legacy_clients_traffic_is_recorded_as_it_crossed_both_hops(
    tmp_path: Path, sdk_legacy_http: str, sdk_sse: str
) -> None:
    """basic/lifecycle (Initialization) on both hops as the peers saw it: the client's own
    `initialize` (not the `server/discover` it is served by), a legacy backend's handshake, the
    legacy requests without the modern `_meta`, server-to-client requests and their answers."""
    path = tmp_path / "tap.jsonl"
    async with tapped_gateway(path, sdk_legacy_http, sdk_sse) as url:
        with anyio.fail_after(3 * BOUND):
            async with Client(url, mode="legacy", elicitation_callback=accept) as client:
                for tool in ("old_echo", "web_echo", "sse_echo", "new_echo"):
                    await client.call_tool(tool, {"text": SECRET})
                for tool in ("old_ask", "new_ask"):
                    result = await client.call_tool(tool, {"question": "why?"})
                    assert not result.is_error
                await client.call_tool("old_getenv", {"name": "N" * 10000})
    lines = records(path)

    # The client hop: the legacy handshake, not what serves it.
    front = on_hop(lines, "frontend")
    assert methods(front, "in")[:2] == ["initialize", "notifications/initialized"]
    assert "server/discover" not in methods(front, "in") + methods(front, "out")
    opening = front[0]
    assert opening["dir"] == "in" and opening["headers"]["Content-Type"] == "application/json"
    init_result = answer_to(front, "out", opening["msg"]["id"])["msg"]["result"]
    assert init_result["protocolVersion"] in ("2025-11-25", "2025-06-18")
    assert "supportedVersions" not in init_result and "serverInfo" in init_result
    client_calls = [e for e in front if e["msg"].get("method") == "tools/call"]
    assert len(client_calls) == 7 and all(e["dir"] == "in" for e in client_calls)
    assert all(modern_keys(e["msg"]) == [] for e in client_calls)
    # The gateway's questions to the client (for both asks) and the client's answers.
    questions = [e for e in front if e["msg"].get("method") == "elicitation/create"]
    assert len(questions) == 2 and {e["dir"] for e in questions} == {"out"}
    for question in questions:
        assert str(question["msg"]["id"]).startswith("mcp-gateway-")
        answered = answer_to(front, "in", question["msg"]["id"])
        assert answered["msg"]["result"]["action"] == "accept"

    # The legacy stdio child: probe, handshake, then requests in its own era and numbering.
    old = on_hop(lines, "backend", "old")
    sent = methods(old, "out")
    assert sent[:3] == ["server/discover", "initialize", "notifications/initialized"]
    handshake = next(e for e in old if e["msg"].get("method") == "initialize")
    assert handshake["msg"]["params"]["clientInfo"]["name"] == "mcp-gateway"
    assert "protocolVersion" in answer_to(old, "in", handshake["msg"]["id"])["msg"]["result"]
    (echo,) = calls_of(old, "echo")
    assert echo["dir"] == "out" and isinstance(echo["msg"]["id"], int)
    assert modern_keys(echo["msg"]) == [] and "resultType" not in str(old)
    assert answer_to(old, "in", echo["msg"]["id"])["msg"]["result"]["content"] == REDACTED
    # The child's own question mid-call, and the gateway's answer with the child's id.
    (asked,) = [e for e in old if e["msg"].get("method") == "elicitation/create"]
    assert asked["dir"] == "in"
    assert answer_to(old, "out", asked["msg"]["id"])["msg"]["result"]["action"] == "accept"
    # Size limits hold on every hop: the oversized call is recorded as its size.
    big = [e for e in old if e["msg"].get("truncated") and e["msg"].get("method") == "tools/call"]
    assert len(big) == 1 and big[0]["dir"] == "out" and big[0]["msg"]["bytes"] > 8192

    # The legacy HTTP server: its handshake, and the session riding on each later POST.
    web_hop = on_hop(lines, "backend", "web")
    assert methods(web_hop, "out")[:3] == [
        "server/discover",
        "initialize",
        "notifications/initialized",
    ]
    (web_echo,) = calls_of(web_hop, "echo")
    assert modern_keys(web_echo["msg"]) == [] and "Mcp-Session-Id" in web_echo["headers"]
    assert "mcp-protocol-version" in {name.lower() for name in web_echo["headers"]}
    # The configured headers (credentials, often) are never recorded.
    assert not any("X-Api-Key" in e.get("headers", {}) for e in web_hop)

    # The HTTP+SSE server: its handshake POSTed, its replies read from the stream.
    sse_hop = on_hop(lines, "backend", "sse")
    assert {"initialize", "notifications/initialized"} <= set(methods(sse_hop, "out"))
    (sse_echo,) = calls_of(sse_hop, "echo")
    assert modern_keys(sse_echo["msg"]) == [] and isinstance(sse_echo["msg"]["id"], int)
    assert answer_to(sse_hop, "in", sse_echo["msg"]["id"])["msg"]["result"]["content"] == REDACTED

    # The dual-era server: the gateway's own requests (its catalog) are modern, as the
    # dispatcher sent them; the legacy client's requests went in the legacy era, to a second child
    # of the same command with a handshake of its own (the era follows the client).
    new = on_hop(lines, "backend", "new")
    (new_echo,) = calls_of(new, "echo")
    assert modern_keys(new_echo["msg"]) == []
    assert "initialize" in methods(new, "out")
    lists = [e for e in new if e["dir"] == "out" and e["msg"].get("method") == "tools/list"]
    assert any(MODERN_KEY + "protocolVersion" in modern_keys(e["msg"]) for e in lists)

    # Redaction applies on every hop, and nothing recorded the secret.
    echoes = [e for e in lines if e["msg"].get("params", {}).get("name", "").endswith("echo")]
    assert echoes and all(e["msg"]["params"]["arguments"]["text"] == REDACTED for e in echoes)
    assert SECRET.encode() not in path.read_bytes()
    assert CONFIGURED_SECRET.encode() not in path.read_bytes()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_modern_clients_traffic_is_recorded_as_before(
    tmp_path: Path, sdk_legacy_http: str, sdk_sse: str
) -> None:
    """A modern client's request and reply as they crossed; the modern child's request keeps
    its modern `_meta` under the channel's own id, and its reply comes back to that id."""
    path = tmp_path / "tap.jsonl"
    async with tapped_gateway(path, sdk_legacy_http, sdk_sse) as url:
        with anyio.fail_after(3 * BOUND):
            async with Client(url) as client:
                await client.call_tool("new_add", {"a": 1, "b": 2})
    lines = records(path)
    front = on_hop(lines, "frontend")
    (incoming,) = calls_of(front, "new_add")
    assert incoming["dir"] == "in" and MODERN_KEY + "protocolVersion" in modern_keys(
        incoming["msg"]
    )
    assert "initialize" not in methods(front, "in")
    reply_out = answer_to(front, "out", incoming["msg"]["id"])
    assert reply_out["msg"]["result"]["resultType"] == "complete"
    new = on_hop(lines, "backend", "new")
    (sent,) = calls_of(new, "add")
    assert sent["dir"] == "out" and modern_keys(sent["msg"]) == modern_keys(incoming["msg"])
    assert answer_to(new, "in", sent["msg"]["id"])["msg"]["result"]["resultType"] == "complete"


def legacy_line(rid: str, method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})


@pytest.mark.slow
def test_a_legacy_stdio_session_and_the_channels_own_ids_and_tokens(tmp_path: Path) -> None:
    """transports/stdio both ways: the client's lines as it wrote them, and the child's as the
    gateway wrote them, with the channel's own request id and progress token (basic/utilities/
    progress), which the client never sees."""
    path = tmp_path / "tap.jsonl"
    backend = stdio_backend(sdk_stdio_command("--legacy-only"))
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {"listen": {"stdio": True}, "backends": {"sdk": backend}, "tap": {"path": str(path)}}
        )
    )
    proc = Proc([PYTHON, "-m", "gateway", "run", "--config", str(config)], stdin=True)
    stdin = proc.popen.stdin
    assert stdin is not None
    try:
        opening = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"},
        }
        slow = {"name": "slow", "arguments": {"seconds": 0.2, "steps": 2}}
        slow["_meta"] = {"progressToken": "tok"}
        cancel = {"requestId": "nothing", "reason": "test"}
        stdin.write(legacy_line("i", "initialize", opening) + b"\n")
        stdin.flush()
        proc.wait_for(r'"id":"i"', stream="stdout", timeout=START_BOUND)
        for line in (
            b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
            legacy_line("s", "tools/call", slow),
            b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":'
            + orjson.dumps(cancel)
            + b"}",
        ):
            stdin.write(line + b"\n")
        stdin.flush()
        proc.wait_for(r'"id":"s"', stream="stdout", timeout=BOUND)
        stdin.close()
        assert proc.popen.wait(BOUND) == 0
    finally:
        proc.stop()
    lines = records(path)
    front = on_hop(lines, "frontend")
    # (Each request is recorded when its task starts: after lines read in the same chunk.)
    assert sorted(methods(front, "in")) == [
        "initialize",
        "notifications/cancelled",
        "notifications/initialized",
        "tools/call",
    ]
    assert "server/discover" not in methods(front, "out")
    (sent_by_client,) = calls_of(front, "slow")
    assert sent_by_client["msg"]["params"]["_meta"] == {"progressToken": "tok"}
    shown = [
        e["msg"]["params"] for e in front if e["msg"].get("method") == "notifications/progress"
    ]
    assert [p["progressToken"] for p in shown] == ["tok", "tok"]

    child = on_hop(lines, "backend", "sdk")
    assert methods(child, "out")[:3] == [
        "server/discover",
        "initialize",
        "notifications/initialized",
    ]
    (written,) = calls_of(child, "slow")
    channel_id = written["msg"]["id"]
    assert isinstance(channel_id, int) and written["msg"]["params"]["_meta"] == {
        "progressToken": channel_id
    }
    read = [e["msg"]["params"] for e in child if e["msg"].get("method") == "notifications/progress"]
    assert [p["progressToken"] for p in read] == [channel_id, channel_id]
    assert answer_to(child, "in", channel_id)["msg"]["result"]["content"][0]["text"] == "done"
    assert answer_to(front, "out", "s")["msg"]["result"]["content"][0]["text"] == "done"
