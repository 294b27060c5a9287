// An access token for `user` from the test provider, the way a public client gets one:
// dynamic registration, an authorization request with PKCE and a resource indicator, the
// browser's redirects, the code exchanged at the token endpoint.
//
// Argument: {"issuer", "resource", "user", "scope"}. Prints {"access_token", "expires_in"}.
import { createHash, randomBytes } from 'node:crypto';
import { signInAs } from './oauth_browser.mjs';

const plan = JSON.parse(process.argv[2]);
const redirect = 'http://127.0.0.1:1/callback';
const metadata = await (await fetch(`${plan.issuer}/.well-known/openid-configuration`)).json();
const registered = await (await fetch(metadata.registration_endpoint, {
  method: 'POST',
  headers: { 'content-type': 'application/json' },
  body: JSON.stringify({
    redirect_uris: [redirect],
    grant_types: ['authorization_code'],
    response_types: ['code'],
    token_endpoint_auth_method: 'none',
  }),
})).json();
const verifier = randomBytes(32).toString('base64url');
const challenge = createHash('sha256').update(verifier).digest('base64url');
const authorize = new URL(metadata.authorization_endpoint);
for (const [k, v] of Object.entries({
  client_id: registered.client_id,
  response_type: 'code',
  redirect_uri: redirect,
  scope: plan.scope ?? '',
  resource: plan.resource,
  code_challenge: challenge,
  code_challenge_method: 'S256',
  state: 'test',
})) authorize.searchParams.set(k, v);
const landed = new URL(await signInAs(authorize.href, plan.user, redirect));
const code = landed.searchParams.get('code');
if (!code) throw new Error(`no code: ${landed}`);
const token = await (await fetch(metadata.token_endpoint, {
  method: 'POST',
  headers: { 'content-type': 'application/x-www-form-urlencoded' },
  body: new URLSearchParams({
    grant_type: 'authorization_code',
    code,
    redirect_uri: redirect,
    client_id: registered.client_id,
    code_verifier: verifier,
    resource: plan.resource,
  }),
})).json();
if (!token.access_token) throw new Error(`no token: ${JSON.stringify(token)}`);
process.stdout.write(JSON.stringify({ access_token: token.access_token, expires_in: token.expires_in }) + '\n');
