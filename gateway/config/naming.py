"""A backend's name made from the command that starts it (`expose`): what a user would call the
server, not the launcher in front of it (`npx`, `uvx`, `python`), nor the file a package starts
(`node .../node_modules/@scope/server-x/dist/index.js` is `server-x`: its package.json's name,
else its folder that is not a build folder).

Pure: what a script's package is called is asked of `package_of` (the CLI's reads package.json
files; the default knows none)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath, PureWindowsPath

import orjson

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
_JS = re.compile(r"\.(js|mjs|cjs|ts|mts|cts|jsx|tsx)$", re.IGNORECASE)
# Folders that hold a package's files rather than name it.
BUILD_FOLDERS = frozenset(
    {"dist", "build", "src", "lib", "out", "bin", "esm", "cjs", "node_modules", ".bin"}
    | {"scripts", "server", "servers", "app", "source", "sources"}
)
# File stems that say nothing of the server: its folder (or package) names it instead.
GENERIC_STEMS = frozenset(
    {"index", "main", "cli", "server", "app", "mod", "start", "run", "__main__", "entry", "mcp"}
)
# What a script's package is called, by the script's path as given (None: not known).
PackageOf = Callable[[str], str | None]


def no_package(_: str) -> str | None:
    return None


def _program(arg: str) -> str:
    base = PureWindowsPath(PurePosixPath(arg).name).name
    return _SCRIPT.sub("", base).lower()


def _is_launcher(program: str) -> bool:
    return program in LAUNCHERS or _PYTHON.match(program) is not None


def _is_path(arg: str) -> bool:
    return (
        ("/" in arg and not arg.startswith("@")) or "\\" in arg or _SCRIPT.search(arg) is not None
    )


def _parts(path: str) -> list[str]:
    return list(PureWindowsPath(path).parts if "\\" in path else PurePosixPath(path).parts)


def _script_name(path: str, package_of: PackageOf) -> str:
    """A script's server: its package's name (JavaScript: package.json upward), else its stem,
    unless that is generic (`index`), then its nearest folder that is not a build folder."""
    if _JS.search(path) and (package := package_of(path)):
        return _package_name(package)
    parts = _parts(path)
    stem = _SCRIPT.sub("", parts[-1]) if parts else ""
    if stem.lower() not in GENERIC_STEMS:
        return stem
    for folder in reversed(parts[:-1]):
        if folder.lower() not in BUILD_FOLDERS and not folder.startswith("@") and _sane(folder):
            return folder
    return stem


def _sane(folder: str) -> bool:
    return folder not in ("/", ".", "..") and not folder.endswith((":\\", ":")) and folder != "\\"


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


def _module(name: str) -> str:
    """`python -m pkg.server`: the package, unless the module's own name says more."""
    head, _, last = name.rpartition(".")
    return head if head and last.lower() in GENERIC_STEMS else name


def backend_name(command: Sequence[str], package_of: PackageOf = no_package) -> str:
    """The name `expose` gives the server started by `command`; always a valid backend name."""
    if not command:
        return FALLBACK
    program = _program(command[0])
    if not _is_launcher(program):
        if _is_path(command[0]):
            return _sanitize(_script_name(command[0], package_of))
        return _sanitize(_package_name(command[0]))
    args = iter(command[1:])
    for arg in args:
        if arg == "-m" and _PYTHON.match(program):
            return _sanitize(_module(next(args, FALLBACK)))
        if arg in VALUED:
            next(args, None)
        elif arg.startswith("-") or arg in SUBCOMMANDS or ("=" in arg and program == "env"):
            continue
        elif _is_launcher(_program(arg)):
            program = _program(arg)  # `uv run python server.py`
        elif _is_path(arg):
            return _sanitize(_script_name(arg, package_of))
        else:
            return _sanitize(_package_name(arg))
    return _sanitize(program)


# How far up from a script its package.json is looked for, and how much of one is read.
MAX_PACKAGE_LEVELS = 6
MAX_PACKAGE_BYTES = 256 * 1024


def package_json(cwd: str | None = None) -> PackageOf:
    """A `package_of` that reads the `name` of the nearest package.json above a script
    (relative paths from `cwd`, else the current directory): a few small reads, once, when
    `expose` starts; anything unreadable is no package."""

    def package_of(script: str) -> str | None:
        folder = (Path(cwd or ".") / script).parent
        for _ in range(MAX_PACKAGE_LEVELS):
            name = _package_json_name(folder / "package.json")
            if name is not None:
                return name
            if folder.parent == folder:
                return None
            folder = folder.parent
        return None

    return package_of


def _package_json_name(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            data = orjson.loads(f.read(MAX_PACKAGE_BYTES))
    except (OSError, orjson.JSONDecodeError):
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name.strip() else None
