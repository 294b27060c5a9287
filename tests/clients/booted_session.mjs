// One whole agent session with the official TypeScript MCP SDK (1.32.2, session lifecycle)
// against a server whose local fleet is a real engine with guests that boot, over stdio or
// Streamable HTTP: the same session, plan and report as booted_session.py.
// Usage: node booted_session.mjs PLAN_JSON (or the plan on stdin when no argument is given)
// PLAN_JSON: {"transport": "stdio"|"http" (optional: "http" when "url" is given),
//   stdio: "server" (or "command") the smol-mcp binary, "args" (optional), "env" its environment;
//   http: "url" (http://127.0.0.1:PORT/mcp) and "token" (the server's SMOL_MCP_AUTH_TOKEN);
//   "engineUrl": the engine's REST base URL (default: env.SMOL_LOCAL_URL), read at the end;
//   "image": an image for create-machine and run-once (default none: the engine's bundled Alpine);
//   "timeout" (s, default 300), "waitSecs" (default 30), "cleanupSecs" (default 60)}.
// The end of the session: stdio, the client closes (the server's stdin, then SIGTERM after 2 s);
// HTTP, terminateSession (DELETE) then close. Then the engine's own list: the session's machines,
// and strays (machines with the server's prefix, "prefix" in the plan, default "mcp-", that
// appeared during the session unnamed by any result).
// Prints one JSON object: {"client", "transport", "mode", "protocol", "ok", "steps": {name: {"ok",
// "seconds", "problems": [...], "error"?, ...what the step saw}}}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { readFileSync } from "node:fs";

const PROGRESS_COMMAND = "for i in 1 2 3; do echo line $i; sleep 1; done";
const JOB_COMMAND = "for i in 1 2 3; do echo job $i; sleep 1; done; exit 3";
const HELLO_PATH = "/tmp/hello.txt";
const HELLO_TEXT = "hello from the session: grüße, ✓\n";
// A whole 1x1 red PNG, which a command in the guest writes and read-file answers as an image.
const PNG_PATH = "/tmp/dot.png";
const PNG_BASE64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVQI12P4z8AAAAMBAQAY3Y2wAAAAAElFTkSuQmCC";
// A service in the guest (busybox nc, one answer a connection, on every address), published
// and opened from this host through the URL publish-port answers.
const SERVICE_PORT = 8000;
const SERVICE_BODY = "hello from the guest\n";
const SERVICE_COMMAND =
  "nohup sh -c 'while true; do printf \"HTTP/1.0 200 OK\\r\\n\\r\\nhello from the guest\\n\" " +
  "| nc -l -p 8000; done' >/dev/null 2>&1 </dev/null &";

const plan = JSON.parse(process.argv[2] ?? readFileSync(0, "utf8"));
const isHttp = (plan.transport ?? (plan.url ? "http" : "stdio")) === "http";
const timeout = (plan.timeout ?? 300) * 1000;
const engine = plan.engineUrl ?? plan.env?.SMOL_LOCAL_URL;
const image = plan.image ? { image: plan.image } : {};
const prefix = plan.prefix ?? "mcp-";
const now = () => performance.now() / 1000;
const round = (s) => Math.round(s * 1000) / 1000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const textOf = (result) => (result.content ?? []).map((c) => c.text ?? "").join("\n");

// The server answered, with isError: its text is the record.
class ToolError extends Error {}
// What the step needs, an earlier one did not give.
class Skipped extends Error {}

const client = new Client({ name: "smol-mcp-ts-booted-session", version: "0" }, { capabilities: {} });
const transport = isHttp
  ? new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    })
  : new StdioClientTransport({
      command: plan.server ?? plan.command,
      args: plan.args ?? [],
      env: plan.env,
      stderr: "ignore",
    });

// The version the SDK settles on at initialize: it tells the transport, which over stdio keeps
// no copy of its own.
let negotiated = null;
const setProtocolVersion = transport.setProtocolVersion?.bind(transport);
transport.setProtocolVersion = (version) => {
  negotiated = version;
  setProtocolVersion?.(version);
};

const steps = {};
const out = {
  client: "typescript sdk 1.32.2",
  transport: isHttp ? "http" : "stdio",
  mode: "session",
  image: plan.image ?? null,
  protocol: null,
  steps,
};
const s = { machine: null, child: null, once: null, connected: false, logSources: false };

