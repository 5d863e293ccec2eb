"""The `mcp-transparent-gateway` command line: loads or builds a config, hands it to `app.run`."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import anyio
import click
import orjson

from gateway import __version__, app
from gateway.backend_auth.shared import StoreUnavailable
from gateway.backend_auth.store import TokenStore, state_dir
from gateway.backend_auth.wire import outbound_problem
from gateway.backends import fallback
from gateway.config import (
    BackendAuth,
    BackendConfig,
    Config,
    ConfigInvalid,
    HttpListen,
    HttpTarget,
    Listen,
    SseTarget,
    StdioTarget,
    default_connect_timeout,
    describe,
    load,
    load_mcp_json,
    missing_commands,
)
from gateway.config.credentials import CLIENT_ASSERTION_ALGORITHMS, CLIENT_AUTH_METHODS
from gateway.config.naming import backend_name
from gateway.config.schema import schema_text
from gateway.telemetry import logs
from gateway.telemetry.tap import DEFAULT_TOP, Summarizer, follow, format_call, format_summary

PYTHON_VAR = "MCP_GATEWAY_PYTHON"
# `connect --auth`: a client secret from the environment rather than the command line (which
# other users of the machine can read in the process list).
SECRET_VAR = "MCP_GATEWAY_CLIENT_SECRET"
LOG_FORMAT_VAR = "MCP_GATEWAY_LOG_FORMAT"


# The log format of this command; in `json` its own error lines are log records too, so that
# every line on stderr is JSON for the collector.
_format = "text"


def _setup_logging(level: str, fmt: str = "text") -> None:
    global _format
    _format = fmt
    logs.setup(level, fmt)


def _error(text: str) -> None:
    if _format == "json":
        logging.getLogger("gateway.cli").error("%s", text)
    else:
        click.echo(f"error: {text}", err=True)


def _config_env() -> dict[str, str]:
    # ${MCP_GATEWAY_PYTHON} lets a config start Python servers with the gateway's own interpreter.
    return {PYTHON_VAR: sys.executable, **os.environ}


def demo_config_path() -> Path:
    return Path(str(resources.files("gateway.demo").joinpath("config.yaml")))


def listen_only_config_path() -> Path:
    return Path(str(resources.files("gateway.demo").joinpath("listen.yaml")))


def _load_or_exit(path: Path, mcp_json: Path | None = None) -> Config:
    try:
        extra = load_mcp_json(mcp_json) if mcp_json is not None else ()
        return load(path, _config_env(), extra)
    except ConfigInvalid as exc:
        for problem in exc.problems:
            _error(str(problem))
        sys.exit(2)


def _loop_options() -> dict[str, bool]:
    # uvloop, when installed, roughly halves the event loop's share of every request's CPU
    # (bench/README.md); MCP_GATEWAY_UVLOOP=0 turns it off to compare or to debug.
    wanted = os.environ.get("MCP_GATEWAY_UVLOOP", "1") != "0"
    return {"use_uvloop": wanted and importlib.util.find_spec("uvloop") is not None}


def _loader(path: Path, mcp_json: Path | None) -> Callable[[], Config]:
    """How a reload reads the config again: the same files `run` read, the environment as it
    is then; a problem is `ConfigInvalid` (the running gateway logs it and keeps its config)."""

    def load_again() -> Config:
        extra = load_mcp_json(mcp_json) if mcp_json is not None else ()
        return load(path, _config_env(), extra)

    return load_again


def _run(
    config: Config,
    reload: Callable[[], Config] | None = None,
    pid_file: Path | None = None,
    watch: Path | None = None,
) -> None:
    status = 0
    try:
        with contextlib.suppress(KeyboardInterrupt):
            run = functools.partial(app.run, load=reload, pid_file=pid_file, watch=watch)
            status = anyio.run(run, config, backend_options=_loop_options())
    except app.StartupError as exc:
        _error(str(exc))
        sys.exit(2)
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mcp-transparent-gateway")
def main() -> None:
    """A transparent gateway for the Model Context Protocol (revision 2026-07-28).

    Clients connect over stdio or Streamable HTTP; the gateway forwards each request to an MCP
    server reached over stdio (a supervised child process) or Streamable HTTP. Logs go to stderr.
    """


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


def _inputs(config_path: Path | None, mcp_json: Path | None) -> tuple[Path, Path | None]:
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


@main.command()
@config_option
@mcp_json_option
@pid_file_option
@click.option(
    "--watch",
    is_flag=True,
    help="Also reload when the config file changes (its modification time, looked at every "
    "second).",
)
@log_level
@log_format
def run(
    config_path: Path | None,
    mcp_json: Path | None,
    pid_file: Path | None,
    watch: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Run the front ends and backends a config names, until SIGINT/SIGTERM. SIGHUP (or
    `reload`) reads the config again: README "Reloading the config".

    Several backends are merged into one server: their tools, prompts and resources are
    namespaced (`{backend}_{name}`, URIs as `mcp-gateway://{backend}/{uri}`, `ui://` ones as
    `ui://{backend}/{rest}`) per the config's `namespacing` section.
    """
    _setup_logging(log_level, log_format.lower())
    path, extra = _inputs(config_path, mcp_json)
    config = _load_or_exit(path, extra)
    _run(config, _loader(path, extra), pid_file, path if watch else None)


