// Follows a machine's log with the official TypeScript MCP SDK (session lifecycle, 2025-11-25),
// over stdio or Streamable HTTP, in steps the Rust test drives through stdin and stdout.
// Usage: node resources_ts.mjs PLAN_JSON
// PLAN_JSON: {"server": path, "env": {...}} for stdio, or {"url": ..., "token": ...} for HTTP,
// "uri": the logs URI to follow, and "endSession": true to end the session instead of
// unsubscribing. Each step prints one JSON line; the test answers "pushed" on stdin after it
// wrote a log line into the fake serve.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { stdioTransport } from "./ts_stdio.mjs";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ResourceUpdatedNotificationSchema } from "@modelcontextprotocol/sdk/types.js";
import readline from "node:readline";

const plan = JSON.parse(process.argv[2]);
const input = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const say = (step) => process.stdout.write(JSON.stringify(step) + "\n");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function expect(word) {
  const { value } = await input.next();
  if ((value ?? "").trim() !== word) throw new Error(`expected ${word}, got ${value}`);
}

const client = new Client({ name: "smol-mcp-ts-resources", version: "0" }, { capabilities: {} });
const updates = [];
client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
  updates.push(n.params.uri);
});
const transport = plan.url
  ? new StreamableHTTPClientTransport(new URL(plan.url), {
      requestInit: { headers: { Authorization: `Bearer ${plan.token}` } },
    })
  : stdioTransport(plan);
await client.connect(transport);

const targets = await client.readResource({ uri: "smol://targets" });
say({ step: "targets", protocol: client.getServerCapabilities() ? "session" : null, targets: JSON.parse(targets.contents[0].text) });

await client.subscribeResource({ uri: plan.uri });
say({ step: "subscribed" });
await expect("pushed");
const deadline = Date.now() + 10000;
while (updates.length === 0 && Date.now() < deadline) await sleep(20);
say({ step: "updated", updates: [...updates] });

if (plan.endSession) {
  // Leave without unsubscribing: the end of the session must stop the server's polling.
  if (plan.url) await transport.terminateSession();
  await client.close();
} else {
  await client.unsubscribeResource({ uri: plan.uri });
}
updates.length = 0;
say({ step: "unsubscribed" });
await expect("pushed");
// Longer than the server's poll interval (1 s) twice over: an update would have come by now.
await sleep(2500);
say({ step: "after", updates: [...updates] });

if (!plan.endSession) {
  if (plan.url) await transport.terminateSession();
  await client.close();
}
process.exit(0);
