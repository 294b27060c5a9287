"""Drives the smol-mcp HTTP server with the official Python MCP client over Streamable HTTP.

Usage: http_plan.py PLAN_JSON
PLAN_JSON: {"url": ..., "token": ..., "mode": "auto"|"legacy", "calls": [{"tool": ..., "args": {...}}]}
Prints one JSON object like stdio_plan.py. Leaving the client ends the HTTP session.
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
    out = {"tools": [], "calls": []}
    async with Client(transport, mode=plan.get("mode", "auto")) as client:
        out["server"] = client.server_info.name if client.server_info else None
        listed = await client.list_tools()
        out["tools"] = [tool.name for tool in listed.tools]
        for call in plan.get("calls", []):
            result = await client.call_tool(call["tool"], call.get("args", {}))
            text = "\n".join(getattr(block, "text", "") for block in result.content)
            out["calls"].append(
                {"isError": bool(result.is_error), "structured": result.structured_content, "text": text}
            )
    print(json.dumps(out))


asyncio.run(main())
