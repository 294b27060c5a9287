"""Follows a background job with the official Python MCP client (mcp 2.3.0, its default mode:
2026-07-28 on a server that offers it), over stdio or Streamable HTTP, every request bounded by a
timeout shorter than the command, as a client with a short tool-call deadline would.

Usage: job_py.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
"timeout": the client's request timeout in seconds; "machine": the machine to create (with
"image"), "command": the long command; "waitSecs": job-output's wait (shorter than "timeout");
"foreground": true to also run the command without background first, expecting the timeout.
Prints one JSON object: the protocol, the foreground attempt's error, the started job, every
job-output read (state, bytes, cursor, seconds), the whole stdout and stderr, the last report.
"""

import asyncio
import json
import sys
import time
from typing import Any

from mcp import Client
from mcp.shared.exceptions import MCPError
from plan_transport import structured, transport_of


async def main() -> None:
    plan = json.loads(sys.argv[1])
    transport = transport_of(plan)
    out: dict[str, Any] = {"reads": []}
    async with Client(transport, read_timeout_seconds=plan["timeout"]) as client:
        out["protocol"] = client.protocol_version
        # Creating the machine is not what is measured: it may take the default deadline.
        structured(
            await client.call_tool(
                "create-machine",
                {"name": plan["machine"], "image": plan.get("image", "alpine")},
                read_timeout_seconds=60,
            )
        )
        if plan.get("foreground"):
            began = time.monotonic()
            try:
                result = await client.call_tool(
                    "run-command", {"name": plan["machine"], "command": plan["command"]}
                )
                out["foreground"] = {"answered": True, "isError": bool(result.is_error)}
            except MCPError as error:
                out["foreground"] = {
                    "answered": False,
                    "code": error.code,
                    "message": str(error),
                    "seconds": time.monotonic() - began,
                }
        began = time.monotonic()
        job = structured(
            await client.call_tool(
                "run-command",
                {"name": plan["machine"], "command": plan["command"], "background": True},
            )
        )
        out["started"] = job
        out["startSeconds"] = time.monotonic() - began
        cursor = job["cursor"]
        stdout, stderr = "", ""
        while True:
            began = time.monotonic()
            report = structured(
                await client.call_tool(
                    "job-output",
                    {"job": job["job"], "cursor": cursor, "waitSecs": plan["waitSecs"]},
                )
            )
            stdout += report["stdout"]
            stderr += report["stderr"]
            cursor = report["cursor"]
            out["reads"].append(
                {
                    "state": report["state"],
                    "stdoutBytes": len(report["stdout"].encode()),
                    "cursor": cursor,
                    "seconds": time.monotonic() - began,
                }
            )
            if report["state"] != "running" and not report["more"]:
                out["last"] = report
                break
            if len(out["reads"]) > 200:
                raise RuntimeError("the job never ended")
        out["stdout"], out["stderr"] = stdout, stderr
    print(json.dumps(out))


asyncio.run(main())
