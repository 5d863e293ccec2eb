"""The config's JSON Schema: made from the loader's key table, shipped, printed by `schema`, and
in agreement with the loader on the repository's configs and on every key's type."""

from __future__ import annotations

import ast
import copy
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import yaml

from gateway.config import BackendLimits, ConfigInvalid, ListenerLimits, Shutdown, parse
from gateway.config.key import Key
from gateway.config.keys import SECTIONS
from gateway.config.schema import schema, schema_text, shipped_text
from tests.support import PYTHON, ROOT, START_BOUND

VALIDATOR = jsonschema.Draft202012Validator(schema())

# Every gateway config file in the repository (the YAML files with a `listen:` or `backends:`).
_SKIP_DIRS = {".git", ".venv", "node_modules", "build", "dist", "__pycache__"}


def _repo_configs() -> list[Path]:
    found = []
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            if name.endswith((".yaml", ".yml")):
                path = Path(top) / name
                doc = yaml.safe_load(path.read_text(encoding="utf-8"))
                if isinstance(doc, dict) and {"listen", "backends"} & doc.keys():
                    found.append(path.relative_to(ROOT))
    return sorted(found)


REPO_CONFIGS = _repo_configs()


def schema_errors(doc: Any) -> list[str]:
    return [e.json_path for e in VALIDATOR.iter_errors(doc)]


class _AnyEnv(Mapping[str, str]):
    """Every variable set, so a test's `${VAR}` does not decide whether the loader accepts it."""

    def __getitem__(self, name: str) -> str:
        return "1"

    def __contains__(self, name: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def loader_accepts(text: str, env: Mapping[str, str] | None = None) -> bool:
    try:
        parse(text, str(ROOT / "tests" / "c.yaml"), env=_AnyEnv() if env is None else env)
    except ConfigInvalid:
        return False
    return True


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_the_shipped_file_is_the_generated_schema() -> None:
    # `make schema` rewrites it; a key added to keys.py without that fails here.
    assert shipped_text() == schema_text()


def test_the_schema_command_prints_it() -> None:
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "schema"],
        capture_output=True,
        cwd=ROOT,
        timeout=START_BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = orjson.loads(done.stdout)
    jsonschema.Draft202012Validator.check_schema(printed)
    assert printed == schema()


def test_the_repository_has_configs_to_check() -> None:
    assert Path("config.example.yaml") in REPO_CONFIGS
    assert Path("gateway/demo/config.yaml") in REPO_CONFIGS


@pytest.mark.parametrize("path", REPO_CONFIGS, ids=str)
def test_every_config_file_in_the_repository_validates(path: Path) -> None:
    assert schema_errors(yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))) == []


OTHERS = frozenset({"servers", "npm"})


def _test_module_configs() -> list[tuple[str, str]]:
    """The configs the tests hold as plain YAML text (string literals, read from the source, not
    imported) that the loader accepts; templates and deliberately broken ones are left out."""
    found = []
    tests = ROOT / "tests"
    # The suite's own modules, in every folder; not the test servers or npm's packages.
    sources = (f for f in tests.rglob("*.py") if f.relative_to(tests).parts[0] not in OTHERS)
    for file in sorted(sources):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Constant)
                and isinstance(value := node.value, str)
                and "backends:" in value
            ):
                continue
            try:
                doc = yaml.safe_load(value)
            except yaml.YAMLError:
                continue
            if isinstance(doc, dict) and loader_accepts(value):
                found.append((f"{file.stem}:{node.lineno}", value))
    return found


TEST_CONFIGS = _test_module_configs()


def test_the_tests_hold_configs_to_check() -> None:
    assert len(TEST_CONFIGS) >= 10
    assert any(name.startswith("test_config:") for name, _ in TEST_CONFIGS)


@pytest.mark.parametrize(("name", "text"), TEST_CONFIGS, ids=[n for n, _ in TEST_CONFIGS])
def test_every_config_the_tests_hold_and_the_loader_accepts_validates(name: str, text: str) -> None:
    assert schema_errors(yaml.safe_load(text)) == []


