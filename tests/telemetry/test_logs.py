"""The gateway's log on stderr (README "Logs"): `--log-format text|json`, UTC times with the
zone everywhere (log, access log), one record per line whatever its message holds, and a
child's stderr at WARNING when it looks like an error, INFO otherwise."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway.backends.stdio import ERROR_LINE
from gateway.telemetry.logs import JsonFormatter, TextFormatter
from tests.support import PYTHON, ROOT, START_BOUND, call, gateway_command, request, run_cli

pytestmark = [pytest.mark.slow]

STARTING = str(ROOT / "tests" / "servers" / "starting_server.py")
PLAIN = "listening for requests on stdio"
ERROR = "ERROR: could not open the cache"
# A child trying to forge a record of the gateway's own: every character here but `\n` can
# pass through a stderr line, and each is a line break to some reader (str.splitlines, a
# terminal's carriage return).
FORGED = "2026-01-01T00:00:00.000Z ERROR gateway.app: forged"
TRICKY = f"tricky\r{FORGED}\x0bvt\x0cff\x1cfs\x85nel\u2028ls\x1b[31mred"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) \S+: ")


def recent_utc(text: str) -> bool:
    """An RFC 3339 time with the zone (`Z`), UTC, within the last minute."""
    when = datetime.fromisoformat(text)
    return (
        text.endswith("Z")
        and when.utcoffset() == timedelta(0)
        and timedelta(0) <= datetime.now(UTC) - when < timedelta(minutes=1)
    )


def serve_a_file(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """The gateway on stdio (requests from a file, so it ends by itself), a stdio backend whose
    child writes PLAIN, ERROR and TRICKY to its stderr, the access log on stderr too."""
    child = [STARTING, "serve", "--stderr", PLAIN, "--stderr", ERROR, "--stderr", TRICKY]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"stdio": True},
                "backends": {"chatty": {"stdio": {"command": PYTHON, "args": child}}},
                "telemetry": {"access_log": "stderr"},
            }
        )
    )
    source = tmp_path / "requests.jsonl"
    lines = [request("list", "tools/list"), call("hello", "hello")]
    source.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    with source.open("rb") as stdin:
        done = subprocess.run(
            [*gateway_command(config), *options],
            stdin=stdin,
            capture_output=True,
            cwd=ROOT,
            timeout=START_BOUND,
            check=False,
        )
    out = subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )
    assert done.returncode == 0, out.stderr
    assert len(out.stdout.splitlines()) == 2  # both answered
    return out


def stderr_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    lines = done.stderr.split("\n")
    assert lines[-1] == ""
    # One record a line even for readers that break lines at more than `\n`.
    assert all(len(line.splitlines()) == 1 for line in lines[:-1])
    return lines[:-1]


def test_json_log_lines_are_one_object_each_with_utc_times(tmp_path: Path) -> None:
    """--log-format json: every line on the gateway's stderr is a JSON object with time (UTC,
    `Z`), level, logger and message; the child's error-looking line is WARNING and its others
    INFO, with the backend named; the forged record stays inside its message; the access log's
    lines (one per request, on stderr too) carry a UTC time with the zone."""
    done = serve_a_file(tmp_path, "--log-format", "json")
    records = [orjson.loads(line) for line in stderr_lines(done)]
    access = [r for r in records if "method" in r and "outcome" in r]
    log = [r for r in records if r not in access]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in log)
    assert all(recent_utc(r["time"]) for r in records)
    assert all(re.fullmatch(r".*T\d\d:\d\d:\d\d\.\d{3}Z", r["time"]) for r in log)
    child = {r["message"]: r for r in log if r["logger"] == "gateway.backend.chatty"}
    assert child[PLAIN]["level"] == "INFO" and child[PLAIN]["backend"] == "chatty"
    assert child[ERROR]["level"] == "WARNING" and child[ERROR]["backend"] == "chatty"
    assert child[TRICKY]["level"] == "WARNING"  # ("ERROR" is in it)
    assert not any(r["message"] == "forged" or r["message"].startswith(FORGED) for r in log)
    assert {r["method"] for r in access} >= {"tools/list", "tools/call"}


def test_text_log_lines_keep_their_look_with_utc_times_and_escapes(tmp_path: Path) -> None:
    """The text format (the default): `TIME LEVEL LOGGER: message`, the time UTC with `Z`; the
    child's control characters escaped, so its forged record is not a line of its own."""
    done = serve_a_file(tmp_path)
    lines = stderr_lines(done)
    log = [line for line in lines if not line.startswith("{")]
    assert log and all(TEXT_LINE.match(line) for line in log)
    assert all(recent_utc(line.split(" ", 1)[0]) for line in log)
    assert any(line.endswith(f" INFO gateway.backend.chatty: {PLAIN}") for line in log)
    assert any(line.endswith(f" WARNING gateway.backend.chatty: {ERROR}") for line in log)
    escaped = "tricky\\r" + FORGED + "\\x0bvt\\x0cff\\x1cfs\\x85nel\\u2028ls\\x1b[31mred"
    assert any(line.endswith(f" WARNING gateway.backend.chatty: {escaped}") for line in log)
    access = [orjson.loads(line) for line in lines if line.startswith("{")]
    assert len(access) == 2 and all(recent_utc(a["time"]) for a in access)


