"""Retries calls that time out, as an agent's client does, with the official Python MCP client
(mcp 2.3.0, its default mode), over stdio or Streamable HTTP.

Usage: retry_py.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
"calls": [{"tool": ..., "args": {...}, "timeout": seconds, "tries": n}]: each call is made
until it answers (a tool error is an answer) or `tries` attempts have timed out, with the same
arguments each time; "reads": resource URIs read at the end.
Prints one JSON object: for each call its attempts (timed out or not, with the seconds each took)
and its answer; the machines list-machines reports at the end; each resource read.
"""

import asyncio
import json
import sys
import time
from typing import Any

from mcp import Client
from mcp.shared.exceptions import MCPError
from plan_transport import transport_of


async def main() -> None:
    plan = json.loads(sys.argv[1])
    transport = transport_of(plan)
    out: dict[str, Any] = {"calls": [], "reads": {}}
    async with Client(transport) as client:
        out["protocol"] = client.protocol_version
        for call in plan["calls"]:
            attempts = []
            answer = None
            for _ in range(call.get("tries", 1)):
                began = time.monotonic()
                try:
                    result = await client.call_tool(
                        call["tool"], call["args"], read_timeout_seconds=call["timeout"]
                    )
                except MCPError as error:
                    attempts.append(
                        {"timedOut": True, "code": error.code, "seconds": time.monotonic() - began}
                    )
                    continue
                attempts.append({"timedOut": False, "seconds": time.monotonic() - began})
                text = "\n".join(getattr(block, "text", "") for block in result.content)
                answer = {
                    "isError": bool(result.is_error),
                    "structured": result.structured_content,
                    "text": text,
                }
                break
            out["calls"].append({"tool": call["tool"], "attempts": attempts, "answer": answer})
        listed = await client.call_tool("list-machines", {})
        out["machines"] = [m["name"] for m in (listed.structured_content or {}).get("machines", [])]
        for uri in plan.get("reads", []):
            read = await client.read_resource(uri)
            out["reads"][uri] = json.loads(read.contents[0].text)
    print(json.dumps(out))


asyncio.run(main())
