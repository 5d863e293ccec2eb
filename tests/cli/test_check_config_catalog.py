"""`check-config --catalogs` (alias `--catalog`): the backends started with no front end,
their lists loaded (server/tools, server/prompts, server/resources), each server printed with its
backends' item counts and the tokens showing them costs a model, the backends stopped again."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import yaml

from tests.support import PYTHON, run_cli

FIXTURE = Path(__file__).parent.parent / "routing" / "budget_catalogs.json"
COUNTS = re.compile(
    r"tools (\d+), prompts (\d+), resources (\d+), templates (\d+); about (\d+) tokens"
)


def line(out: str, start: str) -> str:
    (found,) = [text.strip() for text in out.splitlines() if text.strip().startswith(start)]
    return found


def test_the_demo_config_prints_its_counts_and_token_estimate() -> None:
    done = run_cli("check-config", "--catalogs")  # (no --config: the bundled demo)
    assert done.returncode == 0, done.stderr
    assert "catalogs (backends started, their lists loaded, stopped again):" in done.stdout
    server = line(done.stdout, "server default:")
    match = COUNTS.search(server)
    assert match is not None, server
    tools, prompts, resources, templates, tokens = map(int, match.groups())
    assert (tools, prompts, resources, templates) == (4, 1, 1, 1)
    by_kind = re.search(r"\(tools (\d+), prompts (\d+), resources (\d+), templates (\d+)\)", server)
    assert by_kind is not None and sum(map(int, by_kind.groups())) == tokens
    assert COUNTS.search(line(done.stdout, "backend demo: tools")) is not None
    assert f"about {tokens} tokens" in line(done.stdout, "backend demo: tools")
    # Within the stated error of a real tokenizer's count of the demo's lists (one backend:
    # its names as it lists them).
    reference = orjson.loads(FIXTURE.read_bytes())["reference"]["tokens"]
    real = sum(count for key, count in reference.items() if key.startswith("demo/"))
    assert abs(tokens - real) <= 0.1 * real, (tokens, real)


def test_without_the_flag_nothing_is_started() -> None:
    done = run_cli("check-config")
    assert done.returncode == 0, done.stderr
    assert "catalogs" not in done.stdout and "tokens" not in done.stdout


def test_a_catalog_that_does_not_load_is_named_and_fails_the_check(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    backends = {
        "demo": {"stdio": {"command": PYTHON, "args": ["-m", "gateway.demo.server"]}},
        "broken": {"stdio": {"command": PYTHON, "args": ["-c", "raise SystemExit(3)"]}},
    }
    config.write_text(yaml.safe_dump({"listen": {"stdio": True}, "backends": backends}))
    done = run_cli("check-config", "--catalog", str(config))  # (the flag's other spelling)
    assert done.returncode == 1, done.stderr
    assert "backend broken: not loaded: " in done.stdout
    match = COUNTS.search(line(done.stdout, "server default:"))
    assert match is not None and match.groups()[:4] == ("4", "1", "1", "1")
    assert COUNTS.search(line(done.stdout, "backend demo: tools")) is not None


def test_the_help_says_what_the_flag_does() -> None:
    done = run_cli("check-config", "--help")
    assert done.returncode == 0
    assert "--catalogs, --catalog" in done.stdout and "virtual server" in done.stdout
