"""`client-config HOST`: the entry each host's documented file format takes (golden files in
tests/cli/golden/client-config/, `UPDATE_GOLDEN=1` rewrites them), merged into an existing
file without losing anything, the file backed up first, and a file it cannot read left alone.

The formats, as each host documents them: Claude Desktop, `claude_desktop_config.json`
(`mcpServers`: command, args; stdio only); Claude Code, the project's `.mcp.json`
(code.claude.com/docs/en/mcp: `mcpServers`, `type` stdio or http); VS Code, `.vscode/mcp.json`
(code.visualstudio.com/docs/copilot/reference/mcp-configuration: `servers`, `type`, `inputs`);
Cursor, `~/.cursor/mcp.json` (cursor.com/docs/mcp: `mcpServers`, command/args or url/headers).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from gateway.cli import main
from gateway.config.hosts import HOSTS, default_path

GOLDEN = Path(__file__).parent / "golden" / "client-config"
GATEWAY = "mcp-transparent-gateway"
URL = "http://127.0.0.1:8080/mcp"
CASES = [
    (host, mode)
    for host in HOSTS
    for mode in ("stdio", "http", "config")
    if (host, mode) != ("claude-desktop", "http")
]


def invoke(*args: str) -> Result:
    command = [] if "--command" in args else ["--command", GATEWAY]
    return CliRunner().invoke(main, ["client-config", *args, *command])


def stdio_config(directory: Path) -> Path:
    config = directory / "gateway.yaml"
    config.write_text("listen: {stdio: true}\nbackends:\n  a: {stdio: {command: x}}\n")
    return config


def mode_args(mode: str, directory: Path) -> list[str]:
    if mode == "config":
        return ["--config", str(stdio_config(directory))]
    return [f"--{mode}", "-H", "Authorization: Bearer ${TOKEN}"]


def one_error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("host, mode", CASES)
def test_print_shows_the_entry_in_the_hosts_documented_format(
    host: str, mode: str, tmp_path: Path
) -> None:
    result = invoke(host, "--print", *mode_args(mode, tmp_path))
    assert result.exit_code == 0, result.output
    shown = result.stdout.replace(str(tmp_path / "gateway.yaml"), "<CONFIG>")
    golden = GOLDEN / f"{host}-{mode}.json"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(shown)
    assert shown == golden.read_text()
    assert list(tmp_path.iterdir()) == ([tmp_path / "gateway.yaml"] if mode == "config" else [])


@pytest.mark.parametrize(
    "host, mode",
    [("claude-desktop", "stdio"), ("claude-code", "http"), ("vscode", "http"), ("cursor", "http")],
)
def test_each_host_gets_http_where_its_file_takes_a_url_else_stdio(host: str, mode: str) -> None:
    (entry,) = orjson.loads(invoke(host, "--print").stdout)[HOSTS[host].key].values()
    assert ("url" in entry) == (mode == "http") and ("command" in entry) == (mode == "stdio")
    assert entry.get("url", URL) == URL and entry.get("args", ["connect", URL]) == ["connect", URL]


def test_claude_desktop_refuses_http_in_one_line() -> None:
    line = one_error_line(invoke("claude-desktop", "--http", "--print"))
    assert "leave out --http" in line


def test_a_file_is_merged_keeping_every_other_entry_and_key(tmp_path: Path) -> None:
    file = tmp_path / ".vscode" / "mcp.json"
    file.parent.mkdir()
    before: dict[str, Any] = {
        "inputs": [{"type": "promptString", "id": "token", "password": True}],
        "servers": {"other": {"type": "stdio", "command": "other-server", "args": ["-v"]}},
        "unknownToUs": {"kept": True},
    }
    file.write_bytes(orjson.dumps(before))
    result = invoke("vscode", "--file", str(file), "--url", "http://127.0.0.1:9000/mcp")
    assert result.exit_code == 0, result.output
    after = orjson.loads(file.read_bytes())
    assert list(after) == ["inputs", "servers", "unknownToUs"]
    assert after["inputs"] == before["inputs"] and after["unknownToUs"] == {"kept": True}
    assert list(after["servers"]) == ["other", "gateway"]
    assert after["servers"]["other"] == before["servers"]["other"]
    assert after["servers"]["gateway"] == {"type": "http", "url": "http://127.0.0.1:9000/mcp"}
    (backup,) = tmp_path.joinpath(".vscode").glob("mcp.json.bak-*")
    assert orjson.loads(backup.read_bytes()) == before
    assert str(backup) in result.stdout and result.stdout.startswith("added 'gateway' in ")


def test_the_same_entry_again_changes_nothing_and_a_new_one_replaces_it(tmp_path: Path) -> None:
    file = tmp_path / "mcp.json"
    assert invoke("cursor", "--file", str(file)).exit_code == 0
    assert not list(tmp_path.glob("*.bak-*"))  # nothing to back up: the file is new
    again = invoke("cursor", "--file", str(file))
    assert again.exit_code == 0 and "nothing changed" in again.stdout
    assert not list(tmp_path.glob("*.bak-*"))
    first = file.read_bytes()
    changed = invoke("cursor", "--file", str(file), "--url", "http://gw.internal:8080/mcp")
    assert changed.exit_code == 0 and changed.stdout.startswith("replaced 'gateway' in ")
    (backup,) = tmp_path.glob("mcp.json.bak-*")
    assert backup.read_bytes() == first
    servers = orjson.loads(file.read_bytes())["mcpServers"]
    assert servers == {"gateway": {"url": "http://gw.internal:8080/mcp"}}
    invoke("cursor", "--file", str(file), "--url", "http://gw.internal:8081/mcp")
    assert len(list(tmp_path.glob("mcp.json.bak-*"))) == 2  # one each change, never overwritten


@pytest.mark.parametrize(
    "content, said",
    [
        (b'{"mcpServers": {"a": {"command": "x"},}}', "not valid JSON"),
        (b'// mine\n{"servers": {}}', "not valid JSON"),
        (b"[1, 2]", "not an object"),
        (b'{"mcpServers": ["a"]}', "is not an object"),
    ],
)
def test_a_file_it_cannot_read_is_left_alone_with_one_line(
    content: bytes, said: str, tmp_path: Path
) -> None:
    file = tmp_path / "claude_desktop_config.json"
    file.write_bytes(content)
    line = one_error_line(invoke("claude-desktop", "--file", str(file)))
    assert said in line and "nothing was changed" in line and "--print" in line
    assert file.read_bytes() == content and list(tmp_path.iterdir()) == [file]


def test_a_new_file_with_headers_is_private_and_an_existing_file_keeps_its_mode(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "new" / ".mcp.json"
    assert (
        invoke("claude-code", "--file", str(secret), "-H", "Authorization: Bearer t").exit_code == 0
    )
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    shared.chmod(0o664)
    assert invoke("claude-code", "--file", str(shared)).exit_code == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664


def test_a_config_that_serves_no_stdio_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "http-only.yaml"
    config.write_text(
        "listen: {http: {host: 127.0.0.1, port: 8080}}\nbackends:\n  a: {stdio: {command: x}}\n"
    )
    line = one_error_line(invoke("cursor", "--print", "--config", str(config)))
    assert "listen: {stdio: true}" in line and "--url" in line


@pytest.mark.parametrize(
    "args, said",
    [
        (["--name", "my gateway"], "--name"),
        (["-H", "no colon"], "'Name: value'"),
        (["--config", "gateway.yaml", "--url", URL], "leave out --url and -H"),
        (["--command", ""], "--command is empty"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args: list[str], said: str) -> None:
    assert said in one_error_line(invoke("vscode", "--print", *args))


def test_default_paths_follow_each_host_and_platform() -> None:
    home, cwd = PurePosixPath("/home/u"), PurePosixPath("/src/app")
    desktop = HOSTS["claude-desktop"]
    assert default_path(desktop, "darwin", {}, home, cwd) == PurePosixPath(
        "/home/u/Library/Application Support/Claude/claude_desktop_config.json"
    )
    assert default_path(desktop, "linux", {}, home, cwd) == PurePosixPath(
        "/home/u/.config/Claude/claude_desktop_config.json"
    )
    windows = default_path(
        desktop,
        "win32",
        {"APPDATA": r"C:\Users\u\AppData\Roaming"},
        PureWindowsPath(r"C:\Users\u"),
        cwd,
    )
    assert windows == PureWindowsPath(
        r"C:\Users\u\AppData\Roaming\Claude\claude_desktop_config.json"
    )
    assert default_path(HOSTS["claude-code"], "linux", {}, home, cwd) == cwd / ".mcp.json"
    assert default_path(HOSTS["vscode"], "linux", {}, home, cwd) == cwd / ".vscode" / "mcp.json"
    assert default_path(HOSTS["cursor"], "linux", {}, home, cwd) == home / ".cursor" / "mcp.json"
