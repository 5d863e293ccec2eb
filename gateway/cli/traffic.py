"""`tap`: a traffic tap recording summarized, or followed as it grows."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gateway.telemetry.tap import DEFAULT_TOP, Summarizer, follow, format_call, format_summary


@click.command("tap")
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
