"""Config: YAML validated with line-accurate errors, ${ENV} interpolation; the CLI around it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.app.wiring import make_exposure
from gateway.config import (
    AdminListen,
    BackendLimits,
    ClientTls,
    ConfigInvalid,
    HttpTarget,
    ListenerLimits,
    Root,
    ServerTls,
    SseTarget,
    StdioTarget,
    TapConfig,
    TelemetryConfig,
    describe,
    load,
    load_mcp_json,
    parse,
)
from tests.support import ROOT, run_cli

GOOD = """\
listen:
  http: {host: 127.0.0.1, port: 8080, path: /mcp}
  stdio: true
backends:
  time:  {stdio: {command: mcp-server-time, args: [], env: {TZ: UTC}, cwd: null}}
  docs:  {http:  {url: "https://example.com/mcp", headers: {Authorization: "Bearer ${DOCS_TOKEN}"}}}
"""


def test_the_issue_example_parses_with_env_interpolation() -> None:
    config = parse(GOOD, env={"DOCS_TOKEN": "s3cret"})
    assert config.listen.stdio and config.listen.http is not None
    assert config.listen.http.port == 8080
    time, docs = config.backends
    assert isinstance(time.target, StdioTarget) and time.target.env == {"TZ": "UTC"}
    assert isinstance(docs.target, HttpTarget)
    assert docs.target.headers == {"Authorization": "Bearer s3cret"}


def test_env_default_is_used_when_unset() -> None:
    text = GOOD.replace("${DOCS_TOKEN}", "${DOCS_TOKEN:-anonymous}")
    docs = parse(text, env={}).backends[1]
    assert isinstance(docs.target, HttpTarget)
    assert docs.target.headers["Authorization"] == "Bearer anonymous"


def test_header_and_env_values_keep_their_yaml_text() -> None:
    """YAML 1.1 reads `yes` as true and `0755` as a number; a header value is text."""
    text = (
        "listen: {stdio: true}\n"
        "backends:\n"
        "  a: {http: {url: 'http://x', headers: {X-On: yes, X-Mode: 0755}}}\n"
    )
    target = parse(text, env={}).backends[0].target
    assert isinstance(target, HttpTarget)
    assert target.headers == {"X-On": "yes", "X-Mode": "0755"}


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigInvalid) as caught:
        parse(text, "c.yaml", env={})
    return caught.value.problems


def test_every_problem_is_reported_with_its_line() -> None:
    found = problems(
        "listen:\n"
        "  http: {port: 99999}\n"
        "backends:\n"
        "  a:\n"
        "    stdio: {args: [x]}\n"
        "  b:\n"
        "    http: {url: ftp://nope}\n"
        "    colour: blue\n"
        "  c:\n"
        "    http: {url: 'http://x/${MISSING}'}\n"
    )
    assert any(p.startswith("c.yaml:2: listen.http.port") for p in found), found
    assert any(p.startswith("c.yaml:5: backends.a.stdio.command") for p in found), found
    assert any(p.startswith("c.yaml:7: backends.b.http.url") for p in found), found
    assert any(p.startswith("c.yaml:8: backends.b.colour") for p in found), found
    assert any(p.startswith("c.yaml:10: backends.c.http.url") and "MISSING" in p for p in found)
    assert len(found) == 5


def test_yaml_syntax_error_names_the_line() -> None:
    assert problems("listen:\n  http: {port: 1\nbackends: {}\n")[0].startswith("c.yaml:")


def test_a_backend_needs_exactly_one_transport() -> None:
    found = problems("listen: {stdio: true}\nbackends:\n  a: {}\n")
    assert found == ["c.yaml:3: backends.a: needs exactly one of stdio, http or sse"]


def test_era_defaults_to_auto_and_can_be_pinned() -> None:
    text = (
        "listen: {stdio: true}\n"
        "backends:\n"
        "  a: {http: {url: 'http://x'}}\n"
        "  b: {http: {url: 'http://y'}, era: legacy}\n"
        "  c: {stdio: {command: srv}, era: modern}\n"
    )
    assert [b.era for b in parse(text, env={}).backends] == ["auto", "legacy", "modern"]
    bad = "listen: {stdio: true}\nbackends:\n  a: {http: {url: 'http://x'}, era: old}\n"
    assert problems(bad) == ["c.yaml:3: backends.a.era: must be one of auto, modern, legacy"]


def test_an_sse_backend_is_legacy_and_cannot_be_pinned_modern() -> None:
    text = "listen: {stdio: true}\nbackends:\n  old: {sse: {url: 'http://x/sse'}}\n"
    backend = parse(text, env={}).backends[0]
    assert isinstance(backend.target, SseTarget) and backend.target.url == "http://x/sse"
    assert backend.era == "legacy"
    pinned = text.replace("/sse'}}", "/sse'}, era: modern}")
    expected = "c.yaml:3: backends.old.era: an sse backend speaks a legacy version"
    assert problems(pinned) == [expected]


def test_no_front_end_and_no_backend_are_errors() -> None:
    found = problems("listen: {}\n")
    assert len(found) == 2


def test_check_config_prints_what_would_run(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD.replace("${DOCS_TOKEN}", "${DOCS_TOKEN:-x}"))
    done = run_cli("check-config", str(path))
    assert done.returncode == 0, done.stderr
    assert "backend time: stdio" in done.stdout and "backend docs: http" in done.stdout
    assert "Bearer" not in done.stdout  # secrets are not printed


def test_check_config_exits_2_with_line_accurate_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("listen: {stdio: true}\nbackends:\n  a: {stdio: {command: 5}}\n")
    done = run_cli("check-config", str(path))
    assert done.returncode == 2
    assert f"{path}:3: backends.a.stdio.command" in done.stderr


def test_the_bundled_demo_config_is_valid() -> None:
    done = run_cli("check-config", str(ROOT / "gateway" / "demo" / "config.yaml"))
    assert done.returncode == 0, done.stderr
    assert "backend demo: stdio" in done.stdout


@pytest.mark.parametrize("command", ["run", "connect", "expose", "check-config", "schema"])
def test_every_command_explains_itself(command: str) -> None:
    done = run_cli(command, "--help")
    assert done.returncode == 0 and "Usage:" in done.stdout


def test_backends_from_imports_a_host_mcp_json_next_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text(
        '{"mcpServers": {"files": {"command": "fs-server", "args": ["/srv"], "env": {"A": "1"}},'
        ' "remote": {"url": "https://example.com/mcp", "headers": {"X-Key": "k"}},'
        ' "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},'
        ' "off": {"command": "x", "disabled": true}}}'
    )
    path = tmp_path / "gw.yaml"
    path.write_text("listen: {stdio: true}\nbackends_from: mcp.json\n")
    config = load(path, env={})
    files, remote, old = config.backends
    assert isinstance(files.target, StdioTarget) and files.target.args == ("/srv",)
    assert isinstance(remote.target, HttpTarget) and remote.target.headers == {"X-Key": "k"}
    assert isinstance(old.target, SseTarget) and old.era == "legacy"


def test_a_broken_mcp_json_is_reported_with_the_config_line(tmp_path: Path) -> None:
    (tmp_path / "mcp.json").write_text('{"mcpServers": {"bad": {"type": "sse"}}}')
    path = tmp_path / "gw.yaml"
    path.write_text("listen: {stdio: true}\nbackends_from: mcp.json\n")
    with pytest.raises(ConfigInvalid) as caught:
        load(path, env={})
    assert caught.value.problems[0].startswith(f"{path}:2: backends_from:")
    assert "mcpServers.bad" in caught.value.problems[0]


def test_namespacing_and_policy_values_are_checked() -> None:
    found = problems(
        "listen: {stdio: true}\n"
        "namespacing: {prefix: sometimes, max_name_length: 8}\n"
        "fan_out: {on_failure: shrug}\n"
        "backends:\n"
        "  a: {stdio: {command: x}, namespace: 'bad ns'}\n"
    )
    assert [p.split(":")[1] for p in found] == ["5", "2", "2", "3"], found


MINIMAL = "listen: {stdio: true}\nbackends:\n  a: {stdio: {command: x}}\n"


def test_tap_telemetry_and_admin_are_off_or_defaults_when_absent() -> None:
    config = parse(MINIMAL, env={})
    assert config.tap is None and config.listen.admin is None
    assert config.telemetry == TelemetryConfig()
    assert config.telemetry.service_name == "mcp-gateway" and config.telemetry.access_log is None


def test_tap_section_with_a_path_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        MINIMAL + "tap:\n"
        "  path: rec/tap.jsonl\n"
        "  redact: [params.arguments.password, 'result.*']\n"
        "  redact_headers: [X-Api-Key]\n"
        "  max_bytes: 1000\n"
        "  backups: 0\n"
    )
    tap = load(path, env={}).tap
    assert tap == TapConfig(
        path=str(tmp_path / "rec" / "tap.jsonl"),
        redact=("params.arguments.password", "result.*"),
        redact_headers=("X-Api-Key",),
        max_bytes=1000,
        backups=0,
        max_message_bytes=1024 * 1024,
    )
    assert parse(MINIMAL + "tap: {path: /var/t.jsonl}\n", env={}).tap == TapConfig("/var/t.jsonl")


def test_tap_values_are_checked_with_their_lines() -> None:
    found = problems(
        MINIMAL + "tap:\n"
        "  redact: ['params..x', ok.path]\n"
        "  redact_headers: ['bad header']\n"
        "  max_bytes: 0\n"
        "  backups: -1\n"
        "  max_message_bytes: 1.5\n"
        "  colour: blue\n"
    )
    assert sorted(p.split(":", 2)[1] + " " + p.split(": ")[1] for p in found) == [
        "10 tap.colour",
        "5 tap.path",  # missing: the line where the section's keys start
        "5 tap.redact.0",
        "6 tap.redact_headers.0",
        "7 tap.max_bytes",
        "8 tap.backups",
        "9 tap.max_message_bytes",
    ], found


def test_telemetry_section_parses_and_resolves_an_access_log_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        MINIMAL + "telemetry:\n"
        "  service_name: edge-gw\n"
        "  otlp_endpoint: http://collector:4318\n"
        "  record_payloads: true\n"
        "  access_log: logs/access.log\n"
    )
    assert load(path, env={}).telemetry == TelemetryConfig(
        service_name="edge-gw",
        otlp_endpoint="http://collector:4318",
        record_payloads=True,
        access_log=str(tmp_path / "logs" / "access.log"),
    )
    stderr = parse(MINIMAL + "telemetry: {access_log: stderr}\n", env={})
    assert stderr.telemetry.access_log == "stderr"


def test_telemetry_values_are_checked_with_their_lines() -> None:
    found = problems(
        MINIMAL + "telemetry:\n"
        "  service_name: ''\n"
        "  otlp_endpoint: collector:4317\n"
        "  record_payloads: sometimes\n"
        "  access_log: ''\n"
    )
    assert [p.split(": ")[1] for p in found] == [
        "telemetry.service_name",
        "telemetry.otlp_endpoint",
        "telemetry.access_log",
        "telemetry.record_payloads",
    ], found
    assert all(p.startswith(f"c.yaml:{n}:") for p, n in zip(found, (5, 6, 8, 7), strict=True))


def test_admin_listener_with_stdio_alone_is_valid() -> None:
    config = parse(
        "listen:\n  stdio: true\n  admin: {port: 9100}\nbackends:\n  a: {stdio: {command: x}}\n",
        env={},
    )
    assert config.listen.admin == AdminListen(host="127.0.0.1", port=9100)
    defaults = parse(MINIMAL.replace("{stdio: true}", "{stdio: true, admin: {}}"), env={})
    assert defaults.listen.admin == AdminListen(port=9464)


def test_admin_listener_is_not_a_front_end() -> None:
    found = problems("listen:\n  admin: {port: 9100}\nbackends:\n  a: {stdio: {command: x}}\n")
    assert len(found) == 1 and found[0].startswith("c.yaml:2: listen: name at least one front end")
    assert "admin" in found[0]


def test_admin_listener_values_are_checked() -> None:
    found = problems(
        "listen:\n"
        "  http: {port: 8080}\n"
        "  admin: {port: 8080, path: /x}\n"
        "backends:\n"
        "  a: {stdio: {command: x}}\n"
    )
    assert sorted(found) == sorted(
        [
            "c.yaml:3: listen.admin.port: must differ from listen.http.port (8080)",
            "c.yaml:3: listen.admin.path: unknown key (expected one of: host, port)",
        ]
    )
    # Port 0 picks a free port for each, so two zeros never clash.
    text = "listen:\n  http: {port: 0}\n  admin: {port: 0}\nbackends:\n  a: {stdio: {command: x}}\n"
    assert parse(text, env={}).listen.admin == AdminListen(port=0)


def test_check_config_describes_tap_telemetry_and_admin(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "listen: {stdio: true, admin: {port: 9100}}\n"
        "backends:\n  a: {stdio: {command: x}}\n"
        "tap: {path: tap.jsonl, redact_headers: [X-Api-Key]}\n"
        "telemetry: {otlp_endpoint: 'http://collector:4318', access_log: stderr}\n"
    )
    done = run_cli("check-config", str(path))
    assert done.returncode == 0, done.stderr
    assert "listen admin http://127.0.0.1:9100" in done.stdout
    assert f"tap          {tmp_path / 'tap.jsonl'}" in done.stdout
    assert "X-Api-Key" in done.stdout and "Authorization" in done.stdout
    assert "traces=http://collector:4318" in done.stdout and "access log=stderr" in done.stdout


def test_http_limits_default_and_are_read_from_one_section() -> None:
    """Every listener and backend limit has a default and a key (README "Limits")."""
    plain = parse("listen: {http: {}}\nbackends: {a: {http: {url: 'http://x'}}}\n", env={})
    assert plain.listen.http is not None
    assert plain.listen.http.limits == ListenerLimits()
    assert plain.listen.http.tls is None and plain.listen.http.scheme == "http"
    target = plain.backends[0].target
    assert isinstance(target, HttpTarget)
    assert target.limits == BackendLimits() and target.tls == ClientTls()
    assert target.limits.idle_timeout < 5  # below the 5 s keep-alive of common servers
    text = (
        "listen:\n"
        "  http:\n"
        "    limits: {max_body_bytes: 10, max_header_bytes: 512, max_headers: 20,\n"
        "             max_connections: 3, max_requests_per_connection: 4, idle_timeout: 5,\n"
        "             header_timeout: 6, body_timeout: 7}\n"
        "backends:\n"
        "  a: {sse: {url: 'http://x/sse', limits: {max_connections: 2, idle_timeout: 1.5,\n"
        "      max_reply_bytes: 100, max_event_bytes: 50,\n"
        "      max_header_bytes: 300, max_headers: 9}}}\n"
    )
    config = parse(text, env={})
    assert config.listen.http is not None
    assert config.listen.http.limits == ListenerLimits(10, 512, 20, 3, 4, 5.0, 6.0, 7.0)
    assert config.listen.http.max_body_bytes == 10
    sse = config.backends[0].target
    assert isinstance(sse, SseTarget)
    assert sse.limits == BackendLimits(2, 1.5, 100, 50, 300, 9)


def test_the_older_max_body_bytes_key_still_counts() -> None:
    config = parse("listen: {http: {max_body_bytes: 99}}\nbackends: {a: {stdio: {command: x}}}\n")
    assert config.listen.http is not None and config.listen.http.max_body_bytes == 99


def test_limit_values_are_checked_with_their_lines() -> None:
    text = (
        "listen:\n"
        "  http:\n"
        "    limits:\n"
        "      max_connections: 0\n"
        "      idle_timeout: -1\n"
        "      max_header_bytes: 10\n"
        "      no_such_limit: 1\n"
        "backends:\n"
        "  a:\n"
        "    http:\n"
        "      url: http://x\n"
        "      limits: {max_reply_bytes: many}\n"
    )
    with pytest.raises(ConfigInvalid) as err:
        parse(text, env={})
    problems = "\n".join(err.value.problems)
    for where in (
        ":4: listen.http.limits.max_connections",
        ":5: listen.http.limits.idle_timeout",
        ":6: listen.http.limits.max_header_bytes",
        ":7: listen.http.limits.no_such_limit",
        ":12: backends.a.http.limits.max_reply_bytes",
    ):
        assert where in problems


def test_tls_files_resolve_beside_the_config_and_must_exist(tmp_path: Path) -> None:
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("-")
    file = tmp_path / "gateway.yaml"
    file.write_text(
        "listen: {http: {tls: {cert_file: cert.pem, key_file: key.pem}}}\n"
        "backends:\n"
        "  a: {http: {url: 'https://x', tls: {ca_file: ca.pem, cert_file: cert.pem,\n"
        "      key_file: key.pem, verify: false}}}\n"
    )
    config = load(file)
    assert config.listen.http is not None
    assert config.listen.http.tls == ServerTls(
        str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    )
    assert config.listen.http.scheme == "https"
    target = config.backends[0].target
    assert isinstance(target, HttpTarget)
    assert target.tls == ClientTls(
        str(tmp_path / "ca.pem"), str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"), False
    )
    file.write_text(
        "listen: {http: {tls: {cert_file: missing.pem}}}\n"
        "backends: {a: {http: {url: 'https://x', tls: {key_file: key.pem}}}}\n"
    )
    with pytest.raises(ConfigInvalid) as err:
        load(file)
    problems = "\n".join(err.value.problems)
    assert "listen.http.tls.cert_file" in problems and "missing.pem" in problems
    assert "listen.http.tls.key_file" in problems  # required with cert_file
    assert "backends.a.http.tls.key_file" in problems  # a key without a certificate


def test_stdio_inherit_env_is_off_unless_set() -> None:
    """A config backend's child gets the safe variable list unless `inherit_env: true`."""
    text = (
        "listen: {stdio: true}\n"
        "backends:\n"
        "  quiet: {stdio: {command: srv}}\n"
        "  open: {stdio: {command: srv, inherit_env: true}}\n"
    )
    quiet, open_ = (b.target for b in parse(text, env={}).backends)
    assert isinstance(quiet, StdioTarget) and quiet.inherit_env is False
    assert isinstance(open_, StdioTarget) and open_.inherit_env is True


