"""The docs site (mkdocs.yml, docs/): it builds with warnings as errors, its links and anchors
resolve, and its code samples are true to the code.

The build is MkDocs' own, in this process, strict, with its link and anchor validation set to
warn (so to fail): a broken link, a missing anchor, a nav entry without its page, a missing
snippet file. Then the samples, read from the Markdown sources: every YAML config parses and
passes the loader's checks (what `check-config` runs), every shell line that runs the command
names subcommands and options the click tree has (and every `make` target exists), every JSON
sample parses. README.md's links into the site resolve too.
"""

from __future__ import annotations

import logging
import re
import shlex
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
import yaml

from gateway.cli import reference as cli_reference
from gateway.config import ConfigInvalid, parse

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PROG = cli_reference.PROG

# YAML samples that are other programs' files, by the `title` their fence gives them.
FOREIGN_YAML = {"docker-compose.override.yml"}
# Fenced blocks: ```lang title="..." ... ```, at any indentation (inside list items too).
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.M | re.S,
)
# A gateway config has at least one of these at its top level.
CONFIG_KEYS = {"listen", "backends", "backends_from", "servers", "auth", "policy", "tap"}
# What a fragment (a section shown alone) is completed with before it is checked.
DEMO = {"stdio": {"command": sys.executable, "args": ["-m", "gateway.demo.server"]}}
BASE = {
    "listen": {"http": {"host": "127.0.0.1", "port": 8080, "path": "/mcp"}},
    "backends": {"demo": DEMO},
}


class AnyEnv(Mapping[str, str]):
    """Every `${VAR}` a sample names is set: to the gateway's interpreter for the one the
    gateway sets itself, else to a value long enough for a cluster secret."""

    def __getitem__(self, name: str) -> str:
        return sys.executable if name == "MCP_GATEWAY_PYTHON" else "s" * 44

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str)

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md"))


def samples(lang: set[str]) -> list[tuple[str, str, str]]:
    """(where, info, text) of every fenced block in one of these languages, in the site's
    pages and README.md."""
    found = []
    for page in [*pages(), ROOT / "README.md"]:
        source = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(source):
            if m.group("lang") in lang:
                line = source.count("\n", 0, m.start()) + 1
                where = f"{page.relative_to(ROOT)}:{line}"
                body = re.sub(rf"^{m.group('indent')}", "", m.group("body"), flags=re.M)
                found.append((where, m.group("info"), body))
    return found


# --- the build ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import Abort

    out = tmp_path_factory.mktemp("site")
    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Collect()
    logging.getLogger("mkdocs").addHandler(handler)
    try:
        with pytest.MonkeyPatch.context() as env:
            # Material's banner about its successor, printed at every build.
            env.setenv("NO_MKDOCS_2_WARNING", "1")
            config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(out))
            assert config.strict
            build(config)
    except Abort:
        pytest.fail("the site does not build strict:\n" + "\n".join(warnings))
    finally:
        logging.getLogger("mkdocs").removeHandler(handler)
    assert warnings == []
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    """Every Markdown page is in the site, and the generated references are there."""
    for page in pages():
        assert html_of(site, page.relative_to(DOCS)).is_file(), page
    assert "check-config" in (site / "reference" / "cli" / "index.html").read_text()
    assert "section-listen-http" in (site / "reference" / "config" / "index.html").read_text()


def html_of(site: Path, page: Path) -> Path:
    """Where MkDocs writes a page (its directory URLs: x/y.md is x/y/index.html)."""
    rel = page.with_suffix("")
    return site / (rel.parent if rel.name == "index" else rel) / "index.html"


def ids(html: str) -> set[str]:
    return set(re.findall(r'\sid="([^"]+)"', html))


def test_readme_links_resolve(site: Path) -> None:
    """README.md links into the site's pages (docs/*.md) and their anchors, and to files."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        target, _, anchor = link.partition("#")
        assert (ROOT / target).exists(), link
        if anchor:
            assert target.startswith("docs/") and target.endswith(".md"), link
            html = html_of(site, Path(target).relative_to("docs"))
            assert anchor in ids(html.read_text(encoding="utf-8")), link


def test_generated_references_name_every_key_and_command() -> None:
    """The references are made from the code: every section of the key tables and every
    command of the click tree has its place."""
    from gateway.config.keys import SECTIONS
    from gateway.config.reference import anchor, markdown

    text = markdown()
    for section, table in SECTIONS.items():
        assert f"{{#{anchor(section)}}}" in text
        assert all(f"**`{name}`**" in text for name in table)
    cli = cli_reference.markdown()
    for path, _ in cli_reference.commands():
        if path:
            assert f"## `{PROG} {' '.join(path)}`" in cli


# --- the samples ----------------------------------------------------------------------------


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for k, v in over.items():
            merged[k] = _merge(base[k], v) if k in base else v
        return merged
    return over


class KeysAsWritten(yaml.SafeLoader):
    """Reads a mapping's keys as the gateway's loader does, as written: `on:` is the key "on"
    (YAML 1.1 would make it True), so a sample completed and dumped again says what it said."""


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    def key(k: yaml.Node) -> Any:
        return loader.construct_scalar(k) if isinstance(k, yaml.ScalarNode) else k

    return {key(k): loader.construct_object(v, deep=True) for k, v in node.value}


KeysAsWritten.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def test_yaml_samples_are_valid_configs(tmp_path: Path) -> None:
    """Every YAML sample parses; every gateway config among them (a whole file, or a section
    shown alone, completed with a listener and a backend) passes the loader's checks."""
    checked = 0
    failures: list[str] = []
    for where, info, text in samples({"yaml", "yml"}):
        title = re.search(r'title="([^"]+)"', info)
        if title and title.group(1) in FOREIGN_YAML:
            continue
        data = yaml.load(text.replace("--8<--", "# --8<--"), Loader=KeysAsWritten)
        if data is None:  # only a snippet include
            continue
        assert isinstance(data, dict), where
        assert CONFIG_KEYS & data.keys() or data.keys() <= set(_top_keys()), where
        whole = data if {"backends", "backends_from"} & data.keys() else _merge(BASE, data)
        if whole is not data:  # a section alone: the backends its rules name exist too
            named = dict.fromkeys(_named_backends(data), DEMO)
            whole = {**whole, "backends": {**whole["backends"], **named}}
        if "listen" not in whole:
            whole = {**whole, "listen": BASE["listen"]}
        source = tmp_path / "gateway.yaml"
        (tmp_path / "mcp.json").write_text('{"mcpServers": {}}')
        try:
            parse(yaml.safe_dump(whole) if whole is not data else text, str(source), AnyEnv())
        except ConfigInvalid as exc:
            failures.append(f"{where}: {exc.problems}")
        checked += 1
    assert failures == []
    assert checked >= 20


