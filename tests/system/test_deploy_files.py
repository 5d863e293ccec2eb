"""The deployment files, used rather than only read: deploy/kubernetes/ (Deployment, Service,
PodDisruptionBudget, HorizontalPodAutoscaler, ConfigMap, Redis) and deploy/compose-cluster.yaml
(three replicas, Redis, nginx).

No cluster and no docker daemon here, so: the manifests are parsed and held to each other
(selectors, names, ports, the Secret's key, the shutdown numbers) and to the gateway (its health
routes, its config's ports and ${VAR}s, its shutdown graces); the configs they mount go through
`check-config` and run in a real gateway (ports moved to loopback, Redis a real redis-server)
that answers its probes, serves MCP, reloads a ConfigMap-style update under --watch and keeps
serving, unready, after SIGTERM. Where the `docker compose` CLI is installed, it reads the
compose file too.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.app import HTTP_SHUTDOWN_GRACE
from gateway.backends.stdio import EXIT_GRACE, STDERR_GRACE, TERM_GRACE
from gateway.config import Config, ConfigInvalid, parse
from gateway.frontends.ops import Operations, operation_routes
from tests.support import BOUND, PYTHON, ROOT, START_BOUND, call
from tests.support.nginx import SITE, UPSTREAM_INCLUDE
from tests.support.probe import DIRECT, post, start, status
from tests.support.redis_server import free_port, redis_server, redis_url
from tests.system.test_docker import (
    RequiredUnset,
    dockerfile,
    exec_form,
    final_stage,
    host_ip,
    interpolate,
    resolve,
)

KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE_CLUSTER = ROOT / "deploy" / "compose-cluster.yaml"
COMPOSE_DIR = COMPOSE_CLUSTER.parent
# The docs page whose command makes the Secret (docs/operations/replicas.md, "Kubernetes").
REPLICAS_PAGE = ROOT / "docs" / "operations" / "replicas.md"
# What the cluster's ${GATEWAY_SECRET} is set to here: 32 characters at least, as required.
SECRET = "s" * 44
# Each config as the gateway reads it: its own interpreter for ${MCP_GATEWAY_PYTHON}.
ENV = {"GATEWAY_SECRET": SECRET, "MCP_GATEWAY_PYTHON": PYTHON}
# Set by the gateway itself, never by a manifest.
BUILT_IN = {"MCP_GATEWAY_PYTHON"}
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")

# --- the manifests -------------------------------------------------------------------------------


def manifests() -> dict[tuple[str, str], dict[str, Any]]:
    """Every object in deploy/kubernetes/*.yaml by (kind, name)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in out, key
            out[key] = doc
    return out


OBJECTS = manifests()
DEPLOYMENT = OBJECTS[("Deployment", "mcp-gateway")]
POD = DEPLOYMENT["spec"]["template"]
(CONTAINER,) = POD["spec"]["containers"]
CONFIG_MAP = OBJECTS[("ConfigMap", "mcp-gateway-config")]


def config_text() -> str:
    (text,) = CONFIG_MAP["data"].values()
    assert isinstance(text, str)
    return text


def config(env: dict[str, str] = ENV) -> Config:
    return parse(config_text(), "configmap.yaml", env)


def container_port(name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in CONTAINER["ports"]}
    port: int = ports[name]
    return port


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def config_mount() -> tuple[str, str]:
    """(the config's path in the container, as `--config` names it; the mounted key)."""
    args = CONTAINER["args"]
    assert args[:2] == ["run", "--config"], args
    path = args[2]
    (volume,) = [v for v in POD["spec"]["volumes"] if "configMap" in v]
    (mount,) = [m for m in CONTAINER["volumeMounts"] if m["name"] == volume["name"]]
    assert volume["configMap"]["name"] == CONFIG_MAP["metadata"]["name"]
    # The whole directory, never a subPath: a subPath mount is not updated with the ConfigMap.
    assert "subPath" not in mount, mount
    directory, _, key = path.rpartition("/")
    assert directory == mount["mountPath"], (path, mount)
    return path, key


def test_the_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())
    files = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)


def test_the_service_pdb_and_hpa_are_the_deployments() -> None:
    labels = POD["metadata"]["labels"]
    selector = DEPLOYMENT["spec"]["selector"]["matchLabels"]
    assert selects(selector, labels)
    replicas = DEPLOYMENT["spec"]["replicas"]
    assert replicas == 3

    service = OBJECTS[("Service", "mcp-gateway")]
    assert selects(service["spec"]["selector"], labels)
    # ... and only the gateway's pods: not Redis's, which share the name label.
    for (kind, name), other in OBJECTS.items():
        if kind == "Deployment" and name != "mcp-gateway":
            pod_labels = other["spec"]["template"]["metadata"]["labels"]
            assert not selects(service["spec"]["selector"], pod_labels), name
    (port,) = service["spec"]["ports"]
    assert container_port(port["targetPort"]) == config().listen.http.port  # type: ignore[union-attr]
    assert "sessionAffinity" not in service["spec"]  # any pod takes any request

    pdb = OBJECTS[("PodDisruptionBudget", "mcp-gateway")]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"] == selector
    assert 0 < pdb["spec"]["maxUnavailable"] < replicas

    hpa = OBJECTS[("HorizontalPodAutoscaler", "mcp-gateway")]
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        DEPLOYMENT["apiVersion"],
        "Deployment",
        DEPLOYMENT["metadata"]["name"],
    )
    assert hpa["spec"]["minReplicas"] == replicas < hpa["spec"]["maxReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
    # Utilization is measured against the request: there must be one.
    assert CONTAINER["resources"]["requests"]["cpu"]


def test_the_probes_ask_the_gateways_health_routes_on_its_admin_port() -> None:
    routes = operation_routes(Operations(lambda _: (b"", ""), dict, lambda: True))
    admin = config().listen.admin
    assert admin is not None and admin.host == "0.0.0.0"  # the kubelet asks the pod's address
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = CONTAINER[probe]["httpGet"]
        assert get["path"] == path and path in routes, probe
        assert container_port(get["port"]) == admin.port, probe
    http = config().listen.http
    assert http is not None and http.host == "0.0.0.0"
    assert container_port("http") == http.port


def test_the_secret_is_referenced_by_name_and_never_committed() -> None:
    assert not [key for key in OBJECTS if key[0] == "Secret"]
    needed = set(VAR.findall(config_text())) - BUILT_IN
    assert needed == {"GATEWAY_SECRET"}
    given = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in CONTAINER["env"]}
    assert given.keys() == needed
    ref = given["GATEWAY_SECRET"]
    # The docs' command makes exactly that Secret and key.
    command = f"kubectl create secret generic {ref['name']} --from-literal={ref['key']}="
    assert command in REPLICAS_PAGE.read_text(encoding="utf-8")
    # Without it the config does not load: the pod would not start half-configured.
    with pytest.raises(ConfigInvalid):
        config({"MCP_GATEWAY_PYTHON": PYTHON})
    cluster = config().cluster
    assert cluster is not None and cluster.secrets == (SECRET,)


def test_the_config_is_mounted_whole_and_watched() -> None:
    """Where the image's own command reads it, and with --watch: a ConfigMap update reloads."""
    _, key = config_mount()
    assert key in CONFIG_MAP["data"]
    (cmd,) = [rest for keyword, rest in final_stage(dockerfile()) if keyword == "CMD"]
    assert CONTAINER["args"] == [*exec_form(cmd), "--watch"]
    assert "command" not in CONTAINER  # the image's ENTRYPOINT: tini, then the gateway


def test_the_redis_url_names_the_redis_service() -> None:
    cluster = config().cluster
    assert cluster is not None and cluster.redis is not None
    url = urlsplit(cluster.redis)
    service = OBJECTS[("Service", url.hostname or "")]
    (port,) = service["spec"]["ports"]
    assert port["port"] == url.port
    redis = OBJECTS[("Deployment", url.hostname or "")]
    assert selects(service["spec"]["selector"], redis["spec"]["template"]["metadata"]["labels"])
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == 6379
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+-bookworm", container["image"])


def test_the_shutdown_fits_in_the_grace_period() -> None:
    """The pod stays in the Service's endpoints a few seconds after its deletion began: the
    gateway serves, unready, for pre_stop_delay, then drains; the kubelet's SIGKILL comes only
    after all of it."""
    delay = config().shutdown.pre_stop_delay
    assert delay > 0
    readiness = CONTAINER["readinessProbe"]
    # Unready within the delay by the probe alone, too.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= delay
    # The gateway waits by itself (the image needs no shell or sleep for a preStop hook).
    assert "lifecycle" not in CONTAINER
    stop = delay + HTTP_SHUTDOWN_GRACE + EXIT_GRACE + TERM_GRACE + STDERR_GRACE
    assert POD["spec"]["terminationGracePeriodSeconds"] >= stop + 5


def test_the_pods_run_as_the_images_unprivileged_user() -> None:
    users = [rest for keyword, rest in final_stage(dockerfile()) if keyword == "USER"]
    uid, _, gid = users[-1].partition(":")
    pod = POD["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert (str(pod["runAsUser"]), str(pod["runAsGroup"])) == (uid, gid)
    own = CONTAINER["securityContext"]
    assert own["allowPrivilegeEscalation"] is False
    assert own["capabilities"]["drop"] == ["ALL"]
    assert POD["spec"]["automountServiceAccountToken"] is False
    for kind in ("requests", "limits"):
        assert CONTAINER["resources"][kind]["memory"], kind
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert CONTAINER["image"] == compose["services"]["gateway"]["image"]
    if own.get("readOnlyRootFilesystem"):
        mounted = {m["mountPath"] for m in CONTAINER["volumeMounts"]}
        assert {"/home/gateway", "/tmp"} <= mounted  # npx/uvx caches, the token store


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "GATEWAY_SECRET"}
    return subprocess.run(
        [PYTHON, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        env={**base, **env},
        cwd=ROOT,
        timeout=START_BOUND,
        check=False,
    )


@pytest.mark.slow
def test_check_config_passes_with_the_secret_and_only_with_it(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(config_text(), encoding="utf-8")
    done = check_config(path, {"GATEWAY_SECRET": SECRET})
    assert done.returncode == 0, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert check_config(path, {}).returncode == 2


def on_loopback(text: str, redis: str) -> str:
    """A config as shipped, with its listeners on free loopback ports and its Redis the
    test's; nothing else changes (the backends run as they would in the pod)."""
    doc = yaml.safe_load(text)
    for listener in ("http", "admin"):
        doc["listen"][listener].update(host="127.0.0.1", port=0)
    doc["cluster"]["redis"] = redis
    return yaml.safe_dump(doc, sort_keys=False)


class KubeletMount:
    """A ConfigMap volume as the kubelet writes it: the key is a symlink through `..data`,
    which an update points at a new directory in one rename."""

    def __init__(self, directory: Path, key: str) -> None:
        self.directory = directory
        self.key = key
        self._version = 0
        directory.mkdir()
        (directory / key).symlink_to(Path("..data") / key)

    @property
    def path(self) -> Path:
        return self.directory / self.key

    def write(self, text: str) -> None:
        self._version += 1
        version = self.directory / f"..version_{self._version}"
        version.mkdir()
        (version / self.key).write_text(text, encoding="utf-8")
        link = self.directory / "..data_tmp"
        link.symlink_to(version.name)
        link.rename(self.directory / "..data")


def scrape(admin: str) -> str:
    with DIRECT.open(admin + "/metrics", timeout=BOUND) as resp:
        body: bytes = resp.read()
    return body.decode()


def metric(text: str, name: str) -> Iterator[str]:
    return (line.split()[-1] for line in text.splitlines() if line.startswith(name + " "))


@pytest.mark.slow
def test_the_configmap_config_serves_behind_its_probes(tmp_path: Path) -> None:
    """The ConfigMap's config in a real gateway, run with the Deployment's own arguments: both
    probes 200, an MCP call served with its rate limit checked in Redis, a ConfigMap update
    reloaded by --watch, and after SIGTERM unready yet serving (shutdown.pre_stop_delay)."""
    _, key = config_mount()
    mount = KubeletMount(tmp_path / "mcp-gateway", key)
    port = free_port()
    with redis_server(port):
        text = on_loopback(config_text(), redis_url(port))
        mount.write(text)
        args = CONTAINER["args"][3:]  # after `run --config PATH`
        gateway = start(mount.path, *args, env={"GATEWAY_SECRET": SECRET})
        proc = gateway.proc
        try:
            readiness = CONTAINER["readinessProbe"]["httpGet"]["path"]
            liveness = CONTAINER["livenessProbe"]["httpGet"]["path"]
            assert status(gateway.admin + readiness) == 200
            assert status(gateway.admin + liveness) == 200
            code, reply = post(gateway.mcp, call(1, "echo", text="from the pod"))
            assert code == 200 and reply["result"]["content"][0]["text"] == "from the pod"
            assert list(metric(scrape(gateway.admin), "mcp_gateway_redis_up")) == ["1.0"]

            # An update, as the kubelet makes it: one more backend.
            doc = yaml.safe_load(text)
            doc["backends"]["demo2"] = doc["backends"]["demo"]
            mount.write(yaml.safe_dump(doc, sort_keys=False))
            proc.wait_for(r"config reloaded from .*: added demo2", timeout=BOUND)

            proc.popen.send_signal(signal.SIGTERM)
            proc.wait_for(r"received SIGTERM: unready")
            assert status(gateway.admin + readiness) == 503
            assert status(gateway.admin + liveness) == 200  # unready, not dead: no restart
            code, reply = post(gateway.mcp, call(2, "demo_echo", text="still here"))
            assert code == 200 and reply["result"]["content"][0]["text"] == "still here"
        finally:
            proc.stop()  # a second SIGTERM: no need to wait out the delay here


# --- the compose cluster -----------------------------------------------------------------------


def compose_raw() -> dict[str, Any]:
    value = yaml.safe_load(COMPOSE_CLUSTER.read_text(encoding="utf-8"))
    assert isinstance(value, dict)
    return value


def compose(env: dict[str, str]) -> dict[str, Any]:
    value = resolve(compose_raw(), env)
    assert isinstance(value, dict)
    return value


WITH_SECRET = {"GATEWAY_SECRET": SECRET}
REPLICAS = ("gateway-1", "gateway-2", "gateway-3")


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> the repository file a service mounts there."""
    out: dict[str, Path] = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        out[target] = (COMPOSE_DIR / source).resolve()
    return out


def test_compose_runs_three_identical_replicas_redis_and_nginx() -> None:
    services = compose(WITH_SECRET)["services"]
    assert services.keys() == {*REPLICAS, "redis", "nginx"}
    first = services[REPLICAS[0]]
    for name in REPLICAS:
        assert services[name] == first, name
    assert (COMPOSE_DIR / first["build"]["context"]).resolve() == ROOT
    assert first["command"][:3] == ["run", "--config", "/etc/mcp-gateway/config.yaml"]
    assert "--watch" in first["command"]
    config_file = mounts(first)["/etc/mcp-gateway/config.yaml"]
    assert config_file == (COMPOSE_DIR / "compose-cluster-gateway.yaml").resolve()
    assert first["depends_on"]["redis"]["condition"] == "service_healthy"
    assert re.fullmatch(r"redis:\d+\.\d+\.\d+-bookworm", services["redis"]["image"])
    # nginx starts once every replica is healthy: it resolves their names when it starts.
    nginx = services["nginx"]
    assert re.fullmatch(r"nginx:\d+\.\d+\.\d+-bookworm", nginx["image"])
    assert {n: d["condition"] for n, d in nginx["depends_on"].items()} == dict.fromkeys(
        REPLICAS, "service_healthy"
    )


def test_compose_nginx_runs_the_shipped_site_in_front_of_the_replicas() -> None:
    services = compose(WITH_SECRET)["services"]
    nginx = mounts(services["nginx"])
    sites = [path for target, path in nginx.items() if target.startswith("/etc/nginx/conf.d/")]
    assert sites == [SITE.resolve()]
    upstream = nginx["/etc/nginx/" + UPSTREAM_INCLUDE]
    servers = re.findall(r"^server (\S+);$", upstream.read_text(), re.MULTILINE)
    config = parse(
        mounts(services[REPLICAS[0]])["/etc/mcp-gateway/config.yaml"].read_text(), env=ENV
    )
    assert config.listen.http is not None
    assert servers == [f"{name}:{config.listen.http.port}" for name in REPLICAS]
    # What it publishes is the site's own listen port.
    listen = re.search(r"^\s*listen (\d+);", SITE.read_text(), re.MULTILINE)
    assert listen is not None
    (published,) = services["nginx"]["ports"]
    assert published.rsplit(":", 1)[1] == listen.group(1)


def test_compose_publishes_only_nginx_and_on_loopback() -> None:
    services = compose(WITH_SECRET)["services"]
    ports = {name: s.get("ports", []) for name, s in services.items() if s.get("ports")}
    assert list(ports) == ["nginx"]
    assert [host_ip(p) for p in ports["nginx"]] == ["127.0.0.1"]
    opened = compose({**WITH_SECRET, "BIND_ADDRESS": "0.0.0.0"})["services"]["nginx"]["ports"]
    assert [host_ip(p) for p in opened] == ["0.0.0.0"]


def test_compose_refuses_to_start_without_the_secret() -> None:
    for env in ({}, {"GATEWAY_SECRET": ""}):
        with pytest.raises(RequiredUnset) as caught:
            compose(env)
        assert caught.value.name == "GATEWAY_SECRET"
    environment = compose(WITH_SECRET)["services"][REPLICAS[0]]["environment"]
    assert environment == {"GATEWAY_SECRET": SECRET}
    assert interpolate("${GATEWAY_SECRET}", WITH_SECRET) == SECRET


def test_compose_gateway_config_fits_the_compose_network() -> None:
    services = compose(WITH_SECRET)["services"]
    config = parse(
        mounts(services[REPLICAS[0]])["/etc/mcp-gateway/config.yaml"].read_text(), env=ENV
    )
    assert config.listen.http is not None and config.listen.http.host == "0.0.0.0"
    # The image's HEALTHCHECK asks the admin listener on 9464 (tests/system/test_docker.py).
    assert config.listen.admin is not None and config.listen.admin.port == 9464
    assert config.cluster is not None and config.cluster.redis is not None
    assert urlsplit(config.cluster.redis).hostname == "redis"
    assert set(
        VAR.findall(COMPOSE_CLUSTER.with_name("compose-cluster-gateway.yaml").read_text())
    ) - BUILT_IN == {"GATEWAY_SECRET"}


@pytest.mark.slow
def test_compose_gateway_config_checks_and_serves(tmp_path: Path) -> None:
    source = COMPOSE_CLUSTER.with_name("compose-cluster-gateway.yaml")
    done = check_config(source, WITH_SECRET)
    assert done.returncode == 0, done.stderr
    port = free_port()
    with redis_server(port):
        path = tmp_path / "config.yaml"
        path.write_text(on_loopback(source.read_text(), redis_url(port)), encoding="utf-8")
        gateway = start(path, env=WITH_SECRET)
        try:
            assert status(gateway.admin + "/readyz") == 200
            code, reply = post(gateway.mcp, call(1, "echo", text="from compose"))
            assert code == 200 and reply["result"]["content"][0]["text"] == "from compose"
        finally:
            gateway.proc.stop()


def test_docker_compose_reads_the_file() -> None:
    """`docker compose config` where the CLI is installed (as for docker itself in
    tests/system/test_docker.py, its absence skips, in CI too: no daemon is needed for this)."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed: `docker compose config` is not run")
    version = subprocess.run(
        [docker, "compose", "version"], capture_output=True, timeout=START_BOUND, check=False
    )
    if version.returncode != 0:
        pytest.skip("the docker compose plugin is not installed: `docker compose config` not run")
    done = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_CLUSTER), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, **WITH_SECRET},
        timeout=START_BOUND,
        check=False,
    )
    assert done.returncode == 0, done.stderr
