"""The Tasks extension (`io.modelcontextprotocol/tasks`) for the conformance server.

The suite's `tasks-*` server scenarios name their fixtures: `greet` (never a task),
`slow_compute` (a task that works `seconds` seconds), `failing_job` (a task whose tool
reports an error), `protocol_error_job` (a task that fails with a JSON-RPC error),
`confirm_delete` and `multi_input` (tasks parked on one and two elicitations, answered
through `tasks/update`) and `test_tool_with_task` (an input_required round first, then a
task). This module offers them as an SDK `Extension`: its `tools/call` interceptor turns a
call from a client that declared the extension on that request into a task, and it serves
`tasks/get`, `tasks/update` and `tasks/cancel` (2026-07-28 only; `tasks/result` and
`tasks/list` stay unknown methods, as the extension has none).

A task is a record whose status follows the clock and the client's answers rather than a
worker: on the stateless wire every request is its own exchange, so a background worker
would need a process-wide task group to outlive the call that started it, and a record
read on each `tasks/get` gives the same observable lifecycle with nothing to supervise.
A task is kept for its `ttlMs` and dropped afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding, ToolBinding
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_NAME_HEADER, decode_header_value
from mcp_types import (
    HEADER_MISMATCH,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    CallToolRequestParams,
    CallToolResult,
    InputRequiredResult,
    RequestParams,
)
from pydantic import Field

TASKS = "io.modelcontextprotocol/tasks"
MODERN = frozenset({"2026-07-28"})
TTL_MS = 600_000
POLL_MS = 200
# A task's work is simulated by waiting; this bounds what a caller can ask for.
MAX_SECONDS = 600.0

Outcome = dict[str, Any]  # {"result": CallToolResult JSON} or {"error": JSON-RPC error}
Answers = dict[str, Any]


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def result(text: str, *, is_error: bool = False) -> Outcome:
    body: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if is_error:
        body["isError"] = True
    return {"result": body}


def elicit(message: str, properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties, "required": sorted(properties)}
    return {
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": schema},
    }


def content_of(answer: Any) -> dict[str, Any]:
    """An accepted elicitation's content; empty for a declined or malformed answer."""
    if isinstance(answer, dict) and answer.get("action") == "accept":
        content = answer.get("content")
        if isinstance(content, dict):
            return content
    return {}


def missing_extension() -> MCPError:
    return MCPError(
        code=MISSING_REQUIRED_CLIENT_CAPABILITY,
        message=f"Missing required client capability: extension {TASKS}",
        data={"requiredCapabilities": {"extensions": {TASKS: {}}}},
    )


def declared(ctx: ServerRequestContext[Any, Any]) -> bool:
    """The request's client capabilities (per request on 2026-07-28) name the extension."""
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and TASKS in capabilities.extensions)


@dataclass(frozen=True)
class Plan:
    """What a task does: wait for the answers to `asks`, then work `seconds`, then end
    with `finish(answers)`."""

    seconds: float
    finish: Callable[[Answers], Outcome]
    asks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Task:
    task_id: str
    plan: Plan
    created: float
    # When the last answer arrived (creation, before any): work starts once none is pending.
    started: float
    pending: dict[str, dict[str, Any]]
    answers: Answers = field(default_factory=dict)
    cancelled: float | None = None

    def envelope(self, now: float) -> dict[str, Any]:
        """The task's state now: `Task` fields plus its status's payload (DetailedTask)."""
        status, updated = self.status(now)
        task: dict[str, Any] = {
            "taskId": self.task_id,
            "status": status,
            "createdAt": iso(self.created),
            "lastUpdatedAt": iso(updated),
            "ttlMs": TTL_MS,
            "pollIntervalMs": POLL_MS,
        }
        if status == "input_required":
            task["inputRequests"] = dict(self.pending)
        elif status in ("completed", "failed"):
            task.update(self.plan.finish(self.answers))
        return task

    def status(self, now: float) -> tuple[str, float]:
        if self.cancelled is not None:
            return "cancelled", self.cancelled
        if self.pending:
            return "input_required", self.started
        done = self.started + self.plan.seconds
        if now < done:
            return "working", self.started
        return ("failed" if "error" in self.plan.finish(self.answers) else "completed"), done

    def terminal(self, now: float) -> bool:
        return self.status(now)[0] in ("completed", "failed", "cancelled")


