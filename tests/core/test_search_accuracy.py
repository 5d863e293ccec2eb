"""Tool search's ranking held to the accuracy measured when it was written (README "Tool
search", bench/search.py): the task phrasings kept in tests/core/search_phrasings.yaml over the
reference servers' catalog, and generated ones over a generated catalog of 1,000 tools. A
ranking change that finds fewer of them fails here."""

from __future__ import annotations

from bench.search import accuracy, generated, generated_phrasings, index_of, reference, tokens_saved

# Measured: reference top-1 0.85, top-5 0.95; generated top-1 0.67, top-5 1.00 (bench/README.md).
REFERENCE_TOP5 = 0.9
REFERENCE_TOP1 = 0.8
GENERATED_TOP5 = 0.95


def test_reference_catalog_phrasings() -> None:
    tools, phrasings = reference()
    assert sum(len(t) for t in tools.values()) == 36 and len(phrasings) >= 40
    top1, top5 = accuracy(index_of(tools), phrasings)
    assert top5 >= REFERENCE_TOP5 and top1 >= REFERENCE_TOP1, (top1, top5)


def test_generated_catalog_of_1000_tools() -> None:
    tools = generated()
    assert sum(len(t) for t in tools.values()) == 1000
    assert generated() == tools  # deterministic
    _, top5 = accuracy(index_of(tools), generated_phrasings(tools))
    assert top5 >= GENERATED_TOP5, top5


def test_the_meta_tools_cost_a_fraction_of_the_catalog() -> None:
    """Tokens saved: the meta-tools' list against the whole list's estimate."""
    full, meta = tokens_saved(reference()[0])
    assert meta * 10 < full
