// Follows a background job with the official TypeScript MCP SDK (1.32.2, session lifecycle), over
// stdio or Streamable HTTP, every request bounded by a timeout shorter than the command, as a
// client with a short tool-call deadline would.
// Usage: node job_ts.mjs PLAN_JSON
// PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
// "timeout": the request timeout in seconds; "machine" (and "image"), "command", "waitSecs" and
// "foreground" as in job_py.py. Prints one JSON object of the same shape as job_py.py's.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";

const plan = JSON.parse(process.argv[2]);
const timeout = plan.timeout * 1000;
const client = new Client({ name: "smol-mcp-ts-jobs", version: "0" }, { capabilities: {} });
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    })
  : stdioTransport(plan);
await client.connect(transport);

function structured(result) {
  if (result.isError) throw new Error(`tool error: ${result.content.map((c) => c.text).join("\n")}`);
  return result.structuredContent;
}
const call = (name, args, options = { timeout }) =>
  client.callTool({ name, arguments: args }, undefined, options);

const out = { protocol: "session", reads: [] };
// Creating the machine is not what is measured: it may take the default deadline.
structured(await call("create-machine", { name: plan.machine, image: plan.image ?? "alpine" }, {}));
if (plan.foreground) {
  const began = performance.now();
  try {
    const result = await call("run-command", { name: plan.machine, command: plan.command });
    out.foreground = { answered: true, isError: Boolean(result.isError) };
  } catch (error) {
    if (!(error instanceof McpError)) throw error;
    out.foreground = {
      answered: false,
      code: error.code,
      message: error.message,
      seconds: (performance.now() - began) / 1000,
    };
  }
}
let began = performance.now();
const job = structured(
  await call("run-command", { name: plan.machine, command: plan.command, background: true }),
);
out.started = job;
out.startSeconds = (performance.now() - began) / 1000;
let cursor = job.cursor;
let stdout = "";
let stderr = "";
for (;;) {
  began = performance.now();
  const report = structured(
    await call("job-output", { job: job.job, cursor, waitSecs: plan.waitSecs }),
  );
  stdout += report.stdout;
  stderr += report.stderr;
  cursor = report.cursor;
  out.reads.push({
    state: report.state,
    stdoutBytes: Buffer.byteLength(report.stdout),
    cursor,
    seconds: (performance.now() - began) / 1000,
  });
  if (report.state !== "running" && !report.more) {
    out.last = report;
    break;
  }
  if (out.reads.length > 200) throw new Error("the job never ended");
}
out.stdout = stdout;
out.stderr = stderr;
if (plan.url) await transport.terminateSession();
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
