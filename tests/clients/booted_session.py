"""One whole agent session with the official Python MCP client (mcp 2.3.0) against a server whose
local fleet is a real engine with guests that boot, over stdio or Streamable HTTP.

Usage: booted_session.py PLAN_JSON (or the plan on stdin when no argument is given)
PLAN_JSON: {"transport": "stdio"|"http" (optional: "http" when "url" is given),
  stdio: "server" (or "command") the smol-mcp binary, "args" (optional), "env" its environment
         (SMOL_LOCAL_URL, SMOL_MCP_READY_TIMEOUT_SECS=180, ...);
  http: "url" (http://127.0.0.1:PORT/mcp) and "token" (the server's SMOL_MCP_AUTH_TOKEN);
  "engineUrl": the engine's REST base URL (default: env.SMOL_LOCAL_URL), read at the end;
  "image": an image for create-machine and run-once (default none: the engine's bundled Alpine);
  "mode": the client's mode, "auto" (the default: 2026-07-28, no session; over HTTP the
          server deletes the machines once their lease, SMOL_MCP_MACHINE_LEASE_SECS, runs out)
          or "legacy" (the initialize handshake: over HTTP a session the client DELETEs when it
          leaves); "timeout": every request's timeout in seconds (default 300); "waitSecs":
  job-output's wait (default 30); "cleanupSecs": how long to wait for the server's clean-up
  (default 60); "prefix": the server's ephemeral prefix (default "mcp-")}.
The session, in order: initialize and tools/list; create-machine with no image and no name
(ephemeral, branchable); run-command with a progress callback; a background job read by cursor
to its end; write-file and read-file, and an image a command wrote read as an image block; machine-logs by tail then by cursor (and the same with
source "engine" when the tool lists that argument); branch-machine into an mcp- child and a read
there; a service started in the guest, published with publish-port and fetched from this host
through its url; a program that prompts, driven in a terminal; run-once with no image, then list-machines; the end of the session
(leaving the client), then the engine's own machine list: the session's machines still there,
and strays (machines with the prefix that appeared during the session, unnamed by any result).
A failed step is recorded and the next one still runs.
Prints one JSON object: {"client", "transport", "mode", "protocol", "ok", "steps": {name: {"ok",
"seconds", "problems": [...], "error"?, ...what the step saw}}}. "ok" is whether every step's own
checks held; the Rust test that runs this makes its own assertions.
"""

import asyncio
import json
import os
import sys
import time
import traceback
import urllib.request
from typing import Any

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

PROGRESS_COMMAND = "for i in 1 2 3; do echo line $i; sleep 1; done"
JOB_COMMAND = "for i in 1 2 3; do echo job $i; sleep 1; done; exit 3"
HELLO_PATH = "/tmp/hello.txt"
HELLO_TEXT = "hello from the session: grüße, ✓\n"
# A whole 1x1 red PNG, which a command in the guest writes and read-file answers as an image.
PNG_PATH = "/tmp/dot.png"
PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQI12P4z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC"
# A service in the guest (busybox nc, one answer a connection, on every address), published
# and opened from this host through the URL publish-port answers.
SERVICE_PORT = 8000
SERVICE_BODY = "hello from the guest\n"
SERVICE_COMMAND = (
    "nohup sh -c 'while true; do printf \"HTTP/1.0 200 OK\\r\\n\\r\\nhello from the guest\\n\" "
    "| nc -l -p 8000; done' >/dev/null 2>&1 </dev/null &"
)


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


class ToolError(Exception):
    """The server answered, with isError: its text is the record."""


class Skipped(Exception):
    """What the step needs, an earlier one did not give."""


def structured(name: str, result: Any) -> dict[str, Any]:
    if result.is_error:
        raise ToolError(f"{name} answered isError: {text_of(result)}")
    return result.structured_content or {}


def fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def engine_machines(engine: str) -> list[str]:
    with urllib.request.urlopen(engine.rstrip("/") + "/api/v1/machines", timeout=30) as response:
        body = json.loads(response.read())
    listed = body if isinstance(body, list) else body.get("machines", [])
    return [m.get("name") for m in listed]


