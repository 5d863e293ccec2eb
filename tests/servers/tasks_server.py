"""A hand-written modern MCP server with the Tasks extension (stdlib + orjson + aiohttp).

Usage:
    python tests/servers/tasks_server.py stdio [--label L] [--apps yes]
    python tests/servers/tasks_server.py http [--port P] [--label L] [--apps yes]
    (http prints "READY <port>")

(The SDK in the venv knows extension methods but not the 2026-07-28 task lifecycle.)

It declares `capabilities.extensions["io.modelcontextprotocol/tasks"]` and serves:
  - `slow_job`: for a request whose `_meta` client capabilities declare the extension, a
    CreateTaskResult (taskId "<label>-<n>", status working); otherwise the result at once.
  - `link`: a resource link to `file:///<label>/report.txt` (what a task's result carries too).
  - `tasks/get`: working -> input_required (an elicitation asking for "name") on the first
    poll; after a `tasks/update` answering it, working on the next poll, then completed with
    "Hello, <name> from <label>" and the link. `tasks/cancel`: cancelled. An unknown id: -32602;
    a request not declaring the extension: -32021.
  - `subscriptions/listen` with `notifications.taskIds`: acknowledged with the ids it knows,
    then each such task's state at once and at every change, as `notifications/tasks`.
With `--apps yes` it is an MCP Apps server too: it declares `io.modelcontextprotocol/ui`, lists
the app resource `ui://<label>/view.html` (text/html;profile=mcp-app), reads it, and `slow_job`
names it in `_meta.ui.resourceUri`.
Over HTTP a task method's Mcp-Name must equal its `params.taskId` (Routing Headers): 400
-32020 otherwise, so a gateway mirroring its own id instead of the backend's is caught.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

VERSION = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
CAPS = "io.modelcontextprotocol/clientCapabilities"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
STAMP = "2026-08-01T00:00:00Z"
TOOLS = [
    {"name": "slow_job", "description": "Works as a task.", "inputSchema": {"type": "object"}},
    {"name": "link", "description": "Links the report.", "inputSchema": {"type": "object"}},
]
UI = "io.modelcontextprotocol/ui"
APP_MIME = "text/html;profile=mcp-app"
Message = dict[str, Any]
Emit = Callable[[Message], None]


def result(id_: Any, body: Message) -> Message:
    return {"jsonrpc": "2.0", "id": id_, "result": {"resultType": "complete", **body}}


def error(id_: Any, code: int, message: str, data: Any = None) -> Message:
    err: Message = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}


def declares(msg: Message) -> bool:
    caps = (msg.get("params") or {}).get("_meta", {}).get(CAPS)
    extensions = caps.get("extensions") if isinstance(caps, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


class Server:
    def __init__(self, label: str, apps: bool = False) -> None:
        self.label = label
        self.apps = apps
        self.view = f"ui://{label}/view.html"
        self.tasks: dict[str, Message] = {}  # id -> its DetailedTask (without resultType)
        self.polls: dict[str, int] = {}
        self.listeners: list[tuple[set[str], Emit]] = []
        self.count = 0

    def capabilities(self) -> Message:
        if not self.apps:
            return {"tools": {}, "extensions": {EXTENSION: {}}}
        extensions = {EXTENSION: {}, UI: {"mimeTypes": [APP_MIME]}}
        return {"tools": {}, "resources": {}, "extensions": extensions}

    def tools(self) -> list[Message]:
        if not self.apps:
            return TOOLS
        shown = [dict(t) for t in TOOLS]
        shown[0]["_meta"] = {"ui": {"resourceUri": self.view}}
        return shown

    def link(self) -> Message:
        uri = f"file:///{self.label}/report.txt"
        return {"type": "resource_link", "uri": uri, "name": "report"}

    def answer(self, msg: Message) -> Message:
        method, id_ = msg.get("method"), msg.get("id")
        params = msg.get("params") or {}
        if method == "server/discover":
            return result(
                id_,
                {
                    "supportedVersions": [VERSION],
                    "capabilities": self.capabilities(),
                    "_meta": {
                        "io.modelcontextprotocol/serverInfo": {
                            "name": f"tasks-{self.label}",
                            "version": "1",
                        }
                    },
                },
            )
        if method == "initialize":
            return error(id_, -32022, "Unsupported protocol version", {"supported": [VERSION]})
        if method == "tools/list":
            return result(id_, {"tools": self.tools()})
        if method == "resources/list" and self.apps:
            view = {"uri": self.view, "name": "view", "mimeType": APP_MIME}
            return result(id_, {"resources": [view]})
        if method == "resources/read" and self.apps:
            if params.get("uri") != self.view:
                return error(id_, -32602, "Unknown resource")
            html = f"<html><body>{self.label}</body></html>"
            content = {"uri": self.view, "mimeType": APP_MIME, "text": html}
            return result(id_, {"contents": [content]})
        if method == "tools/call":
            return self.call(msg)
        if method in ("tasks/get", "tasks/update", "tasks/cancel"):
            if not declares(msg):
                needed: Message = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
                return error(id_, -32021, "Missing required client capability", needed)
            task = self.tasks.get(params.get("taskId"))  # type: ignore[arg-type]
            if task is None:
                return error(id_, -32602, "Task not found")
            return self.task_method(id_, method, task, params)
        return error(id_, -32601, f"Method not found: {method}")

    def call(self, msg: Message) -> Message:
        id_, name = msg.get("id"), (msg.get("params") or {}).get("name")
        if name == "link":
            return result(id_, {"content": [self.link()]})
        if name != "slow_job":
            return error(id_, -32602, f"Unknown tool: {name}")
        if not declares(msg):
            return result(id_, {"content": [{"type": "text", "text": "done without a task"}]})
        self.count += 1
        task_id = f"{self.label}-{self.count}"
        task = {
            "taskId": task_id,
            "status": "working",
            "createdAt": STAMP,
            "lastUpdatedAt": STAMP,
            "ttlMs": 60000,
            "pollIntervalMs": 10,
        }
        self.tasks[task_id] = task
        self.polls[task_id] = 0
        return {"jsonrpc": "2.0", "id": id_, "result": {"resultType": "task", **task}}

    def task_method(self, id_: Any, method: str, task: Message, params: Message) -> Message:
        task_id = task["taskId"]
        if method == "tasks/cancel":
            self.change(task, {"status": "cancelled"})
            return result(id_, {})
        if method == "tasks/update":
            answer = (params.get("inputResponses") or {}).get("name")
            if task["status"] == "input_required" and isinstance(answer, dict):
                name = (answer.get("content") or {}).get("name", "?")
                task.pop("inputRequests", None)
                self.change(task, {"status": "working", "_name": name})
            return result(id_, {})
        self.polls[task_id] += 1
        shown = dict(task)
        if task["status"] == "working" and "_name" not in task and self.polls[task_id] == 1:
            ask = {
                "method": "elicitation/create",
                "params": {
                    "mode": "form",
                    "message": "Your name?",
                    "requestedSchema": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
            }
            self.change(task, {"status": "input_required", "inputRequests": {"name": ask}})
            shown = dict(task)
        elif task["status"] == "working" and "_name" in task:
            # Shown working once after the answer, completed from the next poll on.
            if task.get("_seen"):
                text = f"Hello, {task['_name']} from {self.label}"
                done = {"content": [{"type": "text", "text": text}, self.link()], "isError": False}
                self.change(task, {"status": "completed", "result": done})
            else:
                task["_seen"] = True
            shown = dict(task)
        return result(id_, public(shown))

    def change(self, task: Message, fields: Message) -> None:
        task.update(fields)
        for ids, emit in list(self.listeners):
            if task["taskId"] in ids:
                emit({"jsonrpc": "2.0", "method": "notifications/tasks", "params": public(task)})

    def listen(self, msg: Message, emit: Emit) -> Message | None:
        """Starts a listen: its acknowledgement and the current states go to `emit`; an error
        reply instead, when refused."""
        wanted = (msg.get("params") or {}).get("notifications") or {}
        asked = wanted.get("taskIds") or []
        if asked and not declares(msg):
            needed: Message = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
            return error(msg.get("id"), -32021, "Missing required client capability", needed)
        known = [t for t in asked if t in self.tasks]
        sub = {SUBSCRIPTION_ID: msg.get("id")}

        def tagged(note: Message) -> None:
            params = note.setdefault("params", {})
            params["_meta"] = {**params.get("_meta", {}), **sub}
            emit(note)

        ack: Message = {"notifications": {"taskIds": known} if known else {}}
        tagged(
            {"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged", "params": ack}
        )
        self.listeners.append((set(known), tagged))
        for task_id in known:
            params = public(self.tasks[task_id])
            tagged({"jsonrpc": "2.0", "method": "notifications/tasks", "params": params})
        return None


def public(task: Message) -> Message:
    return {k: v for k, v in task.items() if not k.startswith("_")}


def serve_stdio(server: Server) -> None:
    out = sys.stdout.buffer

    def emit(msg: Message) -> None:
        out.write(orjson.dumps(msg) + b"\n")
        out.flush()

    for line in sys.stdin.buffer:
        if not line.strip():
            continue
        msg = orjson.loads(line)
        if not isinstance(msg, dict) or "method" not in msg or "id" not in msg:
            continue
        if msg["method"] == "subscriptions/listen":
            refused = server.listen(msg, emit)
            if refused is not None:
                emit(refused)
            continue  # open until the gateway goes
        emit(server.answer(msg))


async def serve_http(server: Server, port: int) -> None:
    async def handle(request: web.Request) -> web.StreamResponse:
        msg = orjson.loads(await request.read())
        if "id" not in msg:
            return web.Response(status=202)
        method = msg.get("method")
        if method in ("tasks/get", "tasks/update", "tasks/cancel"):
            named = request.headers.getall("Mcp-Name", [])
            if named != [(msg.get("params") or {}).get("taskId")]:
                body = error(msg["id"], -32020, f"Header mismatch: Mcp-Name {named!r}")
                return web.json_response(body, status=400, dumps=lambda v: orjson.dumps(v).decode())
        if method != "subscriptions/listen":
            return web.Response(
                body=orjson.dumps(server.answer(msg)), content_type="application/json"
            )
        queue: asyncio.Queue[Message] = asyncio.Queue()
        refused = server.listen(msg, queue.put_nowait)
        if refused is not None:
            return web.Response(body=orjson.dumps(refused), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        while True:
            note = await queue.get()
            await response.write(b"data: " + orjson.dumps(note) + b"\n\n")

    app = web.Application()
    app.router.add_post("/mcp", handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    print(f"READY {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str]) -> None:
    mode, rest = argv[1], argv[2:]
    label, port, apps = "a", 0, False
    while rest:
        flag, value, *rest = rest
        if flag == "--label":
            label = value
        elif flag == "--apps":
            apps = value == "yes"
        elif flag == "--port":
            port = int(value)
    server = Server(label, apps)
    if mode == "stdio":
        serve_stdio(server)
    else:
        asyncio.run(serve_http(server, port))


if __name__ == "__main__":
    main(sys.argv)
