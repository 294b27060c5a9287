// The official TypeScript SDK as a user's client would drive smol-mcp over stdio: a create-machine
// with `onprogress` (the SDK then sends a progress token), and the server's log messages.
// Usage: node ts_progress.mjs PLAN_JSON, PLAN_JSON: {"server": path, "env": {...}, "name": machine}.
// Prints one JSON report: {result, progress: [{progress, total, message}], logs: [{level, logger, data}]}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const plan = JSON.parse(process.argv[2]);
const client = new Client({ name: "smol-mcp-ts-progress", version: "0" }, { capabilities: {} });
const logs = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
  logs.push({ level: n.params.level, logger: n.params.logger ?? null, data: n.params.data });
});
await client.connect(stdioTransport(plan));
const progress = [];
const r = await client.callTool(
  { name: "create-machine", arguments: { image: "alpine", name: plan.name } },
  undefined,
  {
    onprogress: (p) => progress.push({ progress: p.progress, total: p.total ?? null, message: p.message ?? null }),
  },
);
const result = {
  isError: Boolean(r.isError),
  text: (r.content ?? []).map((c) => c.text ?? "").join("\n"),
};
await client.close();
console.log(JSON.stringify({ result, progress, logs }));
