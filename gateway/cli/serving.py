"""The commands of a config file: `run` it, `reload` a running gateway, `check-config`, and the
config's JSON `schema`."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import click
import orjson

from gateway import app
from gateway.cli.common import (
    config_env,
    config_option,
    error,
    inputs,
    load_or_exit,
    log_format,
    log_level,
    mcp_json_option,
    pid_file_option,
    run_gateway,
    setup_logging,
)
from gateway.cli.startup import Wording
from gateway.config import (
    Config,
    describe,
    load,
    load_mcp_json,
    missing_commands,
)
from gateway.config.schema import schema_text


def _listening(config: Config, host: str | None, port: int | None) -> Config:
    """The config with `run --host/--port` in place of its listen.http address."""
    http = config.listen.http
    if (host is None and port is None) or http is None:
        return config
    http = replace(http, host=http.host if host is None else host)
    http = replace(http, port=http.port if port is None else port)
    return replace(config, listen=replace(config.listen, http=http))


def _loader(
    path: Path, mcp_json: Path | None, host: str | None = None, port: int | None = None
) -> Callable[[], Config]:
    """How a reload reads the config again: the same files `run` read, the environment as it
    is then, the same --host/--port; a problem is `ConfigInvalid` (the running gateway logs it
    and keeps its config)."""

    def load_again() -> Config:
        extra = load_mcp_json(mcp_json) if mcp_json is not None else ()
        return _listening(load(path, config_env(), extra), host, port)

    return load_again


@click.command()
@config_option
@mcp_json_option
@click.option(
    "--host",
    help="Address the MCP HTTP listener binds, instead of the config's listen.http.host "
    "(0.0.0.0: every interface).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help="Port of the MCP HTTP listener, instead of the config's listen.http.port (0: any "
    "free one).",
)
@pid_file_option
@click.option(
    "--watch",
    is_flag=True,
    help="Also reload when the config file changes (its modification time, looked at every "
    "second).",
)
@click.option(
    "--server",
    "server",
    metavar="NAME",
    help="Serve the virtual server NAME (servers.NAME) on stdio instead of the merged server "
    "(needs listen.stdio); HTTP serves every path as configured.",
)
@log_level
@log_format
def run(
    config_path: Path | None,
    mcp_json: Path | None,
    host: str | None,
    port: int | None,
    pid_file: Path | None,
    watch: bool,
    server: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Run the front ends and backends a config names, until SIGINT/SIGTERM. SIGHUP (or
    `reload`) reads the config again: see docs/operations/reload.md.

    Several backends are merged into one server: their tools, prompts and resources are
    namespaced (`{backend}_{name}`, URIs as `mcp-gateway://{backend}/{uri}`, `ui://` ones as
    `ui://{backend}/{rest}`) per the config's `namespacing` section.
    """
    setup_logging(log_level, log_format.lower())
    path, extra = inputs(config_path, mcp_json)
    config = load_or_exit(path, extra)
    if (host is not None or port is not None) and config.listen.http is None:
        raise click.UsageError(
            f"--host/--port set the HTTP listener's address, and {path} has none: add listen.http"
        )
    config = _listening(config, host, port)
    if server is not None:
        names = [s.name for s in config.servers]
        if server not in names:
            known = ", ".join(names) or "none"
            raise click.UsageError(f"--server {server}: no such virtual server (servers: {known})")
        if not config.listen.stdio:
            raise click.UsageError("--server serves a virtual server on stdio: set listen.stdio")
    wording = Wording(port=f"--port {port}" if port is not None else None)
    load_again = _loader(path, extra, host, port)
    run_gateway(config, load_again, pid_file, path if watch else None, server, wording=wording)


@click.command()
@click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Read the running gateway's process id from this file (the one its `run --pid-file` "
    "wrote).",
)
@click.option("--pid", type=int, help="The running gateway's process id.")
def reload(pid_file: Path | None, pid: int | None) -> None:
    """Make a running gateway read its config again (sends it SIGHUP). What was applied, or
    why the new config was refused, is in the gateway's log and its mcp_gateway_reloads
    metric."""
    if (pid_file is None) == (pid is None):
        raise click.UsageError("give the gateway as --pid-file FILE or as --pid PID")
    if pid_file is not None:
        try:
            pid = int(pid_file.read_text(encoding="ascii").strip())
        except (OSError, ValueError) as exc:
            click.echo(f"error: {pid_file}: no process id to read ({exc})", err=True)
            sys.exit(2)
    assert pid is not None
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        click.echo(f"error: no process {pid}", err=True)
        sys.exit(1)
    except PermissionError:
        click.echo(f"error: not allowed to signal process {pid}", err=True)
        sys.exit(1)
    click.echo(f"sent SIGHUP to {pid}; the gateway's log says what it reloaded")


def _is_mcp_json(path: Path) -> bool:
    """A host's mcp.json given where a config file is expected: its servers and nothing of a
    gateway config (which may be written as JSON too)."""
    if path.suffix != ".json":
        return False
    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False  # the loader says what is wrong with it
    gateway_keys = {"listen", "backends", "backends_from"}
    return (
        isinstance(data, dict)
        and bool({"mcpServers", "servers"} & data.keys())
        and not (gateway_keys & data.keys())
    )


@click.command("check-config")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@config_option
@mcp_json_option
@click.option(
    "--catalogs",
    "--catalog",
    "catalogs",
    is_flag=True,
    help="Also start the backends (no listener), load their catalogs, print for each server "
    "(the merged one and each virtual server) its backends' tools, prompts, resources and "
    "templates with the tokens showing them costs a model (docs/guides/context-budget.md), and "
    "stop them; exit 1 if a catalog did not load.",
)
def check_config(
    path: Path | None, config_path: Path | None, mcp_json: Path | None, catalogs: bool
) -> None:
    """Validate what `run` would load from the same --config and --mcp-json (or FILE, a config
    or an mcp.json) and print what it would start: exit 2 on errors. A stdio command not found
    here is a warning (exit 0): it may exist where the gateway runs. Nothing is started unless
    --catalogs is given."""
    if path is not None:
        if config_path is not None:
            raise click.UsageError("give the config as FILE or as --config, not both")
        if mcp_json is None and _is_mcp_json(path):
            mcp_json = path
        else:
            config_path = path
    config = load_or_exit(*inputs(config_path, mcp_json))
    if problems := app.check_hooks(config):  # (imports the hooks' modules, as `run` would)
        for problem in problems:
            error(problem)
        sys.exit(2)
    summary = describe(config)
    if config_path is None and mcp_json is not None:  # not the bundled listen-only file's name
        _, _, rest = summary.partition("\n")
        summary = f"mcp.json {mcp_json}: OK\n{rest}"
    click.echo(summary)
    for warning in missing_commands(config, config_env()):
        click.echo(f"warning: {warning}", err=True)
    if catalogs:
        _print_catalogs(config)


def _print_catalogs(config: Config) -> None:
    try:
        servers = anyio.run(app.inventory, config)
    except app.StartupError as exc:
        error(str(exc))
        sys.exit(2)
    except TimeoutError:
        error("the backends did not start and stop in time")
        sys.exit(1)
    click.echo(app.describe_catalogs(servers))
    if not all(server.complete for server in servers):
        sys.exit(1)


@click.command("schema")
def schema() -> None:
    """Print the config's JSON Schema (Draft 2020-12), for editors and validators."""
    click.echo(schema_text(), nl=False)
