"""Policy rules on tool annotations and call arguments over real processes: a gateway process
whose stdio front end runs under a configured identity, in front of the npm reference servers
`server-filesystem` (its write_file, edit_file and move_file say destructiveHint true,
create_directory false, the readers readOnlyHint true) and `server-everything` (echo and the
get-* tools read only; toggle-simulated-logging and the trigger-* tools do not), spoken to by the
official SDK client in both eras. A tool denied by its annotations is absent from tools/list
(server/tools, Listing Tools) and calling it gets the unknown-tool error (server/tools, Error
Handling) with nothing done on the server; a call whose arguments a rule refuses gets the same
code; the rest works. THREAT_MODEL.md: "destructive tool called by a model that should only
read"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client, MCPError, StdioServerParameters
from mcp_types import TextContent

from tests.support import BOUND, PYTHON, START_BOUND, gateway_command, stdio_backend, tool_names
from tests.support.conformance import npm_server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

ERAS = ["auto", "legacy"]  # (the SDK client discovers the modern era; or opens a session)
POLICY = {
    "rules": [
        # Nobody may call what its server says may destroy.
        {"deny": {"backends": ["fs"], "annotations": {"destructiveHint": True}}},
        # This caller (the CI reader) gets the read-only tools of `ev` only.
        {
            "deny": {"backends": ["ev"], "annotations": {"readOnlyHint": False}},
            "when": {"clients": ["reader"]},
        },
        # And no file with "secret" in its path, whatever the tool's hints.
        {"deny": {"tools": ["read_text_file"], "arguments": {"/path": {"glob": "*secret*"}}}},
    ]
}


def config(directory: Path, shared: Path) -> Path:
    doc = {
        "listen": {"stdio": {"identity": {"subject": "ci-bot", "client_id": "reader"}}},
        "backends": {
            "fs": stdio_backend(
                [*npm_server("server-filesystem"), str(shared)], connect_timeout=60
            ),
            "ev": stdio_backend([*npm_server("server-everything"), "stdio"], connect_timeout=60),
        },
        "policy": POLICY,
    }
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@asynccontextmanager
async def gateway(path: Path, mode: str) -> AsyncIterator[Client]:
    server = StdioServerParameters(command=PYTHON, args=gateway_command(path)[1:])
    with anyio.fail_after(3 * START_BOUND):
        async with Client(server, mode=mode) as client:
            yield client


async def refusal(client: Client, tool: str, arguments: dict[str, Any]) -> MCPError:
    with anyio.fail_after(BOUND), pytest.raises(MCPError) as caught:
        await client.call_tool(tool, arguments)
    return caught.value


async def text(client: Client, tool: str, arguments: dict[str, Any]) -> str:
    with anyio.fail_after(BOUND):
        result = await client.call_tool(tool, arguments)
    assert not result.is_error, result
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


@pytest.mark.parametrize("mode", ERAS)
async def test_destructive_tools_are_hidden_and_refused_by_their_annotations(
    tmp_path: Path, mode: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello.txt").write_text("hello\n")
    (shared / "secret.txt").write_text("the key\n")
    async with gateway(config(tmp_path, shared), mode) as client:
        with anyio.fail_after(2 * START_BOUND):
            names = set(await tool_names(client))
        # server-filesystem: the destructive ones gone, the rest (create_directory writes, but
        # says it destroys nothing) still there.
        assert {"fs_read_text_file", "fs_create_directory", "fs_list_directory"} <= names
        assert not {"fs_write_file", "fs_edit_file", "fs_move_file"} & names
        # server-everything, to this caller: read-only tools alone.
        assert {"ev_echo", "ev_get-sum"} <= names
        assert not {"ev_toggle-simulated-logging", "ev_trigger-sampling-request"} & names

        target = shared / "written.txt"
        denied = await refusal(client, "fs_write_file", {"path": str(target), "content": "x"})
        unknown = await refusal(client, "fs_no_such_tool", {})
        assert denied.code == unknown.code == -32602
        assert denied.message.replace("fs_write_file", "?") == unknown.message.replace(
            "fs_no_such_tool", "?"
        )
        moved = shared / "moved.txt"
        gone = await refusal(
            client, "fs_move_file", {"source": str(shared / "hello.txt"), "destination": str(moved)}
        )
        assert gone.code == -32602
        logging = await refusal(client, "ev_toggle-simulated-logging", {})
        assert logging.code == -32602

        secret = await refusal(client, "fs_read_text_file", {"path": str(shared / "secret.txt")})
        assert secret.code == -32602
        assert await text(client, "fs_read_text_file", {"path": str(shared / "hello.txt")}) == (
            "hello\n"
        )
        await text(client, "fs_create_directory", {"path": str(shared / "made")})
        assert await text(client, "ev_echo", {"message": "hi"}) == "Echo: hi"
    # Nothing the refused calls asked for happened on the server.
    assert not target.exists() and not moved.exists()
    assert (shared / "hello.txt").exists() and (shared / "made").is_dir()


# Callers without the scope neither see nor call destructive tools; callers with it do (one
# backend, so its tools are unprefixed). THREAT_MODEL.md: "destructive tool called by a model
# that should only read".
WRITERS_ONLY = {
    "rules": [
        {
            "deny": {"tools": ["*"], "annotations": {"destructiveHint": True}},
            "when": {"missing_scopes": ["tools:write"]},
        }
    ]
}
CALLERS = {
    "writer": {"identity": {"subject": "ann", "scopes": ["tools:write", "tools:read"]}},
    "reader": {"identity": {"subject": "bob", "scopes": ["tools:read"]}},
    "anonymous": True,  # no identity: lacks every scope
}


@pytest.mark.parametrize("caller", list(CALLERS))
async def test_destructive_tools_are_denied_to_callers_missing_a_scope(
    tmp_path: Path, caller: str
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    doc = {
        "listen": {"stdio": CALLERS[caller]},
        "backends": {
            "fs": stdio_backend([*npm_server("server-filesystem"), str(shared)], connect_timeout=60)
        },
        "policy": WRITERS_ONLY,
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    target = shared / "written.txt"
    async with gateway(path, "auto") as client:
        with anyio.fail_after(2 * START_BOUND):
            names = set(await tool_names(client))
        assert {"read_text_file", "create_directory"} <= names
        arguments = {"path": str(target), "content": "x"}
        if caller == "writer":
            assert {"write_file", "edit_file", "move_file"} <= names
            await text(client, "write_file", arguments)
        else:
            assert not {"write_file", "edit_file", "move_file"} & names
            denied = await refusal(client, "write_file", arguments)
            unknown = await refusal(client, "no_such_tool", {})
            assert denied.code == unknown.code == -32602
        await text(client, "create_directory", {"path": str(shared / "made")})
    assert target.exists() == (caller == "writer")
    assert (shared / "made").is_dir()
