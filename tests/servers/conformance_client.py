"""The client the official conformance suite drives (`conformance client --command ...`).

Usage (the suite appends the mock server's URL):
    python tests/servers/conformance_client.py [--via direct|http|stdio] URL

The suite names the scenario in MCP_CONFORMANCE_SCENARIO, the protocol revision in
MCP_CONFORMANCE_PROTOCOL_VERSION (2025-11-25: the initialize handshake; 2026-07-28:
stateless, per-request `_meta`) and, for some scenarios, the calls to make in
MCP_CONFORMANCE_CONTEXT. The client is the SDK's `Client` (answering elicitation with
the schema's defaults, sampling with a fixed text, roots with one root); what it does
against each mock server is generic: list everything, call every tool it kept.

An `auth/` scenario's mock server wants an OAuth client. Through the gateway, the gateway is
that client: the context (pre-registered client id and secret, private key) becomes the
backend's `auth:` section (`--via http`) or `connect`'s flags (`--via stdio`), the
authorization-code flow's browser is tests/servers/headless_browser.py (BROWSER), and each
gateway process keeps its tokens in a fresh XDG_STATE_HOME. Directly, the client is the SDK's
own OAuth providers, taking the code from the authorization endpoint's redirect.

`--via` says how the client reaches the mock server:
- `direct`: itself, as the suite intends;
- `http`: through a gateway (`mcp-transparent-gateway run`, one HTTP backend: the mock server) over
  HTTP, the gateway being the HTTP client the mock server judges;
- `stdio`: through `mcp-transparent-gateway connect URL`, the stdio bridge, spoken to over stdio.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx2
import orjson
import yaml
from mcp import Client, StdioServerParameters
from mcp.client.auth import AuthorizationCodeResult, OAuthClientProvider
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types import (
    CreateMessageRequestParams,
    CreateMessageResult,
    ElicitRequestParams,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
    Tool,
)

warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

ROOT = Path(__file__).resolve().parent.parent.parent
BROWSER = Path(__file__).resolve().parent / "headless_browser.py"
# How long the gateway may take to start listening.
START_BOUND = 20.0
# The Client ID Metadata Document URL the suite's auth/basic-cimd expects as the client id
# (the mock authorization server never fetches it: the URL is the identity).
CIMD_URL = "https://conformance-test.local/client-metadata.json"
# The scenarios where the client is a service account (no user, no browser).
CLIENT_CREDENTIALS = frozenset({"auth/client-credentials-basic", "auth/client-credentials-jwt"})
# What the direct client registers as its redirect URI: nothing listens there, the code
# is taken from the authorization endpoint's redirect before anything follows it.
DIRECT_REDIRECT = "http://127.0.0.1:1/callback"
# Each hop of the direct client's authorization request (one local mock).
AUTHORIZE_BOUND = 10.0


def value_for(schema: dict[str, Any]) -> Any:
    """A value a property schema accepts: its default, else the first enum/const, else a
    plain value of its type."""
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("oneOf", "anyOf"):
        options = schema.get(key)
        if options and isinstance(options[0], dict) and "const" in options[0]:
            return options[0]["const"]
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items", {})
        return [value_for(items)] if isinstance(items, dict) else []
    return {
        "string": "x",
        "integer": 1,
        "number": 1,
        "boolean": True,
        "object": {},
        "null": None,
    }.get(kind if isinstance(kind, str) else "string", "x")


def arguments_for(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments for every property of an input schema."""
    properties = schema.get("properties") or {}
    return {name: value_for(prop) for name, prop in properties.items() if isinstance(prop, dict)}


async def on_elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    """Accept with every field filled, defaults first (SEP-1034: the client applies them)."""
    schema = getattr(params, "requested_schema", None) or {}
    return ElicitResult(action="accept", content=arguments_for(schema))


async def on_sample(
    context: ClientRequestContext, params: CreateMessageRequestParams
) -> CreateMessageResult:
    return CreateMessageResult(
        role="assistant",
        content=TextContent(type="text", text="This is a test response from the client"),
        model="conformance-client",
        stop_reason="endTurn",
    )


async def on_roots(context: ClientRequestContext) -> ListRootsResult:
    root = Root.model_validate({"uri": "file:///tmp/conformance", "name": "conformance"})
    return ListRootsResult(roots=[root])


async def exercise(client: Client, scenario: str, context: dict[str, Any]) -> None:
    tools: list[Tool] = (await client.list_tools()).tools
    calls: list[tuple[str, dict[str, Any]]]
    if "toolCalls" in context:
        calls = [(c["name"], c.get("arguments") or {}) for c in context["toolCalls"]]
    elif scenario == "json-schema-2020-12-preservation":
        focal = next(t for t in tools if t.name == "json_schema_2020_12_tool")
        calls = [("json_schema_echo", {"schema": focal.input_schema})]
    else:
        calls = [(t.name, arguments_for(t.input_schema)) for t in tools]
    async with anyio.create_task_group() as tg:
        for name, args in calls:
            tg.start_soon(call_quietly, client, name, args)
    if scenario == "http-standard-headers":
        resources = (await client.list_resources()).resources
        for resource in resources[:1]:
            await client.read_resource(resource.uri)
        prompts = (await client.list_prompts()).prompts
        for prompt in prompts[:1]:
            args = {a.name: "x" for a in prompt.arguments or []}
            await client.get_prompt(prompt.name, args)


