"""The official conformance suite through the gateway (`pytest -m conformance`).

Server leg: every server scenario of both requirement sets (2025-11-25 at the initialize
handshake, 2026-07-28 stateless) against tests/servers/conformance_server.py, a dual-era SDK
server, directly and through the gateway HTTP->HTTP and HTTP->stdio. The 2026-07-28 set
runs the Tasks extension's `tasks-*` scenarios without scoring them; they are scored here
(TASKS_SCENARIOS), as that server serves the extension. Client leg: every client scenario
against the suite's mock servers, the SDK client of
tests/servers/conformance_client.py reaching each mock directly, through an HTTP gateway
(HTTP->HTTP) and through `mcp-transparent-gateway connect` (stdio->HTTP); the `auth/`
scenarios (`-k auth`) are a test of their own: through the gateway, the gateway is the OAuth
client they judge (configured from the scenario's context; the login's browser is
tests/servers/headless_browser.py), directly the SDK's own OAuth providers are.

What must hold: directly, every scored scenario passes (the fixtures are right); through
the gateway, every scored scenario passes and no scenario that passes directly fails,
except the ones in EXPECTED_FAILURES, which must fail (strict: one that starts passing fails
the test, so the table shrinks as the gateway bugs behind it are fixed).

Outside CI the tests skip when the suite is not installed (`make npm-deps`); with CI=true a
missing suite is an error.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from tests.support import (
    PYTHON,
    ROOT,
    Proc,
    http_backend,
    start_gateway_http,
    stdio_backend,
    write_config,
)
from tests.support import conformance as suite
from tests.support.conformance import Outcome

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

SERVER = str(ROOT / "tests" / "servers" / "conformance_server.py")
CLIENT = str(ROOT / "tests" / "servers" / "conformance_client.py")
SERVER_PAIRINGS = ("direct", "http->http", "http->stdio")
# The client leg's pairings and the client's --via for each.
CLIENT_PAIRINGS = {"direct": "direct", "http->http": "http", "stdio->http": "stdio"}


@dataclass(frozen=True)
class Known:
    """A scenario that fails through the gateway for a known gateway bug."""

    reason: str
    where: frozenset[str]  # "<pairing>@<revision>"


def at(*places: str) -> frozenset[str]:
    return frozenset(places)


# Auth extensions the gateway's OAuth client does not speak (DPoP-bound tokens, workload
# identity's JWT-bearer grant, enterprise-managed ID-JAG): no `auth:` setting expresses them.
_NO_EXTENSION = at(
    *(
        f"{pairing}@{revision}"
        for pairing in ("http->http", "stdio->http")
        for revision in suite.REVISIONS
    )
)

# The Tasks extension's server scenarios: the requirement set runs them without scoring them
# (`reason: extension`); here they are scored, as the conformance server serves the
# extension (tests/servers/conformance_tasks.py).
TASKS_SCENARIOS = (
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
)
TASKS_REVISION = "2026-07-28"

# (leg, scenario) -> why it fails through the gateway, and where. Empty it as fixes land.
EXPECTED_FAILURES: dict[tuple[str, str], Known] = {
    ("client", "auth/dpop"): Known("no DPoP in the gateway's OAuth client", _NO_EXTENSION),
    ("client", "auth/dpop-nonce"): Known("no DPoP in the gateway's OAuth client", _NO_EXTENSION),
    ("client", "auth/wif-jwt-bearer"): Known(
        "no JWT-bearer grant (workload identity) in the gateway's OAuth client", _NO_EXTENSION
    ),
    ("client", "auth/enterprise-managed-authorization"): Known(
        "no ID-JAG exchange (enterprise-managed) in the gateway's OAuth client", _NO_EXTENSION
    ),
}


@pytest.fixture(scope="module", autouse=True)
def suite_installed() -> None:
    reason = suite.available()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the conformance suite: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def server_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The conformance server, directly and behind each gateway pairing."""
    server = Proc([PYTHON, SERVER, "http", "--port", "0"])
    procs = [server]
    try:
        port = server.wait_for(r"READY (\d+)", stream="stdout").group(1)
        direct = f"http://127.0.0.1:{port}/mcp"
        configs = tmp_path_factory.mktemp("conformance-configs")
        backends = {
            "http->http": http_backend(direct),
            "http->stdio": stdio_backend([PYTHON, SERVER, "stdio"]),
        }
        urls = {"direct": direct}
        for pairing, backend in backends.items():
            proc, url = start_gateway_http(write_config(configs, {"conf": backend}, http=True))
            procs.append(proc)
            urls[pairing] = url
        yield urls
    finally:
        for proc in reversed(procs):
            proc.stop()


# Direct outcomes, the baseline of every gateway pairing: (leg, revision) -> results.
BASELINE: dict[tuple[str, str], dict[str, Outcome]] = {}


def server_results(
    urls: dict[str, str], pairing: str, revision: str, out: Path
) -> dict[str, Outcome]:
    key = ("server", revision)
    if pairing != "direct" and key not in BASELINE:
        BASELINE[key] = suite.run_server_suite(urls["direct"], revision, out / "baseline")
    results = suite.run_server_suite(urls[pairing], revision, out / "run")
    if pairing == "direct":
        BASELINE[key] = results
    return results


def client_results(pairing: str, revision: str, names: list[str], out: Path) -> dict[str, Outcome]:
    # One baseline per revision, filled by whichever test (auth or not) runs `names` first.
    baseline = BASELINE.setdefault(("client", revision), {})
    if pairing != "direct" and not set(names) <= set(baseline):
        baseline.update(run_clients("direct", revision, names, out / "baseline"))
    results = run_clients(pairing, revision, names, out / "run")
    if pairing == "direct":
        baseline.update(results)
    return results


