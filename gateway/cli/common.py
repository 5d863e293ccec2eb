"""What the commands share: logging to stderr, the config loaded (or exit 2), the gateway run
until stopped, and the options several commands take."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import anyio
import click

from gateway import app
from gateway.cli.startup import PLAIN, HeldLogs, Wording, explain
from gateway.config import (
    Config,
    ConfigInvalid,
    load,
    load_mcp_json,
)
from gateway.telemetry import logs

PYTHON_VAR = "MCP_GATEWAY_PYTHON"
# `connect --auth`: a client secret from the environment rather than the command line (which
# other users of the machine can read in the process list).
SECRET_VAR = "MCP_GATEWAY_CLIENT_SECRET"
LOG_FORMAT_VAR = "MCP_GATEWAY_LOG_FORMAT"


# The log format of this command; in `json` its own error lines are log records too, so that
# every line on stderr is JSON for the collector.
_format = "text"


def setup_logging(level: str, fmt: str = "text") -> None:
    global _format
    _format = fmt
    logs.setup(level, fmt)


def error(text: str) -> None:
    if _format == "json":
        logging.getLogger("gateway.cli").error("%s", text)
    else:
        click.echo(f"error: {text}", err=True)


def config_env() -> dict[str, str]:
    # ${MCP_GATEWAY_PYTHON} lets a config start Python servers with the gateway's own interpreter.
    return {PYTHON_VAR: sys.executable, **os.environ}


def demo_config_path() -> Path:
    return Path(str(resources.files("gateway.demo").joinpath("config.yaml")))


def listen_only_config_path() -> Path:
    return Path(str(resources.files("gateway.demo").joinpath("listen.yaml")))


def load_or_exit(path: Path, mcp_json: Path | None = None) -> Config:
    try:
        extra = load_mcp_json(mcp_json) if mcp_json is not None else ()
        return load(path, config_env(), extra)
    except ConfigInvalid as exc:
        for problem in exc.problems:
            error(str(problem))
        sys.exit(2)


def _loop_options() -> dict[str, bool]:
    # uvloop, when installed, roughly halves the event loop's share of every request's CPU
    # (bench/README.md); MCP_GATEWAY_UVLOOP=0 turns it off to compare or to debug.
    wanted = os.environ.get("MCP_GATEWAY_UVLOOP", "1") != "0"
    return {"use_uvloop": wanted and importlib.util.find_spec("uvloop") is not None}


def run_gateway(
    config: Config,
    reload: Callable[[], Config] | None = None,
    pid_file: Path | None = None,
    watch: Path | None = None,
    stdio_server: str | None = None,
    *,
    wording: Wording = PLAIN,
    held: HeldLogs | None = None,
) -> None:
    """Run until stopped; a start that fails is one line (`wording`: in the command's flags)
    and exit status 2. `held`: the start's log lines, held until it is decided; with them the
    gateway also must reach its backends before it serves (connect, expose without --wait)."""
    status = 0
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run = functools.partial(
                app.run,
                load=reload,
                pid_file=pid_file,
                watch=watch,
                stdio_server=stdio_server,
                must_reach=held is not None,
                serving=held.pass_on if held is not None else None,
            )
            status = anyio.run(run, config, backend_options=_loop_options())
    except app.StartupError as exc:
        if held is not None:
            held.discard()
        error(explain(exc, wording))
        sys.exit(2)
    finally:
        if held is not None:
            held.pass_on()  # (stopped while starting: what it logged is still worth seeing)
    if status:
        sys.exit(status)  # (a second signal cut the shutdown short, or replies were lost)


log_level = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log level written to stderr.",
)
# An environment variable as well: a container's log collector wants JSON whatever command
# the image is run with.
log_format = click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS, case_sensitive=False),
    default="text",
    show_default=True,
    envvar=LOG_FORMAT_VAR,
    show_envvar=True,
    help="How stderr's log lines are written: text (for people) or json (one object a line, "
    "for log collectors). Times are UTC either way.",
)


# (No click file checks on these: an unreadable file is one line of the loader's, exit 2.)
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="YAML config file. Without it, the bundled demo config (HTTP on 127.0.0.1:8080/mcp).",
)
mcp_json_option = click.option(
    "--mcp-json",
    type=click.Path(path_type=Path),
    help="Also serve the servers of a host's mcp.json ('mcpServers': command/args/env or "
    "url/headers). With it and no --config, only those servers, on 127.0.0.1:8080/mcp.",
)


def inputs(config_path: Path | None, mcp_json: Path | None) -> tuple[Path, Path | None]:
    """The config file `run` loads for these options, and the mcp.json beside it."""
    if config_path is None:
        config_path = listen_only_config_path() if mcp_json is not None else demo_config_path()
    return config_path, mcp_json


pid_file_option = click.option(
    "--pid-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the gateway's process id here once SIGHUP reloads (removed at exit); "
    "`reload --pid-file` reads it.",
)
