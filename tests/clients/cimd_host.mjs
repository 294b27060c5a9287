// The clients' Client ID Metadata Documents (draft-ietf-oauth-client-id-metadata-document, MCP's
// registration without registration), served over HTTPS on loopback, as a client's web site
// serves its own: each document's client_id is its own URL. The certificate is self-signed,
// made at start with openssl; its PEM file is what the provider is told to trust.
//
// Argument: a JSON plan {"clients": {"<name>": {<metadata but client_id>}}} served at
// /clients/<name>.json. Prints {"origin", "ca", "urls": {name: url}} once it listens, then one
// line {"fetched": path, "from": address} for each request, until its stdin closes.
import https from 'node:https';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const plan = JSON.parse(process.argv[2] ?? '{}');
const dir = mkdtempSync(join(tmpdir(), 'cimd-'));
const key = join(dir, 'key.pem');
const cert = join(dir, 'cert.pem');
execFileSync('openssl', [
  'req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1',
  '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1',
  '-keyout', key, '-out', cert,
], { stdio: 'ignore' });

let origin = '';
const server = https.createServer({ key: readFileSync(key), cert: readFileSync(cert) }, (req, res) => {
  process.stdout.write(JSON.stringify({ fetched: req.url, from: req.socket.remoteAddress }) + '\n');
  const name = /^\/clients\/([a-z0-9-]+)\.json$/.exec(req.url)?.[1];
  const metadata = name && plan.clients?.[name];
  if (!metadata) {
    res.writeHead(404).end();
    return;
  }
  const url = `${origin}/clients/${name}.json`;
  res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'max-age=60' });
  res.end(JSON.stringify({ client_id: metadata.client_id ?? url, ...metadata }));
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
origin = `https://127.0.0.1:${server.address().port}`;
const urls = Object.fromEntries(Object.keys(plan.clients ?? {}).map((n) => [n, `${origin}/clients/${n}.json`]));
process.stdout.write(JSON.stringify({ origin, ca: cert, urls }) + '\n');
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