# Where each section of the table sits in a config that both accept (BASE).
BASE: dict[str, Any] = {
    "listen": {
        "http": {"port": 0, "limits": {}},
        "admin": {"port": 0},
        "stdio": {"identity": {"subject": "me"}},
    },
    "backends": {
        "b": {
            "stdio": {"command": "x"},
            "tools": {"t": {}},
            "roots": [{"uri": "file:///srv"}],
            "retries": {},
            "breaker": {},
            "pins": {},
        },
        "h": {
            "http": {"url": "http://127.0.0.1:1/mcp", "tls": {}, "limits": {}},
            "auth": {"type": "oauth"},
        },
    },
    "namespacing": {},
    "fan_out": {},
    "tasks": {"key_file": "task-key"},
    "tap": {"path": "t.jsonl"},
    "telemetry": {},
    "policy": {
        "rules": [
            {"allow": {"backends": ["b"]}, "when": {}},
            {
                "deny": {
                    "annotations": {"destructiveHint": True},
                    "arguments": {"/path": {"glob": "/etc/*"}},
                }
            },
        ]
    },
    "rate_limits": {"per_identity": {"rate": 1}},
    "overload": {},
    "tool_search": {"mode": "auto"},
    "pins": {},
    "hooks": [{"use": "pkg.module:function"}],
    "shutdown": {},
    "audit": {"path": "a.jsonl"},
    "auth": {
        "issuer": "http://127.0.0.1:9",
        "resource": "http://127.0.0.1:8080/mcp",
        "introspection": {"client_id": "gw", "client_secret": "s"},
        "api_keys": [{"name": "k", "sha256": "0" * 64}],
    },
    "cluster": {"secrets": ["s" * 32]},
    "servers": {"s": {"backends": {"b": {}}, "auth": {}}},
}
WHERE: dict[str, tuple[str | int, ...]] = {
    "config": (),
    "listen": ("listen",),
    "listen_http": ("listen", "http"),
    "listener_limits": ("listen", "http", "limits"),
    "admin": ("listen", "admin"),
    "backend": ("backends", "b"),
    "stdio": ("backends", "b", "stdio"),
    "tools": ("backends", "b", "tools"),
    "tool": ("backends", "b", "tools", "t"),
    "retries": ("backends", "b", "retries"),
    "breaker": ("backends", "b", "breaker"),
    "root": ("backends", "b", "roots", 0),
    "http_target": ("backends", "h", "http"),
    "client_tls": ("backends", "h", "http", "tls"),
    "backend_limits": ("backends", "h", "http", "limits"),
    "backend_auth": ("backends", "h", "auth"),
    "namespacing": ("namespacing",),
    "fan_out": ("fan_out",),
    "tasks": ("tasks",),
    "tap": ("tap",),
    "telemetry": ("telemetry",),
    "listen_stdio": ("listen", "stdio"),
    "stdio_identity": ("listen", "stdio", "identity"),
    "policy": ("policy",),
    "policy_rule": ("policy", "rules", 0),
    "policy_target": ("policy", "rules", 0, "allow"),
    "policy_when": ("policy", "rules", 0, "when"),
    "policy_annotations": ("policy", "rules", 1, "deny", "annotations"),
    "policy_argument": ("policy", "rules", 1, "deny", "arguments", "/path"),
    "rate_limits": ("rate_limits",),
    "rate": ("rate_limits", "per_identity"),
    "overload": ("overload",),
    "tool_search": ("tool_search",),
    "pins": ("pins",),
    "backend_pins": ("backends", "b", "pins"),
    "hook": ("hooks", 0),
    "shutdown": ("shutdown",),
    "audit": ("audit",),
    "auth": ("auth",),
    "introspection": ("auth", "introspection"),
    "api_key": ("auth", "api_keys", 0),
    "cluster": ("cluster",),
    "server": ("servers", "s"),
    "server_backend": ("servers", "s", "backends", "b"),
    "server_auth": ("servers", "s", "auth"),
}
# A value of the wrong type for each kind of key.
WRONG: dict[str, Any] = {
    "string": 5,
    "number": "soon",
    "count": "many",
    "port": 70000,
    "boolean": "maybe",
    "strings": "one",
    "string_map": ["a"],
    "section": 5,
    "sections": 5,
    "roots": "file:///srv",
    "section_list": {"allow": {}},
    "switch": "yes",
    "value": {"a": 1},
}


