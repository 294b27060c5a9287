"""Follows a machine's log with the official Python MCP client in its default mode (2026-07-28:
subscriptions/listen), over stdio or Streamable HTTP, in steps the Rust test drives.

Usage: resources_py.py PLAN_JSON
PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP, and
"uri": the logs URI to follow. Each step prints one JSON line; the test answers "pushed" on
stdin after it wrote a log line into the fake serve.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.shared.subscriptions import ResourceUpdated
from plan_transport import transport_of


def say(step: dict) -> None:
    print(json.dumps(step), flush=True)


async def expect(word: str) -> None:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if line.strip() != word:
        raise RuntimeError(f"expected {word}, got {line!r}")


async def main() -> None:
    plan = json.loads(sys.argv[1])
    transport = transport_of(plan)
    uri = plan["uri"]
    async with Client(transport) as client:
        targets = await client.read_resource("smol://targets")
        say(
            {
                "step": "targets",
                "protocol": client.protocol_version,
                "targets": json.loads(targets.contents[0].text),
            }
        )
        updates: list[str] = []
        async with client.listen(resource_subscriptions=[uri]) as sub:
            honored = sub.honored.resource_subscriptions if sub.honored else None
            say({"step": "subscribed", "honored": honored})
            await expect("pushed")
            events = aiter(sub)
            try:
                while not updates:
                    event = await asyncio.wait_for(anext(events), timeout=10)
                    if isinstance(event, ResourceUpdated):
                        updates.append(event.uri)
            except TimeoutError:
                pass
            say({"step": "updated", "updates": updates})
        say({"step": "unsubscribed"})
        await expect("pushed")
        # The listen is over, so nothing can arrive for it; the test checks that the server
        # stopped polling the log.
        await asyncio.sleep(2.5)
        say({"step": "after", "updates": []})


asyncio.run(main())
