"""A newcomer's first mistakes at start-up: each is one line on stderr naming what is wrong and
where, exit status 2, no traceback, and nothing started (the gateway's own processes)."""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path

import orjson
import pytest
import yaml

from gateway.frontends.listener import bind_failure
from tests.support import PYTHON, one_line, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def marker_backend(marker: Path) -> dict[str, object]:
    """A stdio backend whose start leaves a file behind."""
    script = f"open({str(marker)!r}, 'w').close(); import time; time.sleep(5)"
    return {"stdio": {"command": PYTHON, "args": ["-c", script]}}


def config_file(tmp_path: Path, listen: Mapping[str, object], marker: Path) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"listen": listen, "backends": {"a": marker_backend(marker)}}))
    return path


@pytest.mark.parametrize("section", ["http", "admin"])
def test_a_port_in_use_stops_the_start_before_any_backend(
    tmp_path: Path, taken_port: int, section: str
) -> None:
    marker = tmp_path / "backend-started"
    listen: dict[str, object] = {"http": {"host": "127.0.0.1", "port": 0}}
    listen[section] = {"host": "127.0.0.1", "port": taken_port}
    line = one_line(run_cli("run", "--config", str(config_file(tmp_path, listen, marker))))
    assert line.startswith(f"error: listen.{section}: 127.0.0.1:{taken_port} ")
    assert "port" in line  # ... and what to do: another port
    assert not marker.exists()


def test_an_unknown_host_stops_the_start_before_any_backend(tmp_path: Path) -> None:
    marker = tmp_path / "backend-started"
    listen = {"http": {"host": "no-such-host.invalid", "port": 0}}
    line = one_line(run_cli("run", "--config", str(config_file(tmp_path, listen, marker))))
    assert line.startswith("error: listen.http: ") and "'no-such-host.invalid'" in line
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind any port")
def test_a_privileged_port_says_which_ports_need_root(tmp_path: Path) -> None:
    marker = tmp_path / "backend-started"
    listen = {"http": {"host": "127.0.0.1", "port": 80}}
    line = one_line(run_cli("run", "--config", str(config_file(tmp_path, listen, marker))))
    assert "127.0.0.1:80" in line and "1024" in line
    assert not marker.exists()


def test_a_permission_error_names_the_privileged_ports() -> None:
    # (the message for the case above, where the suite runs as root and cannot produce it)
    refused = OSError(errno.EACCES, os.strerror(errno.EACCES))
    assert "1024" in bind_failure("127.0.0.1", 443, refused)
    assert "1024" not in bind_failure("127.0.0.1", 8443, refused)


@pytest.mark.parametrize("command", ["run", "check-config"])
@pytest.mark.parametrize("kind", ["missing", "directory", "unreadable", "not text"])
def test_a_config_that_cannot_be_read_is_one_line(tmp_path: Path, command: str, kind: str) -> None:
    path = tmp_path / "gateway.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        path.write_text("listen: {stdio: true}\n")
        path.chmod(0)
    elif kind == "not text":
        path.write_bytes(b"listen: \xff\xfe\n")
    line = one_line(run_cli(command, "--config", str(path)))
    assert line.startswith(f"error: {path}: ")


def test_an_mcp_json_that_cannot_be_read_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "mcp.json"
    for command in ("run", "check-config"):
        assert one_line(run_cli(command, "--mcp-json", str(missing))).startswith(
            f"error: {missing}: "
        )


MCP_JSON = {
    "mcpServers": {
        "py": {"command": PYTHON, "args": ["-c", "pass"], "env": {"A": "1"}},
        "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp"},
    }
}


@pytest.fixture
def mcp_json(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.json"
    path.write_bytes(orjson.dumps(MCP_JSON))
    return path


@pytest.mark.parametrize("form", ["--mcp-json", "FILE"])
def test_check_config_accepts_the_mcp_json_run_accepts(mcp_json: Path, form: str) -> None:
    args = ["--mcp-json", str(mcp_json)] if form == "--mcp-json" else [str(mcp_json)]
    done = run_cli("check-config", *args)
    assert done.returncode == 0, done.stderr
    assert "backend py: stdio" in done.stdout and "backend remote: http" in done.stdout
    assert done.stdout.startswith(f"mcp.json {mcp_json}: OK\n")
    assert "listen http" in done.stdout  # where `run --mcp-json` alone serves them
    assert done.stderr == ""  # its command exists: no warning


def test_check_config_takes_a_config_and_an_mcp_json_together(
    tmp_path: Path, mcp_json: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({"listen": {"stdio": True}, "backends": {}}))
    done = run_cli("check-config", "--config", str(config), "--mcp-json", str(mcp_json))
    assert done.returncode == 0, done.stderr
    assert "listen stdio" in done.stdout and "listen http" not in done.stdout
    assert "backend py: stdio" in done.stdout


def test_check_config_warns_of_a_command_not_found_here(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    backends = {
        "absent": {"stdio": {"command": "no-such-command-for-mcp-gateway"}},
        "nofile": {"stdio": {"command": "./no-such-dir/server"}},
        "present": {"stdio": {"command": "sh", "args": ["-c", "true"]}},
        "python": {"stdio": {"command": PYTHON}},
    }
    config.write_text(yaml.safe_dump({"listen": {"stdio": True}, "backends": backends}))
    done = run_cli("check-config", str(config))
    assert done.returncode == 0, done.stderr  # only a warning: it may exist where it runs
    warnings = done.stderr.splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: backend ") for w in warnings)
    assert "'no-such-command-for-mcp-gateway'" in warnings[0] and "PATH" in warnings[0]
    assert "'./no-such-dir/server'" in warnings[1]


def test_a_command_is_looked_up_on_the_path_its_child_gets(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    server = tmp_path / "bin" / "my-mcp-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    config = tmp_path / "gateway.yaml"
    target = {"command": "my-mcp-server", "env": {"PATH": str(tmp_path / "bin")}}
    config.write_text(
        yaml.safe_dump({"listen": {"stdio": True}, "backends": {"a": {"stdio": target}}})
    )
    done = run_cli("check-config", str(config))
    assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path: Path, command: str) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("listen:\n  stdio: true\nbackends:\n  a: {stdio: {command: [x}\n")
    line = one_line(run_cli(command, "--config", str(config)))
    assert line.startswith(f"error: {config}:4:")
    assert "<unicode string>" not in line


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_json_syntax_error_names_file_line_and_column(tmp_path: Path, command: str) -> None:
    path = tmp_path / "mcp.json"
    path.write_text('{\n  "mcpServers": {\n    "a": {"command": "x",}\n  }\n}\n')
    line = one_line(run_cli(command, "--mcp-json", str(path)))
    assert line.startswith(f"error: {path}:3:")


def test_an_access_log_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    marker = tmp_path / "backend-started"
    config = config_file(tmp_path, {"http": {"host": "127.0.0.1", "port": 0}}, marker)
    text = config.read_text() + f"telemetry: {{access_log: {tmp_path / 'no-such-dir' / 'a.log'}}}\n"
    config.write_text(text)
    line = one_line(run_cli("run", "--config", str(config)))
    assert line.startswith("error: telemetry.access_log: ")
    assert not marker.exists()
