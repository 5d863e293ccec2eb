"""What stops a start: the one error the composition root raises for a config it cannot serve."""

from __future__ import annotations


class StartupError(Exception):
    """The gateway cannot start as configured: an address it cannot listen on, a file it cannot
    open, backends that cannot be served together (a name collision under `never`)."""