class TaskIdParams(RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskIdParams):
    # Loose on purpose: an answer for a key not asked for is ignored, whatever its shape.
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def number(arguments: dict[str, Any], key: str, default: float) -> float:
    value = arguments.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MCPError(code=INVALID_PARAMS, message=f"argument {key!r} must be a number")
    return min(max(float(value), 0.0), MAX_SECONDS)


def slow_compute_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    seconds = number(arguments, "seconds", 1.0)
    label = str(arguments.get("label", ""))
    return Plan(seconds, lambda _: result(f"Computed {label!r} in {seconds:g}s"))


def failing_job_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    return Plan(0.5, lambda _: result("failing_job: the job failed", is_error=True))


def protocol_error_job_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    error = {"code": INTERNAL_ERROR, "message": "protocol_error_job: internal failure"}
    return Plan(0.2, lambda _: {"error": error})


def confirm_delete_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    filename = str(arguments.get("filename", ""))

    def finish(given: Answers) -> Outcome:
        confirmed = content_of(given.get("confirm")).get("confirm") is True
        return result(f"Deleted {filename}" if confirmed else f"Kept {filename}")

    ask = elicit(f"Delete {filename}?", {"confirm": {"type": "boolean"}})
    return Plan(0.0, finish, {"confirm": ask})


def multi_input_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    def finish(given: Answers) -> Outcome:
        name = content_of(given.get("name")).get("name")
        confirmed = content_of(given.get("confirm")).get("confirm")
        return result(f"name={name} confirmed={confirmed}")

    asks = {
        "name": elicit("What is your name?", {"name": {"type": "string"}}),
        "confirm": elicit("Please confirm", {"confirm": {"type": "boolean"}}),
    }
    return Plan(0.0, finish, asks)


def greeting_task_plan(arguments: dict[str, Any], answers: Answers) -> Plan:
    name = content_of(answers.get("user_name")).get("name")
    return Plan(0.2, lambda _: result(f"Hello, {name}! (from a task)"))


@dataclass(frozen=True)
class TaskTool:
    plan: Callable[[dict[str, Any], Answers], Plan]
    # Required: no synchronous path, so a client without the extension gets -32021.
    required: bool
    # Asked through input_required rounds of tools/call itself, before the task exists.
    gather: dict[str, dict[str, Any]] = field(default_factory=dict)


TASK_TOOLS: dict[str, TaskTool] = {
    "slow_compute": TaskTool(slow_compute_plan, required=False),
    "protocol_error_job": TaskTool(protocol_error_job_plan, required=False),
    "failing_job": TaskTool(failing_job_plan, required=True),
    "confirm_delete": TaskTool(confirm_delete_plan, required=True),
    "multi_input": TaskTool(multi_input_plan, required=True),
    "test_tool_with_task": TaskTool(
        greeting_task_plan,
        required=True,
        gather={"user_name": elicit("What is your name?", {"name": {"type": "string"}})},
    ),
}


async def run_now(plan: Plan) -> CallToolResult:
    """A task-supporting tool called without the extension: the same work, synchronously."""
    await anyio.sleep(plan.seconds)
    outcome = plan.finish({})
    if "error" in outcome:
        error = outcome["error"]
        raise MCPError(code=error["code"], message=error["message"])
    return CallToolResult.model_validate(outcome["result"])


# The listed tools. The task path never reaches these bodies (the interceptor answers
# first); a required one is refused before its body runs.


def greet(name: str) -> str:
    """Say hello (never a task)."""
    return f"Hello, {name}!"


async def slow_compute(seconds: float = 1.0, label: str = "") -> CallToolResult:
    """Work `seconds` seconds (a task when the client declared the extension)."""
    return await run_now(slow_compute_plan({"seconds": seconds, "label": label}, {}))