def formatted(formatter: logging.Formatter, *args: Any, **kwargs: Any) -> str:
    """What `formatter` writes for one record logged with these arguments."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tests.logs")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning(*args, **kwargs)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return stream.getvalue()


@pytest.fixture(name="failure")
def _failure() -> Iterator[BaseException]:
    try:
        raise ValueError("bad\nvalue")
    except ValueError as exc:
        yield exc


def test_a_message_with_a_newline_stays_one_line_in_both_formats() -> None:
    """A client's or a backend's string with a newline inside a message (log injection) is
    escaped by the text format and by JSON's own string escaping."""
    text = formatted(TextFormatter(), "name %s!", "x\nFAKE ERROR gateway.app: y")
    assert text.count("\n") == 1 and text.endswith(": name x\\nFAKE ERROR gateway.app: y!\n")
    line = formatted(JsonFormatter(), "name %s!", "x\nFAKE\u2028y")
    assert line.count("\n") == 1 and len(line.splitlines()) == 1
    assert orjson.loads(line)["message"] == "name x\nFAKE\u2028y!"


def test_json_keeps_a_traceback_and_extra_fields_in_the_one_line(
    failure: BaseException,
) -> None:
    line = formatted(
        JsonFormatter(), "failed", exc_info=failure, extra={"backend": "b", "big": 2**70}
    )
    assert line.count("\n") == 1
    record = orjson.loads(line)
    assert record["level"] == "WARNING" and record["logger"] == "tests.logs"
    assert record["exception"].startswith("Traceback (most recent call last):")
    assert record["exception"].endswith("ValueError: bad\nvalue")
    assert record["backend"] == "b" and record["big"] == str(2**70)  # (over 64 bits: a string)
    surrogate = orjson.loads(formatted(JsonFormatter(), "%s", "half \udcff"))
    assert surrogate["message"] == "half \\udcff"  # not a traceback of the formatter's


@pytest.mark.parametrize(
    "line",
    [
        "ERROR: could not open the cache",
        "2026-01-01 12:00:00 error something broke",
        "Traceback (most recent call last):",
        "ValueError: bad value",
        "java.io.IOException: closed",
        "panic: runtime error: index out of range",
        "FATAL could not bind",
        "level=critical msg=down",
        "E1206 12:00:00.000000    1 server.go:10] failed",
    ],
)
def test_error_looking_stderr_lines(line: str) -> None:
    assert ERROR_LINE.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "listening on stdio",
        "0 errors, 2 warnings",
        "error_count=0",
        "WARNING: deprecated option",
        "Errors are retried",
        "Everything ok",
    ],
)
def test_other_stderr_lines(line: str) -> None:
    assert not ERROR_LINE.search(line)


def test_help_documents_the_log_format() -> None:
    for command in ("run", "connect", "expose"):
        done = run_cli(command, "--help")
        assert done.returncode == 0
        assert "--log-format [text|json]" in done.stdout
        assert "MCP_GATEWAY_LOG_FORMAT" in done.stdout


def test_an_unknown_log_format_is_refused() -> None:
    done = run_cli("run", "--log-format", "xml")
    assert done.returncode == 2
    assert "Invalid value for '--log-format'" in done.stderr


def test_the_environment_variable_sets_the_format_and_errors_are_records(tmp_path: Path) -> None:
    """MCP_GATEWAY_LOG_FORMAT=json: even the command's own refusal of a config is a JSON line
    on stderr, so a collector reads everything the gateway writes there."""
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "run", "--config", str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "MCP_GATEWAY_LOG_FORMAT": "json"},
        timeout=START_BOUND,
        check=False,
    )
    assert done.returncode == 2
    records = [orjson.loads(line) for line in done.stderr.splitlines()]
    assert records and all(r["level"] == "ERROR" and r["logger"] == "gateway.cli" for r in records)
    assert "missing.yaml" in records[0]["message"]


def test_in_json_a_warning_and_an_uncaught_exception_are_records_too() -> None:
    """What Python itself writes to stderr (a warning, the traceback of an uncaught exception)
    is a JSON record as well once the json format is set up."""
    script = (
        "import warnings; from gateway.telemetry import logs; logs.setup('info', 'json'); "
        "warnings.warn('old'); raise RuntimeError('bad\\nthing')"
    )
    done = subprocess.run(
        [PYTHON, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=START_BOUND,
        check=False,
    )
    assert done.returncode == 1
    warning, uncaught = (orjson.loads(line) for line in done.stderr.splitlines())
    assert warning["level"] == "WARNING" and "UserWarning: old" in warning["message"]
    assert uncaught["level"] == "CRITICAL" and uncaught["message"] == "uncaught exception"
    assert uncaught["exception"].endswith("RuntimeError: bad\nthing")
