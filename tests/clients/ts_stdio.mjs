// The stdio transport the TypeScript client scripts start the server with: the plan's server
// binary, no arguments, the plan's environment only.
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

export function stdioTransport(plan, stderr = "ignore") {
  return new StdioClientTransport({ command: plan.server, args: [], env: plan.env, stderr });
}