async function step(name, body) {
  const record = { problems: [] };
  const began = now();
  try {
    await body(record);
  } catch (error) {
    // Every failure is recorded; the session goes on.
    const cause = error?.cause ? ` (${error.cause.message ?? error.cause})` : "";
    record.error = `${error?.constructor?.name ?? "Error"}: ${error?.message ?? error}${cause}`;
    if (!(error instanceof ToolError || error instanceof Skipped) && error?.stack) {
      record.traceback = error.stack.split("\n").slice(0, 5).join("\n");
    }
  }
  record.seconds = round(now() - began);
  record.ok = record.error === undefined && record.problems.length === 0;
  steps[name] = record;
}
const expect = (r, held, what) => {
  if (!held) r.problems.push(what);
};
const need = (value, what) => {
  if (!value) throw new Skipped(`no ${what} (an earlier step failed)`);
  return value;
};
const call = (name, args, options = {}) => {
  if (!s.connected) throw new Error("no client: initialize failed");
  return client.callTool({ name, arguments: args }, undefined, { timeout, ...options });
};
async function ok(name, args, options) {
  const result = await call(name, args, options);
  if (result.isError) throw new ToolError(`${name} answered isError: ${textOf(result)}`);
  return result.structuredContent ?? {};
}

// What the engine held before: a machine that appears during the session, is not one the
// results named (a create that failed midway, say) and outlives it, is a stray.
let before = null;
if (engine) {
  try {
    before = new Set(await engineMachines());
  } catch (error) {
    out.engineBeforeError = `${error?.message ?? error}${error?.cause ? ` (${error.cause.message})` : ""}`;
  }
}

await step("initialize", async (r) => {
  await client.connect(transport, { timeout });
  s.connected = true;
  out.protocol = r.protocol = negotiated;
  r.server = client.getServerVersion()?.name ?? null;
  if (isHttp) r.sessionId = transport.sessionId ?? null;
});

await step("tools", async (r) => {
  if (!s.connected) throw new Error("no client: initialize failed");
  const listed = (await client.listTools(undefined, { timeout })).tools;
  const names = listed.map((t) => t.name);
  const logs = listed.find((t) => t.name === "machine-logs");
  s.logSources = Boolean(logs?.inputSchema?.properties?.source);
  r.count = names.length;
  r.names = names;
  for (const tool of ["create-machine", "run-command", "job-output", "branch-machine", "run-once"]) {
    expect(r, names.includes(tool), `${tool} not listed`);
  }
});

await step("create", async (r) => {
  const result = await ok("create-machine", { branchable: true, ...image });
  const machine = result.machine ?? {};
  s.machine = machine.name ?? null;
  Object.assign(r, {
    machine: s.machine,
    ready: result.ready,
    ephemeral: result.ephemeral,
    image: machine.image,
    state: machine.state,
    branchable: machine.branchable,
  });
  expect(r, Boolean(s.machine?.startsWith("mcp-")), "the name lacks mcp-");
  expect(r, result.ready === true, "not ready");
  expect(r, result.ephemeral === true, "not ephemeral");
});

await step("progress", async (r) => {
  const machine = need(s.machine, "machine");
  const notes = [];
  const began = now();
  const result = await ok(
    "run-command",
    { name: machine, command: PROGRESS_COMMAND },
    {
      onprogress: (p) =>
        notes.push({
          at: round(now() - began),
          progress: p.progress,
          total: p.total ?? null,
          message: p.message ?? null,
        }),
    },
  );
  const answered = round(now() - began);
  Object.assign(r, {
    notifications: notes,
    resultAt: answered,
    stdout: result.stdout,
    stderr: result.stderr,
    exitCode: result.exitCode,
  });
  expect(r, result.stdout === "line 1\nline 2\nline 3\n", "stdout is not the three lines");
  expect(r, result.exitCode === 0, "exit code is not 0");
  const first = notes.find((n) => (n.message ?? "").includes("line 1"))?.at ?? null;
  r.firstLineAt = first;
  expect(r, first !== null, "no progress notification carried line 1");
  expect(r, first !== null && first <= answered - 1.5, "line 1 did not arrive well before the result");
});

await step("job", async (r) => {
  const machine = need(s.machine, "machine");
  const started = await ok("run-command", { name: machine, command: JOB_COMMAND, background: true });
  r.job = started.job;
  let cursor = started.cursor;
  let stdout = "";
  let last = {};
  const reads = [];
  while (reads.length < 100) {
    const args = { job: r.job, waitSecs: plan.waitSecs ?? 30 };
    if (cursor) args.cursor = cursor;
    const began = now();
    last = await ok("job-output", args);
    stdout += last.stdout ?? "";
    cursor = last.cursor ?? cursor;
    reads.push({
      state: last.state,
      more: last.more,
      bytes: Buffer.byteLength(last.stdout ?? ""),
      seconds: round(now() - began),
    });
    if (last.state !== "running" && !last.more) break;
  }
  Object.assign(r, { reads, stdout, state: last.state, exitCode: last.exitCode });
  expect(r, stdout === "job 1\njob 2\njob 3\n", "stdout is not the three job lines");
  expect(r, last.state === "exited", "the job did not end as exited");
  expect(r, last.exitCode === 3, "exit code is not 3");
});

