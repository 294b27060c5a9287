"""Drives smol-mcp with the official Python MCP client, to see which lifecycle it settles on and
how the fleet question is answered.

Usage: lifecycle_plan.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
"mode": "auto" (the default, which picks 2026-07-28 when offered) or "legacy";
"answer": "local" | "cloud" | "decline" | absent (no elicitation callback, so no capability);
"calls": [{"tool": ..., "args": {...}}]. An argument "$created" is replaced by the machine name in
the structured result of the last call that gave one.
Prints one JSON object: the protocol version, the tool names and whether any lists `target`,
the questions asked, and each call's isError, structured content and text.
"""

import asyncio
import json
import sys

from mcp import Client, types
from plan_transport import transport_of


async def main() -> None:
    plan = json.loads(sys.argv[1])
    asked: list[dict] = []

    async def answer(_context, params: types.ElicitRequestParams):
        asked.append({"message": params.message, "schema": params.requested_schema})
        if plan["answer"] == "decline":
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"fleet": plan["answer"]})

    transport = transport_of(plan)
    options = {"mode": plan.get("mode", "auto")}
    if plan.get("answer"):
        options["elicitation_callback"] = answer
    out = {"calls": []}
    async with Client(transport, **options) as client:
        out["protocol"] = client.protocol_version
        listed = await client.list_tools()
        out["tools"] = [tool.name for tool in listed.tools]
        out["targetListed"] = any("target" in tool.input_schema.get("properties", {}) for tool in listed.tools)
        created = None
        for call in plan.get("calls", []):
            args = {k: (created if v == "$created" else v) for k, v in call.get("args", {}).items()}
            result = await client.call_tool(call["tool"], args)
            text = "\n".join(getattr(block, "text", "") for block in result.content)
            structured = result.structured_content
            if isinstance(structured, dict) and isinstance(structured.get("machine"), dict):
                created = structured["machine"].get("name", created)
            out["calls"].append({"isError": bool(result.is_error), "structured": structured, "text": text})
    out["asked"] = asked
    print(json.dumps(out))


asyncio.run(main())
