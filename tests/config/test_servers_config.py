"""The `servers:` section (virtual servers, issue 33): what the loader accepts and the problems
it names, each with its line and dotted path (fast)."""

from __future__ import annotations

import pytest

from gateway.config import ConfigInvalid, parse
from gateway.config.search import ToolSearchConfig

BASE = """
listen: {http: {port: 0, path: /mcp}}
backends:
  everything: {stdio: {command: x}}
  time: {stdio: {command: y}}
"""


def problems(servers: str, extra: str = "") -> list[str]:
    with pytest.raises(ConfigInvalid) as refused:
        parse(BASE + extra + "servers:\n" + servers)
    return refused.value.problems


def test_the_issues_shape_loads() -> None:
    config = parse(
        BASE
        + """servers:
  docs:
    backends:
      everything: {tools: ["echo", "get-*"], prompts: [], resources: ["*"]}
      time: {}
    namespacing: {prefix: auto}
    instructions: "Docs tools only."
    tool_search: {mode: "on"}
"""
    )
    (docs,) = config.servers
    assert docs.path == "/mcp/docs" and docs.server_name == "docs"
    everything, time = docs.backends
    assert (everything.tools, everything.prompts, everything.resources) == (
        ("echo", "get-*"),
        (),
        ("*",),
    )
    assert (time.tools, time.prompts, time.resources) == (None, None, None)
    assert everything.hidden == frozenset({"prompts"}) and time.hidden == frozenset()
    assert docs.tool_search == ToolSearchConfig(mode="on")
    assert docs.namespacing is not None and docs.namespacing.prefix == "auto"


def test_paths_follow_the_listeners_and_may_be_chosen() -> None:
    config = parse(
        BASE.replace("path: /mcp", "path: /all")
        + "servers:\n  a: {backends: {time: {}}}\n  b: {path: /b, backends: {time: {}}}\n"
    )
    assert [s.path for s in config.servers] == ["/all/a", "/b"]


@pytest.mark.parametrize(
    ("servers", "extra", "expected"),
    [
        ("  s: {backends: {nope: {}}}\n", "", "servers.s.backends.nope: no backend 'nope'"),
        ("  s: {backends: {}}\n", "", "servers.s.backends: name at least one backend"),
        ("  s: {backends: {time: {tool: [x]}}}\n", "", "servers.s.backends.time.tool: unknown key"),
        ("  s: {path: /mcp, backends: {time: {}}}\n", "", "servers.s.path: /mcp is the merged"),
        (
            "  s: {path: /x, backends: {time: {}}}\n  t: {path: /x, backends: {time: {}}}\n",
            "",
            "servers.t.path: /x is also s's",
        ),
        ("  s: {path: x, backends: {time: {}}}\n", "", "servers.s.path: must start with /"),
        (
            "  s: {path: /.well-known/x, backends: {time: {}}}\n",
            "",
            "servers.s.path: is a path the listener serves for itself",
        ),
        ("  s: {auth: {scopes: [a]}, backends: {time: {}}}\n", "", "servers.s.auth: needs the top"),
        (
            "  s: {tool_search: {mode: on, k: 1}, backends: {time: {}}}\n",
            "",
            "servers.s.tool_search.k: unknown key",
        ),
        (
            "  s: {tool_search: {mode: sometimes}, backends: {time: {}}}\n",
            "",
            "servers.s.tool_search.mode: must be one of off, on, auto",
        ),
        (
            "  s: {tool_search: {mode: auto, threshold_tokens: 0}, backends: {time: {}}}\n",
            "",
            "servers.s.tool_search.threshold_tokens:",
        ),
        ("  default: {backends: {time: {}}}\n", "", "servers.default: 'default' is the merged"),
        (
            "  s: {policy: {rules: [{deny: {backends: [nope]}}]}, backends: {time: {}}}\n",
            "",
            "servers.s.policy.rules.0.deny.backends.0: no backend 'nope'",
        ),
        (
            "  s: {rate_limits: {overall: {rate: -1}}, backends: {time: {}}}\n",
            "",
            "servers.s.rate_limits.overall.rate:",
        ),
        ("  'a b': {backends: {time: {}}}\n", "", "servers.a b: a server's name is letters"),
    ],
)
def test_a_bad_server_is_named_with_its_path(servers: str, extra: str, expected: str) -> None:
    found = problems(servers, extra)
    assert any(expected in p for p in found), found
