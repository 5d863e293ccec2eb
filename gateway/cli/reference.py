"""The CLI reference page of the docs site (Markdown), read off the click command tree, so it
shows exactly the commands, options and help that `--help` does.

The docs build calls `markdown()` (docs/hooks.py), and the docs test walks `commands()` to check
the shell samples; nothing on the gateway's own paths imports this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

from gateway.cli import main
from gateway.config.reference import escape

PROG = "mcp-transparent-gateway"


def commands(
    command: click.Command | None = None, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of the tree with its words after the program's name, depth first in the
    order `--help` lists them (`()` is the program itself)."""
    if command is None:
        command = main
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command, info_name=PROG)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                yield from commands(sub, (*path, name))


def options(command: click.Command) -> set[str]:
    """Every option spelling a command takes (`--config`, `-H`, `--help`)."""
    ctx = click.Context(command, info_name=PROG)
    found = {"--help", "-h"}
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            found.update(param.opts)
            found.update(param.secondary_opts)
    return found


def _help(command: click.Command) -> str:
    text = inspect.cleandoc(command.help or "")
    # click's \b marks a paragraph it must not rewrap; Markdown needs no such mark.
    return "\n".join(line for line in text.splitlines() if line.strip() != "\b")


def _section(path: tuple[str, ...], command: click.Command) -> list[str]:
    name = " ".join((PROG, *path))
    parent = click.Context(click.Group(PROG), info_name=PROG)
    ctx = click.Context(command, info_name=" ".join(path) or PROG, parent=parent if path else None)
    out = [f"## `{name}`" if path else f"## `{PROG}` (the program)", ""]
    out += ["```text", command.get_usage(ctx), "```", ""]
    out += [escape(_help(command)), ""]
    arguments = [p for p in command.get_params(ctx) if isinstance(p, click.Argument)]
    if arguments:
        shown = ", ".join(f"`{a.make_metavar(ctx)}`" for a in arguments)
        out += [f"Arguments: {shown}.", ""]
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if isinstance(param, click.Option) and record is not None:
            opts, text = record
            rows.append(f"- `{opts}`: {escape(text)}" if text else f"- `{opts}`")
    if rows:
        out += ["Options:", "", *rows, ""]
    if isinstance(command, click.Group):
        subs = [" ".join(p) for p, _ in commands(command, path) if len(p) == len(path) + 1]
        out += ["Commands: " + ", ".join(f"`{s}`" for s in subs) + ".", ""]
    return out


def markdown() -> str:
    """The whole page."""
    out = [
        "# CLI reference",
        "",
        "Every command and option, generated when the site is built from the command line's own",
        f"definitions (what `{PROG} COMMAND --help` prints), so it cannot fall behind the code.",
        "What the commands are for, with examples, is in [Commands](../commands.md).",
        "",
    ]
    for path, command in commands():
        out += _section(path, command)
    return "\n".join(out)