@main.command()
@pid_file_option
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


def _parse_header(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r} is not 'Name: value'")
        out[name.strip()] = rest.strip()
    return out


@main.command()
@click.argument("url")
@click.option(
    "--header",
    "-H",
    "headers",
    multiple=True,
    callback=_parse_header,
    help="Extra header for every request to the server, as 'Name: value' (repeatable).",
)
@click.option("--request-timeout", type=float, default=300.0, show_default=True, help="Seconds.")
@click.option(
    "--transport",
    type=click.Choice(["auto", "http", "sse"]),
    default="auto",
    show_default=True,
    help="http: Streamable HTTP; sse: the 2024-11-05 HTTP+SSE transport (URL: its SSE "
    "endpoint); auto: Streamable HTTP, or HTTP+SSE if the server answers the first POST with "
    "404 or 405.",
)
@click.option(
    "--auth",
    "auth_type",
    type=click.Choice(["oauth", "client_credentials", "none"]),
    default="oauth",
    show_default=True,
    help="oauth: log in (browser, authorization code + PKCE) when the server answers 401, and "
    "remember the login; client_credentials: a service account (--client-id and "
    "--client-secret or --private-key-file); none: send only the -H headers.",
)
@click.option("--client-id", help="A pre-registered client id (default: CIMD or registration).")
@click.option("--client-secret", help="Its secret (prefer the MCP_GATEWAY_CLIENT_SECRET env var).")
@click.option(
    "--client-metadata-url", help="https URL of a Client ID Metadata Document to use as client id."
)
@click.option(
    "--token-endpoint-auth-method",
    type=click.Choice(list(CLIENT_AUTH_METHODS)),
    help="How to authenticate at the token endpoint (default: from the server's metadata).",
)
@click.option(
    "--private-key-file",
    type=click.Path(exists=True, dir_okay=False),
    help="PEM key for private_key_jwt.",
)
@click.option(
    "--signing-algorithm",
    type=click.Choice(list(CLIENT_ASSERTION_ALGORITHMS)),
    default="RS256",
    show_default=True,
    help="private_key_jwt: the assertion's algorithm.",
)
@click.option("--scope", "scopes", multiple=True, help="A scope to ask for (repeatable).")
@click.option(
    "--authorization-server",
    help="Pin the issuer to log in at (the server's metadata must list it).",
)
@click.option(
    "--redirect-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Port of the 127.0.0.1 login redirect (0: any free one); for a pre-registered client.",
)
@click.option("--no-store", is_flag=True, help="Keep the login in memory only, not on disk.")
@click.option("--no-browser", is_flag=True, help="Do not open a browser; only log the login URL.")
@log_level
@log_format
def connect(
    url: str,
    headers: dict[str, str],
    request_timeout: float,
    transport: str,
    auth_type: str,
    client_id: str | None,
    client_secret: str | None,
    client_metadata_url: str | None,
    token_endpoint_auth_method: str | None,
    private_key_file: str | None,
    signing_algorithm: str,
    scopes: tuple[str, ...],
    authorization_server: str | None,
    redirect_port: int,
    no_store: bool,
    no_browser: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve one remote HTTP server on stdio.

    What a desktop host spawns to reach a remote server, e.g.
    mcp-transparent-gateway connect https://example.com/mcp

    A server that asks for a login (401) gets one, as mcp-remote does: the browser opens on
    the authorization server's page, the redirect comes back to 127.0.0.1, and the tokens are
    kept under $XDG_STATE_HOME/mcp-gateway for next time (`auth list`, `auth logout`).
    """
    _setup_logging(log_level, log_format.lower())
    if authorization_server and (why := outbound_problem(authorization_server)):
        raise click.BadParameter(why, param_hint="--authorization-server")
    auth = None
    if auth_type != "none":
        auth = BackendAuth(
            type=auth_type,
            client_id=client_id,
            client_secret=client_secret or os.environ.get(SECRET_VAR) or None,
            client_metadata_url=client_metadata_url,
            token_endpoint_auth_method=token_endpoint_auth_method,
            private_key_file=private_key_file,
            signing_algorithm=signing_algorithm,
            scopes=scopes,
            open_browser=not no_browser,
            authorization_server=authorization_server,
            redirect_port=redirect_port,
            store=not no_store,
        )
        if auth_type == "client_credentials" and not (
            client_id and (auth.client_secret or private_key_file)
        ):
            raise click.UsageError(
                "--auth client_credentials needs --client-id and --client-secret or "
                "--private-key-file"
            )
    backend = BackendConfig(
        name="remote",
        target=HttpTarget(url=url, headers=headers),
        request_timeout=request_timeout,
        auth=auth,
    )
    try:
        if transport == "sse":
            backend = fallback.as_sse(backend)
        elif transport == "auto":
            backend = anyio.run(fallback.settle, backend)
    except ConfigInvalid as exc:
        for problem in exc.problems:
            _error(str(problem))
        sys.exit(2)
    _run(Config(listen=Listen(stdio=True), backends=(backend,), source="connect"))


def _parse_env(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{value!r} is not 'NAME=value'")
        out[name] = rest
    return out


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8080, show_default=True, help="Port to listen on (0: any free).")
@click.option("--path", default="/mcp", show_default=True, help="Path of the MCP endpoint.")
@click.option("--request-timeout", type=float, default=300.0, show_default=True, help="Seconds.")
@click.option(
    "--env",
    "env",
    multiple=True,
    callback=_parse_env,
    help="Set a variable in the server's environment, as NAME=value (repeatable); the server "
    "also gets this command's whole environment.",
)
@click.option(
    "--cwd",
    type=click.Path(exists=True, file_okay=False),
    help="Directory to start the server in (default: the current one).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@log_level
@log_format
def expose(
    host: str,
    port: int,
    path: str,
    request_timeout: float,
    env: dict[str, str],
    cwd: str | None,
    command: tuple[str, ...],
    log_level: str,
    log_format: str,
) -> None:
    """Serve one stdio server over Streamable HTTP.

    Put the server's command after `--`, e.g.
    mcp-transparent-gateway expose --port 8080 --env API_KEY=... -- python -m my_server --flag

    The server inherits this command's environment, as it would when run from the same shell.
    Its backend is named after the server, not the launcher (`npx -y @scope/server-x` is
    `server-x`, `python server.py` is `server`).
    """
    _setup_logging(log_level, log_format.lower())
    target = StdioTarget(
        command=command[0], args=tuple(command[1:]), env=env, cwd=cwd, inherit_env=True
    )
    backend = BackendConfig(
        name=backend_name(command),
        target=target,
        request_timeout=request_timeout,
        connect_timeout=default_connect_timeout(target),
    )
    listen = Listen(http=HttpListen(host=host, port=port, path=path))
    _run(Config(listen=listen, backends=(backend,), source="expose"))


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


@main.command("check-config")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@config_option
@mcp_json_option
def check_config(path: Path | None, config_path: Path | None, mcp_json: Path | None) -> None:
    """Validate what `run` would load from the same --config and --mcp-json (or FILE, a config
    or an mcp.json) and print what it would start: exit 2 on errors. A stdio command not found
    here is a warning (exit 0): it may exist where the gateway runs."""
    if path is not None:
        if config_path is not None:
            raise click.UsageError("give the config as FILE or as --config, not both")
        if mcp_json is None and _is_mcp_json(path):
            mcp_json = path
        else:
            config_path = path
    config = _load_or_exit(*_inputs(config_path, mcp_json))
    summary = describe(config)
    if config_path is None and mcp_json is not None:  # not the bundled listen-only file's name
        _, _, rest = summary.partition("\n")
        summary = f"mcp.json {mcp_json}: OK\n{rest}"
    click.echo(summary)
    for warning in missing_commands(config, _config_env()):
        click.echo(f"warning: {warning}", err=True)


@main.command("schema")
def schema() -> None:
    """Print the config's JSON Schema (Draft 2020-12), for editors and validators."""
    click.echo(schema_text(), nl=False)


@main.command("tap")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--follow",
    "-f",
    "follow_",
    is_flag=True,
    help="Keep reading lines appended to FILE (following rotation) and print each client call "
    "as it completes; Ctrl-C prints the summary again and exits.",
)
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=DEFAULT_TOP,
    show_default=True,
    help="How many of the slowest client calls to list.",
)
def tap(file: Path, follow_: bool, top: int) -> None:
    """Summarize a traffic tap recording (the `tap:` config section writes one).

    Prints client requests by method, tools/call and prompts/get by name, error codes returned
    to clients, requests sent to each backend, and the slowest calls (from a request reaching the
    gateway to its response leaving it). Lines that are not tap records are skipped and counted.
    Exit status 2 when FILE cannot be read.
    """
    summarizer = Summarizer(top)
    offset = 0
    try:
        with file.open("rb") as handle:
            for line in handle:
                if follow_ and not line.endswith(b"\n"):
                    break  # still being written: `follow` reads it once it is whole
                summarizer.feed(line)
                offset += len(line)
    except OSError as exc:
        click.echo(f"error: cannot read {file}: {exc.strerror}", err=True)
        sys.exit(2)
    click.echo(format_summary(summarizer.summary()))
    if not follow_:
        return
    click.echo(f"following {file} (Ctrl-C to stop)", err=True)
    try:
        for line in follow(file, offset):
            call = summarizer.feed(line)
            if call is not None:
                click.echo(format_call(call))
    except KeyboardInterrupt:
        click.echo("")
        click.echo(format_summary(summarizer.summary()))
    except OSError as exc:
        click.echo(f"error: cannot read {file}: {exc.strerror}", err=True)
        sys.exit(2)


