"""Which tests are fast: `make test-fast` runs them (`pytest -m fast`), in well under a minute.

A test is fast unless it starts a process or a listening server, found by reading code rather
than by a hand-kept list, so a new test is classified the day it is written: the test function,
every fixture it requests (the whole closure pytest computed) and every function or class of
`tests/` they name, followed transitively, are parsed; one reference to a starter below makes
the test slow. Starters are the primitives (subprocess, asyncio/anyio process and server calls,
the SDK's stdio client, aiohttp sites) plus the helpers that reach one outside `tests/` (a
`Gateway` starts its backends' processes and listeners).

The reading can miss a path (a process started by gateway code from a config a test built), so
a fast test runs guarded: starting a process, listening on a socket or connecting beyond the
loopback fails it, naming what to add to `STARTERS`. The guard holds in full runs too, so the
classification cannot rot silently.
"""

from __future__ import annotations

import ast
import inspect
import socket
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest

# Any part of a dotted name as a test module sees it (`subprocess.run`, `loop.create_server`);
# `name()` only where it is called as a method (`sock.listen(0)`, not the config's `.listen`).
STARTERS = frozenset(
    {
        "subprocess",
        "create_subprocess_exec",
        "create_subprocess_shell",
        "open_process",
        "run_process",
        "stdio_client",
        "start_server",
        "start_unix_server",
        "create_server",
        "create_tcp_listener",
        "TCPSite",
        "UnixSite",
        "run_app",
        "uvicorn",
        "Gateway",
        "fork",
        "posix_spawn",
        "Popen",
        "listen()",
        "Listener",
        "RedirectListener",
        "StdioServerParameters",
    }
)


def _references(tree: ast.AST) -> Iterator[tuple[str, ...]]:
    """Names the code uses, dotted (`unruly_http.serving`), and methods it calls (`listen()`),
    leaving out annotations (they run nothing)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            skip.update(id(n) for n in ast.walk(node.annotation))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            skip.update(id(n) for n in ast.walk(node.returns))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield (node.func.attr + "()",)
        if isinstance(node, ast.Name):
            yield (node.id,)
        elif isinstance(node, ast.Attribute):
            parts = [node.attr]
            base: ast.expr = node.value
            while isinstance(base, ast.Attribute):
                parts.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name):
                parts.append(base.id)
            yield tuple(reversed(parts))


def _own(obj: object) -> bool:
    """Code of the test suite (followed), as opposed to the gateway's or a library's."""
    module = getattr(obj, "__module__", None) or ""
    return module == "tests" or module.startswith("tests.")


def _resolve(scope: dict[str, Any], dotted: tuple[str, ...]) -> object:
    found: object = scope.get(dotted[0])
    for part in dotted[1:]:
        if not isinstance(found, ModuleType):
            break
        found = getattr(found, part, None)
    return found


_STARTS: dict[object, bool] = {}


def _starts(obj: object) -> bool:
    """Whether `obj` (a function or class) names a starter, itself or through `tests/` code."""
    if obj not in _STARTS:
        _STARTS[obj] = False  # while it is read: code calling itself back adds nothing
        _STARTS[obj] = _reads_as_starting(obj)
    return _STARTS[obj]


def _reads_as_starting(obj: Any) -> bool:
    try:
        source = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return False
    references = set(_references(ast.parse(source)))
    if any(part in STARTERS for dotted in references for part in dotted):
        return True
    module = inspect.getmodule(obj)
    scope: dict[str, Any] = vars(module) if module is not None else {}
    for dotted in references:
        found = _resolve(scope, dotted)
        if found is obj or not _own(found):
            continue
        if (inspect.isfunction(found) or inspect.isclass(found)) and _starts(found):
            return True
    return False


def _is_fast(item: pytest.Function) -> bool:
    if _starts(item.function):
        return False
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fixturedef in defs:
            func = fixturedef.func
            # The guard below is this module's one fixture; it names starters to refuse them.
            if func.__module__ != __name__ and _own(func) and _starts(func):
                return False
    return True


def mark(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function) and _is_fast(item):
            item.add_marker(pytest.mark.fast)


LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"a test classified fast {what}: name the helper that does it in "
            "tests/fast.py STARTERS so the test is classified slow"
        )

    return refused


@pytest.fixture(autouse=True)
def _guard_fast(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("fast") is None:
        return
    # Every way a process starts from Python goes through Popen (asyncio's and anyio's too);
    # every server (asyncio, aiohttp, uvicorn) calls listen().
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))
    monkeypatch.setattr(socket.socket, "listen", _refuse("listened on a socket"))
    connect = socket.socket.connect

    def loopback_only(sock: socket.socket, address: Any) -> None:
        # A client of something in the test process is fine; the network is not.
        if isinstance(address, tuple) and address[0] not in LOOPBACK:
            _refuse(f"connected to {address[0]}")()
        connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