def test_stdio_inherit_env_must_be_a_boolean() -> None:
    found = problems(
        "listen: {stdio: true}\nbackends:\n  a: {stdio: {command: srv, inherit_env: 'yes'}}\n"
    )
    assert found == ["c.yaml:3: backends.a.stdio.inherit_env: must be true or false"]


def test_lists_from_catalog_is_on_unless_turned_off_per_backend() -> None:
    """`lists_from_catalog` (core/fanout.py): on by default, carried to the backend's exposure,
    and a boolean."""
    text = (
        "listen: {stdio: true}\n"
        "backends:\n"
        "  trusted: {stdio: {command: srv}}\n"
        "  asked: {stdio: {command: srv}, lists_from_catalog: false}\n"
    )
    exposures = [make_exposure(b) for b in parse(text, env={}).backends]
    assert [e.lists_from_catalog for e in exposures] == [True, False]
    found = problems(
        "listen: {stdio: true}\nbackends:\n  a: {stdio: {command: srv}, lists_from_catalog: 1}\n"
    )
    assert found == ["c.yaml:3: backends.a.lists_from_catalog: must be true or false"]


def test_mcp_json_servers_do_not_inherit_the_whole_environment(tmp_path: Path) -> None:
    """An mcp.json server gets what a host's SDK stdio client gives it: the safe list and its
    `env`, not the gateway's whole environment."""
    path = tmp_path / "mcp.json"
    path.write_text('{"mcpServers": {"files": {"command": "fs-server", "env": {"A": "1"}}}}')
    (files,) = load_mcp_json(path)
    assert isinstance(files.target, StdioTarget)
    assert files.target.inherit_env is False and files.target.env == {"A": "1"}


