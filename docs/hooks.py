"""MkDocs hooks (mkdocs.yml `hooks:`): the pages made from the code, at every build, so they
cannot drift from it.

- reference/config.md from the config's key declarations (gateway/config/reference.py, the
  tables the JSON Schema is made from);
- reference/cli.md from the click command tree (gateway/cli/reference.py);
- decisions/index.md, the list of the architecture decision records in docs/decisions/;
- the pages other changes are adding (PENDING: the "Trusting tools" pages) may be named in the
  nav and linked to before they exist: until then their nav entries are dropped and links to
  them are plain text. Any other missing page is still an error of the strict build.

This file is excluded from the site itself (`exclude_docs`).
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent.parent

GENERATED = ("reference/config.md", "reference/cli.md", "decisions/index.md")
PENDING = (
    "trusting-tools/pinning.md",
    "trusting-tools/annotations.md",
    "trusting-tools/hooks.md",
)


def _exists(docs: Path, page: str) -> bool:
    """False only for a pending page not written yet: any other entry is left to MkDocs."""
    return page not in PENDING or (docs / page).is_file()


def prune(items: list[Any], docs: Path) -> list[Any]:
    """The nav without entries naming a missing page (and sections left empty)."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, str):
            if _exists(docs, item):
                out.append(item)
            continue
        ((title, value),) = item.items()
        if isinstance(value, list):
            kept = prune(value, docs)
            if kept:
                out.append({title: kept})
        elif _exists(docs, value):
            out.append(item)
    return out


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    config.mdx_configs.setdefault("pymdownx.snippets", {})["base_path"] = [str(ROOT)]
    if config.nav is not None:
        config.nav = prune(config.nav, Path(config.docs_dir))
    return config


def unlink_pending(markdown: str, src_uri: str, docs: Path) -> str:
    """The page's Markdown with each link to a pending page not written yet made plain text."""
    here = posixpath.dirname(src_uri)

    def unlink(m: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join(here, m.group(2).partition("#")[0]))
        return m.group(0) if _exists(docs, target) else m.group(1)

    return re.sub(r"\[([^\]]+)\]\(([^)\s:]+\.md(?:#[^)\s]*)?)\)", unlink, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    return unlink_pending(markdown, page.file.src_uri, Path(config.docs_dir))


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