await step("files", async (r) => {
  const machine = need(s.machine, "machine");
  const wrote = await ok("write-file", { name: machine, path: HELLO_PATH, content: HELLO_TEXT });
  r.written = { path: wrote.path, size: wrote.size, text: HELLO_TEXT };
  const result = await call("read-file", { name: machine, path: HELLO_PATH });
  if (result.isError) throw new ToolError(`read-file answered isError: ${textOf(result)}`);
  const page = result.structuredContent ?? {};
  const blocks = (result.content ?? []).map((c) => c.text ?? "");
  const back = blocks.length > 1 ? blocks[1] : null;
  r.read = { size: page.size, eof: page.eof, text: back, blocks: blocks.length };
  const size = Buffer.byteLength(HELLO_TEXT);
  expect(r, wrote.size === size, "write-file's size is not the UTF-8 length");
  expect(r, back === HELLO_TEXT, "read-file did not give the text back");
  expect(r, page.size === size, "read-file's size is not the UTF-8 length");
  // An image a command wrote comes back as an image content block the model sees.
  await ok("run-command", { name: machine, command: `echo ${PNG_BASE64} | base64 -d > ${PNG_PATH}` });
  const image = await call("read-file", { name: machine, path: PNG_PATH });
  if (image.isError) throw new ToolError(`read-file of the PNG answered isError: ${textOf(image)}`);
  const images = (image.content ?? []).filter((c) => c.type === "image").map((c) => [c.mimeType, c.data]);
  r.image = { encoding: image.structuredContent?.encoding, types: images.map(([t]) => t) };
  expect(r, JSON.stringify(images) === JSON.stringify([["image/png", PNG_BASE64]]),
    "read-file did not answer the PNG as an image block");
  expect(r, image.structuredContent?.encoding === "image", "read-file's encoding is not image");
});

await step("logs", async (r) => {
  const machine = need(s.machine, "machine");
  // The default log, and the engine's (boot and guest agent) too where the tool offers a
  // source: a machine without an image has no workload, so its default log is empty.
  const sources = [["", {}]];
  if (s.logSources) sources.push(["engine", { source: "engine" }]);
  for (const [key, extra] of sources) {
    const first = await ok("machine-logs", { name: machine, tail: 5, ...extra });
    const lines = first.lines ?? [];
    const tail = { lines: lines.length, cursor: first.cursor, last: lines.slice(-1), note: first.note ?? null };
    const then = await ok("machine-logs", { name: machine, cursor: first.cursor, ...extra });
    const since = {
      lines: (then.lines ?? []).length,
      cursor: then.cursor,
      gap: then.gap,
      note: then.note ?? null,
    };
    r[key ? `${key}Tail` : "tail"] = tail;
    r[key ? `${key}Since` : "since"] = since;
    const label = key || "default";
    // A workload that prints nothing has an empty log: only the bound is checked.
    expect(r, lines.length <= 5, `${label}: tail 5 gave more than 5 lines`);
    expect(r, Boolean(first.cursor), `${label}: no cursor`);
    expect(r, Boolean(then.cursor), `${label}: no cursor from the cursor read`);
  }
});

await step("branch", async (r) => {
  const machine = need(s.machine, "machine");
  const child = `mcp-child-${process.pid}-${Math.floor(Date.now() / 1000) % 100000}`;
  let began = now();
  const result = await ok("branch-machine", { name: machine, childName: child });
  r.branchSeconds = round(now() - began);
  s.child = result.machine?.name ?? child;
  Object.assign(r, { child: s.child, ready: result.ready, ephemeral: result.ephemeral });
  began = now();
  const read = await ok("run-command", { name: s.child, command: `cat ${HELLO_PATH}` });
  r.catSeconds = round(now() - began);
  Object.assign(r, { stdout: read.stdout, exitCode: read.exitCode });
  expect(r, result.ready === true, "the child is not ready");
  expect(r, result.ephemeral === true, "the child is not ephemeral");
  expect(r, read.stdout === HELLO_TEXT, "the child does not have the source's file");
});

