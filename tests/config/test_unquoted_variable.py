"""`${VAR}` unquoted inside a YAML flow mapping or sequence: one line saying to quote it, with
the value to write, instead of YAML's "expected ',' or '}', but got '{'" (issue 36)."""

from __future__ import annotations

import pytest

from gateway.config import ConfigInvalid, parse

HEAD = "listen: {stdio: true}\nbackends:\n"
ENV = {"URL": "http://127.0.0.1:9/mcp", "HOST": "127.0.0.1:9", "TOKEN": "t"}


@pytest.mark.parametrize(
    "line, value",
    [
        ("  a: {http: {url: ${URL}}}\n", "${URL}"),
        ("  a: {http: {url: http://${HOST}/mcp}}\n", "http://${HOST}/mcp"),
        ("  a: {http: {url: ${URL:-http://x/mcp}, headers: {A: b}}}\n", "${URL:-http://x/mcp}"),
        ("  a: {stdio: {command: x, args: [--token, ${TOKEN}]}}\n", "${TOKEN}"),
        (
            "  a:\n    http: {url: u, headers: {Authorization: Bearer ${TOKEN}}}\n",
            "Bearer ${TOKEN}",
        ),
    ],
)
def test_an_unquoted_variable_in_a_flow_gets_one_line_saying_to_quote_it(
    line: str, value: str
) -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(HEAD + line, "gateway.yaml", env=ENV)
    (problem,) = caught.value.problems
    assert "\n" not in problem and problem.startswith(("gateway.yaml:3:", "gateway.yaml:4:"))
    assert f'write "{value}"' in problem and "quote" in problem


@pytest.mark.parametrize(
    "line",
    ['  a: {http: {url: "${URL}"}}\n', "  a:\n    http:\n      url: ${URL}\n"],
)
def test_the_same_variable_quoted_or_in_block_style_is_read(line: str) -> None:
    config = parse(HEAD + line, env=ENV)
    assert config.backends[0].target.url == ENV["URL"]  # type: ignore[union-attr]


def test_other_yaml_errors_keep_their_own_message() -> None:
    with pytest.raises(ConfigInvalid) as caught:
        parse(HEAD + "  a: {http: {url: x}\n", "gateway.yaml", env=ENV)
    (problem,) = caught.value.problems
    assert "not valid YAML" in problem and "quote" not in problem
