// The TypeScript SDK's own OAuth client signing in to smol-mcp-http: the 401 and its
// WWW-Authenticate, the protected resource metadata, the issuer's metadata, dynamic
// registration, PKCE and the resource indicator are all the SDK's; the test only plays the
// browser (oauth_browser.mjs), as `plan.user`. Then it lists the tools and makes the calls of
// the plan as that user, over the 2025-11-25 session the SDK opens.
//
// Plan: {"url", "user", "calls": [{"name", "arguments"}], "clientMetadataUrl"}; with
// clientMetadataUrl the SDK identifies the client by that Client ID Metadata Document where the
// provider supports them, instead of registering. Prints {"tools", "results", "audience",
// "subject", "clientId"} (the last three read from the access token the SDK was given).
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';
import { signInAs } from './oauth_browser.mjs';

const plan = JSON.parse(process.argv[2]);
const redirect = 'http://127.0.0.1:1/callback';

class InMemoryProvider {
  get redirectUrl() { return redirect; }
  get clientMetadataUrl() { return plan.clientMetadataUrl; }
  get clientMetadata() {
    return {
      client_name: 'smol-mcp sign-in test',
      redirect_uris: [redirect],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    };
  }
  clientInformation() { return this.client; }
  saveClientInformation(info) { this.client = info; }
  tokens() { return this.saved; }
  saveTokens(tokens) { this.saved = tokens; }
  redirectToAuthorization(url) { this.authorizationUrl = url; }
  saveCodeVerifier(verifier) { this.verifier = verifier; }
  codeVerifier() { return this.verifier; }
}

const provider = new InMemoryProvider();
const client = new Client({ name: 'ts-signin', version: '0' });
let transport = new StreamableHTTPClientTransport(new URL(plan.url), { authProvider: provider });
try {
  await client.connect(transport);
  throw new Error('connected without signing in');
} catch (e) {
  if (!(e instanceof UnauthorizedError)) throw e;
}
const landed = new URL(await signInAs(provider.authorizationUrl.href, plan.user, redirect));
await transport.finishAuth(landed.searchParams.get('code'));
transport = new StreamableHTTPClientTransport(new URL(plan.url), { authProvider: provider });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const results = [];
for (const call of plan.calls ?? []) {
  const result = await client.callTool({ name: call.name, arguments: call.arguments ?? {} });
  results.push({ isError: result.isError ?? false, structured: result.structuredContent ?? null, text: result.content?.[0]?.text ?? '' });
}
await client.close();
const claims = JSON.parse(Buffer.from(provider.saved.access_token.split('.')[1], 'base64url').toString());
process.stdout.write(JSON.stringify({ tools, results, audience: claims.aud, subject: claims.sub, clientId: claims.client_id }) + '\n');
