// Drives the smol-mcp server with the official TypeScript MCP SDK, over stdio or Streamable HTTP.
// Usage: node ts_plan.mjs PLAN_JSON
// PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP,
// and "calls": [{"tool": ..., "args": {...}}]. Prints one JSON report; the SDK validates every
// structured result against the tool's output schema, so a schema mismatch fails the call.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const plan = JSON.parse(process.argv[2]);
const client = new Client({ name: "smol-mcp-ts-plan", version: "0" }, { capabilities: {} });
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    })
  : stdioTransport(plan);
await client.connect(transport);
const out = { server: client.getServerVersion()?.name ?? null, tools: [], calls: [] };
out.tools = (await client.listTools()).tools.map((t) => t.name);
for (const call of plan.calls ?? []) {
  try {
    const r = await client.callTool({ name: call.tool, arguments: call.args ?? {} });
    out.calls.push({
      isError: Boolean(r.isError),
      structured: r.structuredContent ?? null,
      text: (r.content ?? []).map((c) => c.text ?? "").join("\n"),
    });
  } catch (e) {
    out.calls.push({ isError: true, structured: null, text: `client error: ${e.message}` });
  }
}
if (plan.url) await transport.terminateSession();
await client.close();
console.log(JSON.stringify(out));
