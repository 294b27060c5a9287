// The egress view, beside run-command: while the command runs, the questions about where the
// user's machines may connect wait here for the person (a client that shows views but no forms
// puts them on the server's board); a click answers one, with the state the server sealed for
// it, and the waiting command goes on with the answer. Once the command answers, its exit code
// and what the person allowed are shown.
import { connect, text } from './bridge.js';

const POLL_MS = 1000;
const view = document.getElementById('view');
let command = '';
let machine = '';
let result = null;
let questions = [];
let note = '';

const host = connect('egress', {
  toolInput(args) {
    command = Array.isArray(args.command) ? args.command.join(' ') : String(args.command || '');
    machine = args.name || '';
    render();
  },
  toolResult(r) {
    result = r.structuredContent || {};
    poll();
  },
});

async function poll() {
  try {
    const state = await host.tool('view-state', { view: 'egress' });
    questions = state.questions || [];
  } catch (e) {
    note = e.message;
  }
  render();
}

async function answer(id, allow) {
  const q = questions.find((x) => x.question === id);
  if (!q) return;
  const card = view.querySelector(`[data-question="${id}"]`);
  const allowed = allow
    ? [...card.querySelectorAll('input[type=checkbox]:checked')].map((c) => c.value)
    : [];
  try {
    const state = await host.tool('view-state', {
      view: 'egress',
      answer: { question: q.question, state: q.state, allowed },
    });
    note = state.answered ? (allowed.length ? `Allowed ${allowed.join(', ')}.` : 'Declined.')
      : 'That question was no longer waiting.';
    questions = state.questions || [];
  } catch (e) {
    note = e.message;
  }
  render();
}

function render() {
  const asked = questions.map((q) => `<div class="card" data-question="${text(q.question)}">`
    + `<p>A command in <strong>${text(q.machine)}</strong> tried to reach:</p>`
    + q.destinations.map((d) => `<label class="row"><input type="checkbox" checked value="${text(d)}">`
      + `<code>${text(d)}</code></label>`).join('')
    + '<p class="quiet">A yes lasts for this machine; the agent cannot widen it itself.</p>'
    + `<div class="row"><button class="yes" data-allow="${text(q.question)}">Allow</button>`
    + `<button class="no" data-decline="${text(q.question)}">Decline</button></div></div>`).join('');
  let done = '';
  if (result) {
    const a = result.egressAnswer;
    done = `<p>Exit code <strong>${text(result.exitCode ?? '—')}</strong>`
      + (a ? `; allowed: ${text((a.allowed || []).join(', ') || 'none')}` : '') + '</p>';
  }
  view.innerHTML = `<h1>Egress <small>${text(machine)}</small></h1>`
    + (command ? `<p><code>${text(command)}</code></p>` : '')
    + (asked || `<p class="quiet">${result ? 'No questions waiting.' : 'Running; no question waiting.'}</p>`)
    + (note ? `<p>${text(note)}</p>` : '')
    + done;
}

view.addEventListener('click', (event) => {
  const allow = event.target.closest('[data-allow]');
  const decline = event.target.closest('[data-decline]');
  if (allow) answer(allow.dataset.allow, true);
  if (decline) answer(decline.dataset.decline, false);
});

host.ready.then(() => {
  render();
  poll();
  // Until the command answers: a question is asked only while it runs.
  const timer = setInterval(() => (result ? clearInterval(timer) : poll()), POLL_MS);
});