class Session:
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.timeout = float(plan.get("timeout", 300))
        self.image = {"image": plan["image"]} if plan.get("image") else {}
        self.steps: dict[str, dict[str, Any]] = {}
        self.client: Client | None = None
        self.machine: str | None = None
        self.child: str | None = None
        self.once_machine: str | None = None
        self.log_sources = False

    async def step(self, name: str, body) -> None:
        record: dict[str, Any] = {"problems": []}
        began = time.monotonic()
        try:
            await body(record)
        except Exception as error:  # every failure is recorded; the session goes on
            record["error"] = f"{type(error).__name__}: {error}"
            if not isinstance(error, (ToolError, Skipped)):
                record["traceback"] = traceback.format_exc(limit=4)
        record["seconds"] = round(time.monotonic() - began, 3)
        record["ok"] = "error" not in record and not record["problems"]
        self.steps[name] = record

    def expect(self, record: dict[str, Any], held: bool, what: str) -> None:
        if not held:
            record["problems"].append(what)

    async def call(self, tool: str, args: dict[str, Any], **options) -> Any:
        assert self.client is not None, "no client: initialize failed"
        return await self.client.call_tool(tool, args, read_timeout_seconds=self.timeout, **options)

    async def ok(self, tool: str, args: dict[str, Any], **options) -> dict[str, Any]:
        return structured(tool, await self.call(tool, args, **options))

    def need(self, value: str | None, what: str) -> str:
        if not value:
            raise Skipped(f"no {what} (an earlier step failed)")
        return value

    # 1b
    async def tools(self, r: dict[str, Any]) -> None:
        assert self.client is not None, "no client: initialize failed"
        listed = await self.client.list_tools()
        names = [tool.name for tool in listed.tools]
        logs = next((tool for tool in listed.tools if tool.name == "machine-logs"), None)
        self.log_sources = "source" in ((logs.input_schema or {}).get("properties", {}) if logs else {})
        r["count"] = len(names)
        r["names"] = names
        for tool in ["create-machine", "run-command", "job-output", "branch-machine", "run-once"]:
            self.expect(r, tool in names, f"{tool} not listed")

    # 2
    async def create(self, r: dict[str, Any]) -> None:
        result = await self.ok("create-machine", {"branchable": True, **self.image})
        machine = result.get("machine") or {}
        self.machine = machine.get("name")
        r.update(
            machine=self.machine,
            ready=result.get("ready"),
            ephemeral=result.get("ephemeral"),
            image=machine.get("image"),
            state=machine.get("state"),
            branchable=machine.get("branchable"),
        )
        self.expect(r, bool(self.machine) and self.machine.startswith("mcp-"), "the name lacks mcp-")
        self.expect(r, result.get("ready") is True, "not ready")
        self.expect(r, result.get("ephemeral") is True, "not ephemeral")

    # 3
    async def progress(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        notes: list[dict[str, Any]] = []
        began = time.monotonic()

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            notes.append(
                {"at": round(time.monotonic() - began, 3), "progress": value, "total": total, "message": message}
            )

        result = await self.ok(
            "run-command", {"name": machine, "command": PROGRESS_COMMAND}, progress_callback=on_progress
        )
        answered = round(time.monotonic() - began, 3)
        r.update(
            notifications=notes,
            resultAt=answered,
            stdout=result.get("stdout"),
            stderr=result.get("stderr"),
            exitCode=result.get("exitCode"),
        )
        self.expect(r, result.get("stdout") == "line 1\nline 2\nline 3\n", "stdout is not the three lines")
        self.expect(r, result.get("exitCode") == 0, "exit code is not 0")
        first = next((n["at"] for n in notes if "line 1" in (n["message"] or "")), None)
        r["firstLineAt"] = first
        self.expect(r, first is not None, "no progress notification carried line 1")
        self.expect(
            r, first is not None and first <= answered - 1.5, "line 1 did not arrive well before the result"
        )

    # 4
    async def job(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        started = await self.ok("run-command", {"name": machine, "command": JOB_COMMAND, "background": True})
        r["job"] = started.get("job")
        cursor = started.get("cursor")
        stdout, reads, last = "", [], {}
        wait = int(self.plan.get("waitSecs", 30))
        while len(reads) < 100:
            args = {"job": r["job"], "waitSecs": wait}
            if cursor:
                args["cursor"] = cursor
            began = time.monotonic()
            last = await self.ok("job-output", args)
            stdout += last.get("stdout", "")
            cursor = last.get("cursor", cursor)
            reads.append(
                {
                    "state": last.get("state"),
                    "more": last.get("more"),
                    "bytes": len(last.get("stdout", "").encode()),
                    "seconds": round(time.monotonic() - began, 3),
                }
            )
            if last.get("state") != "running" and not last.get("more"):
                break
        r.update(reads=reads, stdout=stdout, state=last.get("state"), exitCode=last.get("exitCode"))
        self.expect(r, stdout == "job 1\njob 2\njob 3\n", "stdout is not the three job lines")
        self.expect(r, last.get("state") == "exited", "the job did not end as exited")
        self.expect(r, last.get("exitCode") == 3, "exit code is not 3")

    # 5
    async def files(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        wrote = await self.ok("write-file", {"name": machine, "path": HELLO_PATH, "content": HELLO_TEXT})
        r["written"] = {"path": wrote.get("path"), "size": wrote.get("size"), "text": HELLO_TEXT}
        result = await self.call("read-file", {"name": machine, "path": HELLO_PATH})
        page = structured("read-file", result)
        blocks = [getattr(block, "text", "") for block in result.content]
        back = blocks[1] if len(blocks) > 1 else None
        r["read"] = {"size": page.get("size"), "eof": page.get("eof"), "text": back, "blocks": len(blocks)}
        size = len(HELLO_TEXT.encode())
        self.expect(r, wrote.get("size") == size, "write-file's size is not the UTF-8 length")
        self.expect(r, back == HELLO_TEXT, "read-file did not give the text back")
        self.expect(r, page.get("size") == size, "read-file's size is not the UTF-8 length")
        # An image a command wrote comes back as an image content block the model sees.
        await self.ok("run-command", {"name": machine, "command": f"echo {PNG_BASE64} | base64 -d > {PNG_PATH}"})
        result = await self.call("read-file", {"name": machine, "path": PNG_PATH})
        page = structured("read-file", result)
        images = [
            (getattr(block, "mimeType", None) or getattr(block, "mime_type", None), block.data)
            for block in result.content
            if getattr(block, "type", None) == "image"
        ]
        r["image"] = {"encoding": page.get("encoding"), "types": [t for t, _ in images]}
        self.expect(r, images == [("image/png", PNG_BASE64)], "read-file did not answer the PNG as an image block")
        self.expect(r, page.get("encoding") == "image", "read-file's encoding is not image")

    # 6
    async def logs(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        # The default log, and the engine's (boot and guest agent) too where the tool offers a
        # source: a machine without an image has no workload, so its default log is empty.
        for key, extra in [("", {})] + ([("engine", {"source": "engine"})] if self.log_sources else []):
            first = await self.ok("machine-logs", {"name": machine, "tail": 5, **extra})
            cursor = first.get("cursor")
            tail = {
                "lines": len(first.get("lines", [])),
                "cursor": cursor,
                "last": first.get("lines", [])[-1:],
                "note": first.get("note"),
            }
            then = await self.ok("machine-logs", {"name": machine, "cursor": cursor, **extra})
            since = {
                "lines": len(then.get("lines", [])),
                "cursor": then.get("cursor"),
                "gap": then.get("gap"),
                "note": then.get("note"),
            }
            r[f"{key}Tail" if key else "tail"] = tail
            r[f"{key}Since" if key else "since"] = since
            # A workload that prints nothing has an empty log: only the bound is checked.
            self.expect(r, tail["lines"] <= 5, f"{key or 'default'}: tail 5 gave more than 5 lines")
            self.expect(r, bool(cursor), f"{key or 'default'}: no cursor")
            self.expect(r, bool(then.get("cursor")), f"{key or 'default'}: no cursor from the cursor read")

    # 7
    async def branch(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        child = f"mcp-child-{os.getpid()}-{int(time.time()) % 100000}"
        began = time.monotonic()
        result = await self.ok("branch-machine", {"name": machine, "childName": child})
        r["branchSeconds"] = round(time.monotonic() - began, 3)
        self.child = (result.get("machine") or {}).get("name") or child
        r.update(child=self.child, ready=result.get("ready"), ephemeral=result.get("ephemeral"))
        began = time.monotonic()
        read = await self.ok("run-command", {"name": self.child, "command": f"cat {HELLO_PATH}"})
        r["catSeconds"] = round(time.monotonic() - began, 3)
        r.update(stdout=read.get("stdout"), exitCode=read.get("exitCode"))
        self.expect(r, result.get("ready") is True, "the child is not ready")
        self.expect(r, result.get("ephemeral") is True, "the child is not ephemeral")
        self.expect(r, read.get("stdout") == HELLO_TEXT, "the child does not have the source's file")

    # 7b
    async def publish(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        await self.ok("run-command", {"name": machine, "command": SERVICE_COMMAND})
        published = await self.ok("publish-port", {"name": machine, "port": SERVICE_PORT, "waitSecs": 60})
        url = published.get("url")
        r.update(
            url=url, hostPort=published.get("hostPort"), listening=published.get("listening"), note=published.get("note")
        )
        self.expect(r, published.get("listening") is True, "publish-port saw nothing listening")
        self.expect(r, bool(url), "publish-port answered no url")
        body, attempts = None, 0
        # The guest's nc serves one connection at a time: one refused between two is retried.
        while url and body is None and attempts < 5:
            attempts += 1
            try:
                body = await asyncio.to_thread(fetch_text, url)
            except Exception as error:
                r.setdefault("fetchErrors", []).append(f"{type(error).__name__}: {error}")
                await asyncio.sleep(1)
        r["body"] = body
        self.expect(r, body == SERVICE_BODY, "the url did not answer the guest's service")
        record = (await self.ok("list-machines", {"name": machine}))["machines"][0]
        r["ports"] = record.get("ports")
        self.expect(
            r,
            {"guest": SERVICE_PORT, "host": published.get("hostPort")} in (record.get("ports") or []),
            "list-machines does not list the published port",
        )

    # 7c
    async def terminal(self, r: dict[str, Any]) -> None:
        machine = self.need(self.machine, "machine")
        opened = await self.ok(
            "terminal", {"name": machine, "command": "printf 'name? '; read n; echo \"hi $n\"", "waitMs": 10000}
        )
        answered = await self.ok(
            "terminal",
            {"name": machine, "terminal": opened.get("terminal"), "input": "Ada", "keys": ["enter"], "waitMs": 10000},
        )
        r.update(prompt=opened.get("output"), output=answered.get("output"), ended=answered.get("ended"))
        self.expect(r, (opened.get("output") or "").endswith("name? "), "the terminal did not show the prompt")
        self.expect(r, "hi Ada" in (answered.get("output") or ""), "the program did not answer the typed line")
        self.expect(r, answered.get("ended") == "exited 0", "the program did not end with exit 0")

    # 8
    async def run_once(self, r: dict[str, Any]) -> None:
        began = time.monotonic()
        once = await self.ok("run-once", {"command": ["echo", "once"], **self.image})
        r["runSeconds"] = round(time.monotonic() - began, 3)
        self.once_machine = once.get("machine")
        r.update(machine=self.once_machine, stdout=once.get("stdout"), exitCode=once.get("exitCode"))
        listed = await self.ok("list-machines", {})
        names = [m.get("name") for m in listed.get("machines", [])]
        r["listed"] = names
        r["stillListed"] = self.once_machine in names
        self.expect(r, once.get("stdout") == "once\n", "stdout is not once")
        self.expect(r, once.get("exitCode") == 0, "exit code is not 0")
        self.expect(r, bool(self.once_machine), "run-once named no machine")
        self.expect(r, self.once_machine not in names, "the run-once machine is still listed")


async def main() -> None:
    plan = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())
    http_transport = plan.get("transport", "http" if "url" in plan else "stdio") == "http"
    mode = plan.get("mode", "auto")
    session = Session(plan)
    if http_transport:
        http = create_mcp_http_client(
            headers={"Authorization": f"Bearer {plan['token']}"},
            timeout=httpx2.Timeout(30, read=session.timeout + 30),
        )
        transport = streamable_http_client(plan["url"], http_client=http)
    else:
        transport = StdioServerParameters(
            command=plan.get("server") or plan["command"], args=plan.get("args", []), env=plan.get("env")
        )
    engine = plan.get("engineUrl") or (plan.get("env") or {}).get("SMOL_LOCAL_URL")
    out: dict[str, Any] = {
        "client": "python mcp 2.3.0",
        "transport": "http" if http_transport else "stdio",
        "mode": mode,
        "image": plan.get("image"),
        "protocol": None,
        "steps": session.steps,
    }
    # What the engine held before: a machine that appears during the session, is not one the
    # results named (a create that failed midway, say) and outlives it, is a stray.
    before: set[str] | None = None
    if engine:
        try:
            before = set(await asyncio.to_thread(engine_machines, engine))
        except Exception as error:
            out["engineBeforeError"] = f"{type(error).__name__}: {error}"
    client = Client(transport, mode=mode, read_timeout_seconds=session.timeout)
    entered = False

    async def initialize(r: dict[str, Any]) -> None:
        nonlocal entered
        await client.__aenter__()
        entered = True
        session.client = client
        out["protocol"] = r["protocol"] = client.protocol_version
        r["server"] = client.server_info.name if client.server_info else None

    await session.step("initialize", initialize)
    await session.step("tools", session.tools)
    await session.step("create", session.create)
    await session.step("progress", session.progress)
    await session.step("job", session.job)
    await session.step("files", session.files)
    await session.step("logs", session.logs)
    await session.step("branch", session.branch)
    await session.step("publish", session.publish)
    await session.step("terminal", session.terminal)
    await session.step("runOnce", session.run_once)

    async def end(r: dict[str, Any]) -> None:
        # Leaving the client: over stdio it closes the server's stdin (then SIGTERM after 2 s);
        # over HTTP with a session it sends DELETE for it.
        r["how"] = (
            "stdin closed"
            if not http_transport
            else ("DELETE of the session" if out["protocol"] and out["protocol"] < "2026" else "no session")
        )
        if entered:
            began = time.monotonic()
            try:
                await client.__aexit__(None, None, None)
            finally:
                r["closeSeconds"] = round(time.monotonic() - began, 3)
        names = [n for n in (session.machine, session.child, session.once_machine) if n]
        r["sessionMachines"] = names
        if not engine:
            raise RuntimeError("no engineUrl in the plan and no SMOL_LOCAL_URL in env")
        # Only names with the server's prefix: the engine may have other users.
        prefix = plan.get("prefix", "mcp-") if before is not None else "\0"
        began = time.monotonic()
        deadline = began + float(plan.get("cleanupSecs", 60))
        while True:
            present = set(await asyncio.to_thread(engine_machines, engine))
            remaining = sorted(set(names) & present)
            strays = sorted(n for n in present - set(names) - (before or set()) if n.startswith(prefix))
            if (not remaining and not strays) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(2)
        r["remaining"] = remaining
        r["strays"] = strays
        r["waitedSeconds"] = round(time.monotonic() - began, 3)
        session.expect(r, not remaining, "machines of the session still exist on the engine")
        session.expect(r, not strays, "machines that appeared during the session still exist on the engine")

    await session.step("end", end)
    out["ok"] = all(step["ok"] for step in session.steps.values())
    print(json.dumps(out))


asyncio.run(main())
