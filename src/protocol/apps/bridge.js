// The view's side of MCP Apps (SEP-1865): JSON-RPC 2.0 with the host over postMessage. Written
// here rather than taken from @modelcontextprotocol/ext-apps' App, whose bundle (the MCP client
// and zod with it) made each view 650 KB; the host side the tests run is the package's own
// AppBridge, which checks every message this sends against the extension's schemas.
// PROTOCOL_VERSION is the package's LATEST_PROTOCOL_VERSION, put in by scripts/views/build.mjs.

/* global PROTOCOL_VERSION */

// A request the host does not answer within this is given up (a tool call the host forwards
// waits on the server, and view-state's longest wait is 20 s).
const ANSWER_WITHIN_MS = 60000;

export function connect(name, on) {
  const host = window.parent;
  const waiting = new Map();
  let next = 1;
  const send = (message) => host.postMessage({ jsonrpc: '2.0', ...message }, '*');
  const request = (method, params) =>
    new Promise((resolve, reject) => {
      const id = next++;
      const timer = setTimeout(() => {
        waiting.delete(id);
        reject(new Error(`${method}: no answer from the host in ${ANSWER_WITHIN_MS / 1000} s`));
      }, ANSWER_WITHIN_MS);
      waiting.set(id, { resolve, reject, timer });
      send({ id, method, params });
    });
  const notify = (method, params) => send({ method, params });
  const handlers = {
    'ui/notifications/tool-input': (p) => on.toolInput && on.toolInput(p.arguments || {}),
    'ui/notifications/tool-result': (p) => on.toolResult && on.toolResult(p),
    'ui/notifications/tool-cancelled': (p) => on.toolCancelled && on.toolCancelled(p),
    'ui/notifications/host-context-changed': (p) => theme(p),
  };
  window.addEventListener('message', (event) => {
    if (event.source !== host) return;
    const m = event.data;
    if (!m || m.jsonrpc !== '2.0') return;
    if (m.id !== undefined && m.method === undefined) {
      const w = waiting.get(m.id);
      if (!w) return;
      waiting.delete(m.id);
      clearTimeout(w.timer);
      if (m.error) w.reject(new Error(m.error.message || 'the host refused'));
      else w.resolve(m.result);
      return;
    }
    if (m.id !== undefined) {
      // Requests from the host: a ping, or the view about to go (nothing to keep).
      if (m.method === 'ping' || m.method === 'ui/resource-teardown') {
        if (m.method === 'ui/resource-teardown' && on.teardown) on.teardown();
        send({ id: m.id, result: {} });
      } else {
        send({ id: m.id, error: { code: -32601, message: `${m.method} is not handled by this view` } });
      }
      return;
    }
    const handle = handlers[m.method];
    if (handle) handle(m.params || {});
  });
  const ready = request('ui/initialize', {
    protocolVersion: PROTOCOL_VERSION,
    appInfo: { name: `smol-mcp ${name}`, version: '1' },
    appCapabilities: {},
  }).then((answer) => {
    theme((answer && answer.hostContext) || {});
    notify('ui/notifications/initialized', {});
    sizeFollowsContent(notify);
    return answer;
  });
  return {
    ready,
    // A tool of this server, called by the host on its connection: its structured result, or
    // an Error with the tool's own words.
    async tool(toolName, args) {
      await ready;
      const result = await request('tools/call', { name: toolName, arguments: args });
      if (result.isError) {
        const text = (result.content || []).map((c) => c.text || '').join(' ');
        throw new Error(text || `${toolName} failed`);
      }
      return result.structuredContent || {};
    },
    openLink: async (url) => {
      await ready;
      return request('ui/open-link', { url });
    },
  };
}

function theme(context) {
  if (context.theme === 'dark' || context.theme === 'light') {
    document.documentElement.dataset.theme = context.theme;
  }
}

function sizeFollowsContent(notify) {
  let last = '';
  const measure = () => {
    const height = Math.ceil(document.documentElement.getBoundingClientRect().height);
    const width = Math.ceil(window.innerWidth);
    const now = `${width}x${height}`;
    if (now !== last) {
      last = now;
      notify('ui/notifications/size-changed', { width, height });
    }
  };
  new ResizeObserver(measure).observe(document.body);
  measure();
}

// Text made safe to put in the page, in an element or in a quoted attribute: what a view shows
// comes in part from the guest (a destination its program tried, a screen it painted), and a
// quote let through would let the guest add an attribute (an event handler) to the view, and
// with it answer its own egress question.
const ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export function text(value) {
  return String(value == null ? '' : value).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}
