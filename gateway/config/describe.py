"""Config -> the human summary `check-config` prints: what `run` would start, and never a
secret (this output is pasted into tickets).
"""

from __future__ import annotations

from gateway.config.credentials import AuthConfig, ClusterConfig, redacted_url
from gateway.config.hooks import HookConfig
from gateway.config.model import Config, HttpTarget, SseTarget, StdioTarget
from gateway.config.operations import AUDIT_STDERR
from gateway.config.search import ToolSearchConfig


def describe(config: Config) -> str:
    """A human summary of what `run` would start, for `check-config`."""
    lines = [f"config {config.source}: OK"]
    if config.listen.http is not None:
        h = config.listen.http
        lines.append(f"  listen http  {h.scheme}://{h.host}:{h.port}{h.path}")
    if config.listen.stdio:
        who = config.listen.stdio_identity
        lines.append("  listen stdio" + (f" (as {who.subject})" if who is not None else ""))
    if config.listen.admin is not None:
        a = config.listen.admin
        lines.append(f"  listen admin http://{a.host}:{a.port} (metrics and health)")
    n = config.namespacing
    lines.append(
        f"  namespacing  prefix={n.prefix} separator={n.separator!r} max={n.max_name_length}"
        f"  on backend failure: {config.on_backend_failure}"
    )
    lines.extend(f"  note: {notice}" for notice in prefix_notices(config))
    for b in config.backends:
        if b.namespace:
            lines.append(f"  backend {b.name}: namespace {b.namespace}")
        era = "" if b.era == "auto" else f" (era {b.era})"
        if not b.legacy_lane and b.era != "legacy":
            era += " (legacy clients on the modern session)"
        if isinstance(b.target, StdioTarget):
            cmd = " ".join([b.target.command, *b.target.args])
            each = (
                f" (a child per session, at most {b.max_children}, idle {b.child_idle_timeout:g}s)"
                if b.isolation == "per_session"
                else ""
            )
            lines.append(f"  backend {b.name}: stdio `{cmd}`{era}{each}")
        else:
            kind = "sse" if isinstance(b.target, SseTarget) else "http"
            where = b.target.url
            if isinstance(b.target, HttpTarget) and b.target.urls:
                where = f"{' '.join(map(redacted_url, b.target.urls))} ({b.target.balance})"
            lines.append(f"  backend {b.name}: {kind} {where}{era}")
        if b.roots:
            lines.append(f"  backend {b.name}: roots {' '.join(r.uri for r in b.roots)}")
        if b.hooks:
            lines.append(f"  backend {b.name}: hooks {_hooks(b.hooks)} (after the top-level)")
    t = config.telemetry
    lines.append(
        f"  telemetry    service={t.service_name} traces={t.otlp_endpoint or 'off'}"
        f" access log={t.access_log or 'off'}"
        f" payloads on spans={'yes' if t.record_payloads else 'no'}"
    )
    if config.tool_search.enabled:
        lines.append(describe_search(config.tool_search))
    if config.pins is not None:
        own = [
            f"{b.name} {b.pins.on_change}" for b in config.backends if b.pins and b.pins.on_change
        ]
        others = f" (backends: {', '.join(own)})" if own else ""
        lines.append(
            f"  pins         {config.pins.file}, on change {config.pins.on_change}{others}"
        )
    if config.hooks:
        lines.append(f"  hooks        {_hooks(config.hooks)}")
    if config.policy is not None:
        p = config.policy
        lines.append(f"  policy       default {p.default}, rules: {len(p.rules)}")
    if config.auth is not None:
        lines.append(_describe_auth(config.auth))
    if config.cluster is not None:
        lines.append(_describe_cluster(config.cluster))
    if config.tap is not None:
        tap = config.tap
        lines.append(
            f"  tap          {tap.path} (rotates at {_mib(tap.max_bytes)}, keeps {tap.backups}"
            f" old; redacts {len(tap.redact)} paths, Authorization, Cookie"
            f"{''.join(', ' + h for h in tap.redact_headers)})"
        )
    lines.extend(_limit_lines(config))
    lines.extend(describe_servers(config))
    return "\n".join(lines)


def prefix_notices(config: Config) -> list[str]:
    """One line per server whose names `prefix: auto` prefixes (two backends or more): a
    second backend renames the first one's tools, which nothing else would tell (issue 36)."""
    notices = []
    n = config.namespacing
    if n.prefix == "auto" and len(config.backends) > 1:
        example = config.backends[0].effective_namespace
        notices.append(
            _prefix_notice(len(config.backends), example, n.separator, "namespacing: {prefix: ")
        )
    for s in config.servers:
        own = s.namespacing or n
        if own.prefix == "auto" and len(s.backends) > 1:
            where = f"servers.{s.name}.namespacing: {{prefix: "
            first = s.backends[0]
            base = next((b for b in config.backends if b.name == first.name), None)
            example = first.namespace or (base.effective_namespace if base else first.name)
            notice = _prefix_notice(len(s.backends), example, own.separator, where)
            notices.append(f"server {s.name}: {notice}")
    return notices


