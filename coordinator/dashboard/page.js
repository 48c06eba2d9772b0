// The dashboard's script (coordinator/dashboard/page.py inlines it): poll /api/state, draw, open episodes.
let chosen = null;   // {split, iteration} picked in the grid's selector; null: the live rollout
let openEpisode = null;
function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') node.className = v; else if (k === 'text') node.textContent = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v); else node.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined)
    node.append(typeof kid === 'string' || typeof kid === 'number' ? String(kid) : kid);
  return node;
}
function dur(s) {
  if (s === null || s === undefined) return '?';
  s = Math.round(s);
  if (s >= 3600) return Math.floor(s / 3600) + 'h' + String(Math.floor(s % 3600 / 60)).padStart(2, '0') + 'm';
  if (s >= 60) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
  return s + 's';
}
function pct(x) { return x === null || x === undefined ? '-' : (100 * x).toFixed(1) + ' %'; }
function num(x, d) { return x === null || x === undefined ? '-' : Number(x).toFixed(d); }
function fill(id, ...kids) { document.getElementById(id).replaceChildren(...kids.filter(k => k !== null)); }

function renderRun(s) {
  const run = s.run;
  const phases = run.phases.length ? run.phases.map(p => p.phase + ' (rank ' + p.rank + ')').join(', ') : 'none running';
  const marks = Object.entries(run.markers).map(([k, v]) => k + (v ? ': ' + v : '')).join('; ');
  const rows = [el('tr', {}, el('th', {text: 'iteration'}), el('td', {id: 'iteration', text: run.iteration ?? '-'})),
    el('tr', {}, el('th', {text: 'phase'}), el('td', {id: 'phase', text: phases})),
    el('tr', {}, el('th', {text: 'done this iteration'}), el('td', {text: marks || '-'}))];
  const nodes = run.nodes.length ? el('table', {},
    el('tr', {}, ...['rank', 'host', 'pid', 'heartbeat #', 'unchanged for'].map(h => el('th', {text: h}))),
    ...run.nodes.map(n => el('tr', {class: n.late ? 'trouble' : ''}, el('td', {text: n.rank}), el('td', {text: n.host}),
      el('td', {text: n.pid}), el('td', {text: n.seq}), el('td', {text: dur(n.quiet_s)}))))
    : el('p', {class: 'muted', text: 'one node (no cluster/ heartbeats on this log path)'});
  fill('run', el('h2', {text: 'Run'}), el('table', {}, ...rows), el('h2', {text: 'Nodes'}), nodes);
}

function renderTroubles(s) {
  if (!s.troubles.length) { fill('troubles', el('h2', {}, 'Trouble: ', el('span', {class: 'ok', text: 'none seen'}))); return; }
  fill('troubles', el('h2', {text: 'Trouble (' + s.troubles.length + ')'}), ...s.troubles.map(t =>
    el('div', {class: 'trouble'}, el('b', {text: (t.rank === null ? '' : 'rank ' + t.rank + ': ') + t.what}),
      el('div', {class: 'fix', text: 'what to do: ' + t.fix}))));
}

function renderRollouts(s) {
  const head = ['rank', 'split', 'iter', 'finished', 'planned', 'successes', 'running', 'failed', 'replies cut', 'tokens/s', 'elapsed', 'ETA'];
  const rows = s.rollouts.map(r => el('tr', {},
    el('td', {text: r.rank ?? 0}), el('td', {text: r.split ?? '?'}), el('td', {text: r.iteration ?? '?'}),
    el('td', {class: 'finished', text: r.finished}), el('td', {class: 'planned', text: r.todo + (r.resumed ? ' (+' + r.resumed + ' resumed)' : '')}),
    el('td', {text: r.successes + (r.finished ? ' (' + (100 * r.successes / r.finished).toFixed(1) + ' %)' : '')}),
    el('td', {text: r.running}), el('td', {text: Object.values(r.failures).reduce((a, b) => a + b, 0)}),
    el('td', {class: 'truncated', text: r.truncated_turns ?? 0}), el('td', {text: num(r.tokens_per_s, 1)}), el('td', {text: dur(r.elapsed_s)}), el('td', {text: r.done ? 'done' : dur(r.eta_s)})));
  const planned = s.rollouts.reduce((a, r) => a + r.todo, 0), finished = s.rollouts.reduce((a, r) => a + r.finished, 0);
  const t = s.training;
  const train = t ? el('p', {}, el('span', {class: 'k', text: 'update (iteration ' + t.iteration + '): '}),
    'step ' + t.step + '/' + t.total_steps + ', loss ' + num(t.loss, 4) + ', ' + dur(t.elapsed_s) + ' elapsed, ETA ' + dur(t.remaining_s)) : null;
  fill('rollouts', el('h2', {}, 'Rollouts: ', el('span', {id: 'finished-total', text: finished}), ' of ',
      el('span', {id: 'planned-total', text: planned}), ' episodes finished'),
    s.rollouts.length ? el('table', {}, el('tr', {}, ...head.map(h => el('th', {text: h}))), ...rows)
      : el('p', {class: 'muted', text: 'no rollout has started on this log path yet (no status.json)'}), train);
}

