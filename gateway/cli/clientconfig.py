"""`client-config HOST`: the entry for this gateway in a desktop host's or editor's MCP file,
written there (merged, the file backed up first) or printed. The entries' shapes are in
gateway/config/hosts.py; here the file is read, backed up and replaced."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import click

from gateway.cli.common import error, load_or_exit
from gateway.config import hosts
from gateway.config.hosts import HOSTS, Host, HostFileError, Launch

PROGRAM = "mcp-transparent-gateway"
# A new file holding headers (a token, usually) is readable by its owner only.
PRIVATE_MODE = 0o600
PLAIN_MODE = 0o644


def gateway_command() -> tuple[str, ...]:
    """How a host starts this gateway: the installed program's absolute path (hosts start
    servers with a short PATH of their own), else this interpreter with `-m gateway`."""
    beside = Path(sys.executable).parent / PROGRAM
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside),)
    found = shutil.which(PROGRAM)
    if found is not None:
        return (str(Path(found).absolute()),)
    return (sys.executable, "-m", "gateway")


@click.command("client-config")
@click.argument("host", type=click.Choice(list(HOSTS)))
@click.option(
    "--print",
    "print_only",
    is_flag=True,
    help="Print the entry (under the host's key, ready to paste) instead of writing the file.",
)
@click.option(
    "--url",
    help=f"The gateway's Streamable HTTP endpoint (default: {hosts.DEFAULT_URL}, what `run` "
    "listens on).",
)
@click.option(
    "--stdio",
    "mode",
    flag_value="stdio",
    help="The host starts `connect URL` on stdio (default for claude-desktop, whose file "
    "takes no URL).",
)
@click.option(
    "--http",
    "mode",
    flag_value="http",
    help="The host connects to URL itself (default for claude-code, vscode and cursor).",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="The host starts a whole gateway, `run --config FILE`, on stdio (FILE must set "
    "listen.stdio); instead of --url.",
)
@click.option(
    "--header",
    "-H",
    "headers",
    multiple=True,
    help="A header for every request to URL, as 'Name: value' (repeatable); written into the "
    "file: prefer the host's variables (e.g. 'Authorization: Bearer ${env:TOKEN}' in VS Code).",
)
@click.option(
    "--name", default=hosts.DEFAULT_NAME, show_default=True, help="The server's name in the host."
)
@click.option(
    "--file",
    "file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The host's file to write (default: where the host reads it; e.g. .cursor/mcp.json "
    "for a Cursor project).",
)
@click.option(
    "--command",
    "program",
    help="How the host starts the gateway, e.g. 'uvx mcp-transparent-gateway' (default: this "
    "installation's absolute path).",
)
def client_config(
    host: str,
    print_only: bool,
    url: str | None,
    mode: str | None,
    config_path: Path | None,
    headers: tuple[str, ...],
    name: str,
    file: Path | None,
    program: str | None,
) -> None:
    """Add this gateway to HOST's MCP servers: claude-desktop, claude-code (the project's
    .mcp.json), vscode (.vscode/mcp.json) or cursor (~/.cursor/mcp.json).

    The file is merged, every other entry kept, after a copy FILE.bak-TIMESTAMP; a file that
    is not valid JSON is left alone (exit 2). With --print nothing is written.
    """
    target = HOSTS[host]
    try:
        launch = _launch(target, mode, url, config_path, headers, program)
        server = hosts.entry(target, launch)
        hosts.check_name(name)
        if print_only:
            click.echo(hosts.render(hosts.fragment(target, name, server)).decode(), nl=False)
            return
        path = file if file is not None else _default_path(target)
        click.echo(_write(path, target, name, server, bool(launch.headers)))
    except HostFileError as exc:
        error(str(exc))
        sys.exit(2)


def _launch(
    host: Host,
    mode: str | None,
    url: str | None,
    config_path: Path | None,
    raw_headers: tuple[str, ...],
    program: str | None,
) -> Launch:
    if config_path is not None and (url is not None or raw_headers):
        raise HostFileError(
            "--config starts a gateway of the host's own: leave out --url and -H (they are for "
            "a gateway already running)"
        )
    headers = dict(hosts.parse_header(h) for h in raw_headers)
    gateway = tuple(shlex.split(program)) if program is not None else gateway_command()
    if not gateway:
        raise HostFileError("--command is empty: give the program the host starts")
    if config_path is not None:
        if mode == "http":
            raise HostFileError("--config starts a gateway on stdio: leave out --http")
        config = load_or_exit(config_path)  # (exit 2, its problems said, as `run` would)
        if not config.listen.stdio:
            raise HostFileError(
                f"{config_path}: a host talks to the gateway on stdio: set `listen: {{stdio: "
                "true}` in it, or give the URL of a running gateway with --url instead"
            )
        return hosts.run_launch(gateway, config_path.absolute())
    url = url or hosts.DEFAULT_URL
    if hosts.choose_mode(host, mode) == "stdio":
        return hosts.connect_launch(gateway, url, headers)
    return hosts.http_launch(url, headers)


def _default_path(host: Host) -> Path:
    return Path(
        hosts.default_path(host, sys.platform, os.environ, Path.home(), Path.cwd().absolute())
    )


def _write(path: Path, host: Host, name: str, server: dict[str, object], secret: bool) -> str:
    """Merge the entry into `path` (backed up first) and say what was done, in one line."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as exc:
        raise HostFileError(f"{path}: cannot read it: {exc.strerror}") from None
    document = hosts.read_document(data or b"", str(path), host)
    merged, change = hosts.merge(document, host, name, server)
    if change == "unchanged":
        return f"{path}: already has this entry for {name!r}; nothing changed"
    backup = None
    try:
        if data is not None:
            backup = backup_path(path, datetime.now(UTC))
            shutil.copy2(path, backup)  # (its mode too: the file may hold tokens)
        _replace(path, hosts.render(merged), secret)
    except OSError as exc:
        raise HostFileError(f"{path}: cannot write it: {exc.strerror}; nothing changed") from None
    saved = f" (the old file is {backup})" if backup is not None else ""
    return f"{change} {name!r} in {path}{saved}; {host.after}"


def backup_path(path: Path, now: datetime) -> Path:
    """FILE.bak-YYYYmmddTHHMMSSZ beside it; another in the same second gets -2, -3, ..."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    return candidate


def _replace(path: Path, data: bytes, secret: bool) -> None:
    """Write `data` whole or not at all (a host may read the file at any moment): a temporary
    file beside it, renamed over it; an existing file's mode is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = PRIVATE_MODE if secret else PLAIN_MODE & ~_umask()
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temp, mode)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
