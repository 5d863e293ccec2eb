"""Hooks: Python functions a backend's requests and results pass through, configured in
`hooks:` (docs/trusting-tools/hooks.md). The API a hook is written against is `HookEvent` and
`Refuse`; the runner (runner.py) is wired as a layer only for a backend that has hooks."""

from gateway.hooks.api import HookEvent, Refuse, Stage

__all__ = ["HookEvent", "Refuse", "Stage"]