def _named_backends(node: Any) -> Iterator[str]:
    """The backend names a section's rules list (`backends: [github]`) or a virtual server
    takes (`backends: {github: {}}`)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "backends" and isinstance(v, list | dict):  # (a dict: a virtual server's)
                yield from (str(n) for n in v)
            else:
                yield from _named_backends(v)
    elif isinstance(node, list):
        for item in node:
            yield from _named_backends(item)


def _top_keys() -> set[str]:
    from gateway.config.keys import SECTIONS

    return set(SECTIONS["config"])


def _make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([\w-]+):", makefile, re.M))


SHELL_OPERATORS = re.compile(r"\s(?:\||&&|\|\||;|>|<|2>|&)(?:\s|$)|\)|`")


def commands_in(text: str) -> Iterator[list[str]]:
    """The words of each command line of a shell sample that runs the gateway's command."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        for m in re.finditer(rf"(?:^|[\s/(]){re.escape(PROG)}(?=\s|$)", line):
            rest = line[m.end() :]
            cut = SHELL_OPERATORS.search(rest)
            words = shlex.split(rest[: cut.start()] if cut else rest, comments=True)
            yield words


def check_words(words: list[str]) -> None:
    tree = dict(cli_reference.commands())
    path: tuple[str, ...] = ()
    command = tree[path]
    rest = list(words)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        path = (*path, rest.pop(0))
        assert path in tree, f"no command {' '.join(path)!r}"
        command = tree[path]
    known = cli_reference.options(command)
    for word in rest:
        if word == "--":
            break
        if word.startswith("-") and word != "-":
            assert word.split("=", 1)[0] in known, f"{' '.join(path)}: no option {word}"


def test_shell_samples_use_commands_and_options_that_exist() -> None:
    """Every shell line that runs the command names a subcommand and options the click tree
    has; every `make` target named exists."""
    targets = _make_targets()
    seen = 0
    for where, _, text in samples({"sh", "bash", "shell", "console"}):
        for words in commands_in(text):
            try:
                check_words(words)
            except AssertionError as exc:
                pytest.fail(f"{where}: {exc}: {' '.join(words)}")
            seen += 1
        for target in re.findall(r"(?:^|\s)make ([a-z][\w-]*)", text, re.M):
            assert target in targets, f"{where}: no make target {target}"
    assert seen >= 15


def test_check_words_refuses_what_does_not_exist() -> None:
    """The shell check itself: an unknown subcommand or option fails it."""
    check_words(["run", "--config", "x.yaml"])
    check_words(["auth", "logout", "docs"])
    check_words(["expose", "--port", "8080", "--", "npx", "--not-ours"])
    with pytest.raises(AssertionError):
        check_words(["runn"])
    with pytest.raises(AssertionError):
        check_words(["check-config", "--no-such-flag"])


def test_json_samples_parse() -> None:
    """Every JSON sample is JSON."""
    found = samples({"json"})
    assert len(found) >= 5
    for where, _, text in found:
        try:
            orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            pytest.fail(f"{where}: {exc}")


def test_every_code_block_names_its_language() -> None:
    """A fence without a language would escape the sample checks above: each says what it is
    (`sh`, `yaml`, `json`, `python`, `text`, ...)."""
    bare = []
    for page in [*pages(), ROOT / "README.md"]:
        source = page.read_text(encoding="utf-8")
        for m in FENCE.finditer(source):
            if not m.group("lang"):
                bare.append(f"{page.relative_to(ROOT)}:{source.count(chr(10), 0, m.start()) + 1}")
    assert bare == []


# --- the hook's pending pages -----------------------------------------------------------------


def _hooks() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pending_pages_are_left_out_until_written(tmp_path: Path) -> None:
    """A pending page (another change writes it) is dropped from the nav and its links become
    text while it is missing; once written, both are back. Any other missing page is kept, for
    the strict build to refuse."""
    hooks = _hooks()
    pending = hooks.PENDING[0]
    nav = [{"Home": "index.md"}, {"Trusting tools": [{"Pinning": pending}]}, "typo.md"]
    page = f"See [pinning]({Path(pending).name}#top) and [typo](typo.md)."
    assert hooks.prune(nav, tmp_path) == [{"Home": "index.md"}, "typo.md"]
    text = hooks.unlink_pending(page, "trusting-tools/index.md", tmp_path)
    assert text == "See pinning and [typo](typo.md)."
    (tmp_path / pending).parent.mkdir(parents=True)
    (tmp_path / pending).write_text("# Pinning\n")
    assert hooks.prune(nav, tmp_path) == nav
    assert hooks.unlink_pending(page, "trusting-tools/index.md", tmp_path) == page