def _prefix_notice(count: int, namespace: str, separator: str, key: str) -> str:
    return (
        f"{count} backends under prefix auto, so each tool and prompt is offered as "
        f"NAMESPACE{separator}NAME ({namespace}'s `search` as `{namespace}{separator}search`); "
        f"pin `{key}always}}` to keep them so as backends come and go, or `{key}never}}` "
        "for the servers' own names"
    )


def _hooks(hooks: tuple[HookConfig, ...]) -> str:
    """Each hook in its order: its name, when it runs, and what fails it closed or open."""
    return ", ".join(f"{h.use} (on {h.on}, {h.timeout:g}s, on_error {h.on_error})" for h in hooks)


def describe_servers(config: Config) -> list[str]:
    """Each virtual server: where it is served, its own settings, and per backend what it
    selects (what that comes to, with the tokens it costs: `check-config --catalogs`)."""
    lines = []
    for s in config.servers:
        own = [f"serverInfo {s.server_name}"]
        if s.namespacing is not None:
            own.append(f"prefix={s.namespacing.prefix}")
        if s.instructions is not None:
            own.append("own instructions")
        if s.auth is not None:
            own.append(f"auth scopes: {' '.join(s.auth.scopes) or 'none'}")
        if s.policy is not None:
            own.append(f"own policy ({len(s.policy.rules)} rules)")
        if s.rate_limits is not None:
            own.append("own rate limits")
        if s.tool_search is not None:
            own.append(f"tool search {s.tool_search.mode}")
        lines.append(f"  server {s.name}: {s.path} ({', '.join(own)})")
        for b in s.backends:
            picked = [f"{kind} {_selection(getattr(b, kind))}" for kind in _KINDS]
            rename = f"; {len(b.rename)} renamed" if b.rename else ""
            lines.append(f"    {b.name}: {'; '.join(picked)}{rename}")
    return lines


_KINDS = ("tools", "prompts", "resources")


def _selection(patterns: tuple[str, ...] | None) -> str:
    if patterns is None:
        return "all"
    return ", ".join(patterns) if patterns else "none"


def _limit_lines(config: Config) -> list[str]:
    lines = []
    limits = config.rate_limits
    if limits is not None:
        parts = [
            f"{name} {rate.rate:g}/s burst {rate.burst}"
            for name, rate in (
                ("per caller", limits.per_identity),
                ("per caller and tool", limits.per_tool),
                ("overall", limits.overall),
            )
            if rate is not None
        ]
        parts += [f"tool {name} {r.rate:g}/s burst {r.burst}" for name, r in limits.tools.items()]
        lines.append(f"  rate limits  {'; '.join(parts) or 'none'}")
    if config.audit is not None:
        a = config.audit
        rotation = (
            ""
            if a.path == AUDIT_STDERR
            else f" (rotates at {_mib(a.max_bytes)}, keeps {a.backups} old)"
        )
        arguments = (
            f"with arguments ({len(a.redact)} paths redacted)" if a.include_arguments else ""
        )
        lines.append(f"  audit log    {a.path}{rotation} {arguments or 'without arguments'}")
    return lines


def _describe_auth(auth: AuthConfig) -> str:
    who = [f"issuer {auth.issuer}"] if auth.issuer else []
    if auth.introspection is not None:
        who.append("introspection")
    if auth.api_keys:
        who.append(f"{len(auth.api_keys)} API keys")
    needs = f", requires {' '.join(auth.required_scopes)}" if auth.required_scopes else ""
    return f"  auth         resource {auth.resource} ({', '.join(who)}){needs}"


def _describe_cluster(cluster: ClusterConfig) -> str:
    # How many and from where, never what: this output is pasted into tickets.
    count = len(cluster.secrets)
    where = f" from {cluster.secrets_file}" if cluster.secrets_file else ""
    line = (
        f"  cluster      {count} secret{'s' if count != 1 else ''}{where} (the first signs, "
        "any is accepted): cursors are valid on every replica"
    )
    if cluster.redis is not None:
        # Redacted: the URL may carry Redis's password.
        line += (
            f"\n  cluster      rate limits shared through {redacted_url(cluster.redis)} (each"
            f" check waits {cluster.redis_timeout:g} s at most; unreachable: per replica,"
            f" tried again after {cluster.redis_retry_interval:g} s)"
        )
    return line


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB" if size >= 1024 * 1024 else f"{size} bytes"


def describe_search(search: ToolSearchConfig) -> str:
    """The `tool_search` line (a virtual server's too)."""
    when = f" above {search.threshold_tokens} tokens" if search.mode == "auto" else ""
    return f"  tool search  {search.mode}{when}: meta-tools listed instead of the tools"
