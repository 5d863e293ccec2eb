"""`expose` names its backend after the server its command starts (README, Commands;
docs/guide/first-hour-cli.md): the package, not the launcher nor the file a package starts."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.config.model import _NAME
from gateway.config.naming import MAX_PACKAGE_BYTES, backend_name, package_json

# What a package.json names, by the script path as given (the table's stand-in for the files).
PACKAGES = {
    "/srv/app/node_modules/@acme/server-x/dist/index.js": "@acme/server-x",
    "./build/index.js": "weather-mcp",
    "/opt/tools/cli.mjs": "@tools/tool-kit@ignored",
}


@pytest.mark.parametrize(
    ("command", "name"),
    [
        (["npx", "-y", "@modelcontextprotocol/server-everything"], "server-everything"),
        (
            ["npx", "-y", "@modelcontextprotocol/server-filesystem@2025.1.0", "/tmp"],
            "server-filesystem",
        ),
        (["npx", "--package", "some-pkg", "the-bin"], "the-bin"),
        (["uvx", "mcp-server-time"], "mcp-server-time"),
        (["uvx", "--from", "git+https://example.com/x", "mcp-server-git"], "mcp-server-git"),
        (["uvx", "mcp-server-fetch==0.6.2"], "mcp-server-fetch"),
        (["uv", "run", "python", "server.py"], "server"),
        (["python", "server.py"], "server"),
        (["python3.11", "-u", "tools/weather.py", "--flag"], "weather"),
        (["python", "-m", "my_server.main"], "my_server"),
        (["python", "-m", "mcp_server_time"], "mcp_server_time"),
        (["python", "-m", "pkg.weather"], "pkg.weather"),
        (["/usr/local/bin/node", "dist/index.js"], "index"),
        # (issue 36: the `@` of a scope in the path named it `node_modules`)
        (["node", "/srv/app/node_modules/@acme/server-x/dist/index.js"], "server-x"),
        (["node", "/x/node_modules/@acme/server-y/dist/index.js"], "server-y"),
        (["node", "/home/me/weather-server/build/index.js"], "weather-server"),
        (["node", "./build/index.js"], "weather-mcp"),
        (["node", "/opt/tools/cli.mjs"], "tool-kit"),
        (["node", "/home/me/projects/github-tools/src/server.ts"], "github-tools"),
        (["tsx", "src/index.ts"], "index"),
        (["python", "/home/me/notes-mcp/src/server.py"], "notes-mcp"),
        (["/home/me/venv/bin/python", "/srv/mcp/main.py"], "mcp"),
        (["node", "C:\\work\\jira-mcp\\dist\\index.js"], "jira-mcp"),
        (["bunx", "@scope/pkg@latest"], "pkg"),
        (["npx", "-y", "@scope/pkg"], "pkg"),
        (["uvx", "pkg"], "pkg"),
        (["pipx", "run", "mcp-server-sqlite[extra]"], "mcp-server-sqlite"),
        (["docker", "run", "-i", "--rm", "mcp/time"], "time"),
        (["./my-server"], "my-server"),
        (["/opt/bin/weather_server", "--port", "1"], "weather_server"),
        (["C:\\tools\\srv.exe"], "srv"),
        (["npx"], "npx"),
        (["python", "--", "@@@.py"], "server"),
        (["./héllo wörld"], "h-llo-w-rld"),
    ],
)
def test_the_name_is_the_servers_not_the_launchers(command: list[str], name: str) -> None:
    assert backend_name(command, PACKAGES.get) == name


@pytest.mark.parametrize("command", [[], ["..."], ["-"], ["python", "-m"], ["_x_"]])
def test_every_name_satisfies_the_configs_backend_name_rule(command: list[str]) -> None:
    assert _NAME.match(backend_name(command))


def write_package(folder: Path, body: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "package.json").write_bytes(body)


def test_the_package_json_above_the_script_names_it(tmp_path: Path) -> None:
    package = tmp_path / "node_modules" / "@scope" / "server-x"
    write_package(package, orjson.dumps({"name": "@scope/server-x", "version": "1.0.0"}))
    (package / "dist").mkdir()
    script = package / "dist" / "index.js"
    assert backend_name(["node", str(script)], package_json()) == "server-x"
    # relative to --cwd, as the child is started there
    assert backend_name(["node", "dist/index.js"], package_json(str(package))) == "server-x"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"name": 3}', b"[]", b'{"name": "  "}', b" " * (MAX_PACKAGE_BYTES + 1)],
)
def test_an_unusable_package_json_falls_back_to_the_folder(tmp_path: Path, body: bytes) -> None:
    package = tmp_path / "weather-server"
    write_package(package, body)
    script = package / "build" / "index.js"
    assert backend_name(["node", str(script)], package_json()) == "weather-server"


def test_no_package_json_anywhere_is_the_folder(tmp_path: Path) -> None:
    script = tmp_path / "deep" / "a" / "b" / "c" / "d" / "e" / "f" / "g" / "dist" / "index.js"
    assert backend_name(["node", str(script)], package_json()) == "g"