def run_clients(pairing: str, revision: str, names: list[str], out: Path) -> dict[str, Outcome]:
    command = shlex.join([PYTHON, CLIENT, "--via", CLIENT_PAIRINGS[pairing]])
    # Three at a time: each is mostly process start-ups; the suite's mocks use ephemeral ports.
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = pool.map(
            lambda name: suite.run_client_scenario(command, name, revision, out), names
        )
        return dict(zip(names, outcomes, strict=True))


def also_scored(leg: str, revision: str) -> tuple[str, ...]:
    """Scenarios scored here that the requirement set runs without scoring."""
    return TASKS_SCENARIOS if (leg, revision) == ("server", TASKS_REVISION) else ()


def judge(
    leg: str, pairing: str, revision: str, results: dict[str, Outcome], asked: list[str]
) -> list[str]:
    """What is wrong with `results` of the scenarios `asked` for, one line each; the table of
    all outcomes is printed."""
    req = suite.requirements(revision)
    baseline = BASELINE.get((leg, revision), {})
    problems = []
    required = [n for n in [*req.scored(leg), *also_scored(leg, revision)] if n in asked]
    names = list(dict.fromkeys([*required, *results]))
    for name in names:
        outcome = results.get(name, Outcome(failures=["not-run"]))
        scored = name in required
        known = EXPECTED_FAILURES.get((leg, name))
        expected = known is not None and f"{pairing}@{revision}" in known.where
        direct = baseline.get(name)
        print(
            f"{leg} {revision} {pairing:12} {name:45} "
            f"{'PASS' if outcome.passed else 'FAIL'}"
            f"{'' if direct is None else (' (direct PASS)' if direct.passed else ' (direct FAIL)')}"
            f"{' scored' if scored else ''}{' expected-failure' if expected else ''}"
        )
        if expected and outcome.passed:
            problems.append(f"{name} passes now: remove it from EXPECTED_FAILURES")
        elif not expected and not outcome.passed:
            if pairing == "direct" and scored:
                problems.append(f"{name} (scored) fails directly: {outcome.messages}")
            elif pairing != "direct" and (scored or (direct is not None and direct.passed)):
                problems.append(f"{name} fails through {pairing}: {outcome.messages}")
            elif direct is not None and (new := set(outcome.failures) - set(direct.failures)):
                # Failing both ways, but through the gateway more of its checks fail.
                problems.append(f"{name}: checks {sorted(new)} fail only through {pairing}")
    return problems


@pytest.mark.timeout(300)
@pytest.mark.parametrize("revision", suite.REVISIONS)
@pytest.mark.parametrize("pairing", SERVER_PAIRINGS)
def test_server_scenarios(
    server_urls: dict[str, str], pairing: str, revision: str, tmp_path: Path
) -> None:
    """conformance server --requirements R: the server leg of each requirement set."""
    results = server_results(server_urls, pairing, revision, tmp_path)
    names = suite.server_scenarios(revision)
    assert set(names) <= set(results)
    assert judge("server", pairing, revision, results, names) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("revision", suite.REVISIONS)
@pytest.mark.parametrize("pairing", list(CLIENT_PAIRINGS))
def test_client_scenarios(pairing: str, revision: str, tmp_path: Path) -> None:
    """conformance client --scenario S: each non-auth client scenario of each set."""
    names = [n for n in suite.client_scenarios(revision) if not suite.is_auth(n)]
    results = client_results(pairing, revision, names, tmp_path)
    assert judge("client", pairing, revision, results, names) == []


# A negative scenario the client gets wrong runs into the suite's own 30 s client bound;
# a dozen of those, three at a time, and the direct baseline before them.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("revision", suite.REVISIONS)
@pytest.mark.parametrize("pairing", list(CLIENT_PAIRINGS))
def test_client_auth_scenarios(pairing: str, revision: str, tmp_path: Path) -> None:
    """conformance client --scenario auth/...: each authorization scenario of each set,
    the gateway (or, directly, the SDK) logging in to the mock's authorization server."""
    names = [n for n in suite.client_scenarios(revision) if suite.is_auth(n)]
    results = client_results(pairing, revision, names, tmp_path)
    assert judge("client", pairing, revision, results, names) == []


def test_expected_failures_name_real_scenarios() -> None:
    """Every entry of the table names a scenario the suite runs, at a pairing tested here."""
    pairings = {*SERVER_PAIRINGS, *CLIENT_PAIRINGS}
    for (leg, name), known in EXPECTED_FAILURES.items():
        revisions = {place.split("@")[1] for place in known.where}
        assert all(
            name in (suite.server_scenarios(r) if leg == "server" else suite.client_scenarios(r))
            for r in revisions
        ), name
        assert {place.split("@")[0] for place in known.where} <= pairings, name


def test_tasks_scenarios_are_the_suites() -> None:
    """TASKS_SCENARIOS is every Tasks-extension server scenario the 2026-07-28 set runs
    (Tasks extension, the io.modelcontextprotocol/tasks identifier): a suite that adds one
    makes it scored here only once the conformance server is checked against it."""
    runs = [n for n in suite.server_scenarios(TASKS_REVISION) if n.startswith("tasks-")]
    assert sorted(runs) == sorted(TASKS_SCENARIOS)


def test_suite_installed_is_the_pinned_one() -> None:
    """The installed suite is the one tests/npm/package.json pins (a stale install would
    measure another version; `make npm-deps` reinstalls when package.json changes)."""
    pinned = orjson.loads((suite.NPM_DIR / "package.json").read_bytes())["dependencies"]
    assert suite.suite_version() == pinned["@modelcontextprotocol/conformance"]