def test_roots_default_to_none_and_take_uris_or_uri_name_mappings() -> None:
    """client/roots, Root: a `uri` and an optional `name`, as roots/list returns them."""
    text = (
        "listen: {stdio: true}\n"
        "backends:\n"
        "  bare: {stdio: {command: srv}}\n"
        "  files:\n"
        "    stdio: {command: srv}\n"
        "    roots:\n"
        "      - file:///srv/projects\n"
        "      - {uri: 'file:///srv/data', name: Data}\n"
        "      - {uri: 'file://localhost/srv/${WHERE}%20two'}\n"
    )
    bare, files = parse(text, env={"WHERE": "env"}).backends
    assert bare.roots == ()
    assert files.roots == (
        Root("file:///srv/projects"),
        Root("file:///srv/data", "Data"),
        Root("file://localhost/srv/env%20two"),
    )
    assert [r.as_wire() for r in files.roots[:2]] == [
        {"uri": "file:///srv/projects"},
        {"uri": "file:///srv/data", "name": "Data"},
    ]


def test_bad_roots_are_config_errors_naming_their_lines() -> None:
    """client/roots: a root's URI must be a file:// URI (2025-11-25 and 2026-07-28 alike)."""
    found = problems(
        "listen: {stdio: true}\n"
        "backends:\n"
        "  a:\n"
        "    stdio: {command: srv}\n"
        "    roots:\n"
        "      - /srv/plain/path\n"
        "      - https://example.com/x\n"
        "      - file://srv/x\n"
        "      - file:///my dir\n"
        "      - file:///bad%zz\n"
        "      - {name: no uri}\n"
        "      - {uri: 'file:///ok', colour: red}\n"
        "      - {uri: 'file:///ok', name: 3}\n"
        "      - 42\n"
        "      - file://\n"
        "  b: {stdio: {command: srv}, roots: file:///not-a-list}\n"
    )
    assert [p.split(": ", 2)[:2] for p in found] == [
        ["c.yaml:6", "backends.a.roots.0"],
        ["c.yaml:7", "backends.a.roots.1"],
        ["c.yaml:8", "backends.a.roots.2"],
        ["c.yaml:9", "backends.a.roots.3"],
        ["c.yaml:10", "backends.a.roots.4"],
        ["c.yaml:11", "backends.a.roots.5.uri"],
        ["c.yaml:12", "backends.a.roots.6.colour"],
        ["c.yaml:13", "backends.a.roots.7.name"],
        ["c.yaml:14", "backends.a.roots.8"],
        ["c.yaml:15", "backends.a.roots.9"],
        ["c.yaml:16", "backends.b.roots"],
    ]
    assert "three slashes (file:///srv/...)" in found[2]


def test_check_config_lists_a_backends_roots(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "listen: {stdio: true}\n"
        "backends:\n  files: {stdio: {command: srv}, roots: [file:///a, file:///b]}\n"
    )
    assert "backend files: roots file:///a file:///b" in describe(load(path))
