"""The container image (Dockerfile, deploy/container.yaml) and the compose stack's exposure
(docker-compose.yml, .env.example).

Without docker: the files are parsed and held to what README says: every base image pinned to
a release, node 22 and uv in the image, a non-root user, a HEALTHCHECK on the admin listener's
`/healthz` (its command run here against a real gateway), every published port on 127.0.0.1
unless `BIND_ADDRESS` says otherwise, Grafana without anonymous admin and with its admin
password from `.env`. With docker: the image is built and run, and answers a `tools/call`
through its published port (`test_the_image_builds_and_serves`, see its skip reasons).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gateway.config import parse
from tests.support import (
    BOUND,
    DEMO_BACKEND,
    IN_CI,
    PYTHON,
    START_BOUND,
    Proc,
    call,
    dead_url,
    gateway_command,
    mirrored_headers,
)

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONTAINER_CONFIG = ROOT / "deploy" / "container.yaml"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
IMAGE_CONFIG = "/etc/mcp-gateway/config.yaml"

# --- the Dockerfile, read as docker reads it -------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comment lines dropped (inside a continued instruction
    too), backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return out


def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text(encoding="utf-8"))


def args_of(steps: list[tuple[str, str]]) -> dict[str, str]:
    """The defaults of the ARGs declared before the first FROM (those FROM lines may use)."""
    out: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "FROM":
            break
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default
    return out


def stages(steps: list[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """(image reference, stage name) of each FROM, ARGs replaced by their defaults."""
    args = args_of(steps)
    out: list[tuple[str, str | None]] = []
    for keyword, rest in steps:
        if keyword == "FROM":
            words = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], rest).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            out.append((words[0], name))
    return out


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    start = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[start + 1 :]


def env_of(steps: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for keyword, rest in steps:
        if keyword == "ENV":
            for word in shlex.split(rest):
                name, _, value = word.partition("=")
                out[name] = value
    return out


def exec_form(rest: str) -> list[str]:
    value = orjson.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def healthcheck(steps: list[tuple[str, str]]) -> tuple[dict[str, str], list[str]]:
    """The HEALTHCHECK's options and its exec-form command."""
    (rest,) = [rest for keyword, rest in steps if keyword == "HEALTHCHECK"]
    options, _, command = rest.partition(" CMD ")
    flags = dict(word.removeprefix("--").split("=", 1) for word in options.split())
    return flags, exec_form(command)


_VERSION_TAG = re.compile(r"v?\d+\.\d+\.\d+(?:-[a-z0-9.-]+)?")


def tag_of(reference: str) -> str:
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2]


# --- docker compose's variable interpolation ---------------------------------------------------


class RequiredUnset(Exception):
    """`${NAME:?message}` (or `${NAME?message}`) with NAME unset: compose refuses the file."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


_REFERENCE = re.compile(r"\$(?:(\$)|\{([^}]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_BRACED = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?", re.DOTALL)


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """A value as docker compose reads it: `$$`, `$NAME`, `${NAME}`, and `${NAME` then one of
    `:-` `-` `:?` `?` `:+` `+` and a word (with `:` an empty value counts as unset)."""

    def sub(match: re.Match[str]) -> str:
        if match[1]:
            return "$"
        if match[3]:
            return env.get(match[3], "")
        braced = _BRACED.fullmatch(match[2])
        assert braced is not None, f"compose cannot read ${{{match[2]}}}"
        name, op, word = braced[1], braced[2], braced[3] or ""
        value = env.get(name)
        present = bool(value) if op and op.startswith(":") else value is not None
        if op is None:
            return value or ""
        if op.endswith("-"):
            return value if present and value is not None else word
        if op.endswith("?"):
            if not present or value is None:
                raise RequiredUnset(name, word)
            return value
        return word if present else ""  # `+`

    return _REFERENCE.sub(sub, text)


def resolve(value: Any, env: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return interpolate(value, env)
    if isinstance(value, list):
        return [resolve(v, env) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, env) for k, v in value.items()}
    return value


def compose_raw() -> dict[str, Any]:
    value = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


def compose(env: Mapping[str, str]) -> dict[str, Any]:
    value = resolve(compose_raw(), env)
    assert isinstance(value, dict)
    return value


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file, as `cp .env.example .env` would give compose."""
    out: dict[str, str] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {raw!r}"
            out[name.strip()] = value.strip()
    return out


