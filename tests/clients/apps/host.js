// The test host's page: a chat client's side of MCP Apps, built from the extension's own host
// side (@modelcontextprotocol/ext-apps' AppBridge and PostMessageTransport, bundled by
// scripts/views/build.mjs --host). Each view runs in a sandboxed iframe (scripts only, an opaque
// origin) under the CSP a host builds from the view's declared domains (none), and talks to the
// host only through the bridge; the host forwards its tool calls to the server over its MCP
// connection (the harness's, apps_host.mjs, reached at /rpc).
import {
  AppBridge,
  PostMessageTransport,
  getToolUiResourceUri,
  isToolVisibilityAppOnly,
} from '@modelcontextprotocol/ext-apps/app-bridge';

const CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

async function rpc(method, params) {
  const answer = await fetch('/rpc', {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ method, params }),
  });
  const body = await answer.json();
  if (body.error) throw new Error(`${method}: ${body.error}`);
  return body.result;
}

let tools = [];
window.openedLinks = [];
window.viewCalls = [];

// What a model is shown: every tool but those only views may call.
window.agentTools = async () => {
  tools = (await rpc('tools/list', {})).tools;
  return {
    model: tools.filter((t) => !isToolVisibilityAppOnly(t)).map((t) => t.name),
    appOnly: tools.filter((t) => isToolVisibilityAppOnly(t)).map((t) => t.name),
    views: Object.fromEntries(tools.filter((t) => getToolUiResourceUri(t)).map((t) => [t.name, getToolUiResourceUri(t)])),
  };
};

// The agent calls a tool; a tool with a view has it shown beside the call (as `key`), given
// the call's input first and its result once it answers.
window.runTool = async (name, args, options = {}) => {
  const tool = tools.find((t) => t.name === name);
  const uri = tool && getToolUiResourceUri(tool);
  const bridge = uri && options.view ? await mount(options.view, uri) : null;
  if (bridge) await bridge.sendToolInput({ arguments: args });
  const result = await rpc('tools/call', { name, arguments: args });
  if (bridge) await bridge.sendToolResult(result);
  return result;
};

async function mount(key, uri) {
  const read = await rpc('resources/read', { uri });
  const content = read.contents[0];
  const section = document.createElement('section');
  section.innerHTML = `<h2>${key} <small>${uri} · ${content.mimeType}</small></h2>`;
  const frame = document.createElement('iframe');
  frame.id = key;
  frame.title = uri;
  frame.setAttribute('sandbox', 'allow-scripts');
  section.append(frame);
  document.getElementById('views').append(section);
  const bridge = new AppBridge(
    null,
    { name: 'smol-mcp test host', version: '1' },
    { openLinks: {}, serverTools: {}, logging: {} },
    { hostContext: { theme: 'light', displayMode: 'inline' } },
  );
  bridge.oncalltool = async (params) => {
    window.viewCalls.push({ view: key, name: params.name, arguments: params.arguments });
    return rpc('tools/call', params);
  };
  bridge.onopenlink = async ({ url }) => {
    window.openedLinks.push(url);
    window.open(url, '_blank');
    return {};
  };
  bridge.onsizechange = ({ height }) => {
    if (height) frame.style.height = `${Math.min(height, 900)}px`;
  };
  const initialized = new Promise((resolve) => { bridge.oninitialized = resolve; });
  // Connected before the page is given, so that the view's first message is heard.
  await bridge.connect(new PostMessageTransport(frame.contentWindow, frame.contentWindow));
  frame.srcdoc = content.text.replace(
    '<head>',
    `<head><meta http-equiv="Content-Security-Policy" content="${CSP}">`,
  );
  await initialized;
  return bridge;
}
