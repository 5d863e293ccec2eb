"""What `check-config` can only warn about: things true or false of the machine it runs on,
which need not be the one the gateway runs on."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from gateway.config.model import Config, StdioTarget


def missing_commands(config: Config, env: Mapping[str, str]) -> list[str]:
    """A warning for each stdio backend whose command would not be found: a bare name looked
    up on the PATH the child gets (its `env`'s, else the gateway's, as the child's exec does),
    a path (with a separator) relative to the child's working directory."""
    warnings: list[str] = []
    for backend in config.backends:
        target = backend.target
        if not isinstance(target, StdioTarget):
            continue
        command = target.command
        if os.sep in command or (os.altsep is not None and os.altsep in command):
            where = Path(target.cwd or ".") / Path(command).expanduser()
            if not where.is_file():
                warnings.append(
                    f"backend {backend.name}: command {command!r} is not an existing file "
                    "here (fine if it exists where the gateway runs)"
                )
        elif (
            shutil.which(command, path=target.env.get("PATH", env.get("PATH", os.defpath))) is None
        ):
            warnings.append(
                f"backend {backend.name}: command {command!r} is not on PATH here: install it or "
                "give its full path (fine if it exists where the gateway runs)"
            )
    return warnings
