// The machines view, beside list-machines: the user's machines as view-state lists them (the
// same ownership check as the tool's), refreshed while shown; a published port opens through
// the host (ui/open-link), as a link in a sandboxed view must.
import { connect, text } from './bridge.js';

const REFRESH_MS = 10000;
const view = document.getElementById('view');
let target;
let shown = null;

const host = connect('machines', {
  toolInput(args) {
    target = args.target;
    refresh();
  },
  toolResult() {
    refresh();
  },
});

async function refresh() {
  try {
    const args = { view: 'machines' };
    if (target) args.target = target;
    shown = await host.tool('view-state', args);
    render();
  } catch (e) {
    view.innerHTML = `<p class="error">${text(e.message)}</p>`;
  }
}

function render() {
  const machines = shown.machines || [];
  const rows = machines.map((m) => {
    const ports = m.ports.map((p) => (p.url
      ? `<button class="link" data-url="${text(p.url)}"><span class="nowrap">${text(p.guest)} →</span> ${text(p.url)}</button>`
      : `${text(p.guest)} (not placed)`)).join('<br>');
    const jobs = m.jobs.map((j) => `<code>${text(j.job)}</code> ${text(j.command)}`).join('<br>');
    const terminals = m.terminals.map((t) => `<code>${text(t)}</code>`).join(' ');
    return `<tr data-machine="${text(m.name)}"><td class="name"><strong>${text(m.name)}</strong><br>`
      + `<span class="quiet">${text(m.image || 'bundled Alpine')}</span></td>`
      + `<td class="state ${text(m.state)}">${text(m.state)}</td>`
      + `<td>${text(m.cost || (m.target === 'local' ? 'free (local)' : '—'))}</td>`
      + `<td>${ports || '<span class="quiet">none</span>'}</td>`
      + `<td>${terminals || '<span class="quiet">none</span>'}</td>`
      + `<td>${jobs || '<span class="quiet">none</span>'}</td></tr>`;
  }).join('');
  const more = shown.more ? `<p class="quiet">and ${text(shown.more)} more not listed</p>` : '';
  view.innerHTML = `<h1>Machines <small>${text(machines.length)} of yours</small></h1>`
    + (machines.length
      ? `<table><thead><tr><th>machine</th><th>state</th><th>cost so far</th><th>published ports</th>`
        + `<th>terminals</th><th>jobs running</th></tr></thead><tbody>${rows}</tbody></table>`
      : '<p class="quiet">No machines.</p>')
    + more;
}

view.addEventListener('click', (event) => {
  const url = event.target.closest('[data-url]');
  if (url) host.openLink(url.dataset.url).catch((e) => {
    view.insertAdjacentHTML('beforeend', `<p class="error">${text(e.message)}</p>`);
  });
});

host.ready.then(() => {
  if (!shown) refresh();
  setInterval(() => { if (document.visibilityState === 'visible') refresh(); }, REFRESH_MS);
});
