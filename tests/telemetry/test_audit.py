"""The audit log (`audit:`): one JSON line per client request, with who asked (the caller's
identity), what, where it went, how it ended, how long it took and the trace id.

Fast tests run the dispatcher over an in-memory backend with the gateway's telemetry; the
end-to-end ones go through the HTTP front end (a modern request and a legacy session's) and the
stdio front end of a gateway process.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.app import Gateway, StartupError
from gateway.caller_auth.identity import API_KEY, Identity
from gateway.config import AuditConfig, Rate, RateLimits, load, parse
from gateway.core.dispatcher import Dispatcher
from gateway.core.ratelimit import RateLimiter
from gateway.origin import Origin
from gateway.protocol import codes
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.otel import GatewayTelemetry
from tests.support import (
    BOUND,
    DEMO_STDIO,
    START_BOUND,
    Proc,
    call,
    gateway_command,
    mirrored_headers,
)
from tests.support.memory_backend import MemoryBackend, dispatcher_over, ignore, modern, tool_call

pytestmark = pytest.mark.anyio

DEMO = DEMO_STDIO
ALICE = Identity("alice", "cli-1", "https://as.example", frozenset({"tools"}), method=API_KEY)
TOKEN = "Bearer not-for-the-audit-log"
FIELDS = {
    "time",
    "frontend",
    "peer",
    "subject",
    "client_id",
    "issuer",
    "auth",
    "method",
    "name",
    "uri",
    "backend",
    "outcome",
    "code",
    "duration_ms",
    "id",
    "trace_id",
}


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def alice() -> Origin:
    return Origin("http", "127.0.0.1", {"Authorization": TOKEN}, identity=ALICE)


async def audited(
    path: Path | str,
    limiter: RateLimiter | None = None,
    tracing: TracerProvider | None = None,
    **config: Any,
) -> tuple[Dispatcher, MemoryBackend, AuditLog]:
    audit = AuditLog(AuditConfig(path=str(path), **config))
    tracer = tracing.get_tracer("test") if tracing is not None else None
    telemetry = GatewayTelemetry(tracer, None, audit=audit)
    backend = MemoryBackend()
    return await dispatcher_over(backend, telemetry, limiter), backend, audit


def is_utc_now(text: str) -> bool:
    when = datetime.fromisoformat(text)
    return when.utcoffset() == timedelta(0) and abs(datetime.now(UTC) - when) < timedelta(
        seconds=BOUND
    )


async def test_one_line_per_request_with_who_what_where_and_how(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    limits = RateLimiter(RateLimits(per_tool=Rate(rate=0.001, burst=1)), Counter())
    dispatcher, _, audit = await audited(path, limits)
    requests = [
        tool_call(1, "echo", text="hi"),
        tool_call("two", "fail"),
        modern(3, "resources/read", uri="mem://note"),
        modern(4, "tools/list", cursor="forged"),
        modern(5, "tools/list"),
        tool_call(6, "echo", text="again"),  # past per_tool's burst
    ]
    for msg in requests:
        await dispatcher.handle(msg, ignore, alice())
    audit.close()
    records = lines(path)
    assert len(records) == len(requests)
    assert all(set(r) == FIELDS for r in records)
    assert [r["id"] for r in records] == [1, "two", 3, 4, 5, 6]
    assert all(r["time"].endswith("Z") and is_utc_now(r["time"]) for r in records)
    first = records[0]
    assert (first["subject"], first["client_id"], first["issuer"], first["auth"]) == (
        "alice",
        "cli-1",
        "https://as.example",
        "api_key",
    )
    assert (first["frontend"], first["peer"]) == ("http", "127.0.0.1")
    outcomes = [
        (r["method"], r["name"], r["uri"], r["backend"], r["outcome"], r["code"]) for r in records
    ]
    assert outcomes == [
        ("tools/call", "echo", None, "mem", "ok", None),
        ("tools/call", "fail", None, "mem", "error", -32000),
        ("resources/read", None, "mem://note", "mem", "ok", None),
        ("tools/list", None, None, None, "error", codes.INVALID_PARAMS),
        ("tools/list", None, None, None, "ok", None),
        ("tools/call", "echo", None, None, "error", codes.RATE_LIMITED),
    ]
    assert all(r["duration_ms"] >= 0 and r["trace_id"] is None for r in records)
    # Arguments only when configured; credentials never.
    assert "arguments" not in first
    assert b"not-for-the-audit-log" not in path.read_bytes()
    assert b'"hi"' not in path.read_bytes()  # (no argument text)


async def test_a_cancelled_request_is_recorded_as_cancelled(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    dispatcher, backend, audit = await audited(path)
    with anyio.fail_after(BOUND):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dispatcher.handle, tool_call("held", "hold"), ignore, alice())
            await backend.holding.wait()
            tg.cancel_scope.cancel()
    audit.close()
    (record,) = lines(path)
    assert (record["id"], record["outcome"], record["code"]) == ("held", "cancelled", None)
    assert record["backend"] == "mem"


async def test_a_caller_without_identity_has_nulls(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    dispatcher, _, audit = await audited(path)
    await dispatcher.handle(tool_call(1, "echo"), ignore, Origin("stdio"))
    audit.close()
    (record,) = lines(path)
    assert record["frontend"] == "stdio" and record["peer"] is None
    assert [record[k] for k in ("subject", "client_id", "issuer", "auth")] == [None] * 4


async def test_arguments_when_configured_go_through_the_redaction_rules(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    dispatcher, backend, audit = await audited(
        path,
        include_arguments=True,
        redact=("params.arguments.password", "params.arguments.nested.*"),
    )
    arguments = {"user": "al\n{}", "password": "hunter2", "nested": {"a": "x1", "b": "x2"}}
    reply = await dispatcher.handle(tool_call(1, "echo", **arguments), ignore, alice())
    await dispatcher.handle(modern(2, "tools/list"), ignore, alice())
    audit.close()
    assert "result" in reply
    # The backend got the arguments as they were: redaction is the record's only.
    assert backend.calls()[0]["params"]["arguments"] == arguments
    called, listed = lines(path)
    assert called["arguments"] == {
        "user": "al\n{}",  # (a newline stays inside its string: one record per line)
        "password": "[redacted]",
        "nested": {"a": "[redacted]", "b": "[redacted]"},
    }
    assert "arguments" not in listed
    assert b"hunter2" not in path.read_bytes() and b"x1" not in path.read_bytes()


async def test_arguments_past_max_arguments_bytes_are_recorded_as_their_size(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.jsonl"
    dispatcher, backend, audit = await audited(
        path, include_arguments=True, max_arguments_bytes=100
    )
    small, large = {"text": "s" * 50}, {"text": "l" * 200}
    for i, arguments in enumerate((small, large)):
        await dispatcher.handle(tool_call(i, "echo", **arguments), ignore, alice())
    audit.close()
    first, second = lines(path)
    assert first["arguments"] == small
    assert second["arguments"] == {"truncated": True, "bytes": len(orjson.dumps(large))}
    assert backend.calls()[1]["params"]["arguments"] == large  # forwarded whole


async def test_the_file_rotates_past_max_bytes(tmp_path: Path) -> None:
    """audit.max_bytes / audit.backups: the same rotation as the tap's."""
    path = tmp_path / "audit.jsonl"
    dispatcher, _, audit = await audited(path, max_bytes=1000, backups=2)
    for i in range(30):
        await dispatcher.handle(tool_call(i, "echo"), ignore, alice())
    audit.close()
    files = [path, path.with_name("audit.jsonl.1"), path.with_name("audit.jsonl.2")]
    assert all(f.exists() and 0 < f.stat().st_size <= 1000 for f in files)
    assert not path.with_name("audit.jsonl.3").exists()
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in files)  # the owner's only
    kept = [r for f in reversed(files) for r in lines(f)]
    ids = [r["id"] for r in kept]
    assert ids == list(range(30 - len(ids), 30))  # the newest, in order, each line whole


