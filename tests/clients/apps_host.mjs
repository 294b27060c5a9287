// A chat client that shows MCP Apps, in a real browser: the official TypeScript SDK (1.32.2)
// connects to smol-mcp over stdio declaring the io.modelcontextprotocol/ui extension (and no
// elicitation), serves the host page (apps/host.js, built on ext-apps' AppBridge) to Debian's
// Chromium driven by playwright-core, and plays an agent and the person beside it on a machine
// of the nested engine: the machines view lists it and opens its published port's page; a
// question about its egress shows in the egress view, a click answers it and the asking call
// completes with that answer; the terminal view shows what the agent's command printed, and
// what the person types reaches the program. Screenshots of each view go to plan.shots.
// Usage: node apps_host.mjs PLAN_JSON; PLAN_JSON: {"server", "env", "hostPage" (the bundled
// host.js), "chromium", "shots", "hostPort" (a service on the host the guest reaches at
// 10.0.2.2), "machine"}. Prints one JSON report: {"ok", "problems": [...], ...what it saw}.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { stdioTransport } from './ts_stdio.mjs';
import { chromium } from 'playwright-core';
import { createServer } from 'node:http';
import { readFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';

const plan = JSON.parse(process.argv[2]);
const UI = 'io.modelcontextprotocol/ui';
const SERVICE_PORT = 8000;
const SERVICE_COMMAND =
  "nohup sh -c 'while true; do printf \"HTTP/1.0 200 OK\\r\\nContent-Type: text/plain\\r\\n\\r\\nhello from the guest\\n\" " +
  "| nc -l -p 8000; done' >/dev/null 2>&1 </dev/null &";
const CALL_TIMEOUT = 15 * 60 * 1000;
const report = { ok: false, problems: [] };
const problem = (text) => report.problems.push(text);
const check = (cond, text) => { if (!cond) problem(text); };

const client = new Client(
  { name: 'smol-mcp-apps-host', version: '0' },
  { capabilities: { extensions: { [UI]: { mimeTypes: ['text/html;profile=mcp-app'] } } } },
);
await client.connect(stdioTransport(plan, 'inherit'));
report.serverDeclares = client.getServerCapabilities()?.extensions?.[UI] !== undefined;

const hostScript = readFileSync(plan.hostPage, 'utf8');
const page = `<!doctype html><meta charset="utf-8"><title>smol-mcp test host</title>
<style>body{font:14px system-ui;margin:16px;background:#eef0f3}section{margin:0 0 16px}
h2{font-size:13px;margin:0 0 4px}h2 small{color:#666;font-weight:normal}
iframe{width:860px;height:200px;border:1px solid #ccd;border-radius:10px;background:#fff}</style>
<div id="views"></div><script>${hostScript.replaceAll('</script', '<\\/script')}</script>`;
const http = createServer(async (req, res) => {
  if (req.method === 'GET' && req.url === '/') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(page);
    return;
  }
  if (req.url === '/favicon.ico') {
    // Asked by the browser for the host page itself; the host has none.
    res.writeHead(204);
    res.end();
    return;
  }
  if (req.method === 'POST' && req.url === '/rpc') {
    let body = '';
    for await (const chunk of req) body += chunk;
    const { method, params } = JSON.parse(body);
    let answer;
    try {
      const options = { timeout: CALL_TIMEOUT };
      if (method === 'tools/list') answer = { result: await client.listTools(params, options) };
      else if (method === 'tools/call') answer = { result: await client.callTool(params, undefined, options) };
      else if (method === 'resources/read') answer = { result: await client.readResource(params, options) };
      else answer = { error: `the test host forwards no ${method}` };
    } catch (e) {
      answer = { error: String(e.message ?? e) };
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(answer));
    return;
  }
  res.writeHead(404);
  res.end();
});
await new Promise((r) => http.listen(0, '127.0.0.1', r));
const origin = `http://127.0.0.1:${http.address().port}`;

mkdirSync(plan.shots, { recursive: true });
const browser = await chromium.launch({ executablePath: plan.chromium, args: ['--no-sandbox'] });
const context = await browser.newContext({ viewport: { width: 900, height: 900 } });
const tab = await context.newPage();
// Every request the host page and its views make: the views' must be none beyond the page.
const requests = [];
tab.on('request', (r) => requests.push(r.url()));
const consoleErrors = [];
tab.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
tab.on('pageerror', (e) => consoleErrors.push(String(e)));
const name = plan.machine;
const structured = (r) => r.structuredContent ?? {};
const agent = async (tool, args) => {
  const r = await tab.evaluate(([t, a]) => window.runTool(t, a), [tool, args]);
  if (r.isError) throw new Error(`${tool}: ${(r.content ?? []).map((c) => c.text).join(' ')}`);
  return structured(r);
};
const shot = async (view) => {
  const file = join(plan.shots, `${view}.png`);
  await tab.locator(`#${view}`).screenshot({ path: file });
  return file;
};

