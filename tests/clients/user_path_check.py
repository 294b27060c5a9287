"""Starts the server the way one client entry of the README says, through the official Python MCP
client, and lists the local machines (which starts the engine the server found).

Usage: user_path_check.py CLIENT ENTRY_JSON PATH HOME [--tools-only]
CLIENT: claude-desktop | cursor | opencode (each spells command, args and env its own way).
--tools-only: list the tools and call none, for a platform where no engine is installed with the
server (scripts/check-wheel.sh --no-engine).
Exits non-zero, saying why, when the server does not start or the call fails.
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters


def launch(client: str, entry: dict) -> tuple[str, list[str], dict[str, str]]:
    if client in ("claude-desktop", "cursor"):
        server = entry["mcpServers"]["smol"]
        return server["command"], server.get("args", []), server.get("env", {})
    if client == "opencode":
        server = entry["mcp"]["smol"]
        assert server["type"] == "local" and server["enabled"] is True, server
        command = server["command"]
        return command[0], command[1:], server.get("environment", {})
    raise SystemExit(f"unknown client {client}")


async def main() -> None:
    client, entry, path, home = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    tools_only = sys.argv[5:] == ["--tools-only"]
    command, args, env = launch(client, entry)
    # What a client passes on: its own environment (a clean user's) plus the entry's env block.
    full_env = {"PATH": path, "HOME": home, "XDG_RUNTIME_DIR": os.path.join(home, "run")}
    full_env.update(env)
    # The README's root paragraph: a server run as root gets SMOLVM_VM_UID_DROP=off from every
    # client entry (the check runs as root in CI; an ordinary user's entry leaves it out).
    if os.geteuid() == 0:
        full_env.setdefault("SMOLVM_VM_UID_DROP", "off")
    os.makedirs(full_env["XDG_RUNTIME_DIR"], mode=0o700, exist_ok=True)
    params = StdioServerParameters(command=command, args=args, env=full_env)
    async with Client(params, mode="legacy") as session:
        tools = await session.list_tools()
        assert any(t.name == "list-machines" for t in tools.tools), tools
        if tools_only:
            print(f"{client}: {command} listed {len(tools.tools)} tools")
            return
        # With a cloud token the server serves both fleets and every call names one.
        args = {"target": "local"} if full_env.get("SMOL_CLOUD_TOKEN") else {}
        result = await session.call_tool("list-machines", args)
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        if result.is_error:
            raise SystemExit(f"{client}: list-machines failed: {text}")
        print(f"{client}: {command} answered list-machines: {text}")


asyncio.run(main())