async def test_a_write_failure_is_one_log_line_and_requests_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dispatcher, _, _ = await audited("/dev/full")  # every write: no space left on device
    with caplog.at_level(logging.WARNING):
        replies = [await dispatcher.handle(tool_call(i, "echo"), ignore, alice()) for i in range(3)]
    assert all("result" in r for r in replies)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "audit log" in warnings[0].getMessage()
    assert warnings[0].exc_info is None


async def test_the_trace_id_is_the_requests_span(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dispatcher, _, audit = await audited(path, tracing=provider)
    await dispatcher.handle(tool_call(1, "echo"), ignore, alice())
    audit.close()
    (record,) = lines(path)
    (span,) = exporter.get_finished_spans()
    assert span.context is not None
    assert record["trace_id"] == format(span.context.trace_id, "032x")


async def test_stderr_gets_the_lines_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    dispatcher, _, _ = await audited("stderr")
    await dispatcher.handle(tool_call(1, "echo"), ignore, alice())
    (line,) = capsys.readouterr().err.splitlines()
    record = orjson.loads(line)
    assert record["method"] == "tools/call" and record["subject"] == "alice"


def test_the_config_resolves_the_path_beside_the_file_and_keeps_stderr(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    for given, expected in (("audit.jsonl", str(tmp_path / "audit.jsonl")), ("stderr", "stderr")):
        config.write_text(
            yaml.safe_dump(
                {"listen": {"stdio": True}, "backends": {"demo": DEMO}, "audit": {"path": given}}
            )
        )
        audit = load(config).audit
        assert audit is not None and audit.path == expected
        assert (audit.include_arguments, audit.max_bytes, audit.backups) == (False, 64 << 20, 5)


def test_an_unusable_path_stops_the_start(tmp_path: Path) -> None:
    text = yaml.safe_dump(
        {
            "listen": {"stdio": True},
            "backends": {"demo": DEMO},
            "audit": {"path": str(tmp_path / "missing" / "audit.jsonl")},
        }
    )
    with pytest.raises(StartupError):
        Gateway(parse(text))


# --- end to end -------------------------------------------------------------------------------

LEGACY = "2025-11-25"
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def post(
    session: aiohttp.ClientSession, url: str, msg: dict[str, Any], headers: dict[str, str]
) -> tuple[aiohttp.ClientResponse, dict[str, Any]]:
    with anyio.fail_after(BOUND):
        async with session.post(url, data=orjson.dumps(msg), headers=headers) as resp:
            body = await resp.read()
    if resp.content_type == "text/event-stream":
        body = body.strip().rsplit(b"data: ", 1)[1]
    reply: dict[str, Any] = orjson.loads(body)
    return resp, reply


@pytest.mark.slow
async def test_http_requests_of_both_eras_are_audited(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    listen = {"http": {"host": "127.0.0.1", "port": 0}}
    text = yaml.safe_dump(
        {"listen": listen, "backends": {"demo": DEMO}, "audit": {"path": str(path)}}
    )
    with anyio.fail_after(START_BOUND):
        async with Gateway(parse(text)) as gw, aiohttp.ClientSession() as session:
            url = gw.http_url
            assert url is not None
            await gw.catalogs_loaded.wait()
            msg = call("modern-1", "echo", text="m")
            auth = {"Authorization": TOKEN}
            resp, reply = await post(session, url, msg, {**mirrored_headers(msg), **auth})
            assert "result" in reply
            opening = {
                "jsonrpc": "2.0",
                "id": "open",
                "method": "initialize",
                "params": {
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "legacy", "version": "1"},
                },
            }
            resp, reply = await post(session, url, opening, JSON_HEADERS)
            assert "result" in reply
            session_headers = {
                **JSON_HEADERS,
                "Mcp-Session-Id": resp.headers["Mcp-Session-Id"],
                "MCP-Protocol-Version": LEGACY,
            }
            legacy_call = {
                "jsonrpc": "2.0",
                "id": "legacy-1",
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": "l"}},
            }
            resp, reply = await post(session, url, legacy_call, session_headers)
            assert "result" in reply
    records = lines(path)
    by_id = {r["id"]: r for r in records}
    for rid in ("modern-1", "legacy-1"):
        record = by_id[rid]
        assert (record["method"], record["name"], record["backend"]) == (
            "tools/call",
            "echo",
            "demo",
        )
        assert (record["outcome"], record["code"], record["frontend"]) == ("ok", None, "http")
        assert record["peer"] == "127.0.0.1" and record["time"].endswith("Z")
    # The legacy opening asked the gateway for discovery in the client's name.
    assert by_id["open"]["method"] == "server/discover"
    assert b"not-for-the-audit-log" not in path.read_bytes()


@pytest.mark.slow
def test_the_stdio_front_end_is_audited(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"stdio": True},
                "backends": {"demo": DEMO},
                "audit": {"path": "audit.jsonl"},
            }
        )
    )
    proc = Proc(gateway_command(config), stdin=True)
    try:
        stdin = proc.popen.stdin
        assert stdin is not None
        stdin.write(orjson.dumps(call("s1", "echo", text="x")) + b"\n")
        stdin.flush()
        proc.wait_for('"id":"s1"', stream="stdout", timeout=START_BOUND)
    finally:
        proc.stop()
    (record,) = [r for r in lines(path) if r["id"] == "s1"]
    assert (record["frontend"], record["method"], record["name"]) == ("stdio", "tools/call", "echo")
    assert record["backend"] == "demo" and record["outcome"] == "ok"
