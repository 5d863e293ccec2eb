"""Tool search's figures (README "Tool search", bench/README.md): top-1 and top-5 accuracy of the
task phrasings in tests/core/ over the reference servers' catalog and over a generated catalog
of 1,000 tools, the tokens the meta-tools save, index build time and memory, and a search's
time at the gateway (a `_search_tools` call through the dispatcher, in memory).

`python -m bench.search` prints them; `generated()` and `accuracy()` are what the accuracy test
(tests/core/test_search_accuracy.py) holds to a floor.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import yaml

from gateway.app.process import settle_gc
from gateway.backends.base import Call, NotificationSink
from gateway.config.search import ToolSearchConfig
from gateway.core import toolsearch
from gateway.core.dispatcher import Dispatcher, GatewayInfo
from gateway.protocol.jsonrpc import Message
from gateway.routing.names import Naming, PrefixMode
from gateway.routing.search import Entry, Index
from gateway.routing.table import Exposure

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "tests" / "core" / "search_catalog.json"
PHRASINGS = ROOT / "tests" / "core" / "search_phrasings.yaml"
Tools = dict[str, list[dict[str, Any]]]  # backend -> its tools, as it lists them
Phrasing = tuple[str, str]  # (query, "backend/tool")

# The generated catalog: services, each with some of the objects below and four verbs on each.
_SERVICES_TEXT = (
    "github gitlab jira confluence slack teams zoom gmail outlook calendar drive dropbox box "
    "notion asana trello linear monday airtable hubspot salesforce zendesk intercom "
    "freshdesk stripe paypal shopify quickbooks xero netsuite workday greenhouse lever "
    "bamboohr okta auth0 datadog pagerduty sentry grafana splunk snowflake bigquery postgres "
    "mongodb redis kubernetes terraform vercel jenkins"
)
SERVICES = tuple(_SERVICES_TEXT.split())
_OBJECTS_TEXT = (
    "issue ticket comment user team project repository branch commit release invoice "
    "customer payment subscription order product contact deal account meeting event message "
    "channel file folder document page task board alert incident dashboard query table "
    "deployment secret webhook report candidate employee"
)
OBJECTS = tuple(_OBJECTS_TEXT.split())
# verb -> (how a description says it, how people ask for it)
VERBS: Mapping[str, tuple[str, Sequence[str]]] = {
    "list": ("Lists every", ("list all", "show all", "enumerate the")),
    "get": ("Gets one", ("get the", "show the details of the", "look up the")),
    "create": ("Creates a new", ("create a", "make a new", "open a new")),
    "update": ("Updates an existing", ("update the", "change the", "edit the")),
    "delete": ("Deletes a", ("delete the", "remove the", "get rid of the")),
}
OBJECTS_PER_SERVICE = 5
VERBS_PER_OBJECT = 4


def generated(size: int = 1000, seed: int = 33) -> Tools:
    """A deterministic catalog of `size` tools over services named like real ones: each tool
    `{verb}_{object}` of a service, described in a sentence, with arguments by its kind."""
    rng = random.Random(seed)
    tools: Tools = {}
    count = 0
    for service in SERVICES:
        own: list[dict[str, Any]] = []
        for obj in rng.sample(OBJECTS, OBJECTS_PER_SERVICE):
            for verb in rng.sample(sorted(VERBS), VERBS_PER_OBJECT):
                if count == size:
                    break
                own.append(_tool(service, verb, obj))
                count += 1
        tools[service] = own
    return tools


def _tool(service: str, verb: str, obj: str) -> dict[str, Any]:
    said = VERBS[verb][0]
    noun = f"{obj}s" if verb == "list" else obj
    properties: dict[str, Any] = {}
    if verb in ("get", "update", "delete"):
        properties[f"{obj}_id"] = {"type": "string", "description": f"The {obj}'s id."}
    if verb in ("create", "update"):
        properties["fields"] = {"type": "object", "description": f"The {obj}'s fields."}
    if verb == "list":
        properties["limit"] = {"type": "integer"}
        properties["cursor"] = {"type": "string"}
    return {
        "name": f"{verb}_{obj}",
        "description": f"{said} {noun} in {service.capitalize()}. Needs a {service} connection.",
        "inputSchema": {"type": "object", "properties": properties},
    }


def generated_phrasings(tools: Tools, count: int = 200, seed: int = 34) -> list[Phrasing]:
    """Requests for `count` of the generated tools, in the words people use (one of several
    ways of saying each verb, most not the tool's), each naming the service."""
    rng = random.Random(seed)
    every = [(service, t) for service, own in tools.items() for t in own]
    out: list[Phrasing] = []
    for service, tool in rng.sample(every, min(count, len(every))):
        verb, _, obj = tool["name"].partition("_")
        said = rng.choice(VERBS[verb][1])
        noun = f"{obj}s" if verb == "list" else obj
        out.append((f"{said} {noun.replace('_', ' ')} in {service}", f"{service}/{tool['name']}"))
    return out


def reference() -> tuple[Tools, list[Phrasing]]:
    """The reference servers' catalog and the phrasings kept for it."""
    tools: Tools = orjson.loads(CATALOG.read_bytes())
    rows = yaml.safe_load(PHRASINGS.read_text())
    return tools, [(row["query"], row["tool"]) for row in rows]


def index_of(tools: Tools) -> Index:
    """The index as a server prefixing every backend's names with `_` shows them."""
    entries = [
        Entry(f"{backend}_{t['name']}", backend, t["name"], {**t, "name": f"{backend}_{t['name']}"})
        for backend, own in tools.items()
        for t in own
    ]
    return Index.build(entries)


def accuracy(index: Index, phrasings: Sequence[Phrasing]) -> tuple[float, float]:
    """(top-1, top-5): the share of phrasings whose tool comes first, and among the first five."""
    first = five = 0
    for query, wanted in phrasings:
        found = [e.name for e, _ in index.search(query, 5)]
        name = wanted.replace("/", "_", 1)
        first += found[:1] == [name]
        five += name in found
    return first / len(phrasings), five / len(phrasings)


def tokens_saved(tools: Tools) -> tuple[int, int]:
    """(the whole list's estimated tokens, the meta-tools')."""
    index = index_of(tools)
    return index.tokens, toolsearch.META_TOKENS


def build_figures(tools: Tools, rounds: int = 5) -> tuple[float, int]:
    """(median ms to build the index, its bytes as tracemalloc counts them)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        index_of(tools)
        times.append((time.perf_counter() - start) * 1000)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = index_of(tools)
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del index
    return statistics.median(times), size


class _Memory:
    """A backend in memory that lists `tools` (the gateway's cost alone is measured)."""

    transport = "memory"
    up = True

    def __init__(self, name: str, tools: list[dict[str, Any]]) -> None:
        self.name = name
        self._tools = tools

    async def run(self) -> None:
        return None

    async def notify(self, msg: Message) -> None:
        return None

    async def request(
        self, msg: Message, sink: NotificationSink, call: Call, *, long_lived: bool = False
    ) -> Message:
        result: dict[str, Any] = {}
        if msg["method"] == "server/discover":
            result = {"capabilities": {"tools": {}}, "supportedVersions": []}
        elif msg["method"] == "tools/list":
            result = {"tools": self._tools}
        return {"jsonrpc": "2.0", "id": msg["id"], "result": result}


async def at_gateway(tools: Tools, queries: Sequence[str], rounds: int = 20) -> list[float]:
    """Milliseconds of each `_search_tools` call through a dispatcher over `tools`."""
    backends = [_Memory(name, own) for name, own in tools.items()]
    dispatcher = Dispatcher(
        backends,
        [Exposure(backend=b.name, namespace=b.name) for b in backends],
        Naming(PrefixMode.ALWAYS, backends=len(backends)),
        GatewayInfo("mcp-gateway", "bench"),
        tool_search=ToolSearchConfig(mode="on"),
    )
    await dispatcher.catalogs.load_all()
    settle_gc()  # as the gateway does once started (gateway/app/process.py)
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    times: list[float] = []
    for i in range(rounds * len(queries)):
        arguments = {"query": queries[i % len(queries)]}
        msg = {
            "jsonrpc": "2.0",
            "id": i,
            "method": "tools/call",
            "params": {"name": toolsearch.FIND, "arguments": arguments, "_meta": meta},
        }
        start = time.perf_counter()
        reply = await dispatcher.handle(msg, _ignore)
        times.append((time.perf_counter() - start) * 1000)
        assert "result" in reply, reply
    return times[len(queries) :]  # (the first round builds the index)


async def _ignore(_: Message) -> None:
    return None


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def main() -> None:
    real, real_phrasings = reference()
    big = generated()
    big_phrasings = generated_phrasings(big)
    for label, tools, phrasings in (
        ("reference servers", real, real_phrasings),
        ("generated 1,000", big, big_phrasings),
    ):
        count = sum(len(t) for t in tools.values())
        top1, top5 = accuracy(index_of(tools), phrasings)
        full, meta = tokens_saved(tools)
        build_ms, size = build_figures(tools)
        print(f"{label}: {count} tools, {len(phrasings)} phrasings")
        print(f"  accuracy   top-1 {top1:.2f}  top-5 {top5:.2f}")
        print(f"  tokens     full list {full:,}  meta-tools {meta:,}  saved {full - meta:,}")
        print(f"  index      build {build_ms:.1f} ms  memory {size / 1e6:.2f} MB")
        times = await at_gateway(tools, [q for q, _ in phrasings])
        p50, p99 = statistics.median(times), _percentile(times, 0.99)
        print(
            f"  search at the gateway ({len(times)} calls)  p50 {p50:.3f} ms  p99 {p99:.3f} ms"
            f"  max {max(times):.3f} ms"
        )
    print("(tokens: the context budget's estimate, gateway/routing/budget.py)")


if __name__ == "__main__":
    anyio.run(main)
