// The official TypeScript SDK running a command that prints for longer than its own request
// timeout: with `onprogress` (the SDK then sends a progress token) and `resetTimeoutOnProgress`,
// each output notification restarts the timeout, so the call completes.
// Usage: node ts_stream.mjs PLAN_JSON, PLAN_JSON: {"server": path, "env": {...}, "name": machine,
// "timeoutMs": n}. Prints one JSON report: {result, progress: [{progress, message}], elapsedMs}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";

const plan = JSON.parse(process.argv[2]);
const client = new Client({ name: "smol-mcp-ts-stream", version: "0" }, { capabilities: {} });
await client.connect(stdioTransport(plan));
const progress = [];
const began = Date.now();
let result;
try {
  const r = await client.callTool(
    { name: "run-command", arguments: { name: plan.name, command: "build.sh" } },
    undefined,
    {
      timeout: plan.timeoutMs,
      resetTimeoutOnProgress: true,
      onprogress: (p) => progress.push({ progress: p.progress, message: p.message ?? null }),
    },
  );
  result = { isError: Boolean(r.isError), structured: r.structuredContent ?? null };
} catch (e) {
  result = { isError: true, thrown: String(e) };
}
const elapsedMs = Date.now() - began;
await client.close();
console.log(JSON.stringify({ result, progress, elapsedMs }));
