"""The official Python MCP client over Streamable HTTP, as a user's client: a create-machine with a
progress callback, and the server's log messages at the level the client asks for.

Usage: progress_http.py PLAN_JSON
PLAN_JSON: {"url": ..., "token": ..., "mode": "auto"|"legacy", "name": machine, "logLevel": "info"}
With mode "auto" the client speaks 2026-07-28 (no session; the level travels in each request's
_meta), with "legacy" it opens a session and sends logging/setLevel.
Prints {"protocolVersion", "result": {isError, text}, "progress": [{progress, total, message}], "logs": [{level, logger, data}]}.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def main() -> None:
    plan = json.loads(sys.argv[1])
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {plan['token']}"})
    transport = streamable_http_client(plan["url"], http_client=http)
    progress = []
    logs = []

    async def on_progress(value, total, message):
        progress.append({"progress": value, "total": total, "message": message})

    async def on_log(params):
        logs.append({"level": params.level, "logger": params.logger, "data": params.data})

    async with Client(
        transport, mode=plan["mode"], log_level=plan.get("logLevel"), logging_callback=on_log
    ) as client:
        if plan["mode"] == "legacy" and plan.get("logLevel"):
            await client.session.set_logging_level(plan["logLevel"])
        result = await client.call_tool(
            "create-machine",
            {"image": "alpine", "name": plan["name"]},
            progress_callback=on_progress,
        )
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        protocol = client.protocol_version
    print(
        json.dumps(
            {
                "protocolVersion": protocol,
                "result": {"isError": bool(result.is_error), "text": text},
                "progress": progress,
                "logs": logs,
            }
        )
    )


asyncio.run(main())
