"""The distribution on its own: `python -m build` makes the sdist and the wheel (the wheel built
from the sdist, so a file missing from the sdist shows too), the wheel is installed with its
dependencies into a fresh venv, and the installed command runs from a directory outside the
source tree with no PYTHONPATH: `--version`, `check-config config.example.yaml` and a
`tools/call` bridged over the stdio front end to the bundled demo server (basic/transports/stdio).

Also the shell completion script that click's own mechanism prints for the command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import orjson
import pytest

from gateway import __version__
from tests.support import ROOT, call, request

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DISTRIBUTION: str = PYPROJECT["project"]["name"]
COMMAND = next(k for k, v in PYPROJECT["project"]["scripts"].items() if v == "gateway.cli:main")
# Building and installing fetch from the package index (pip's cache makes repeats quick).
INSTALL_BOUND = 300.0
RUN_BOUND = 20.0
# What the copy of the source tree leaves out: local state, not project files.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".*cache"
)


@dataclass(frozen=True)
class Installed:
    wheel: Path
    sdist: Path
    bin: Path
    env: dict[str, str]
    cwd: Path

    def run(self, *args: str, stdin: Path | None = None) -> subprocess.CompletedProcess[str]:
        with stdin.open("rb") if stdin else open(os.devnull, "rb") as source:
            return subprocess.run(
                [str(self.bin / COMMAND), *args],
                stdin=source,
                capture_output=True,
                text=True,
                cwd=self.cwd,
                env=self.env,
                timeout=RUN_BOUND,
                check=False,
            )


def _isolated_env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module", name="installed")
def _installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    top = tmp_path_factory.mktemp("packaging")
    source = top / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = top / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)],
        capture_output=True,
        timeout=INSTALL_BOUND,
        check=True,
    )
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    target = top / "venv"
    venv.create(target, with_pip=True)
    bin_dir = target / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
        capture_output=True,
        cwd=top,
        env=_isolated_env(bin_dir),
        timeout=INSTALL_BOUND,
        check=True,
    )
    cwd = top / "elsewhere"
    cwd.mkdir()
    return Installed(wheel, sdist, bin_dir, _isolated_env(bin_dir), cwd)


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_BOUND * 2)
def test_wheel_metadata_and_package_data(installed: Installed) -> None:
    """The wheel carries the version of gateway/__init__.py, the SPDX license and its text, and
    the demo configs `run` uses without a config; the sdist carries what builds that wheel."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert metadata["Name"] == DISTRIBUTION and metadata["Version"] == __version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert f"{info}/licenses/LICENSE" in names
    demo = {"gateway/demo/config.yaml", "gateway/demo/listen.yaml", "gateway/demo/server.py"}
    assert demo <= names
    assert f"{COMMAND} = gateway.cli:main" in entry_points
    assert not any(n.startswith("tests/") for n in names)
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {"LICENSE", "README.md", "pyproject.toml", "gateway/demo/config.yaml"} <= members


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_BOUND * 2)
def test_installed_command_outside_the_source_tree(installed: Installed) -> None:
    """`--version` names the version; the package imported is the venv's copy, not the source
    tree's; the bundled demo config resolves inside the installed package."""
    done = installed.run("--version")
    assert done.returncode == 0 and __version__ in done.stdout, done.stderr
    where = subprocess.run(
        [
            str(installed.bin / "python"),
            "-c",
            "import gateway, gateway.cli as c; print(gateway.__file__); "
            "print(c.demo_config_path().is_file())",
        ],
        capture_output=True,
        text=True,
        cwd=installed.cwd,
        env=installed.env,
        timeout=RUN_BOUND,
        check=True,
    )
    module, demo_found = where.stdout.split()
    assert Path(module).is_relative_to(installed.bin.parent) and demo_found == "True"


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_BOUND * 2)
def test_installed_check_config_accepts_the_example(installed: Installed) -> None:
    shutil.copy(ROOT / "config.example.yaml", installed.cwd / "config.example.yaml")
    done = installed.run("check-config", "config.example.yaml")
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
@pytest.mark.timeout(INSTALL_BOUND * 2)
def test_installed_gateway_bridges_a_tool_call_to_the_bundled_demo(installed: Installed) -> None:
    """basic/transports/stdio: the installed gateway, stdio in front, starts the demo server from
    the installed package as its child and answers a tools/call read from stdin, then exits 0
    at the end of the input."""
    config = installed.cwd / "stdio-demo.yaml"
    config.write_text(
        "listen: {stdio: true}\n"
        "backends:\n"
        "  demo:\n"
        "    stdio: {command: '${MCP_GATEWAY_PYTHON}', args: [-m, gateway.demo.server]}\n"
    )
    requests = installed.cwd / "requests.jsonl"
    lines = [request("list", "tools/list"), call("echo", "echo", text="from the wheel")]
    requests.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    done = installed.run("run", "--config", str(config), stdin=requests)
    assert done.returncode == 0, done.stderr
    replies = {m["id"]: m for m in map(orjson.loads, done.stdout.splitlines())}
    assert {t["name"] for t in replies["list"]["result"]["tools"]} >= {"echo", "add"}
    assert replies["echo"]["result"]["content"][0]["text"] == "from the wheel"


COMPLETE_VAR = f"_{COMMAND.replace('-', '_').upper()}_COMPLETE"


def _complete(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / COMMAND)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=RUN_BOUND,
        check=False,
    )


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_from_clicks_variable(shell: str) -> None:
    """`_{COMMAND}_COMPLETE={shell}_source COMMAND` prints the completion script README shows."""
    done = _complete({COMPLETE_VAR: f"{shell}_source"})
    assert done.returncode == 0, done.stderr
    assert COMPLETE_VAR in done.stdout and COMMAND in done.stdout


def test_completion_completes_a_subcommand() -> None:
    """What the bash script asks for a partial word: the subcommands it can become."""
    done = _complete(
        {COMPLETE_VAR: "bash_complete", "COMP_WORDS": f"{COMMAND} ch", "COMP_CWORD": "1"}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain,check-config"]