def host_ip(port: Any) -> str:
    """The host address a compose `ports:` entry binds; without one, docker binds every
    interface."""
    if isinstance(port, dict):
        return str(port.get("host_ip", "0.0.0.0"))
    spec = str(port).split("/", 1)[0]
    parts = spec.rsplit(":", 2)
    return parts[0].strip("[]") if len(parts) == 3 else "0.0.0.0"


def published(env: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(service, port entry, host address) of every published port."""
    return [
        (name, str(port), host_ip(port))
        for name, service in compose(env)["services"].items()
        for port in service.get("ports", [])
    ]


# A password, as a user's .env would give it: the only variable compose cannot do without.
WITH_PASSWORD = {"GRAFANA_ADMIN_PASSWORD": "s3cret"}


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("${A:-127.0.0.1}:80:80", {}, "127.0.0.1:80:80"),
        ("${A:-127.0.0.1}:80:80", {"A": ""}, "127.0.0.1:80:80"),
        ("${A-x}", {"A": ""}, ""),
        ("${A-x}", {}, "x"),
        ("${A:?say why}", {"A": "v"}, "v"),
        ("$A and ${B}", {"A": "1", "B": "2"}, "1 and 2"),
        ("${A:+on}|${B:+on}", {"A": "1"}, "on|"),
        ("$$A", {"A": "1"}, "$A"),
    ],
)
def test_interpolation_follows_compose(text: str, env: dict[str, str], expected: str) -> None:
    assert interpolate(text, env) == expected


@pytest.mark.parametrize("env", [{}, {"A": ""}])
def test_a_required_variable_unset_or_empty_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(RequiredUnset) as caught:
        interpolate("${A:?set A in .env}", env)
    assert caught.value.name == "A"


@pytest.mark.parametrize(
    ("port", "address"),
    [
        ("127.0.0.1:8080:8080", "127.0.0.1"),
        ("8080:8080", "0.0.0.0"),
        ("8080", "0.0.0.0"),
        ("[::1]:8080:8080/tcp", "::1"),
        ({"target": 80, "published": 8080}, "0.0.0.0"),
        ({"target": 80, "host_ip": "127.0.0.1"}, "127.0.0.1"),
    ],
)
def test_host_ip_reads_every_form_of_a_port(port: Any, address: str) -> None:
    assert host_ip(port) == address


# --- docker-compose.yml: what is reachable, and who gets in ------------------------------------


@pytest.mark.parametrize(
    "env",
    [WITH_PASSWORD, {**env_file(ENV_EXAMPLE), **WITH_PASSWORD}],
    ids=["nothing-set", "env-example-copied"],
)
def test_every_published_port_binds_loopback_by_default(env: dict[str, str]) -> None:
    ports = published(env)
    assert {service for service, _, _ in ports} == {
        "gateway",
        "otel-collector",
        "jaeger",
        "prometheus",
        "grafana",
    }
    for service, port, address in ports:
        assert address == "127.0.0.1", (service, port)


def test_bind_address_opens_every_port_and_only_deliberately() -> None:
    """The one knob README names: set, it moves every published port; nothing else does."""
    opened = published({**WITH_PASSWORD, "BIND_ADDRESS": "0.0.0.0"})
    assert opened and all(address == "0.0.0.0" for _, _, address in opened)
    for service, service_raw in compose_raw()["services"].items():
        for port in service_raw.get("ports", []):
            assert str(port).startswith("${BIND_ADDRESS:-127.0.0.1}:"), (service, port)


def _grafana_env(env: Mapping[str, str]) -> dict[str, str]:
    raw = compose(env)["services"]["grafana"].get("environment", {})
    if isinstance(raw, list):
        return dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


def test_grafana_has_no_anonymous_admin() -> None:
    grafana = _grafana_env(WITH_PASSWORD)
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert grafana.get("GF_AUTH_DISABLE_LOGIN_FORM", "false") == "false"
    assert "env_file" not in compose_raw()["services"]["grafana"]  # nothing else can set them
    # Even when anonymous access is turned on, it is as a viewer.
    opened = _grafana_env({**WITH_PASSWORD, "GRAFANA_ANONYMOUS_VIEWER": "true"})
    assert opened["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert opened["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert env_file(ENV_EXAMPLE)["GRAFANA_ANONYMOUS_VIEWER"] == "false"


def test_grafana_admin_password_comes_from_the_env_file() -> None:
    assert _grafana_env(WITH_PASSWORD)["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"
    assert _grafana_env(WITH_PASSWORD)["GF_SECURITY_ADMIN_USER"] == "admin"
    # No password, or .env.example copied unedited (empty): compose refuses to start.
    for env in ({}, env_file(ENV_EXAMPLE)):
        with pytest.raises(RequiredUnset) as caught:
            compose(env)
        assert caught.value.name == "GRAFANA_ADMIN_PASSWORD"


def test_env_example_names_every_variable_compose_reads() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    assert used >= {"BIND_ADDRESS", "GRAFANA_ADMIN_PASSWORD", "GRAFANA_ANONYMOUS_VIEWER"}
    example = ENV_EXAMPLE.read_text(encoding="utf-8")
    for name in used:
        assert re.search(rf"^#? ?{name}=", example, re.MULTILINE), name
    # The real .env holds the password: never committed, never sent to a build.
    for ignore in (".gitignore", ".dockerignore"):
        lines = (ROOT / ignore).read_text(encoding="utf-8").splitlines()
        assert ".env" in lines, ignore


# --- the Dockerfile ------------------------------------------------------------------------------


def test_every_base_image_is_pinned_to_a_release() -> None:
    steps = dockerfile()
    refs = dict((name, ref) for ref, name in stages(steps))
    assert set(refs) == {"node", "uv", None}
    for ref in refs.values():
        tag = tag_of(ref)
        assert tag and tag != "latest" and _VERSION_TAG.match(tag), ref
    python, node = refs[None], refs["node"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-(\w+)", python), python
    assert re.fullmatch(r"node:22\.\d+\.\d+-(\w+)-slim", node), node
    assert re.fullmatch(r"ghcr\.io/astral-sh/uv:\d+\.\d+\.\d+", refs["uv"]), refs["uv"]
    # node's binary runs on the Python image: both on the same Debian release (same glibc).
    assert python.rsplit("-", 1)[1] == node.split("-")[1]


def test_node_npx_and_uv_come_from_their_stages() -> None:
    final = final_stage(dockerfile())
    copies = [rest for keyword, rest in final if keyword == "COPY" and "--from=" in rest]
    assert "--from=node /usr/local/bin/node /usr/local/bin/node" in copies
    assert any(c.startswith("--from=node /usr/local/lib/node_modules/npm ") for c in copies)
    assert "--from=uv /uv /uvx /usr/local/bin/" in copies
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert "npx-cli.js /usr/local/bin/npx" in runs
    # The build itself checks that each tool starts.
    for check in ("node --version", "uvx --version"):
        assert check in runs, check


def test_the_image_runs_as_a_numbered_non_root_user() -> None:
    final = final_stage(dockerfile())
    users = [rest for keyword, rest in final if keyword == "USER"]
    assert users, "no USER: the image would run as root"
    user, _, group = users[-1].partition(":")
    assert user.isdigit() and int(user) != 0, users[-1]
    assert not group or (group.isdigit() and int(group) != 0), users[-1]
    runs = " ".join(rest for keyword, rest in final if keyword == "RUN")
    assert f"--uid {user}" in runs and "--create-home" in runs  # npx/uvx caches live there
    # Nothing after the switch runs as root again.
    last_user = max(i for i, (keyword, _) in enumerate(final) if keyword == "USER")
    assert not any(keyword == "RUN" for keyword, _ in final[last_user:])


def test_the_image_serves_its_config_and_checks_its_health() -> None:
    steps = dockerfile()
    final = final_stage(steps)
    flags, command = healthcheck(final)
    assert {"interval", "timeout", "retries"} <= flags.keys()
    assert command[0] == "python"
    url = env_of(final)["MCP_GATEWAY_HEALTH_URL"]
    assert url == f"http://127.0.0.1:{_admin_port()}/healthz"
    entry = exec_form(next(rest for keyword, rest in final if keyword == "ENTRYPOINT"))
    assert entry == ["tini", "--", "mcp-transparent-gateway"]
    cmd = exec_form(next(rest for keyword, rest in final if keyword == "CMD"))
    assert cmd == ["run", "--config", IMAGE_CONFIG]
    assert ("COPY", f"deploy/container.yaml {IMAGE_CONFIG}") in final
    exposed = {int(p) for keyword, rest in final if keyword == "EXPOSE" for p in rest.split()}
    listen = yaml.safe_load(CONTAINER_CONFIG.read_text(encoding="utf-8"))["listen"]
    assert exposed == {listen["http"]["port"], listen["admin"]["port"]}
    for keyword, rest in final:  # everything copied from the context exists
        if keyword == "COPY" and "--from=" not in rest:
            for source in rest.split()[:-1]:
                assert (ROOT / source).exists(), rest


def _admin_port() -> int:
    listen = yaml.safe_load(CONTAINER_CONFIG.read_text(encoding="utf-8"))["listen"]
    port = listen["admin"]["port"]
    assert isinstance(port, int)
    return port


def test_the_container_config_listens_on_all_interfaces_in_front_of_the_demo() -> None:
    config = parse(
        CONTAINER_CONFIG.read_text(encoding="utf-8"),
        str(CONTAINER_CONFIG),
        {"MCP_GATEWAY_PYTHON": "/usr/local/bin/python"},
    )
    http, admin = config.listen.http, config.listen.admin
    assert http is not None and admin is not None
    # Inside a container the published port arrives on the container's address, not loopback.
    assert (http.host, http.port, http.path) == ("0.0.0.0", 8080, "/mcp")
    assert (admin.host, admin.port) == ("0.0.0.0", 9464)
    assert [b.name for b in config.backends] == ["demo"]


@pytest.mark.slow
def test_the_healthcheck_command_asks_the_admin_listener(tmp_path: Path) -> None:
    """The HEALTHCHECK's own command, run here: 0 against a gateway's admin `/healthz` (even
    with an HTTP proxy set for backends), not 0 where nothing listens."""
    _, command = healthcheck(final_stage(dockerfile()))
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {
                    "http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"},
                    "admin": {"host": "127.0.0.1", "port": 0},
                },
                "backends": {"demo": DEMO_BACKEND},
            }
        ),
        encoding="utf-8",
    )
    proc = Proc(gateway_command(config))
    try:
        admin = proc.wait_for(r"admin listener .* on (http://\S+)").group(1)
        proc.wait_for(r"listening on http://")
        dead_proxy = dead_url().removesuffix("/mcp")

        def check(url: str) -> int:
            env = {**os.environ, "MCP_GATEWAY_HEALTH_URL": url, "HTTP_PROXY": dead_proxy}
            env.pop("NO_PROXY", None)
            env.pop("no_proxy", None)
            done = subprocess.run(
                [PYTHON, *command[1:]],
                env=env,
                capture_output=True,
                timeout=START_BOUND,
                check=False,
            )
            return done.returncode

        assert check(admin + "/healthz") == 0
        assert check(dead_url().removesuffix("/mcp") + "/healthz") != 0
        assert check(admin + "/no-such-route") != 0  # a 404 is not healthy either
    finally:
        proc.stop()


# --- the image, built and run (where docker is) -------------------------------------------------

# Outside CI the build runs only when asked: the first one pulls three base images and
# installs the dependencies, which can take minutes.
OPT_IN = "MCP_GATEWAY_DOCKER_TEST"
BUILD_BOUND = 600.0
# Run inside the container: the real uid of every process (tini, the gateway, its demo child).
PROCESS_UIDS = """
import pathlib, re
uids = set()
for status in pathlib.Path("/proc").glob("[0-9]*/status"):
    try:
        uids.add(re.search(r"^Uid:\\s+(\\d+)", status.read_text(), re.M)[1])
    except FileNotFoundError:  # a process that ended meanwhile
        pass
print(" ".join(sorted(uids)))
"""


def _docker() -> str:
    """The docker client with a daemon that answers, or a skip saying what is absent. Docker
    in CI is 'when present', so its absence skips there too; present, a failing build fails."""
    path = shutil.which("docker")
    if path is None:
        pytest.skip("docker is not installed: the image build and smoke test need it")
    info = subprocess.run(
        [path, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        text=True,
        timeout=START_BOUND,
        check=False,
    )
    if info.returncode != 0:
        why = (info.stderr.strip().splitlines() or ["no answer"])[-1]
        pytest.skip(f"docker's daemon does not answer ({why}): the image is not built here")
    if not IN_CI and os.environ.get(OPT_IN) != "1":
        pytest.skip(f"the image build is slow: set {OPT_IN}=1 to build and run it (CI does)")
    return path


def _docker_run(docker: str, *args: str, timeout: float = START_BOUND) -> str:
    done = subprocess.run(
        [docker, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"docker {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


def _host_port(docker: str, container: str, port: int) -> int:
    # `127.0.0.1:49153` (one line per address family)
    line = _docker_run(docker, "port", container, f"{port}/tcp").splitlines()[0]
    host, _, number = line.rpartition(":")
    assert host == "127.0.0.1", line
    return int(number)


# No proxy from the environment between the test and the container's published port.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(url: str, message: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=orjson.dumps(message), headers=mirrored_headers(message))
    try:
        with DIRECT.open(req, timeout=START_BOUND) as resp:
            status, kind, body = resp.status, resp.headers.get_content_type(), resp.read()
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{exc.code}: {exc.read()[:500]!r}") from exc
    assert status == 200, status
    if kind == "text/event-stream":
        data = [line[5:].strip() for line in body.splitlines() if line.startswith(b"data:")]
        body = data[-1]
    value = orjson.loads(body)
    assert isinstance(value, dict)
    return value


@pytest.mark.slow
@pytest.mark.timeout(BUILD_BOUND + 120)
def test_the_image_builds_and_serves() -> None:
    """Built from this checkout and run with its own config: healthy by its HEALTHCHECK, a
    `tools/call` to the demo through the port published on 127.0.0.1, node 22's npx and uvx
    there, and every process in it unprivileged."""
    docker = _docker()
    steps = dockerfile()
    refs = {name: ref for ref, name in stages(steps)}
    tag = f"mcp-gateway:test-{uuid.uuid4().hex[:12]}"
    name = tag.replace(":", "-")
    _docker_run(docker, "build", "--tag", tag, str(ROOT), timeout=BUILD_BOUND)
    since = f"{time.time() - 1:.3f}"
    try:
        container = _docker_run(
            docker,
            "run",
            "--detach",
            "--name",
            name,
            "--health-interval",
            "1s",  # the image's command and retries, checked every second here
            "--publish",
            "127.0.0.1::8080",
            "--publish",
            "127.0.0.1::9464",
            tag,
        )
        events = Proc(
            [
                docker,
                "events",
                "--since",
                since,
                "--filter",
                f"container={name}",
                "--filter",
                "event=health_status",
                "--filter",
                "event=die",
                "--format",
                "{{.Action}}",
            ]
        )
        try:
            seen = events.wait_for(
                r"^(health_status: (?:healthy|unhealthy)|die)$", "stdout", timeout=60
            )
        finally:
            events.stop()
        logs = subprocess.run(
            [docker, "logs", container],
            capture_output=True,
            text=True,
            timeout=START_BOUND,
            check=False,
        )
        assert seen.group(1) == "health_status: healthy", logs.stdout + logs.stderr

        url = f"http://127.0.0.1:{_host_port(docker, container, 8080)}/mcp"
        reply = _post(url, call(1, "echo", text="from the container"))
        assert reply["id"] == 1 and "error" not in reply, reply
        assert reply["result"]["content"][0]["text"] == "from the container"
        health = f"http://127.0.0.1:{_host_port(docker, container, 9464)}/healthz"
        with DIRECT.open(health, timeout=BOUND) as resp:
            assert resp.status == 200

        node = _docker_run(docker, "exec", container, "node", "--version")
        assert node == "v" + tag_of(refs["node"]).split("-")[0], node
        assert re.fullmatch(
            r"\d+\.\d+\.\d+", _docker_run(docker, "exec", container, "npx", "--version")
        )
        uvx = _docker_run(docker, "exec", container, "uvx", "--version")
        assert tag_of(refs["uv"]) in uvx, uvx
        uids = _docker_run(docker, "exec", container, "python", "-c", PROCESS_UIDS)
        assert uids and "0" not in uids.split(), uids
    finally:
        subprocess.run([docker, "rm", "--force", name], capture_output=True, check=False)
        subprocess.run([docker, "rmi", tag], capture_output=True, check=False)