@main.group()
def auth() -> None:
    """The logins the gateway keeps for its backends ($XDG_STATE_HOME/mcp-gateway, default
    ~/.local/state/mcp-gateway): one 0600 file per backend URL, client and user."""


@auth.command("list")
def auth_list() -> None:
    """The stored logins: backend, URL, user, issuer, expiry, whether a refresh token is held."""
    store = TokenStore(state_dir())
    records = store.records()
    if not records:
        click.echo(f"no stored logins in {store.directory}")
        return
    now = time.time()
    for _, record in records:
        held = record.get("token")
        token: dict[str, Any] = held if isinstance(held, dict) else {}
        expires = token.get("expires_at")
        if isinstance(expires, int | float):
            left = expires - now
            when = f"expires in {int(left)}s" if left > 0 else "expired"
        else:
            when = "no expiry given"
        refresh = "refresh token" if token.get("refresh_token") else "no refresh token"
        user = record.get("user") or "(gateway)"
        click.echo(
            f"{record.get('backend')}\t{record.get('resource')}\tuser {user}\t"
            f"issuer {record.get('issuer')}\t{when}\t{refresh}"
        )


@auth.command("logout")
@click.argument("backend")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A cluster's config (cluster.redis): also forget BACKEND's logins the replicas share.",
)
def auth_logout(backend: str, config_path: Path | None) -> None:
    """Forget the stored logins of BACKEND (its name or its URL); the next request logs in again."""
    gone = TokenStore(state_dir()).forget(backend)
    if config_path is not None:
        gone += anyio.run(_forget_shared, _load_or_exit(config_path), backend)
    if not gone:
        click.echo(f"no stored login for {backend}", err=True)
        sys.exit(1)
    click.echo(f"removed {gone} stored login(s) for {backend}")


async def _forget_shared(config: Config, backend: str) -> int:
    """Delete BACKEND's (a name in `config`, or a URL) logins from the cluster's Redis."""
    shared = app.shared_logins(config)
    if shared is None:
        click.echo(f"{config.source} has no cluster.redis: no shared logins", err=True)
        sys.exit(2)
    urls = {
        b.target.url
        for b in config.backends
        if isinstance(b.target, HttpTarget | SseTarget) and backend in (b.name, b.target.url)
    } or {backend}
    try:
        return sum([await shared.forget(url) for url in sorted(urls)])
    except StoreUnavailable as exc:
        click.echo(f"shared logins not forgotten: {exc}", err=True)
        sys.exit(1)
    finally:
        await shared.close()
