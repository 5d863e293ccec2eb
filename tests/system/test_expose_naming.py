"""`expose` names its backend after the server its command starts (README, Commands)."""

from __future__ import annotations

import pytest

from gateway.config.model import _NAME
from gateway.config.naming import backend_name


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
        (["python", "-m", "my_server.main"], "my_server.main"),
        (["/usr/local/bin/node", "dist/index.js"], "index"),
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
    assert backend_name(command) == name


@pytest.mark.parametrize("command", [[], ["..."], ["-"], ["python", "-m"], ["_x_"]])
def test_every_name_satisfies_the_configs_backend_name_rule(command: list[str]) -> None:
    assert _NAME.match(backend_name(command))
