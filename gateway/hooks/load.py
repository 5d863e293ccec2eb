"""`use:` -> a hook: a built-in (imported only when used), an entry point of the
`mcp_gateway.hooks` group, or `module:function` (an object path after the colon). Loaded once,
when the backend's stack is built; a hook that cannot be loaded stops the start (or the
reload) with a config problem, never a request."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from gateway.config.hooks import HookConfig
from gateway.config.model import ConfigInvalid
from gateway.hooks.runner import Hook

ENTRY_POINT_GROUP = "mcp_gateway.hooks"


def load_all(configs: tuple[HookConfig, ...], where: str) -> tuple[Hook, ...]:
    """Every hook of a list; all the ones that fail to load named in one ConfigInvalid."""
    hooks: list[Hook] = []
    problems: list[str] = []
    for i, config in enumerate(configs):
        try:
            hooks.append(load(config))
        except ConfigInvalid as exc:
            problems += [f"{where}.{i}.use: {p}" for p in exc.problems]
    if problems:
        raise ConfigInvalid(problems)
    return tuple(hooks)


def load(config: HookConfig) -> Hook:
    use = config.use
    if use == "redact":
        from gateway.hooks.redact import Redactor

        return Hook(config, Redactor(config), inline=True)
    if use == "output_limit":
        from gateway.hooks.limit import OutputLimit

        return Hook(config, OutputLimit(config), inline=True)
    return Hook(config, _function(use))


def _function(use: str) -> Any:
    if ":" in use:
        module_name, _, attributes = use.partition(":")
        try:
            value: Any = importlib.import_module(module_name)
            for attribute in attributes.split("."):
                value = getattr(value, attribute)
        except Exception as exc:  # (the operator's module: whatever its import raises)
            raise ConfigInvalid([f"cannot load {use} ({type(exc).__name__}: {exc})"]) from None
    else:
        found = entry_points(group=ENTRY_POINT_GROUP, name=use)
        if not found:
            why = f"{use} is neither a built-in (redact, output_limit) nor an entry point of "
            raise ConfigInvalid([why + ENTRY_POINT_GROUP])
        try:
            value = next(iter(found)).load()
        except Exception as exc:
            raise ConfigInvalid([f"cannot load {use} ({type(exc).__name__}: {exc})"]) from None
    if not callable(value):
        raise ConfigInvalid([f"{use} is not a function"])
    return value