await step("publish", async (r) => {
  const machine = need(s.machine, "machine");
  await ok("run-command", { name: machine, command: SERVICE_COMMAND });
  const published = await ok("publish-port", { name: machine, port: SERVICE_PORT, waitSecs: 60 });
  const url = published.url;
  Object.assign(r, { url, hostPort: published.hostPort, listening: published.listening, note: published.note });
  expect(r, published.listening === true, "publish-port saw nothing listening");
  expect(r, Boolean(url), "publish-port answered no url");
  let body = null;
  // The guest's nc serves one connection at a time: one refused between two is retried.
  for (let attempt = 0; url && body === null && attempt < 5; attempt++) {
    try {
      const response = await fetch(url, { signal: AbortSignal.timeout(30_000) });
      body = await response.text();
    } catch (error) {
      (r.fetchErrors ??= []).push(`${error?.message ?? error}${error?.cause ? ` (${error.cause.message})` : ""}`);
      await new Promise((done) => setTimeout(done, 1000));
    }
  }
  r.body = body;
  expect(r, body === SERVICE_BODY, "the url did not answer the guest's service");
  const record = (await ok("list-machines", { name: machine })).machines[0];
  r.ports = record.ports;
  expect(
    r,
    (record.ports ?? []).some((p) => p.guest === SERVICE_PORT && p.host === published.hostPort),
    "list-machines does not list the published port",
  );
});

await step("terminal", async (r) => {
  const machine = need(s.machine, "machine");
  const opened = await ok("terminal", {
    name: machine,
    command: "printf 'name? '; read n; echo \"hi $n\"",
    waitMs: 10000,
  });
  const answered = await ok("terminal", {
    name: machine,
    terminal: opened.terminal,
    input: "Ada",
    keys: ["enter"],
    waitMs: 10000,
  });
  Object.assign(r, { prompt: opened.output, output: answered.output, ended: answered.ended });
  expect(r, (opened.output ?? "").endsWith("name? "), "the terminal did not show the prompt");
  expect(r, (answered.output ?? "").includes("hi Ada"), "the program did not answer the typed line");
  expect(r, answered.ended === "exited 0", "the program did not end with exit 0");
});

await step("runOnce", async (r) => {
  const began = now();
  const once = await ok("run-once", { command: ["echo", "once"], ...image });
  r.runSeconds = round(now() - began);
  s.once = once.machine ?? null;
  Object.assign(r, { machine: s.once, stdout: once.stdout, exitCode: once.exitCode });
  const listed = await ok("list-machines", {});
  const names = (listed.machines ?? []).map((m) => m.name);
  r.listed = names;
  r.stillListed = names.includes(s.once);
  expect(r, once.stdout === "once\n", "stdout is not once");
  expect(r, once.exitCode === 0, "exit code is not 0");
  expect(r, Boolean(s.once), "run-once named no machine");
  expect(r, !names.includes(s.once), "the run-once machine is still listed");
});

async function engineMachines() {
  const response = await fetch(`${engine.replace(/\/$/, "")}/api/v1/machines`, {
    signal: AbortSignal.timeout(30000),
  });
  if (!response.ok) throw new Error(`the engine answered ${response.status}`);
  const body = await response.json();
  return (Array.isArray(body) ? body : (body.machines ?? [])).map((m) => m.name);
}

await step("end", async (r) => {
  r.how = isHttp ? "DELETE of the session (terminateSession)" : "stdin closed (client.close)";
  if (s.connected) {
    const began = now();
    try {
      if (isHttp) {
        r.sessionId = transport.sessionId ?? null;
        await transport.terminateSession();
      }
      await client.close();
    } finally {
      r.closeSeconds = round(now() - began);
    }
  }
  const names = [s.machine, s.child, s.once].filter(Boolean);
  r.sessionMachines = names;
  if (!engine) throw new Error("no engineUrl in the plan and no SMOL_LOCAL_URL in env");
  const began = now();
  const deadline = began + (plan.cleanupSecs ?? 60);
  let remaining;
  let strays;
  for (;;) {
    const present = new Set(await engineMachines());
    remaining = names.filter((n) => present.has(n)).sort();
    // Only names with the server's prefix: the engine may have other users.
    strays = before
      ? [...present].filter((n) => n.startsWith(prefix) && !names.includes(n) && !before.has(n)).sort()
      : [];
    if ((remaining.length === 0 && strays.length === 0) || now() >= deadline) break;
    await sleep(2000);
  }
  r.remaining = remaining;
  r.strays = strays;
  r.waitedSeconds = round(now() - began);
  expect(r, remaining.length === 0, "machines of the session still exist on the engine");
  expect(r, strays.length === 0, "machines that appeared during the session still exist on the engine");
});

out.ok = Object.values(steps).every((st) => st.ok);
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
