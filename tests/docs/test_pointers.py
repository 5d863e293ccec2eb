"""What the code points a reader to: the docs pages (the README is a short overview now, its old
sections pages of the site, issue 36). Every `docs/....md` path the package names exists, and no
text points to a README section (bench/README.md, a file of its own, aside)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from gateway.cli import main
from gateway.frontends import status_page
from gateway.telemetry.api import Stats
from gateway.telemetry.metrics import GatewayCollector
from tests.support import ROOT

pytestmark = pytest.mark.fast

DOC_PATH = re.compile(r"docs/[\w./-]+\.md")
# README as a pointer: not bench/README.md, nor the demo server's README resource (a name).
README_POINTER = re.compile(r"(?<!bench/)\bREADME\b(?!\.md)")
DEMO = ROOT / "gateway" / "demo" / "server.py"


def sources() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "gateway").rglob("*.py"))
    ]


def test_every_docs_page_the_code_names_exists() -> None:
    named = {(where, m) for where, text in sources() for m in DOC_PATH.findall(text)}
    assert named  # (the help texts below name some)
    missing = [(where, m) for where, m in sorted(named) if not (ROOT / m).is_file()]
    assert missing == []


def test_no_text_points_to_a_readme_section() -> None:
    found = [
        (where, text.count("\n", 0, m.start()) + 1)
        for where, text in sources()
        if where != str(DEMO.relative_to(ROOT))
        for m in README_POINTER.finditer(text)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("command", "page"),
    [
        (["check-config", "--help"], "docs/guides/context-budget.md"),
        (["run", "--help"], "docs/operations/reload.md"),
    ],
)
def test_help_names_the_docs_page(command: list[str], page: str) -> None:
    result = CliRunner().invoke(main, command, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert page in result.output and "README" not in result.output


def test_the_status_page_and_the_metric_name_the_context_budget_page() -> None:
    page = status_page.PAGE.decode()
    assert "docs/guides/context-budget.md" in page and "README" not in page
    registry = CollectorRegistry()
    rows = [("default", "tools", 1, 10)]
    registry.register(GatewayCollector(Stats(), list, lambda: 0, list, lambda: rows))
    text = generate_latest(registry).decode()
    (help_line,) = [h for h in text.splitlines() if h.startswith("# HELP mcp_gateway_catalog_tok")]
    assert "docs/guides/context-budget.md" in help_line and "README" not in help_line
