"""`hooks:` as the loader reads it (gateway/config/hook_loader.py): defaults, the shape the
docs give, and each rule broken; `check-config` refusing a hook that cannot be loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import ConfigInvalid, parse
from gateway.config.hooks import DEFAULT_METHODS, MAX_TIMEOUT
from tests.support import run_cli

BACKEND = {"stdio": {"command": "x"}}


def load(hooks: Any, backend_hooks: Any = None) -> Any:
    backend = dict(BACKEND, hooks=backend_hooks) if backend_hooks is not None else BACKEND
    return parse(
        yaml.safe_dump({"listen": {"stdio": True}, "backends": {"b": backend}, "hooks": hooks})
    )


def test_the_documented_shape_and_its_defaults() -> None:
    config = load(
        [
            {"use": "redact"},
            {"use": "output_limit", "max_result_bytes": 65536, "action": "truncate"},
            {"use": "pkg.module:function", "on": "request", "timeout": 1, "on_error": "deny"},
            {"use": "my_entry_point"},
        ],
        backend_hooks=[{"use": "output_limit", "max_result_tokens": 1000}],
    )
    redact, limit, own, entry = config.hooks
    assert (redact.on, redact.methods, redact.timeout, redact.on_error) == (
        "result",
        DEFAULT_METHODS,
        1.0,
        "deny",
    )
    assert (limit.limit, limit.action) == (65536, "truncate")
    assert own.stages == {"request"} and entry.stages == {"request", "result"}
    (backend_limit,) = config.backends[0].hooks
    assert backend_limit.limit == 4000 and backend_limit.action == "refuse"


@pytest.mark.parametrize(
    ("hook", "where"),
    [
        ({}, "hooks.0.use"),
        ({"use": "not a path!"}, "hooks.0.use"),
        ({"use": "redact", "on": "request"}, "hooks.0.on"),
        ({"use": "m:f", "on": "sometimes"}, "hooks.0.on"),
        ({"use": "m:f", "on_error": "shrug"}, "hooks.0.on_error"),
        ({"use": "m:f", "methods": ["tools/list"]}, "hooks.0.methods.0"),
        ({"use": "m:f", "timeout": MAX_TIMEOUT + 1}, "hooks.0.timeout"),
        ({"use": "m:f", "timeout": 0}, "hooks.0.timeout"),
        ({"use": "m:f", "max_result_bytes": 100}, "hooks.0.max_result_bytes"),
        ({"use": "output_limit", "max_result_bytes": 10}, "hooks.0.max_result_bytes"),
        ({"use": "output_limit", "action": "shorten"}, "hooks.0.action"),
        ({"use": "output_limit", "marker": "{secret}"}, "hooks.0.marker"),
        ({"use": "redact", "kinds": ["passwords"]}, "hooks.0.kinds.0"),
        ({"use": "redact", "patterns": {"bad": "("}}, "hooks.0.patterns.bad"),
        ({"use": "redact", "with": {"a": 1}}, "hooks.0.with"),
        ({"use": "m:f", "unknown": 1}, "hooks.0.unknown"),
    ],
)
def test_each_rule_broken_is_a_problem_at_its_key(hook: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        load([hook])
    assert any(f" {where}" in p for p in caught.value.problems), caught.value.problems


def test_hooks_must_be_a_list() -> None:
    with pytest.raises(ConfigInvalid):
        load({"use": "redact"})


def test_check_config_refuses_a_hook_that_cannot_be_loaded(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    doc = {"listen": {"stdio": True}, "backends": {"b": BACKEND}}
    path.write_text(yaml.safe_dump({**doc, "hooks": [{"use": "tests.support.hooks:nothing"}]}))
    done = run_cli("check-config", "--config", str(path))
    assert done.returncode == 2
    assert "hooks.0.use: cannot load tests.support.hooks:nothing" in done.stderr
    path.write_text(yaml.safe_dump({**doc, "hooks": [{"use": "tests.support.hooks:refuse"}]}))
    done = run_cli("check-config", "--config", str(path))
    assert done.returncode == 0
    assert "hooks        tests.support.hooks:refuse (on both, 1s, on_error deny)" in done.stdout
