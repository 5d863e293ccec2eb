"""What a stdio child's environment is (basic/transports/stdio: the client launches the server
as a subprocess): `expose` passes its own environment, `--env` additions and `--cwd`, as a
shell would; a config backend gets only a safe list and its `env` unless `inherit_env: true`.
Each through a real gateway process and the SDK server's `getenv` tool.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp_types import TextContent

from tests.support import (
    BOUND,
    PYTHON,
    ROOT,
    Proc,
    gateway_command,
    sdk_stdio_command,
    stdio_backend,
    write_config,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SECRET = "MCP_GATEWAY_TEST_SECRET"


async def child_env(url: str, *names: str) -> list[str]:
    """The values the child sees for `names` ('' when unset), through the gateway."""
    out = []
    with anyio.fail_after(3 * BOUND):
        async with Client(url) as client:
            for name in names:
                result = await client.call_tool("getenv", {"name": name})
                block = result.content[0]
                assert isinstance(block, TextContent)
                out.append(block.text)
    return out


@pytest.fixture
def serving() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    for proc in procs:
        assert proc.stop() == 0, proc.output()


def listening(procs: list[Proc], args: list[str], env: dict[str, str]) -> str:
    proc = Proc(args, env=env)
    procs.append(proc)
    return proc.wait_for(r"listening on (http://\S+)").group(1)


async def test_expose_passes_its_environment_env_additions_and_cwd(
    serving: list[Proc],
) -> None:
    """The server sees the caller's variables and `--env` ones (which win), and starts in
    `--cwd`: its script is named relative to that directory, so it starts only there."""
    url = listening(
        serving,
        [
            *[PYTHON, "-m", "gateway", "expose", "--port", "0"],
            *["--env", "ADDED=yes", "--env", f"{SECRET}=overridden"],
            *["--env", "EMPTY=", "--cwd", str(ROOT / "tests" / "servers")],
            *["--", PYTHON, "sdk_server.py", "stdio"],
        ],
        {"CALLER_KEY": "from-caller", SECRET: "from-caller"},
    )
    seen = await child_env(url, "CALLER_KEY", "ADDED", SECRET, "EMPTY")
    assert seen == ["from-caller", "yes", "overridden", ""]


@pytest.mark.parametrize("inherit", [False, True])
async def test_config_backend_sees_the_gateways_secrets_only_with_inherit_env(
    serving: list[Proc], tmp_path: Path, inherit: bool
) -> None:
    """`inherit_env` off (the default): a variable of the gateway's environment that the
    config does not name stays out of the child, while `env` and PATH reach it."""
    backend = stdio_backend(sdk_stdio_command())
    stdio = backend["stdio"]
    assert isinstance(stdio, dict)
    stdio["env"] = {"NAMED": "named"}
    if inherit:
        stdio["inherit_env"] = True
    config = write_config(tmp_path, {"sdk": backend}, http=True)
    url = listening(serving, gateway_command(config), {SECRET: "s3cret"})
    secret, named, path = await child_env(url, SECRET, "NAMED", "PATH")
    assert secret == ("s3cret" if inherit else "")
    assert named == "named" and path != ""