try {
  await tab.goto(origin);
  const seen = await tab.evaluate(() => window.agentTools());
  report.tools = seen;
  check(!seen.model.includes('view-state'), 'view-state is shown to the model');
  check(seen.appOnly.includes('view-state'), 'view-state is not app-only');
  await agent('create-machine', { name, network: 'ask', cpus: 1, memoryMb: 256 });
  await agent('run-command', { name, command: SERVICE_COMMAND });
  const published = await agent('publish-port', { name, port: SERVICE_PORT });
  report.published = published.url;

  // The terminal view: what the agent's command printed, then what the person types.
  const opening = await tab.evaluate(
    ([n]) => window.runTool('terminal', { name: n, command: 'sh', screen: true }, { view: 'terminal' }),
    [name],
  );
  const terminal = structured(opening).terminal;
  report.terminal = terminal;
  await agent('terminal', { name, terminal, input: 'echo printed-by-the; echo agent-$((6*7))', keys: ['enter'] });
  const screen = tab.frameLocator('#terminal').locator('#screen');
  await screen.locator('text=agent-42').waitFor({ timeout: 60000 });
  await screen.click();
  await tab.keyboard.type('echo person-$((7*6))', { delay: 20 });
  await tab.keyboard.press('Enter');
  await screen.locator('text=/^person-42$/m').first().waitFor({ timeout: 60000 }).catch(() => {});
  report.screenText = await screen.innerText();
  report.screens = { terminal: await shot('terminal') };
  const read = await agent('terminal', { name, terminal, waitMs: 500 });
  report.agentReads = read.output;

  // The egress view: the asking call waits while the question shows; a click answers it.
  const asking = tab.evaluate(
    ([n, port]) => window.runTool('run-command', {
      name: n,
      command: `wget -q -T 5 -O- http://10.0.2.2:${port}/asked`,
    }, { view: 'egress' }),
    [name, plan.hostPort],
  );
  const egress = tab.frameLocator('#egress');
  const question = egress.locator('.card').first();
  await question.waitFor({ timeout: 120000 });
  report.question = await question.innerText();
  report.screens.egress = await shot('egress');
  await question.locator('button.yes').click();
  const asked = await asking;
  report.askedAnswer = structured(asked).egressAnswer ?? null;
  report.askedExit = structured(asked).exitCode;
  await egress.locator('text=Exit code').waitFor({ timeout: 30000 });
  const after = await agent('run-command', {
    name,
    command: `wget -q -T 10 -O- http://10.0.2.2:${plan.hostPort}/after-yes`,
  });
  report.afterYes = { exitCode: after.exitCode, stdout: after.stdout };

  // The machines view: the machine, running, its open terminal and running job, its port a
  // link the person opens.
  const job = await agent('run-command', { name, command: 'sleep 900', background: true });
  report.job = job.job;
  await tab.evaluate(([n]) => window.runTool('list-machines', {}, { view: 'machines' }), [name]);
  const machines = tab.frameLocator('#machines');
  const row = machines.locator(`tr[data-machine="${name}"]`);
  await row.waitFor({ timeout: 60000 });
  await row.locator(`text=${report.terminal}`).waitFor({ timeout: 60000 });
  report.machinesRow = await row.innerText();
  const popup = context.waitForEvent('page', { timeout: 60000 });
  report.screens.machines = await shot('machines');
  await row.locator('[data-url]').first().click();
  const opened = await popup;
  await opened.waitForLoadState('domcontentloaded');
  report.openedUrl = opened.url();
  report.openedText = (await opened.textContent('body'))?.trim();
  await opened.close();

  report.viewCalls = await tab.evaluate(() => window.viewCalls.map((c) => `${c.view}:${c.name}`));
  report.openedLinks = await tab.evaluate(() => window.openedLinks);
  report.foreignRequests = requests.filter((u) => !u.startsWith(origin) && !u.startsWith('about:') && !u.startsWith('data:'));
  report.consoleErrors = consoleErrors;
  await agent('delete-machine', { name });
  report.ok = report.problems.length === 0;
} catch (e) {
  problem(`stopped: ${e.stack ?? e}`);
  report.consoleErrors = consoleErrors;
  await tab.screenshot({ path: join(plan.shots, 'stopped.png'), fullPage: true }).catch(() => {});
  await client.callTool({ name: 'delete-machine', arguments: { name } }).catch(() => {});
} finally {
  await browser.close().catch(() => {});
  http.close();
  await client.close().catch(() => {});
}
console.log(JSON.stringify(report));
process.exit(0);
