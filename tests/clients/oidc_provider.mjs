// A real OpenID provider (the npm package oidc-provider, pinned in package.json) for the
// sign-in tests: dynamic client registration, PKCE, resource indicators (RFC 8707) giving JWT
// access tokens whose audience is the resource asked for, signed with an RS256 key made at
// start. Its one departure from a provider a person uses: the login and consent pages answer
// themselves, signing in as the `login_hint` of the authorization request (else "alice") and
// granting what was asked, so that a test's "browser" only follows redirects.
//
// Argument: a JSON plan {"resources": [urls], "scopes": [names], "registration": bool,
// "cimd": {"origin", "ca"}}; a resource ending in `*` stands for every URL it begins (so that a
// token can be asked for a server other than the one under test, whose audience that server
// must refuse). `registration` (default true) is dynamic client registration; `cimd` turns on
// Client ID Metadata Documents (oidc-provider's clientIdMetadataDocument, draft 02) for client
// ids under `origin`, fetched over HTTPS trusting the PEM certificate `ca` (the test's own
// loopback host, tests/clients/cimd_host.mjs). Prints {"issuer": url} once it listens, then
// serves until killed or its stdin closes.
import Provider from 'oidc-provider';
import http from 'node:http';
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';

const plan = JSON.parse(process.argv[2] ?? '{}');
const resources = plan.resources ?? [];
const scopes = plan.scopes ?? [];
const cimd = plan.cimd;

// The provider fetches a metadata document through `fetch` with a dispatcher of its own that
// refuses loopback and private addresses (its SSRF guard), which a document on the test's
// loopback host is. For the test's origin alone, a dispatcher that trusts the test's
// certificate takes its place; every other URL keeps the guard.
let fetchOption = {};
if (cimd) {
  // Node's built-in undici puts its global dispatcher (whose class is the Agent used here; the
  // npm undici in node_modules needs a newer Node) under this symbol only once fetch has run.
  await fetch('data:,');
  const Agent = globalThis[Symbol.for('undici.globalDispatcher.1')].constructor;
  const trusting = new Agent({ connect: { ca: readFileSync(cimd.ca) } });
  fetchOption = {
    fetch: (url, options) => {
      if (String(url).startsWith(`${cimd.origin}/`)) {
        return globalThis.fetch(url, { ...options, dispatcher: trusting });
      }
      return globalThis.fetch(url, options);
    },
  };
}

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'test-rs256', alg: 'RS256', use: 'sig' };

const server = http.createServer();
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  scopes: ['openid', 'offline_access', ...scopes],
  features: {
    devInteractions: { enabled: false },
    registration: { enabled: plan.registration ?? true },
    clientIdMetadataDocument: cimd
      ? { enabled: true, ack: 'draft-02', allowFetch: (_ctx, clientId) => clientId.startsWith(`${cimd.origin}/`) }
      : { enabled: false },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resources.find((r) => !r.endsWith('*')),
      useGrantedResource: () => true,
      getResourceServerInfo: (_ctx, indicator) => {
        const known = resources.some((r) => (r.endsWith('*') ? indicator.startsWith(r.slice(0, -1)) : r === indicator));
        if (!known) {
          throw new Provider.errors.InvalidTarget(`unknown resource ${indicator}`);
        }
        return {
          scope: scopes.join(' '),
          audience: indicator,
          accessTokenTTL: 600,
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  pkce: { required: () => true },
  clientBasedCORS: () => true,
  interactions: { url: (_ctx, interaction) => `/interaction/${interaction.uid}` },
  findAccount: (_ctx, id) => ({ accountId: id, claims: () => ({ sub: id }) }),
  ...fetchOption,
});

const callback = provider.callback();
server.on('request', async (req, res) => {
  if (!req.url.startsWith('/interaction/')) {
    callback(req, res);
    return;
  }
  try {
    const details = await provider.interactionDetails(req, res);
    if (details.prompt.name === 'login') {
      const accountId = details.params.login_hint || 'alice';
      await provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
      return;
    }
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const missing = details.prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [indicator, wanted] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(indicator, wanted.join(' '));
    }
    const grantId = await grant.save();
    await provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  } catch (e) {
    res.statusCode = 500;
    res.end(String(e));
  }
});

process.stdout.write(JSON.stringify({ issuer }) + '\n');
// Whatever the provider logs from here goes to stderr: stdout carried only the line above.
console.log = console.error;
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