async def protocol_error_job() -> CallToolResult:
    """Fail with a JSON-RPC internal error (a failed task when run as one)."""
    return await run_now(protocol_error_job_plan({}, {}))


def failing_job() -> str:
    """Report a tool error after a short while (task required)."""
    raise missing_extension()


def confirm_delete(filename: str) -> str:
    """Ask for confirmation before deleting `filename` (task required)."""
    raise missing_extension()


def multi_input() -> str:
    """Ask two questions at once (task required)."""
    raise missing_extension()


def greet_from_task() -> str:
    """Ask for the user's name, then greet them from a task (task required)."""
    raise missing_extension()


class TasksExtension(Extension):
    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}

    def tools(self) -> Sequence[ToolBinding]:
        fns: list[Callable[..., Any]] = [greet, slow_compute, protocol_error_job]
        fns += [failing_job, confirm_delete, multi_input]
        # Named here, not by its function: pytest would collect a `test_*` function.
        named = ToolBinding(greet_from_task, kwargs={"name": "test_tool_with_task"})
        return [*(ToolBinding(fn) for fn in fns), named]

    def methods(self) -> Sequence[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskIdParams, self.get, MODERN),
            MethodBinding("tasks/update", UpdateTaskParams, self.update, MODERN),
            MethodBinding("tasks/cancel", TaskIdParams, self.cancel, MODERN),
        ]

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        tool = TASK_TOOLS.get(params.name)
        if tool is None or ctx.protocol_version not in MODERN:
            return await call_next(ctx)
        if not declared(ctx):
            if tool.required:
                raise missing_extension()
            return await call_next(ctx)
        answers = {
            key: value.model_dump(by_alias=True, mode="json", exclude_none=True)
            if hasattr(value, "model_dump")
            else value
            for key, value in (params.input_responses or {}).items()
        }
        if wanted := {k: v for k, v in tool.gather.items() if not content_of(answers.get(k))}:
            return InputRequiredResult.model_validate(
                {"resultType": "input_required", "inputRequests": wanted}
            )
        plan = tool.plan(params.arguments or {}, answers)
        now = time.time()
        self.expire(now)
        task = Task(uuid.uuid4().hex, plan, now, now, dict(plan.asks))
        # Stored before the reply leaves: a tasks/get right after it must find the task.
        self.tasks[task.task_id] = task
        envelope = task.envelope(now)
        # CreateTaskResult carries the Task fields only; the payloads live on tasks/get.
        for key in ("inputRequests", "result", "error"):
            envelope.pop(key, None)
        return {"resultType": "task", **envelope}

    def expire(self, now: float) -> None:
        for task_id in [t for t, task in self.tasks.items() if now - task.created > TTL_MS / 1e3]:
            del self.tasks[task_id]

    def find(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> Task:
        """The task a tasks/* request names, after the checks every such request gets."""
        headers = getattr(ctx.request, "headers", None)
        # Over HTTP, Mcp-Name must carry the taskId (the extension's routing headers).
        if headers is not None and decode_header_value(headers.get(MCP_NAME_HEADER)) != (
            params.task_id
        ):
            raise MCPError(
                code=HEADER_MISMATCH, message=f"{MCP_NAME_HEADER} header does not match taskId"
            )
        if not declared(ctx):
            raise missing_extension()
        task = self.tasks.get(params.task_id)
        if task is None:
            raise MCPError(code=INVALID_PARAMS, message="Failed to retrieve task: Task not found")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams) -> HandlerResult:
        return self.find(ctx, params).envelope(time.time())

    async def update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateTaskParams
    ) -> HandlerResult:
        task = self.find(ctx, params)
        now = time.time()
        if task.terminal(now):
            return {}
        answered = [key for key in params.input_responses if key in task.pending]
        for key in answered:
            task.answers[key] = params.input_responses[key]
            del task.pending[key]
        if answered:
            # An answer is the task's last change; once none is pending, work starts.
            task.started = now
        return {}

    async def cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskIdParams
    ) -> HandlerResult:
        task = self.find(ctx, params)
        now = time.time()
        if not task.terminal(now):
            task.cancelled = now
        return {}
