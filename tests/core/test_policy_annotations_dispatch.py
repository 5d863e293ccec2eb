"""Rules on tool annotations and call arguments in the dispatcher, in memory, against a fake
backend whose tools carry annotations (server/tools, Tool annotations): a tool a rule denies by
its annotations is left out of tools/list (server/tools, Listing Tools) and its call gets the
unknown-tool error (server/tools, Error Handling) without reaching the backend; a call is judged
by the catalog's definition, a list by the one it shows; a call whose arguments a rule refuses
gets the same code; a virtual server may offer read-only tools only."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app.servers import make
from gateway.app.wiring import INFO, make_exposure, make_naming
from gateway.backends.base import NotificationSink
from gateway.config import Config, parse
from gateway.core.dispatcher import Dispatcher
from gateway.core.policy import Policy
from gateway.protocol import codes
from gateway.protocol.jsonrpc import Message
from gateway.telemetry.api import NoTelemetry
from tests.support.memory_backend import FakeBackend, ignore, modern, tool_call

pytestmark = [pytest.mark.anyio, pytest.mark.fast]


def tool(name: str, **annotations: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}, "annotations": annotations}


class Files(FakeBackend):
    """A file server in the manner of server-filesystem: its tools and their hints (a test may
    change what it lists); a call answers with its arguments."""

    def __init__(self) -> None:
        super().__init__(self._handle, "fs")
        self.tools = [
            tool("read_file", readOnlyHint=True, openWorldHint=False),
            tool("write_file", readOnlyHint=False, destructiveHint=True),
            tool(
                "create_directory", readOnlyHint=False, destructiveHint=False, idempotentHint=True
            ),
            {"name": "touch", "inputSchema": {"type": "object"}},  # no hints: destructive
        ]

    async def _handle(self, msg: Message, sink: NotificationSink) -> Message | None:
        if msg["method"] == "tools/list":
            return {"jsonrpc": "2.0", "id": msg["id"], "result": {"tools": list(self.tools)}}
        return None  # (MemoryBackend's own answer: a call echoes its arguments)


HEAD = "listen: {stdio: true}\nbackends:\n  fs:\n    stdio: {command: x}\n"
NO_DESTRUCTION = "  rules:\n    - deny: {tools: ['*'], annotations: {destructiveHint: true}}\n"


def over(fs: Files, cfg: Config) -> Dispatcher:
    policy = Policy(cfg.policy) if cfg.policy is not None else None
    exposures = [make_exposure(b) for b in cfg.backends]
    return Dispatcher([fs], exposures, make_naming(cfg), INFO, policy=policy)


async def gateway(policy: str = NO_DESTRUCTION, backend: str = "") -> tuple[Dispatcher, Files]:
    """A dispatcher under `policy` over `Files()` (`backend`: more of its config), loaded."""
    fs = Files()
    dispatcher = over(fs, parse(HEAD + backend + "policy:\n" + policy))
    await dispatcher.catalogs.load_all()
    return dispatcher, fs


async def reload(dispatcher: Dispatcher) -> None:
    """What a list-changed notification brings about: the catalog loaded again."""
    dispatcher.catalogs.invalidate("fs")
    await dispatcher.catalogs.refresh("fs")


async def names(dispatcher: Dispatcher) -> list[str]:
    reply = await dispatcher.handle(modern(1, "tools/list"), ignore)
    return sorted(t["name"] for t in reply["result"]["tools"])


def calls(backend: Files) -> list[str]:
    return [m["params"]["name"] for m in backend.calls()]


def error(reply: Message) -> dict[str, Any]:
    assert "error" in reply, reply
    found: dict[str, Any] = reply["error"]
    return found


async def test_destructive_tools_are_left_out_of_the_list() -> None:
    dispatcher, _ = await gateway()
    assert await names(dispatcher) == ["create_directory", "read_file"]


async def test_calling_a_destructive_tool_is_refused_as_unknown_and_reaches_no_backend() -> None:
    dispatcher, fs = await gateway()
    denied = error(await dispatcher.handle(tool_call(1, "write_file", path="/x"), ignore))
    unknown = error(await dispatcher.handle(tool_call(2, "no_such_tool"), ignore))
    assert denied["code"] == unknown["code"] == codes.INVALID_PARAMS
    assert denied["message"].replace("write_file", "?") == unknown["message"].replace(
        "no_such_tool", "?"
    )
    assert error(await dispatcher.handle(tool_call(3, "touch"), ignore))["code"] == (
        codes.INVALID_PARAMS
    )
    assert calls(fs) == []
    read = await dispatcher.handle(tool_call(4, "read_file", path="/x"), ignore)
    assert "result" in read and calls(fs) == ["read_file"]


async def test_a_call_is_judged_by_the_catalogs_definition_and_a_list_by_its_own() -> None:
    dispatcher, fs = await gateway()
    # The server now claims write_file reads only; the catalog has not been loaded again.
    fs.tools[1] = tool("write_file", readOnlyHint=True)
    assert "write_file" in await names(dispatcher)  # what the list shows
    reply = await dispatcher.handle(tool_call(1, "write_file"), ignore)
    assert error(reply)["code"] == codes.INVALID_PARAMS and calls(fs) == []
    await reload(dispatcher)
    assert "result" in await dispatcher.handle(tool_call(2, "write_file"), ignore)
    # And back: a tool that turns destructive is refused by the reloaded catalog.
    fs.tools[2] = tool("create_directory")
    await reload(dispatcher)
    reply = await dispatcher.handle(tool_call(3, "create_directory"), ignore)
    assert error(reply)["code"] == codes.INVALID_PARAMS
    assert calls(fs) == ["write_file"]


async def test_a_name_no_catalog_has_fails_closed_under_a_rule_on_annotations() -> None:
    # One unprefixed backend that takes unknown names: a guess has no definition to judge.
    guessing = "    forward_unknown: true\n"
    dispatcher, fs = await gateway(backend=guessing)
    reply = await dispatcher.handle(tool_call(1, "unlisted"), ignore)
    assert error(reply)["code"] == codes.INVALID_PARAMS and calls(fs) == []
    # A rule on names alone lets the same guess through (the backend answers for itself).
    names_only, fs = await gateway("  rules:\n    - deny: {tools: [x]}\n", guessing)
    await names_only.handle(tool_call(2, "unlisted"), ignore)
    assert calls(fs) == ["unlisted"]


ARGUMENTS = (
    "  rules:\n"
    "    - deny: {tools: [read_file], arguments: {/path: {glob: '/etc/*'}}}\n"
    "    - deny: {tools: [create_directory], arguments: {/mode: {equals: 511}}}\n"
)


async def test_a_call_whose_arguments_a_rule_refuses_gets_the_same_code() -> None:
    dispatcher, fs = await gateway(ARGUMENTS)
    assert "read_file" in await names(dispatcher)  # argument conditions hide nothing
    shadow = await dispatcher.handle(tool_call(1, "read_file", path="/etc/shadow"), ignore)
    assert error(shadow)["code"] == codes.INVALID_PARAMS
    mode = await dispatcher.handle(tool_call(2, "create_directory", mode=511), ignore)
    assert error(mode)["code"] == codes.INVALID_PARAMS
    assert calls(fs) == []
    fine = await dispatcher.handle(tool_call(3, "read_file", path="/tmp/a"), ignore)
    assert "result" in fine
    as_text = await dispatcher.handle(tool_call(4, "create_directory", mode="511"), ignore)
    assert "result" in as_text  # "511" is not 511
    assert calls(fs) == ["read_file", "create_directory"]
    assert dispatcher.telemetry.stats.policy_denials["denied"] == 2


async def test_discovery_leaves_out_tools_when_every_one_is_denied_by_its_hints() -> None:
    dispatcher, _ = await gateway(
        "  rules:\n    - deny: {annotations: {openWorldHint: true}}\n"
        "    - deny: {annotations: {readOnlyHint: true}}\n"
    )
    assert await names(dispatcher) == []
    reply = await dispatcher.handle(modern(1, "server/discover"), ignore)
    assert "tools" not in reply["result"].get("capabilities", {})


async def test_a_policy_on_names_alone_reads_no_definition() -> None:
    dispatcher, _ = await gateway("  rules:\n    - deny: {tools: [write_file]}\n")
    assert await names(dispatcher) == ["create_directory", "read_file", "touch"]
    assert "result" in await dispatcher.handle(tool_call(1, "touch"), ignore)
    data = dispatcher.catalogs.data("fs")
    assert data is not None and "tools_by_name" not in vars(data)  # never built


READ_ONLY_SERVER = """servers:
  readonly:
    backends: {fs: {}}
    policy:
      rules:
        - deny: {annotations: {readOnlyHint: false}}
