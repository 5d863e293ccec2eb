"""The policy end to end: a gateway process whose stdio front end runs under a configured identity
(`listen.stdio.identity`), in front of two real backends (the SDK test server and the demo
server), spoken to by the official SDK client in both eras. What the policy hides is absent from
tools/list (server/tools, Listing Tools); calling it gets the unknown-tool error (server/tools,
Error Handling); what needs a scope the identity lacks gets the insufficient-scope error with
the scope (basic/authorization, Scope Challenge Handling); the rest works."""

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

from tests.support import (
    BOUND,
    PYTHON,
    gateway_command,
    sdk_stdio_command,
    stdio_backend,
    tool_names,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

IDENTITY = {"subject": "ci-bot", "client_id": "ci", "scopes": ["read"], "claims": {"team": "docs"}}
POLICY = {
    "default": "allow",
    "rules": [
        {"deny": {"backends": ["sdk"], "tools": ["boom", "getenv", "t[0-9]*"]}},
        {"deny": {"backends": ["demo"]}, "when": {"claims": {"team": "docs"}}},
        {"require": {"backends": ["sdk"], "tools": ["add"]}, "scopes": ["math"]},
    ],
}


def config(directory: Path, identity: dict[str, Any] | None) -> Path:
    stdio: object = {"identity": identity} if identity is not None else True
    doc = {
        "listen": {"stdio": stdio},
        "backends": {
            "sdk": stdio_backend(sdk_stdio_command()),
            "demo": stdio_backend([PYTHON, "-m", "gateway.demo.server"]),
        },
        "policy": POLICY,
    }
    path = directory / f"gateway-{identity is not None}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@asynccontextmanager
async def gateway(path: Path, mode: str = "auto") -> AsyncIterator[Client]:
    server = StdioServerParameters(command=PYTHON, args=gateway_command(path)[1:])
    with anyio.fail_after(4 * BOUND):
        async with Client(server, mode=mode) as client:
            yield client


async def refusal(client: Client, tool: str) -> MCPError:
    with anyio.fail_after(BOUND), pytest.raises(MCPError) as caught:
        await client.call_tool(tool, {"text": "x", "a": 1, "b": 2, "name": "HOME"})
    return caught.value


async def check_the_policy_holds(client: Client) -> None:
    names = await tool_names(client)
    assert "sdk_echo" in names and "sdk_touch" in names
    assert "sdk_add" in names  # needs a scope: listed, so a client learns what to step up to
    hidden = {"sdk_boom", "sdk_getenv", "sdk_t00", "sdk_t29"}
    assert not hidden & set(names)
    assert not [n for n in names if n.startswith("demo_")]  # the identity's claim hides it

    echoed = await client.call_tool("sdk_echo", {"text": "allowed"})
    block = echoed.content[0]
    assert isinstance(block, TextContent) and block.text == "allowed"

    for name in ("sdk_boom", "demo_echo"):
        denied, unknown = await refusal(client, name), await refusal(client, "sdk_nothing")
        assert denied.code == unknown.code == -32602
        assert denied.message.replace(name, "?") == unknown.message.replace("sdk_nothing", "?")
        assert denied.data == unknown.data

    scoped = await refusal(client, "sdk_add")
    assert scoped.code == -31007
    assert scoped.data == {"scope": "math"}


async def test_a_configured_identity_sees_and_calls_only_what_the_policy_allows(
    tmp_path: Path,
) -> None:
    async with gateway(config(tmp_path, IDENTITY)) as client:
        await check_the_policy_holds(client)


async def test_a_legacy_client_over_stdio_is_filtered_the_same(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, IDENTITY), mode="legacy") as client:
        await check_the_policy_holds(client)


async def test_without_the_identity_the_rules_on_its_claims_do_not_apply(tmp_path: Path) -> None:
    async with gateway(config(tmp_path, None)) as client:
        names = await tool_names(client)
        assert "demo_echo" in names and "sdk_boom" not in names
        echoed = await client.call_tool("demo_echo", {"text": "anonymous"})
        assert not echoed.is_error