async def call_quietly(client: Client, name: str, args: dict[str, Any]) -> None:
    """A failing call is the scenario's to judge, not a reason to stop the others."""
    try:
        await client.call_tool(name, args)
    except Exception as exc:
        print(f"call {name} failed: {exc!r}", file=sys.stderr)


def auth_settings(scenario: str, context: dict[str, Any], workdir: Path) -> dict[str, Any] | None:
    """The backend's `auth:` section for an `auth/` scenario (None for the others): what the
    suite hands a client in MCP_CONFORMANCE_CONTEXT, and nothing more, so that the gateway's
    own choices (scopes, token endpoint auth method, CIMD or registration) are what is judged."""
    if not scenario.startswith("auth/"):
        return None
    kind = "client_credentials" if scenario in CLIENT_CREDENTIALS else "oauth"
    settings: dict[str, Any] = {"type": kind}
    for key in ("client_id", "client_secret", "signing_algorithm"):
        if isinstance(context.get(key), str):
            settings[key] = context[key]
    if isinstance(context.get("private_key_pem"), str):
        key_file = workdir / "client-key.pem"
        key_file.write_text(context["private_key_pem"])
        key_file.chmod(0o600)
        settings["private_key_file"] = str(key_file)
        # A key is only ever for signing assertions: say so rather than leave the gateway to
        # pick from the server's metadata.
        settings["token_endpoint_auth_method"] = "private_key_jwt"
    if kind == "oauth" and "client_id" not in settings:
        # As a deployed gateway would be set up: a CIMD URL, used where the authorization
        # server supports CIMD (auth/basic-cimd), dynamic registration elsewhere.
        settings["client_metadata_url"] = CIMD_URL
    return settings


def connect_flags(settings: dict[str, Any]) -> list[str]:
    """`mcp-transparent-gateway connect`'s flags for an `auth:` section (key -> --key)."""
    flags = ["--auth", str(settings["type"])]
    for key, value in settings.items():
        if key == "scopes":
            for scope in value:
                flags += ["--scope", str(scope)]
        elif key != "type":
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def gateway_env(workdir: Path) -> dict[str, str]:
    """The gateway process's environment: a state directory of its own (tokens and
    registrations must not leak between scenarios, nor come from the user's) and the
    headless browser (a test must never open a real one)."""
    state = workdir / "state"
    state.mkdir()
    return {**os.environ, "XDG_STATE_HOME": str(state), "BROWSER": str(browser_wrapper(workdir))}


def browser_wrapper(workdir: Path) -> Path:
    """An executable that runs the headless browser. Python 3.11's `webbrowser` takes BROWSER
    as one program path (a command line with arguments would be taken whole as the program's
    name), so the interpreter and the script go in a script of their own."""
    wrapper = workdir / "browser"
    command = shlex.join([sys.executable, str(BROWSER)])
    wrapper.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    wrapper.chmod(0o700)
    return wrapper


def write_gateway_config(url: str, auth: dict[str, Any] | None, workdir: Path) -> Path:
    """The config of a gateway whose one backend is `url`, logging in as `auth` says."""
    config = workdir / "gateway.yaml"
    backend: dict[str, Any] = {"http": {"url": url}}
    if auth is not None:
        backend["auth"] = auth
    config.write_text(
        yaml.safe_dump(
            {
                "listen": {"http": {"host": "127.0.0.1", "port": 0, "path": "/mcp"}},
                "backends": {"mock": backend},
            }
        )
    )
    return config


