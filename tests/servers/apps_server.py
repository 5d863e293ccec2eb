"""An MCP Apps test server (the `io.modelcontextprotocol/ui` extension) on the official `mcp` SDK
(v2, MCPServer and its `Apps` extension), speaking MCP 2026-07-28.

Usage:
    python tests/servers/apps_server.py stdio [--label TEXT]
    python tests/servers/apps_server.py http --port N [--label TEXT]

It declares the extension in its capabilities and serves, with LABEL (default "apps"):
- `ui://LABEL/view.html`, the view (mimeType `text/html;profile=mcp-app`, a CSP in `_meta.ui`);
- `show`: a tool whose UI is the view (`_meta.ui.resourceUri`, visible to model and app);
- `refresh`: an app-only tool (`visibility: ["app"]`), bound to the same view;
- `summary`: a model-only tool (`visibility: ["model"]`), bound to the same view;
- `classic`: bound to the view by the deprecated flat `_meta["ui/resourceUri"]` key;
- `hello_LABEL`: a plain tool whose own name no copy with another label shares;
- `seen_extensions`: the `extensions` of the client capabilities this request arrived with, as
  JSON text (what the gateway passed on).
Every tool answers with LABEL in its text, so a test sees which copy ran it. HTTP mode serves
Streamable HTTP at http://127.0.0.1:N/mcp and prints `READY <port>` once it accepts
connections (`--port 0`: an ephemeral port).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import anyio
import orjson
from mcp.server.apps import Apps, ResourceCsp
from mcp.server.mcpserver import Context, MCPServer

if not __package__:
    # Run as a script: serve HTTP as the SDK test server does (one copy of that code).
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.servers.sdk_server import serve_http

VIEW = "<!DOCTYPE html><html><body><p>{label}</p></body></html>"


def build(label: str) -> MCPServer:
    view = f"ui://{label}/view.html"
    apps = Apps()

    @apps.tool(resource_uri=view, description="Show the view.")
    def show() -> str:
        return f"shown by {label}"

    @apps.tool(resource_uri=view, visibility=["app"], description="What the view's button does.")
    def refresh() -> str:
        return f"refreshed by {label}"

    @apps.tool(resource_uri=view, visibility=["model"], description="For the model only.")
    def summary() -> str:
        return f"summary by {label}"

    apps.add_html_resource(
        view,
        VIEW.format(label=label),
        name=f"{label} view",
        csp=ResourceCsp(connect_domains=[f"https://{label}.example"]),
        prefers_border=True,
    )
    mcp = MCPServer(f"apps-{label}", version="1.0.0", log_level="WARNING", extensions=[apps])

    @mcp.tool(meta={"ui/resourceUri": view, "other": {"kept": label}})
    def classic() -> str:
        """Bound to the view by the deprecated flat key."""
        return f"classic by {label}"

    def hello() -> str:
        return f"hello from {label}"

    mcp.add_tool(hello, name=f"hello_{label}", description="Say hello.")

    @mcp.tool()
    def seen_extensions(ctx: Context) -> str:
        """The client capabilities' extensions this request came with."""
        caps = ctx.client_capabilities
        extensions = caps.extensions if caps is not None else None
        return orjson.dumps(extensions or {}).decode()

    return mcp


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--label", default="apps")
    args = parser.parse_args(argv)
    mcp = build(args.label)
    if args.transport == "stdio":
        anyio.run(mcp.run_stdio_async)
    else:
        # uvicorn re-raises a captured SIGTERM after its graceful shutdown; a no-op handler
        # makes that harmless, so the process exits with status 0.
        signal.signal(signal.SIGTERM, lambda *_: None)
        anyio.run(serve_http, mcp, args.port, False)
    sys.exit(0)


if __name__ == "__main__":
    main()
