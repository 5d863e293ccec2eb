"""Hot reload (README "Reloading the config"), each test a real gateway process with stdio
backends (SDK servers): SIGHUP, `reload --pid-file` and `--watch` read the config again; an
unchanged backend keeps its child, a removed one finishes what it was sent and its child exits,
an added one's tools appear; a config that does not validate is refused whole, each problem
logged with its file and line, and the old set serves on; calls made during reloads all
succeed; what needs a restart is said and left; the reload metrics count.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
import yaml

from gateway.protocol import codes
from tests.support import (
    BOUND,
    Message,
    Proc,
    call,
    gateway_command,
    gone,
    messages,
    mirrored_headers,
    request,
    run_cli,
    sdk_stdio_command,
    stdio_backend,
)
from tests.support.hooks import REFUSAL_CODE

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

RELOADED = r"config reloaded from \S+: added (.*); removed (.*); changed (.*); kept (.*)$"
# The slow call in flight on a removed backend: long enough to be running during the reload.
SLOW_SECONDS = 1.5


def backend(label: str) -> dict[str, object]:
    # One page per list (no pagination): a tools/list is one request.
    return stdio_backend(sdk_stdio_command("--label", label, "--page-size", "0"))


def write(path: Path, backends: dict[str, dict[str, object]], port: int = 0) -> None:
    listen = {
        "http": {"host": "127.0.0.1", "port": port, "path": "/mcp"},
        "admin": {"host": "127.0.0.1", "port": 0},
    }
    path.write_text(yaml.safe_dump({"listen": listen, "backends": backends}))


@dataclass
class Running:
    proc: Proc
    url: str
    admin: str
    pid_file: Path
    session: aiohttp.ClientSession

    async def post(self, msg: Message, running: anyio.Event | None = None) -> Message:
        async with self.session.post(
            self.url, data=orjson.dumps(msg), headers=mirrored_headers(msg)
        ) as resp:
            async for got in messages(resp):
                if got.get("method") == "notifications/progress" and running is not None:
                    running.set()
                elif got.get("id") == msg["id"]:
                    return got
        raise AssertionError(f"no reply to {msg['id']}")

    async def text(self, tool: str, **arguments: Any) -> str:
        reply = await self.post(call(tool, tool, **arguments))
        assert "result" in reply, reply
        text: str = reply["result"]["content"][0]["text"]
        return text

    async def tools(self) -> set[str]:
        reply = await self.post(request("list", "tools/list"))
        assert "nextCursor" not in reply["result"], reply
        return {t["name"] for t in reply["result"]["tools"]}

    async def metrics(self) -> str:
        async with self.session.get(f"{self.admin}/metrics") as resp:
            return await resp.text()

    def reloads(self, count: int) -> list[re.Match[str]]:
        """The first `count` "config reloaded" lines, once there are that many (bounded)."""

        def found(lines: list[str]) -> list[re.Match[str]]:
            return [m for line in lines if (m := re.search(RELOADED, line))]

        return found(self.proc.wait_lines(lambda lines: len(found(lines)) >= count))[:count]

    def wait_count(self, pattern: str, count: int) -> list[str]:
        def matching(lines: list[str]) -> list[str]:
            return [line for line in lines if re.search(pattern, line)]

        return matching(self.proc.wait_lines(lambda lines: len(matching(lines)) >= count))

    def hangup(self) -> None:
        os.kill(self.proc.popen.pid, signal.SIGHUP)


@asynccontextmanager
async def gateway(config: Path, *extra: str) -> AsyncIterator[Running]:
    pid_file = config.parent / "gateway.pid"
    proc = Proc(gateway_command(config, "--pid-file", str(pid_file), *extra))
    try:
        url = proc.wait_for(r"listening on (http://\S+)").group(1)
        admin = proc.wait_for(r"admin listener \(metrics, health\) on (http://\S+)").group(1)
        async with aiohttp.ClientSession() as session:
            yield Running(proc, url, admin, pid_file, session)
    finally:
        proc.stop()


def sample(metrics: str, name: str, label: str, value: str) -> float:
    found = re.search(rf'^{name}\{{{label}="{value}"\}} (\S+)$', metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def test_sighup_adds_removes_and_keeps_backends(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "b": backend("b")})
    async with gateway(config) as gw:
        assert {"a_echo", "b_echo"} <= await gw.tools()
        a_pid = int(await gw.text("a_whoami"))
        b_pid = int(await gw.text("b_whoami"))
        assert gw.pid_file.read_text().strip() == str(gw.proc.popen.pid)
        replies: dict[str, Message] = {}
        running = anyio.Event()

        async def slow() -> None:
            msg = call("slow", "b_slow", token="s", seconds=SLOW_SECONDS, steps=3)
            replies["slow"] = await gw.post(msg, running)

        with anyio.fail_after(SLOW_SECONDS + BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                await running.wait()  # in flight on b when b is removed
                write(config, {"a": backend("a"), "c": backend("c")})
                gw.hangup()
                (done,) = gw.reloads(1)
                assert done.groups() == ("c", "b", "none", "a")
                tools = await gw.tools()
        assert "c_echo" in tools
        assert not any(t.startswith("b_") for t in tools), tools
        assert await gw.text("c_label") == "c"
        assert int(await gw.text("a_whoami")) == a_pid  # the same child as before
        # b finished its call before it stopped, then its child exited.
        assert replies["slow"]["result"]["content"][0]["text"] == "done", replies
        gw.wait_count(r"backend b stopped", 1)
        with anyio.fail_after(BOUND):
            await gone(b_pid)
        refused = await gw.post(call("gone", "b_echo", text="x"))
        assert refused["error"]["code"] == codes.INVALID_PARAMS, refused
        metrics = await gw.metrics()
        assert sample(metrics, "mcp_gateway_reloads_total", "outcome", "applied") == 1
        assert sample(metrics, "mcp_gateway_reloaded_backends_total", "change", "added") == 1
        assert sample(metrics, "mcp_gateway_reloaded_backends_total", "change", "removed") == 1


async def test_a_changed_backend_is_replaced_and_the_others_keep_their_children(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "b": backend("b")})
    async with gateway(config) as gw:
        a_pid = int(await gw.text("a_whoami"))
        b_pid = int(await gw.text("b_whoami"))
        write(config, {"a": backend("a"), "b": backend("b2")})
        gw.hangup()
        (done,) = gw.reloads(1)
        assert done.groups() == ("none", "none", "b", "a")
        assert await gw.text("b_label") == "b2"
        assert int(await gw.text("b_whoami")) != b_pid
        assert int(await gw.text("a_whoami")) == a_pid
        with anyio.fail_after(BOUND):
            await gone(b_pid)
        metrics = await gw.metrics()
        assert sample(metrics, "mcp_gateway_reloaded_backends_total", "change", "changed") == 1


async def test_an_invalid_config_is_refused_whole_and_the_old_set_serves_on(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "b": backend("b")})
    async with gateway(config) as gw:
        b_pid = int(await gw.text("b_whoami"))
        # Two problems, and a valid change beside them that must not be applied either.
        broken = {"a": {**backend("a"), "bogus": 1}, "c": {**backend("c"), "request_timeout": "x"}}
        write(config, broken)
        gw.hangup()
        lines = gw.wait_count(r"reload refused \(2 problem\(s\)\)", 1)
        problems = gw.wait_count(rf"reload refused: {re.escape(str(config))}:\d+: ", 2)
        assert any("bogus" in line for line in problems), problems
        assert any("request_timeout" in line for line in problems), problems
        assert lines
        tools = await gw.tools()
        assert {"a_echo", "b_echo"} <= tools
        assert not any(t.startswith("c_") for t in tools), tools
        assert int(await gw.text("b_whoami")) == b_pid
        metrics = await gw.metrics()
        assert sample(metrics, "mcp_gateway_reloads_total", "outcome", "refused") == 1
        assert sample(metrics, "mcp_gateway_reloads_total", "outcome", "applied") == 0


async def test_calls_made_during_reloads_all_succeed(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "z": backend("z")})
    async with gateway(config) as gw:
        stop = anyio.Event()
        results: list[Message] = []

        async def keep_calling() -> None:
            while not stop.is_set():
                results.append(await gw.post(call(len(results), "a_echo", text="hi")))

        reloads = 4
        with anyio.fail_after(reloads * BOUND):
            async with anyio.create_task_group() as tg:
                tg.start_soon(keep_calling)
                for n in range(1, reloads + 1):
                    # b comes and goes; a and z stay, so `a` keeps its prefix (auto) and child.
                    extra = {"b": backend("b")} if n % 2 else {}
                    write(config, {"a": backend("a"), **extra, "z": backend("z")})
                    gw.hangup()
                    gw.reloads(n)
                    await gw.text("z_label")
                stop.set()
        failures = [r for r in results if "result" not in r]
        assert results and not failures, failures


async def test_reload_command_and_what_needs_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "b": backend("b")})
    async with gateway(config) as gw:
        port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
        # A new listen port (needs a restart) beside a new backend (applied).
        write(config, {"a": backend("a"), "b": backend("b"), "c": backend("c")}, port=port + 1)
        done = run_cli("reload", "--pid-file", str(gw.pid_file))
        assert done.returncode == 0, done.stderr
        assert f"sent SIGHUP to {gw.proc.popen.pid}" in done.stdout
        (reloaded,) = gw.reloads(1)
        assert reloaded.group(1) == "c"
        gw.wait_count(r"reload: listen changed, which needs a restart; left as it was", 1)
        assert await gw.text("c_label") == "c"  # still served on the old address
    usage = run_cli("reload")
    assert usage.returncode == 2 and "--pid-file" in usage.stderr
    assert not gw.pid_file.exists()  # removed at exit


async def test_watch_reloads_when_the_file_changes(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a")})
    async with gateway(config, "--watch") as gw:
        write(config, {"a": backend("a"), "c": backend("c")})
        (done,) = gw.reloads(1)
        assert done.group(1) == "c"
        assert gw.wait_count(r"gateway\.yaml changed, reloading the config", 1)
        assert await gw.text("c_label") == "c"


async def test_a_hook_that_cannot_be_loaded_is_refused_and_a_loadable_one_applies(
    tmp_path: Path,
) -> None:
    """docs/trusting-tools/hooks.md: a backend's `hooks:` reload with it; a hook that cannot be
    loaded refuses the whole reload (the running set serves on), a loadable one is applied."""
    config = tmp_path / "gateway.yaml"
    write(config, {"a": backend("a"), "b": backend("b")})
    async with gateway(config) as gw:
        a_pid = int(await gw.text("a_whoami"))
        missing = [{"use": "tests.support.hooks:no_such_hook"}]
        write(config, {"a": backend("a"), "b": {**backend("b"), "hooks": missing}})
        gw.hangup()
        problems = gw.wait_count(r"reload refused: .*b\.hooks\.0\.use: cannot load", 1)
        assert problems
        refuse = [{"use": "tests.support.hooks:refuse", "on": "request", "tools": ["label"]}]
        write(config, {"a": backend("a"), "b": {**backend("b"), "hooks": refuse}})
        gw.hangup()
        gw.wait_count(RELOADED, 1)
        reply = await gw.post(call(1, "b_label"))
        assert reply["error"]["code"] == REFUSAL_CODE  # (the refuse hook's own)
        assert int(await gw.text("a_whoami")) == a_pid  # (an unchanged backend kept)
