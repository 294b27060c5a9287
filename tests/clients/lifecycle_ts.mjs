// Drives smol-mcp with the official TypeScript MCP SDK (session lifecycle), answering the fleet
// question. Usage: node lifecycle_ts.mjs PLAN_JSON
// PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP;
// "answer": "local" | "cloud" | "decline"; "calls": [{"tool": ..., "args": {...}}].
// Prints one JSON report: whether target was listed before and after the calls, the questions
// asked, whether tools/list_changed arrived, and each call's isError and text.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema, ToolListChangedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const plan = JSON.parse(process.argv[2]);
const client = new Client(
  { name: "smol-mcp-lifecycle-ts", version: "0" },
  { capabilities: { elicitation: { form: {} } } },
);
const asked = [];
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  asked.push(request.params.message);
  if (plan.answer === "decline") return { action: "decline" };
  return { action: "accept", content: { fleet: plan.answer } };
});
let listChanged;
const changed = new Promise((resolve) => (listChanged = resolve));
let changes = 0;
client.setNotificationHandler(ToolListChangedNotificationSchema, async () => {
  changes += 1;
  listChanged();
});
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    })
  : stdioTransport(plan);
await client.connect(transport);
const listsTarget = async () =>
  (await client.listTools()).tools.some((t) => "target" in (t.inputSchema.properties ?? {}));
const out = { targetBefore: await listsTarget(), calls: [] };
for (const call of plan.calls ?? []) {
  const r = await client.callTool({ name: call.tool, arguments: call.args ?? {} });
  out.calls.push({ isError: Boolean(r.isError), text: (r.content ?? []).map((c) => c.text ?? "").join("\n") });
}
if (plan.answer !== "decline") {
  // The notification may travel on another stream than the call's answer: wait for it (the
  // Rust test bounds the whole run).
  await changed;
}
out.listChanged = changes;
out.targetAfter = await listsTarget();
out.asked = asked;
if (plan.url) await transport.terminateSession();
await client.close();
console.log(JSON.stringify(out));
