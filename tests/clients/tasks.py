"""The official Python MCP client (mcp 2.3.0) with the MCP tasks extension (SEP-2663), which it
has no client for: this script declares `io.modelcontextprotocol/tasks` through the SDK's generic
extension hook (`mcp.client.extension`), claims the `resultType: "task"` answer of tools/call and
resolves it by polling `tasks/get` until the task is done, each request bounded by a timeout
shorter than the command, as a client with a short tool-call timeout would.

Usage: tasks.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
"timeout": each request's timeout in seconds; "calls": [{"tool": ..., "args": {...}}].
Prints one JSON object: the protocol version and, for each call, whether it became a task, the
task's status messages while it worked, the final status, isError, structured content and text.
"""

import asyncio
import json
import sys
import time
from typing import Any, Literal

from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, RequestParams, Result
from plan_transport import transport_of

TASKS = "io.modelcontextprotocol/tasks"


class CreatedTask(Result):
    """A tools/call answered with a task (SEP-2663 CreateTaskResult)."""

    result_type: Literal["task"]
    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None


class TaskIdParams(RequestParams):
    task_id: str


class GetTask(Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    name_param = "taskId"


class TaskState(Result):
    """A tasks/get answer: the task, with its result or error once done."""

    task_id: str
    status: str
    status_message: str | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskFailed(RuntimeError):
    pass


class Tasks(ClientExtension):
    identifier = TASKS

    def __init__(self) -> None:
        # What the last resolved task went through, for the report.
        self.seen: list[dict[str, Any]] = []

    def claims(self):
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        record = {"taskId": created.task_id, "messages": [], "polls": 0}
        self.seen.append(record)
        interval = (created.poll_interval_ms or 1000) / 1000
        while True:
            state = await ctx.session.send_request(
                GetTask(params=TaskIdParams(task_id=created.task_id)),
                TaskState,
                request_read_timeout_seconds=ctx.read_timeout_seconds,
            )
            record["polls"] += 1
            record["status"] = state.status
            if state.status in ("working", "input_required"):
                if state.status_message:
                    record["messages"].append(state.status_message)
                await asyncio.sleep(min(interval, 0.5))
                continue
            if state.status == "completed" and state.result is not None:
                return CallToolResult.model_validate(state.result)
            raise TaskFailed(f"task {created.task_id} ended {state.status}: {state.error}")


async def main() -> None:
    plan = json.loads(sys.argv[1])
    transport = transport_of(plan)
    tasks = Tasks()
    out: dict[str, Any] = {"calls": []}
    async with Client(transport, extensions=[tasks], read_timeout_seconds=plan["timeout"]) as client:
        out["protocol"] = client.protocol_version
        for call in plan["calls"]:
            tasks.seen.clear()
            began = time.monotonic()
            result = await client.call_tool(call["tool"], call.get("args", {}))
            task = tasks.seen[0] if tasks.seen else None
            out["calls"].append(
                {
                    "task": task,
                    "seconds": time.monotonic() - began,
                    "isError": bool(result.is_error),
                    "structured": result.structured_content,
                    "text": "\n".join(getattr(block, "text", "") for block in result.content),
                }
            )
    print(json.dumps(out))


asyncio.run(main())
