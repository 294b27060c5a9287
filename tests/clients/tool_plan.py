"""Drives smol-mcp with the official Python MCP client, over stdio or Streamable HTTP.

Usage: tool_plan.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} (stdio) or {"url": ..., "token": ...} (HTTP), with
"mode": "auto"|"legacy" and "calls": [{"tool": ..., "args": {...}}]
Prints one JSON object: the server's name, the tool names, and each call's isError, structured
content and text. Assertions live in the Rust test that runs this. Leaving the client ends an
HTTP session.
"""

import asyncio
import json
import sys

from mcp import Client
from plan_transport import transport_of


async def main() -> None:
    plan = json.loads(sys.argv[1])
    out = {"tools": [], "calls": []}
    async with Client(transport_of(plan), mode=plan.get("mode", "auto")) as client:
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
