"""`pins record|diff|approve`: the pin file of a config's `pins:` (docs/trusting-tools/pinning.md).

Each starts the pinned backends as `run` would (no listener), reads their definitions and
stops them again. `record` writes every pinned backend's definitions; `diff` prints what differs
from the pins (exit 1 when anything does, as diff(1)); `approve` accepts one backend's current
definitions, or one of its items. The file is written whole and renamed into place, so a running
gateway (which looks at it every second) never reads half of it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import anyio
import click

from gateway.app.cluster import share_pins
from gateway.app.errors import StartupError
from gateway.app.inventory import Definitions, definitions
from gateway.app.pins import read
from gateway.cli.common import error, load_or_exit, setup_logging
from gateway.config import Config
from gateway.core import pins as p

config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The gateway's YAML config (its pins: names the pin file).",
)


@click.group()
def pins() -> None:
    """Tool-definition pinning: record, compare and approve the definitions of the backends'
    tools, prompts and resource templates (the config's pins:)."""


@pins.command()
@config_option
def record(config_path: Path) -> None:
    """Write the pin file from the pinned backends' definitions as they list them now."""
    config = _pinned(config_path)
    found = _definitions(config)
    failed = [d for d in found if d.found is None]
    for d in failed:
        error(f"backend {d.name}: definitions not read: {d.problem}")
    if failed:
        sys.exit(1)
    assert config.pins is not None
    pinned = {d.name: d.found for d in found if d.found is not None}
    _write(config, pinned)
    for name, kinds in pinned.items():
        counts = ", ".join(f"{len(kinds.get(kind, {}))} {kind}" for kind in p.KINDS)
        click.echo(f"{name}: {counts}")
    click.echo(f"pins recorded in {config.pins.file}")


@pins.command()
@config_option
@click.argument("backend", required=False)
def diff(config_path: Path, backend: str | None) -> None:
    """What differs between the pins and the definitions now (of BACKEND, or of every pinned
    backend). Exit 1 when anything does."""
    config = _pinned(config_path)
    pinned = _pins(config)
    found = _definitions(config, [backend] if backend is not None else None)
    differs = False
    for d in found:
        if d.found is None:
            error(f"backend {d.name}: definitions not read: {d.problem}")
            differs = True
            continue
        for change in p.changes(pinned.get(d.name), d.found):
            differs = True
            click.echo(f"{d.name} {_singular(change.kind)} {change.name}: {change.status}")
            for line in change.lines:
                click.echo(f"    {line}")
    if not differs:
        click.echo("no changes: every definition is as pinned")
    sys.exit(1 if differs else 0)


@pins.command()
@config_option
@click.argument("backend")
@click.argument("tool", required=False)
def approve(config_path: Path, backend: str, tool: str | None) -> None:
    """Accept BACKEND's current definitions into the pin file: all of them, or only TOOL (a
    tool's or prompt's name, or a template's uriTemplate). A running gateway takes the approval
    up within a second."""
    config = _pinned(config_path)
    pinned = _pins(config)
    (found,) = _definitions(config, [backend])
    if found.found is None:
        error(f"backend {backend}: definitions not read: {found.problem}")
        sys.exit(1)
    if tool is not None and not any(tool in items for items in found.found.values()):
        error(f"backend {backend} lists no tool, prompt or template named {tool!r}")
        sys.exit(1)
    assert config.pins is not None
    before = pinned.get(backend)
    _write(config, p.approve(pinned, backend, found.found, tool))
    accepted = [
        c
        for c in p.changes(before, found.found)
        if tool is None or c.name == tool
        if c.status != p.REMOVED or tool is None
    ]
    for change in accepted:
        click.echo(f"approved {backend} {_singular(change.kind)} {change.name} ({change.status})")
    if not accepted:
        click.echo(f"nothing to approve: {backend}'s definitions are as pinned")


def _pinned(config_path: Path) -> Config:
    setup_logging("warning")
    config = load_or_exit(config_path)
    if config.pins is None:
        error(f"{config.source} has no pins: section")
        sys.exit(2)
    return config


def _pins(config: Config) -> dict[str, dict[str, dict[str, p.Pin]]]:
    assert config.pins is not None
    try:
        return read(config.pins.file)
    except p.PinFileInvalid as exc:
        error(str(exc))
        sys.exit(2)


def _definitions(config: Config, only: list[str] | None = None) -> list[Definitions]:
    if only is not None:
        names = {b.name: b for b in config.backends}
        for name in only:
            if name not in names:
                error(f"{config.source} has no backend {name!r}")
                sys.exit(2)
            if config.pin_mode(names[name]) is None:
                error(f"backend {name!r} is not pinned")
                sys.exit(2)
    try:
        return anyio.run(definitions, config, only)
    except StartupError as exc:
        error(str(exc))
        sys.exit(2)
    except TimeoutError:
        error("the backends did not list their definitions in time")
        sys.exit(1)


def _write(config: Config, pinned: p.PinSet) -> None:
    """The file whole, renamed into place (a reader sees the old or the new, never half); with
    cluster.redis, the cluster's pins too, every replica told."""
    assert config.pins is not None
    target = Path(config.pins.file)
    text = p.dump(pinned)
    fd, temporary = tempfile.mkstemp(prefix=".pins-", dir=target.parent)
    try:
        os.fchmod(fd, 0o644)  # (a file to commit and share, not a secret)
        with os.fdopen(fd, "wb") as f:
            f.write(text)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    if anyio.run(share_pins, config, text) is False:
        error("the cluster's pins (redis) not written: each replica takes up its own file")
        sys.exit(1)


def _singular(kind: str) -> str:
    return {"tools": "tool", "prompts": "prompt", "resourceTemplates": "template"}[kind]
