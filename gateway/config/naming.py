"""A backend's name made from the command that starts it (`expose`): what a user would call the
server, not the launcher in front of it (`npx`, `uvx`, `python`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePosixPath, PureWindowsPath

from gateway.config.model import _NAME

FALLBACK = "server"
# Programs that start the server named by a later argument.
LAUNCHERS = frozenset(
    {"npx", "uvx", "bunx", "pipx", "uv", "npm", "pnpm", "yarn", "bun", "deno", "node", "tsx"}
    | {"python", "python3", "py", "pypy", "pypy3", "ruby", "sh", "bash", "env", "docker"}
)
# Their subcommands that come before the server's own name.
SUBCOMMANDS = frozenset({"run", "exec", "dlx", "x", "tool"})
# Their options that take a value as the next argument (`uvx --from PKG CMD`: CMD names it).
VALUED = frozenset({"-p", "--package", "--from", "--with", "--python", "-e", "--env", "-c"})
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
_SCRIPT = re.compile(r"\.(py|pyz|js|mjs|cjs|ts|mts|rb|sh|exe|cmd|bat)$", re.IGNORECASE)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _program(arg: str) -> str:
    base = PureWindowsPath(PurePosixPath(arg).name).name
    return _SCRIPT.sub("", base).lower()


def _is_launcher(program: str) -> bool:
    return program in LAUNCHERS or _PYTHON.match(program) is not None


def _package_name(spec: str) -> str:
    """`@scope/name@1.2` -> `name`; `pkg==1.0`, `pkg[extra]` -> `pkg`; a path -> its stem."""
    if spec.startswith("@") and "/" in spec:
        spec = spec.split("/", 1)[1]
    spec = spec.split("@", 1)[0] if not spec.startswith("@") else spec
    spec = re.split(r"[=<>!~\[;]", spec, maxsplit=1)[0]
    return _SCRIPT.sub("", PureWindowsPath(PurePosixPath(spec).name).name)


def _sanitize(name: str) -> str:
    name = _UNSAFE.sub("-", name).lstrip("_.-").rstrip("-")
    return name if name and _NAME.match(name) else FALLBACK


def backend_name(command: Sequence[str]) -> str:
    """The name `expose` gives the server started by `command`; always a valid backend name."""
    if not command:
        return FALLBACK
    program = _program(command[0])
    if not _is_launcher(program):
        return _sanitize(_package_name(command[0]))
    args = iter(command[1:])
    for arg in args:
        if arg == "-m" and _PYTHON.match(program):
            return _sanitize(next(args, FALLBACK))  # `python -m pkg.server`: the module
        if arg in VALUED:
            next(args, None)
        elif arg.startswith("-") or arg in SUBCOMMANDS or ("=" in arg and program == "env"):
            continue
        elif _is_launcher(_program(arg)):
            program = _program(arg)  # `uv run python server.py`
        else:
            return _sanitize(_package_name(arg))
    return _sanitize(program)
