"""The one-server commands, no config file: `connect` (a remote HTTP server served on stdio) and
`expose` (a stdio server served over Streamable HTTP)."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import NoReturn

import anyio
import click

from gateway.backend_auth.wire import outbound_problem
from gateway.backends import fallback
from gateway.cli.common import (
    SECRET_VAR,
    error,
    log_format,
    log_level,
    run_gateway,
    setup_logging,
)
from gateway.cli.startup import HeldLogs, Wording, first_answer
from gateway.config import (
    BackendAuth,
    BackendConfig,
    Config,
    ConfigInvalid,
    HttpListen,
    HttpTarget,
    Listen,
    Root,
    StdioTarget,
    default_connect_timeout,
)
from gateway.config.credentials import CLIENT_ASSERTION_ALGORITHMS, CLIENT_AUTH_METHODS
from gateway.config.model import ISOLATIONS
from gateway.config.naming import backend_name, package_json

wait_option = click.option(
    "--wait",
    is_flag=True,
    help="Start even if the server cannot be reached yet, and retry in the background "
    "(without it: one line and exit status 2).",
)


def _parse_header(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition(":")
        if not sep or not name.strip():
            raise click.BadParameter(f"{value!r} is not 'Name: value'")
        out[name.strip()] = rest.strip()
    return out


@click.command()
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
@wait_option
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
    wait: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve one remote HTTP server on stdio.

    What a desktop host spawns to reach a remote server, e.g.
    mcp-transparent-gateway connect https://example.com/mcp

    A server that asks for a login (401) gets one, as mcp-remote does: the browser opens on
    the authorization server's page, the redirect comes back to 127.0.0.1, and the tokens are
    kept under $XDG_STATE_HOME/mcp-gateway for next time (`auth list`, `auth logout`).

    A server that cannot be reached at start (nothing listening, a wrong path, a token it
    wants and no login possible) ends the command with one line and status 2; --wait starts
    anyway and retries in the background.
    """
    setup_logging(log_level, log_format.lower())
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
    held = None if wait else HeldLogs()
    try:
        if wait:
            if transport == "sse":
                backend = fallback.as_sse(backend)
            elif transport == "auto":
                backend = anyio.run(fallback.settle, backend)
        else:
            token = any(name.lower() == "authorization" for name in headers)
            ask = functools.partial(first_answer, backend, transport, token=token)
            backend, line = anyio.run(ask)
            if line is not None:
                _stop(held, line)
    except ConfigInvalid as exc:
        if held is not None:
            held.discard()
        for problem in exc.problems:
            error(str(problem))
        sys.exit(2)
    except KeyboardInterrupt:  # (Ctrl-C while the URL is asked: no traceback)
        if held is not None:
            held.discard()
        sys.exit(130)
    config = Config(listen=Listen(stdio=True), backends=(backend,), source="connect")
    run_gateway(config, wording=Wording(url=url), held=held)


def _stop(held: HeldLogs | None, line: str) -> NoReturn:
    """A start that cannot be: its one line (what was logged so far is dropped), status 2."""
    if held is not None:
        held.discard()
    error(line)
    sys.exit(2)


def _parse_env(_: click.Context, __: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{value!r} is not 'NAME=value'")
        out[name] = rest
    return out


@click.command(context_settings={"ignore_unknown_options": True})
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
@click.option(
    "--isolation",
    type=click.Choice(ISOLATIONS),
    default="shared",
    show_default=True,
    help="per_session: a child of its own for each client (a legacy session, or a caller by "
    "its Authorization header), for servers that keep state per client; shared: one child "
    "for every client.",
)
@click.option(
    "--roots",
    "roots",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    metavar="PATH",
    help="A directory the gateway answers the server's roots/list with when no client's "
    "roots can be asked (repeatable).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@wait_option
@log_level
@log_format
def expose(
    host: str,
    port: int,
    path: str,
    request_timeout: float,
    env: dict[str, str],
    cwd: str | None,
    isolation: str,
    roots: tuple[Path, ...],
    command: tuple[str, ...],
    wait: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve one stdio server over Streamable HTTP.

    Put the server's command after `--`, e.g.
    mcp-transparent-gateway expose --port 8080 --env API_KEY=... -- python -m my_server --flag

    The server inherits this command's environment, as it would when run from the same shell.
    Its backend is named after the server, not the launcher (`npx -y @scope/server-x` is
    `server-x`, `node .../server-x/dist/index.js` is its package.json's name, `python
    server.py` is `server`).

    A server that does not start (command not found, exits at once) ends the command with one
    line, its stderr's last lines in it, and status 2; --wait starts anyway and retries in the
    background.
    """
    setup_logging(log_level, log_format.lower())
    target = StdioTarget(
        command=command[0], args=tuple(command[1:]), env=env, cwd=cwd, inherit_env=True
    )
    backend = BackendConfig(
        name=backend_name(command, package_json(cwd)),
        target=target,
        request_timeout=request_timeout,
        connect_timeout=default_connect_timeout(target),
        isolation=isolation,
        roots=tuple(Root(uri=p.resolve().as_uri()) for p in roots),
    )
    listen = Listen(http=HttpListen(host=host, port=port, path=path))
    wording = Wording(port=f"--port {port}", command=command)
    held = None if wait else HeldLogs()
    run_gateway(
        Config(listen=listen, backends=(backend,), source="expose"), wording=wording, held=held
    )
