"""The client the official conformance suite drives (`conformance client --command ...`).

Usage (the suite appends the mock server's URL):
    python tests/servers/conformance_client.py [--via direct|http|stdio] URL

The suite names the scenario in MCP_CONFORMANCE_SCENARIO, the protocol revision in
MCP_CONFORMANCE_PROTOCOL_VERSION (2025-11-25: the initialize handshake; 2026-07-28:
stateless, per-request `_meta`) and, for some scenarios, the calls to make in
MCP_CONFORMANCE_CONTEXT. The client is the SDK's `Client` (answering elicitation with
the schema's defaults, sampling with a fixed text, roots with one root); what it does
against each mock server is generic: list everything, call every tool it kept.

`--via` says how the client reaches the mock server:
- `direct`: itself, as the suite intends;
- `http`: through a gateway (`mcp-transparent-gateway run`, one HTTP backend: the mock server) over
  HTTP, the gateway being the HTTP client the mock server judges;
- `stdio`: through `mcp-transparent-gateway connect URL`, the stdio bridge, spoken to over stdio.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.context import ClientRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
    Tool,
)

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

ROOT = Path(__file__).resolve().parent.parent.parent
# How long the gateway may take to start listening.
START_BOUND = 20.0


def value_for(schema: dict[str, Any]) -> Any:
    """A value a property schema accepts: its default, else the first enum/const, else a
    plain value of its type."""
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        options = schema.get(key)
        if options and isinstance(options[0], dict) and "const" in options[0]:
            return options[0]["const"]
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items", {})
        return [value_for(items)] if isinstance(items, dict) else []
    return {
        "string": "x",
        "integer": 1,
        "number": 1,
        "boolean": True,
        "object": {},
        "null": None,
    }.get(kind if isinstance(kind, str) else "string", "x")


def arguments_for(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments for every property of an input schema."""
    properties = schema.get("properties") or {}
    return {name: value_for(prop) for name, prop in properties.items() if isinstance(prop, dict)}


async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    """Accept with every field filled, defaults first (SEP-1034: the client applies them)."""
    schema = getattr(params, "requested_schema", None) or {}
    return ElicitResult(action="accept", content=arguments_for(schema))


async def on_sample(
    context: ClientRequestContext, params: CreateMessageRequestParams
) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant",
        content=TextContent(type="text", text="This is a test response from the client"),
        model="conformance-client",
        stop_reason="endTurn",
    )


async def on_roots(context: ClientRequestContext) -> ListRootsResult:
    root = Root.model_validate({"uri": "file:///tmp/conformance", "name": "conformance"})
    return ListRootsResult(roots=[root])


async def exercise(client: Client, scenario: str, context: dict[str, Any]) -> None:
    tools: list[Tool] = (await client.list_tools()).tools
    calls: list[tuple[str, dict[str, Any]]]
    if "toolCalls" in context:
        calls = [(c["name"], c.get("arguments") or {}) for c in context["toolCalls"]]
    elif scenario == "json-schema-2020-12-preservation":
        focal = next(t for t in tools if t.name == "json_schema_2020_12_tool")
        calls = [("json_schema_echo", {"schema": focal.input_schema})]
    else:
        calls = [(t.name, arguments_for(t.input_schema)) for t in tools]
    async with anyio.create_task_group() as tg:
        for name, args in calls:
            tg.start_soon(call_quietly, client, name, args)
    if scenario == "http-standard-headers":
        resources = (await client.list_resources()).resources
        for resource in resources[:1]:
            await client.read_resource(resource.uri)
        prompts = (await client.list_prompts()).prompts
        for prompt in prompts[:1]:
            args = {a.name: "x" for a in prompt.arguments or []}
            await client.get_prompt(prompt.name, args)


async def call_quietly(client: Client, name: str, args: dict[str, Any]) -> None:
    """A failing call is the scenario's to judge, not a reason to stop the others."""
    try:
        await client.call_tool(name, args)
    except Exception as exc:
        print(f"call {name} failed: {exc!r}", file=sys.stderr)


@contextmanager
def gateway_http(url: str) -> Iterator[str]:
    """An HTTP gateway whose one backend is `url`; yields the gateway's own URL."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
                    "backends": {"mock": {"http": {"url": url}}},
                }
            )
        )
        args = [sys.executable, "-m", "gateway", "run", "--config", str(config)]
        proc = subprocess.Popen(
            [*args, "--log-level", "info"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            yield wait_listening(proc)
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_listening(proc: subprocess.Popen[bytes]) -> str:
    """Read the gateway's stderr until it says where it listens (bounded); keep relaying the
    rest to our stderr, which the suite saves."""
    found: list[str] = []
    seen = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            if not found and (m := re.search(r"listening on (http://\S+)", line)):
                found.append(m.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=pump, daemon=True).start()
    if not seen.wait(START_BOUND) or not found:
        raise SystemExit("gateway did not start listening")
    return found[0]


@asynccontextmanager
async def connect(via: str, url: str, version: str) -> AsyncIterator[Client]:
    mode = "legacy" if version <= "2025-11-25" else "auto"
    callbacks: dict[str, Any] = {
        "elicitation_callback": on_elicit,
        "sampling_callback": on_sample,
        "list_roots_callback": on_roots,
        "mode": mode,
    }
    if via == "stdio":
        bridge = StdioServerParameters(
            command=sys.executable,
            args=["-m", "gateway", "connect", url],
            cwd=str(ROOT),
            env=dict(os.environ),
        )
        async with Client(bridge, **callbacks) as client:
            yield client
    elif via == "http":
        with gateway_http(url) as front:
            async with Client(front, **callbacks) as client:
                yield client
    else:
        async with Client(url, **callbacks) as client:
            yield client


async def run(via: str, url: str) -> None:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    version = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "2025-11-25")
    context = orjson.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    async with connect(via, url, version) as client:
        await exercise(client, scenario, context)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--via", choices=["direct", "http", "stdio"], default="direct")
    parser.add_argument("url")
    args = parser.parse_args()
    anyio.run(run, args.via, args.url)


if __name__ == "__main__":
    main()