@contextmanager
def gateway_http(url: str, auth: dict[str, Any] | None, workdir: Path) -> Iterator[str]:
    """An HTTP gateway whose one backend is `url`; yields the gateway's own URL."""
    config = write_gateway_config(url, auth, workdir)
    args = [sys.executable, "-m", "gateway", "run", "--config", str(config)]
    proc = subprocess.Popen(
        [*args, "--log-level", "info"],
        cwd=ROOT,
        env=gateway_env(workdir),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield wait_listening(proc)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_listening(proc: subprocess.Popen[bytes]) -> str:
    """Read the gateway's stderr until it says where it listens (bounded); keep relaying the
    rest to our stderr, which the suite saves."""
    found: list[str] = []
    seen = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            if not found and (m := re.search(r"listening on (http://\S+)", line)):
                found.append(m.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=pump, daemon=True).start()
    if not seen.wait(START_BOUND) or not found:
        raise SystemExit("gateway did not start listening")
    return found[0]


class MemoryStorage:
    """The SDK's token storage, in memory: a direct run is one process, one scenario."""

    def __init__(self, client_info: OAuthClientInformationFull | None = None) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info = client_info

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class HeadlessLogin:
    """The SDK's redirect and callback handlers without a person: the mock authorization
    endpoint approves at once and redirects to the redirect URI with the code, so the code,
    state and iss are read from that redirect's Location."""

    def __init__(self) -> None:
        self.result: AuthorizationCodeResult | None = None

    async def redirect(self, authorization_url: str) -> None:
        async with httpx2.AsyncClient(timeout=AUTHORIZE_BOUND) as http:
            response = await http.get(authorization_url)
        location = response.headers.get("location")
        if location is None:
            raise RuntimeError(f"authorization endpoint answered {response.status_code}")
        query = parse_qs(urlsplit(location).query)
        if "code" not in query:
            raise RuntimeError(f"no code in the redirect: {location}")
        self.result = AuthorizationCodeResult(
            code=query["code"][0],
            state=query.get("state", [None])[0],
            iss=query.get("iss", [None])[0],
        )

    async def callback(self) -> AuthorizationCodeResult:
        if self.result is None:
            raise RuntimeError("the callback came before the redirect")
        return self.result


def direct_auth(scenario: str, context: dict[str, Any], url: str) -> httpx2.Auth | None:
    """The SDK's own OAuth provider for an `auth/` scenario, configured from the same context
    the gateway gets (None for the others). The extensions the SDK client is not set up for
    here (DPoP, workload identity, enterprise-managed) get the plain provider and fail."""
    if not scenario.startswith("auth/"):
        return None
    client_id = context.get("client_id")
    if scenario == "auth/client-credentials-basic":
        return ClientCredentialsOAuthProvider(
            url, MemoryStorage(), str(client_id), str(context["client_secret"])
        )
    if scenario == "auth/client-credentials-jwt":
        signer = SignedJWTParameters(
            issuer=str(client_id),
            subject=str(client_id),
            signing_key=str(context["private_key_pem"]),
            signing_algorithm=str(context.get("signing_algorithm") or "ES256"),
        )
        return PrivateKeyJWTOAuthProvider(
            url, MemoryStorage(), str(client_id), signer.create_assertion_provider()
        )
    metadata = OAuthClientMetadata.model_validate(
        {
            "client_name": "conformance-client",
            "redirect_uris": [DIRECT_REDIRECT],
            "grant_types": ["authorization_code", "refresh_token"],
            "response_types": ["code"],
        }
    )
    storage = MemoryStorage()
    if isinstance(client_id, str) and isinstance(context.get("client_secret"), str):
        # Pre-registered: the client holds its registration, so nothing is registered.
        storage.client_info = OAuthClientInformationFull.model_validate(
            {
                "client_id": client_id,
                "client_secret": context["client_secret"],
                "token_endpoint_auth_method": "client_secret_basic",
                "redirect_uris": [DIRECT_REDIRECT],
            }
        )
    login = HeadlessLogin()
    return OAuthClientProvider(
        url,
        metadata,
        storage,
        redirect_handler=login.redirect,
        callback_handler=login.callback,
        client_metadata_url=None if storage.client_info else CIMD_URL,
    )


@asynccontextmanager
async def connect(
    via: str, url: str, version: str, scenario: str, context: dict[str, Any]
) -> AsyncIterator[Client]:
    mode = "legacy" if version <= "2025-11-25" else "auto"
    callbacks: dict[str, Any] = {
        "elicitation_callback": on_elicit,
        "sampling_callback": on_sample,
        "list_roots_callback": on_roots,
        "mode": mode,
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        auth = auth_settings(scenario, context, workdir)
        if via == "stdio":
            flags = [] if auth is None else connect_flags(auth)
            bridge = StdioServerParameters(
                command=sys.executable,
                args=["-m", "gateway", "connect", *flags, url],
                cwd=str(ROOT),
                env=gateway_env(workdir),
            )
            async with Client(bridge, **callbacks) as client:
                yield client
        elif via == "http":
            with gateway_http(url, auth, workdir) as front:
                async with Client(front, **callbacks) as client:
                    yield client
        elif (provider := direct_auth(scenario, context, url)) is not None:
            http = httpx2.AsyncClient(auth=provider, timeout=httpx2.Timeout(30.0, read=300.0))
            async with (
                http,
                Client(streamable_http_client(url, http_client=http), **callbacks) as client,
            ):
                yield client
        else:
            async with Client(url, **callbacks) as client:
                yield client


async def run(via: str, url: str) -> None:
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    version = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "2025-11-25")
    context = orjson.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    async with connect(via, url, version, scenario, context) as client:
        await exercise(client, scenario, context)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--via", choices=["direct", "http", "stdio"], default="direct")
    parser.add_argument("url")
    args = parser.parse_args()
    anyio.run(run, args.via, args.url)


if __name__ == "__main__":
    main()