function cellClass(c) {
  if (c.state === 'done') return c.success ? 'success' : 'nosuccess';
  return c.state;
}
function renderGrid(s) {
  const g = s.grid;
  const select = el('select', {id: 'rollout-choice', onchange: e => {
    const [split, iteration] = e.target.value.split(':'); chosen = {split, iteration: Number(iteration)}; poll(); }});
  for (const c of g.choices) {
    const opt = el('option', {value: c.split + ':' + c.iteration, text: c.split + ' rollout, iteration ' + c.iteration});
    if (c.split === g.split && c.iteration === g.iteration) opt.selected = true;
    select.append(opt);
  }
  const legend = el('div', {class: 'legend'}, ...[['waiting', 'waiting'], ['setup', 'setup'], ['generating', 'generating'],
    ['env', 'in the environment'], ['scoring', 'scoring'], ['success', 'success'], ['nosuccess', 'done, no success'],
    ['failed', 'failed']].map(([c, t]) => el('span', {}, el('span', {class: 'cell ' + c}), ' ' + t)));
  const rows = g.ranks.map(r => el('div', {class: 'rankrow'},
    el('div', {class: 'label'}, el('b', {text: 'rank ' + r.rank}), ' ' + r.cells.filter(c => c.state === 'done' || c.state === 'failed').length +
      '/' + r.planned + (r.live ? ' (live)' : ' (journal)')),
    el('div', {class: 'cells'}, ...r.cells.map(c => el('div', {
      class: 'cell ' + cellClass(c) + (openEpisode === c.episode_id ? ' chosen' : ''), 'data-episode': c.episode_id,
      'data-state': c.state, title: c.episode_id + ': ' + c.state + ', step ' + c.step + (c.reward === null || c.reward === undefined ? '' : ', reward ' + c.reward),
      text: c.state === 'waiting' ? '' : (c.state === 'done' || c.state === 'failed' ? num(c.reward, 1) : c.step),
      onclick: () => showEpisode(g.split, g.iteration, c.episode_id)})))));
  fill('grid', el('h2', {}, 'Episodes ', select), legend,
    ...(rows.length ? rows : [el('p', {class: 'muted', text: 'no episodes yet'})]));
}

function renderIterations(s) {
  const head = ['iteration', 'policy', 'train success', 'held-out success', 'loss', 'steps', 'update', 'seconds per phase'];
  const rows = s.iterations.slice().reverse().map(r => el('tr', {},
    el('td', {text: r.iteration}), el('td', {text: r.served_version === null || r.served_version === undefined ? 'base' : 'v' + r.served_version}),
    el('td', {text: pct(r.train_success_rate) + (r.train_episodes ? ' (' + r.train_episodes + ')' : '')}),
    el('td', {text: pct(r.eval_success_rate) + (r.eval_episodes ? ' (' + r.eval_episodes + ')' : '')}),
    el('td', {text: num(r.train_loss, 4)}), el('td', {text: r.training_steps ?? '-'}), el('td', {text: r.update ?? '-'}),
    el('td', {text: Object.entries(r.phase_s || {}).map(([k, v]) => k + ' ' + dur(v)).join(', ')})));
  fill('iterations', el('h2', {text: 'Iterations'}), rows.length ? el('table', {}, el('tr', {}, ...head.map(h => el('th', {text: h}))), ...rows)
    : el('p', {class: 'muted', text: 'no iteration finished yet (metrics.jsonl has no iteration record)'}));
}

function renderCharts(s) {
  const box = el('div', {class: 'charts'});
  box.innerHTML = s.charts.map(c => c.svg).join('');   // drawn and escaped by the server
  fill('charts', el('h2', {text: 'Curves'}), box);
}

function block(label, value) {
  if (value === null || value === undefined || value === '') return null;
  return el('div', {}, el('div', {class: 'k', text: label}), el('pre', {text: typeof value === 'string' ? value : JSON.stringify(value, null, 2)}));
}
async function showEpisode(split, iteration, id) {
  openEpisode = id;
  const q = new URLSearchParams({split, iteration, id});
  const reply = await fetch('/api/episode?' + q);
  if (!reply.ok) {
    fill('episode', el('h2', {text: 'Episode ' + id}), el('p', {class: 'muted', text: 'not in the journal yet: it is still running'}));
    return;
  }
  const t = await reply.json();
  const turns = t.turns.map(turn => el('div', {class: 'turn'},
    el('b', {text: 'turn ' + turn.index + (turn.reward === null || turn.reward === undefined ? '' : ', reward ' + turn.reward) +
      (turn.invalid_action ? ', invalid action' : '') + (turn.finish_reason === 'length' ? ', reply cut at the token limit' : '')}),
    // the screenshots the model was shown with this turn's prompt: what it saw before it replied
    el('div', {}, ...(turn.images || []).map(p => el('img', {src: '/files/' + p.split('/').map(encodeURIComponent).join('/'), alt: p}))),
    block('messages', turn.messages.map(m => m.role + ': ' + (typeof m.content === 'string' ? m.content : JSON.stringify(m.content))).join('\n\n')),
    block('response', turn.response), block('the environment saw (the reply after its reasoning)', turn.env_reply === '' ? '(nothing: the reasoning never ended)' : turn.env_reply),
    block('action', turn.action), block('observation', turn.observation)));
  fill('episode', el('h2', {text: 'Episode ' + t.episode_id}),
    el('p', {}, 'task ' + t.task_id + ' (' + (t.env || '?') + (t.family ? ', ' + t.family : '') + '), status ' + t.status +
      ', reward ' + t.reward + ', success ' + t.success + (t.error ? ', error: ' + t.error : '') +
      (t.info && t.info.truncated ? ' (' + t.info.truncated + ')' : '') + ' — ' + t.journal),
    ...turns);
  document.getElementById('episode').scrollIntoView({block: 'nearest'});
}

async function poll() {
  const q = chosen ? '?' + new URLSearchParams(chosen) : '';
  try {
    const reply = await fetch('/api/state' + q);
    const s = await reply.json();
    renderRun(s); renderTroubles(s); renderRollouts(s); renderGrid(s); renderIterations(s); renderCharts(s);
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById('updated').textContent = 'the dashboard does not answer (' + e + '); retrying';
  }
}
poll();
setInterval(poll, POLL_MS);
