"""The `mcp-transparent-gateway` command line: loads or builds a config, hands it to `app.run`.

One module per group of commands: serving.py (a config file: run, reload, check-config,
schema), single.py (one server, no config file: connect, expose), traffic.py (tap), logins.py
(auth list, auth logout), pins.py (pins record, diff, approve); common.py holds what they share.
"""

from __future__ import annotations

import mimetypes

# aiohttp's static-file responses make a MIME table when aiohttp.web is imported, reading the
# system's mime.types where it has one (Debian's: ~1,300 types, 0.5 MB resident). The gateway
# serves and sends no files: Python's own table is enough, and the memory is the same with or
# without the file (issue 34). Set before any command module imports aiohttp.
mimetypes.knownfiles = []

import click  # noqa: E402

from gateway import __version__  # noqa: E402
from gateway.cli import clientconfig, logins, pins, serving, single, traffic  # noqa: E402
from gateway.cli.common import demo_config_path  # noqa: E402


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mcp-transparent-gateway")
def main() -> None:
    """A transparent gateway for the Model Context Protocol (revision 2026-07-28).

    Clients connect over stdio or Streamable HTTP; the gateway forwards each request to an MCP
    server reached over stdio (a supervised child process) or Streamable HTTP. Logs go to stderr.
    """


main.add_command(serving.run)
main.add_command(serving.reload)
main.add_command(single.connect)
main.add_command(single.expose)
main.add_command(serving.check_config)
main.add_command(serving.schema)
main.add_command(traffic.tap)
main.add_command(logins.auth)
main.add_command(clientconfig.client_config)
main.add_command(pins.pins)

__all__ = ["demo_config_path", "main"]