def _with(section: str, key: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    node: Any = doc
    for step in WHERE[section]:
        node = node[step]
    node[key] = value
    return doc


def _text(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def test_the_base_config_is_accepted_by_both() -> None:
    assert loader_accepts(_text(BASE)) and schema_errors(BASE) == []


def test_every_section_of_the_table_is_placed() -> None:
    # server_tls needs real PEM files for the loader; the other sections are all exercised.
    assert set(WHERE) == set(SECTIONS) - {"server_tls"}


CASES = [
    (section, key, spec)
    for section in WHERE
    for key, spec in SECTIONS[section].items()
    if not (section == "config" and key in {"listen", "backends"})  # needed by the loader
]


@pytest.mark.parametrize(("section", "key", "spec"), CASES, ids=[f"{s}.{k}" for s, k, _ in CASES])
def test_a_wrong_type_fails_both_the_loader_and_the_schema(
    section: str, key: str, spec: Key
) -> None:
    doc = _with(section, key, WRONG[spec.kind])
    assert not loader_accepts(_text(doc))
    assert schema_errors(doc), f"{section}.{key}: {WRONG[spec.kind]!r} passed the schema"


@pytest.mark.parametrize("section", list(WHERE))
def test_an_unknown_key_fails_both_the_loader_and_the_schema(section: str) -> None:
    doc = _with(section, "no_such_key", 1)
    assert not loader_accepts(_text(doc))
    assert schema_errors(doc)


def test_a_known_bad_config_fails_validation() -> None:
    bad = yaml.safe_load(
        "listen: {http: {port: eighty, hots: x}}\nbackends:\n  a: {stdio: {command: [x]}}\n"
    )
    assert set(schema_errors(bad)) >= {"$.listen.http", "$.listen.http.port"}
    assert any(path.startswith("$.backends.a") for path in schema_errors(bad))


def test_a_backend_needs_exactly_one_transport_in_the_schema_too() -> None:
    both = _with("backend", "http", {"url": "http://127.0.0.1:1/mcp"})
    none = copy.deepcopy(BASE)
    del none["backends"]["b"]["stdio"]
    for doc in (both, none):
        assert not loader_accepts(_text(doc)) and schema_errors(doc)


def test_a_cluster_needs_exactly_one_source_of_secrets_in_the_schema_too() -> None:
    both = _with("cluster", "secrets_file", "secrets.txt")
    none = copy.deepcopy(BASE)
    none["cluster"] = {}
    for doc in (both, none):
        assert not loader_accepts(_text(doc)) and schema_errors(doc)


def test_a_var_reference_is_accepted_where_the_value_is_only_known_at_load_time() -> None:
    # A pattern-checked string (a URL) may be `${VAR}`; a number may not, as in the loader.
    url = _with("http_target", "url", "${DOCS_URL}")
    env = {"DOCS_URL": "http://127.0.0.1:2/mcp"}
    assert loader_accepts(_text(url), env) and schema_errors(url) == []
    port = _with("listen_http", "port", "${PORT}")
    assert not loader_accepts(_text(port)) and schema_errors(port)


def test_the_table_defaults_are_the_dataclass_defaults() -> None:
    for section, model in (
        ("listener_limits", ListenerLimits()),
        ("backend_limits", BackendLimits()),
        ("shutdown", Shutdown()),
    ):
        assert {k: v.default for k, v in SECTIONS[section].items()} == vars(model)
