"""`auth list` and `auth logout`: the logins the gateway keeps for its backends, on disk and in a
cluster's Redis."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import click

from gateway import app
from gateway.backend_auth.shared import StoreUnavailable
from gateway.backend_auth.store import TokenStore, state_dir
from gateway.cli.common import (
    load_or_exit,
)
from gateway.config import (
    Config,
    HttpTarget,
    SseTarget,
)


@click.group()
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
        gone += anyio.run(_forget_shared, load_or_exit(config_path), backend)
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