"""


async def test_a_virtual_server_may_offer_read_only_tools_only() -> None:
    cfg = parse(HEAD.replace("stdio: true", "http: {port: 0}") + READ_ONLY_SERVER)
    fs = Files()
    main = over(fs, cfg)
    (server,) = cfg.servers
    readonly = make(cfg, server, main, {"fs": fs}, NoTelemetry())
    await main.catalogs.load_all()
    assert await names(readonly) == ["read_file"]
    assert len(await names(main)) == 4  # the merged server has no policy
    refused = await readonly.handle(tool_call(1, "create_directory"), ignore)
    assert error(refused)["code"] == codes.INVALID_PARAMS and calls(fs) == []
    assert "result" in await readonly.handle(tool_call(2, "read_file"), ignore)


async def test_a_reload_that_brings_rules_on_annotations_reads_the_catalog() -> None:
    dispatcher, fs = await gateway("  rules:\n    - deny: {tools: [x]}\n")
    assert "write_file" in await names(dispatcher)
    cfg = parse(HEAD + "policy:\n" + NO_DESTRUCTION)
    assert cfg.policy is not None
    dispatcher.reconfigure(
        [fs],
        [make_exposure(b) for b in cfg.backends],
        make_naming(cfg),
        cfg.on_backend_failure,
        Policy(cfg.policy),
        None,
    )
    assert await names(dispatcher) == ["create_directory", "read_file"]
    reply = await dispatcher.handle(tool_call(1, "write_file"), ignore)
    assert error(reply)["code"] == codes.INVALID_PARAMS and calls(fs) == []
    assert "result" in await dispatcher.handle(tool_call(2, "create_directory"), ignore)
