// The terminal view, beside terminal: the screen the program painted (the server's terminal
// emulator model, as screen: true gives the agent), followed as the program prints. Read-only
// until the person clicks the screen and types: each key goes to the program through
// view-state, as the agent's typing does, and reading here never moves the agent's cursor.
import { connect, text } from './bridge.js';

const view = document.getElementById('view');
let machine = '';
let target;
let terminal = '';
let printed = 0;
let following = false;
let typed = '';
let flush = null;

const host = connect('terminal', {
  toolInput(args) {
    machine = args.name || '';
    target = args.target;
    if (args.terminal) terminal = args.terminal;
  },
  toolResult(r) {
    const s = r.structuredContent || {};
    if (s.terminal) terminal = s.terminal;
    if (!following && terminal && machine) follow();
  },
});

function args(extra) {
  const a = { view: 'terminal', name: machine, terminal, ...extra };
  if (target) a.target = target;
  return a;
}

async function follow() {
  following = true;
  let state = await show(host.tool('view-state', args({})));
  while (state && !state.ended) {
    state = await show(host.tool('view-state', args({ after: printed })));
  }
}

async function show(call) {
  try {
    const state = await call;
    printed = state.printed;
    render(state);
    return state;
  } catch (e) {
    view.insertAdjacentHTML('beforeend', `<p class="error">${text(e.message)}</p>`);
    return null;
  }
}

function render(state) {
  const screen = state.screen || { rows: [], cursor: [0, 0] };
  const [cr, cc] = screen.cursor;
  const rows = screen.rows.map((row, r) => {
    if (r !== cr || state.ended) return text(row);
    const padded = row.padEnd(cc + 1, ' ');
    return text(padded.slice(0, cc)) + `<span class="cursor">${text(padded[cc])}</span>`
      + text(padded.slice(cc + 1));
  }).join('\n');
  const focused = document.activeElement && document.activeElement.id === 'screen';
  view.innerHTML = `<h1>${text(screen.title || 'Terminal')} <small>${text(state.machine)} · `
    + `${text(state.terminal)}${state.ended ? ` · ${text(state.ended)}` : ''}</small></h1>`
    + `<pre id="screen" class="screen" tabindex="0" aria-label="terminal screen">${rows}</pre>`
    + `<p class="quiet">${state.ended ? 'The program ended.' : 'Click the screen and type to send keys to the program.'}</p>`;
  if (focused) document.getElementById('screen').focus();
}

const NAMED = { Enter: 'enter', Tab: 'tab', Escape: 'escape', Backspace: 'backspace',
  Delete: 'delete', ArrowUp: 'up', ArrowDown: 'down', ArrowLeft: 'left', ArrowRight: 'right',
  Home: 'home', End: 'end', PageUp: 'pageup', PageDown: 'pagedown' };

// Keys typed within a moment go in one call; a named key ends the batch.
function send(input, key) {
  typed += input;
  clearTimeout(flush);
  const go = () => {
    const extra = {};
    if (typed) extra.input = typed;
    if (key) extra.keys = [key];
    typed = '';
    show(host.tool('view-state', args(extra)));
  };
  if (key) go(); else flush = setTimeout(go, 80);
}

view.addEventListener('keydown', (event) => {
  if (event.target.id !== 'screen' || !terminal) return;
  if (event.ctrlKey && /^[a-z]$/i.test(event.key)) {
    send('', `ctrl-${event.key.toLowerCase()}`);
  } else if (NAMED[event.key]) {
    send('', NAMED[event.key]);
  } else if (event.key.length === 1) {
    send(event.key, null);
  } else {
    return;
  }
  event.preventDefault();
});

host.ready.then(() => {
  if (!terminal) view.innerHTML = '<p class="quiet">Waiting for the terminal to open…</p>';
});
