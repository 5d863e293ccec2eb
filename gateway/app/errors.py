"""What stops a start: the one error the composition root raises for a config it cannot serve."""

from __future__ import annotations


class StartupError(Exception):
    """The gateway cannot start as configured: an address it cannot listen on, a file it cannot
    open, backends that cannot be served together (a name collision under `never`), a lone
    backend that cannot be reached (`Unreachable`)."""

    def __init__(self, message: str, *, in_use: str | None = None) -> None:
        """`in_use`: listen.http's address (host:port), which another process holds (a command
        line that chose the port names its flag instead)."""
        super().__init__(message)
        self.in_use = in_use


class Unreachable(StartupError):
    """A backend that must be reached at start-up (`connect`, `expose`) is down before its
    first catalog (`reason`: its health's; for a child, its exit and stderr's tail), or
    `answered` its first catalog load with a refusal (`reason`: the load's problem)."""

    def __init__(self, backend: str, reason: str, *, answered: bool = False) -> None:
        super().__init__(f"backend {backend}: {reason}")
        self.backend = backend
        self.reason = reason
        self.answered = answered
