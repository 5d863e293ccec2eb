"""`reload --help`: its options are described from the side of the command that reads them."""

from __future__ import annotations

from click.testing import CliRunner

from gateway.cli import main


def _option_help(command: str, option: str) -> str:
    ctx_command = main.commands[command]
    (param,) = [p for p in ctx_command.params if option in getattr(p, "opts", ())]
    return str(getattr(param, "help", ""))


def test_reload_describes_pid_file_as_the_file_it_reads() -> None:
    """`run --pid-file` writes the id; `reload --pid-file` reads it: not `run`'s text."""
    text = _option_help("reload", "--pid-file")
    assert "Read" in text and "run --pid-file" in text
    assert text != _option_help("run", "--pid-file")
    shown = CliRunner().invoke(main, ["reload", "--help"])
    assert shown.exit_code == 0
    assert "removed at exit" not in shown.output and "Read the running gateway" in shown.output
