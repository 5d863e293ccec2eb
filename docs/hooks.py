"""MkDocs hooks (mkdocs.yml `hooks:`): the pages made from the code, at every build, so they
cannot drift from it.

- reference/config.md from the config's key declarations (gateway/config/reference.py, the
  tables the JSON Schema is made from);
- reference/cli.md from the click command tree (gateway/cli/reference.py);
- decisions/index.md, the list of the architecture decision records in docs/decisions/;
- nav entries whose page does not exist are dropped (the "Trusting tools" pages other changes
  add), so the nav can name a page before it is written.

This file is excluded from the site itself (`exclude_docs`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

GENERATED = ("reference/config.md", "reference/cli.md", "decisions/index.md")


def _exists(docs: Path, page: str) -> bool:
    return page in GENERATED or page.startswith(("http://", "https://")) or (docs / page).is_file()


def _prune(items: list[Any], docs: Path) -> list[Any]:
    """The nav without entries naming a missing page (and sections left empty)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            if _exists(docs, item):
                out.append(item)
            continue
        ((title, value),) = item.items()
        if isinstance(value, list):
            kept = _prune(value, docs)
            if kept:
                out.append({title: kept})
        elif _exists(docs, value):
            out.append(item)
    return out


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    if config.nav is not None:
        config.nav = _prune(config.nav, Path(config.docs_dir))
    return config


def _decisions(docs: Path) -> str:
    lines = [
        "# Design decisions",
        "",
        "The architecture decision records: each says what was decided, why, and what it costs.",
        "ARCHITECTURE.md in the repository describes the layout they shape.",
        "",
    ]
    for path in sorted((docs / "decisions").glob("[0-9]*.md")):
        first = path.read_text(encoding="utf-8").splitlines()[0]
        lines.append(f"- [{first.removeprefix('# ')}]({path.name})")
    return "\n".join(lines) + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    # The checkout the site is built from, not whatever `gateway` the interpreter has installed
    # (set here: MkDocs restores sys.path after loading a hook module).
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gateway.cli import reference as cli_reference
    from gateway.config import reference as config_reference

    pages = {
        "reference/config.md": config_reference.markdown(),
        "reference/cli.md": cli_reference.markdown(),
        "decisions/index.md": _decisions(Path(config.docs_dir)),
    }
    for uri, text in pages.items():
        files.append(File.generated(config, uri, content=text))
    return files
