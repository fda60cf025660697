// The trainctl dashboard: one page, four views chosen by the path
// (/ jobs, /jobs/ID a job, /workers workers, /queues queues), each kept current by polling
// the coordinator's JSON endpoints (coordinator/web/dashboard.h) about once a
// second. Charts are Chart.js (vendored, /static/chart.min.js). Every
// server string goes through esc() or textContent.
'use strict';

const POLL_MS = 1000;

function esc(s) {
  return String(s ?? '').replace(/[&<>"']/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c]));
}
const stateName = s => String(s || 'JOB_STATE_UNSPECIFIED').replace(/^(JOB|WORKER)_STATE_/, '');
const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED', 'TIMEOUT']);
const num = v => Number(v || 0);
// Every time on the dashboard in one form, the CLI's: local "2026-12-05
// 17:07:33" (24 h, no locale's AM/PM to wrap a table cell at).
function fmtTime(ts) {
  if (!ts) return '';
  const d = new Date(ts), two = n => String(n).padStart(2, '0');
  if (isNaN(d)) return '';
  return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())} ` +
         `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}
function fmtRate(v) { return v ? num(v).toFixed(1) : '–'; }

async function getJson(url) {
  const res = await fetch(url, {credentials: 'same-origin', cache: 'no-store'});
  if (res.status === 401) { location.href = '/login?next=' + encodeURIComponent(location.pathname); throw new Error('signed out'); }
  const body = await res.json();
  if (!res.ok) throw new Error(body.error || res.statusText);
  return body;
}

function setStatus(text, isError) {
  const el = document.getElementById('status');
  el.textContent = text;
  el.className = isError ? 'error' : 'muted';
}

// Calls fn now and every POLL_MS until it returns false; errors are shown
// and polling goes on (the coordinator may be restarting).
function poll(fn) {
  let stopped = false;
  const tick = async () => {
    let again = true;
    try { again = (await fn()) !== false; setStatus('updated ' + fmtTime(new Date())); }
    catch (e) { setStatus(e.message, true); }
    if (again && !stopped) setTimeout(tick, POLL_MS);
  };
  tick();
  return () => { stopped = true; };
}

// Progress of a job in state `s`: a SUCCEEDED job is full; one that ended
// otherwise shows where it stopped. A job with no known number of epochs (a
// script's) shows the step it reported, of its epoch's steps when it said
// how many; "–" only when it reported no step at all.
function progressCell(p, s) {
  p = p || {};
  const spe = num(p.steps_per_epoch);
  if (!num(p.epochs)) {
    const at = spe ? `epoch ${num(p.epoch) + 1}, step ${num(p.step)}/${spe}`
                   : num(p.step) ? `step ${num(p.step)}` : '';
    if (!at) return '<span class="muted">–</span>';
    return at + (TERMINAL.has(s) && s !== 'SUCCEEDED' ? ' (stopped)' : '');
  }
  const done = s === 'SUCCEEDED';
  const frac = done ? 1 : Math.min(1, (num(p.epoch) + (spe ? num(p.step) / spe : 0)) / num(p.epochs));
  // The width is set by sizeBars (CSSOM): the page's CSP allows no style attributes.
  const bar = `<span class="bar"><span data-frac="${frac.toFixed(4)}"></span></span> `;
  if (done) return bar + `epoch ${num(p.epochs)}/${num(p.epochs)}, done`;
  return bar + `epoch ${num(p.epoch) + 1}/${num(p.epochs)}` + (spe ? `, step ${num(p.step)}/${spe}` : '') +
         (TERMINAL.has(s) ? ' (stopped)' : '');
}

// Rank 0's last reported training loss (a reported 0 too), from the live
// progress or, where that has none, the job's metric summary; "–" when it
// reported no loss.
function lossText(j) {
  const v = j.progress?.last_loss ?? j.metric_summary?.last_loss;
  return v === undefined || v === null ? '–' : num(v).toFixed(4);
}

// Sizes the progress bars under `root` from their data-frac.
function sizeBars(root) {
  root.querySelectorAll('.bar > span[data-frac]').forEach(el => {
    el.style.width = (Number(el.dataset.frac) * 100).toFixed(1) + '%';
  });
}

// A polled table: `url`'s `key` list, one row each (or `empty`), under
// what `banner` (optional) makes of the whole answer.
function tableView(main, title, id, headers, url, key, row, empty, banner) {
  main.innerHTML = `<h1>${title}</h1><div id="${id}-banner"></div><table id="${id}"><thead><tr>` +
    headers.map(h => `<th>${h}</th>`).join('') + '</tr></thead><tbody></tbody></table>';
  poll(async () => {
    const r = await getJson(url);
    document.getElementById(`${id}-banner`).innerHTML = banner ? banner(r) : '';
    const body = document.querySelector(`#${id} tbody`);
    body.innerHTML =
      (r[key] || []).map(row).join('') || `<tr><td colspan="${headers.length}" class="muted">${empty}</td></tr>`;
    sizeBars(body);
  });
}

// --- jobs -------------------------------------------------------------------
function jobsView(main) {
  tableView(main, 'Jobs', 'jobs', ['Job', 'State', 'Progress', 'Samples/s', 'Loss', 'Owner', 'Submitted'],
            '/api/jobs', 'jobs', j => {
    const s = stateName(j.state);
    const p = j.progress || {};
    return `<tr><td><a href="/jobs/${encodeURIComponent(j.id)}">${esc(j.id)}</a></td>` +
      `<td><span class="state ${esc(s)}">${esc(s)}</span> <span class="muted">${esc(j.state_reason)}</span></td>` +
      `<td>${progressCell(p, s)}</td><td>${TERMINAL.has(s) ? '–' : fmtRate(p.samples_per_sec)}</td>` +
      `<td>${esc(lossText(j))}</td><td>${esc(j.owner)}</td>` +
      `<td class="time">${esc(fmtTime(j.submit_time))}</td></tr>`;
  }, 'No jobs yet.');
}

// --- workers ----------------------------------------------------------------
function workersView(main) {
  tableView(main, 'Workers', 'workers', ['Worker', 'Host', 'State', 'Slots (busy/total)', 'Labels', 'Last heartbeat'],
            '/api/workers', 'workers', w => {
    const slots = w.slots || [];
    const kinds = [...new Set(slots.map(s => String(s.kind || '').replace(/^KIND_/, '').toLowerCase()).filter(Boolean))];
    // GPU flavors (Slot.flavor), e.g. "gpu (h100)".
    const flavors = [...new Set(slots.map(s => s.flavor || '').filter(Boolean))];
    if (flavors.length) kinds.push(`(${flavors.join(', ')})`);
    const labels = Object.entries(w.labels || {}).map(([k, v]) => `<span class="label">${esc(k)}=${esc(v)}</span>`).join('');
    return `<tr><td>${esc(w.id)}</td><td>${esc(w.hostname)}</td><td>${esc(stateName(w.state))}</td>` +
      `<td>${(w.busy_slots || []).length}/${slots.length} ${esc(kinds.join(' '))}</td>` +
      `<td>${labels || '<span class="muted">none</span>'}</td><td class="time">${esc(fmtTime(w.last_heartbeat_time))}</td></tr>`;
  }, 'No workers registered.', storeBanner);
}

// --- queues -----------------------------------------------------------------
// "used/nominal" of one slot kind ("-" = unlimited) and what the queue
// borrows beyond its nominal (QueueStatus.borrowed_*, computed by the
// coordinator: coordinator/queues/queue_status.h).
function quotaCell(used, nominal, borrowedSlots, fmt = num) {
  const limited = nominal !== undefined && nominal !== null && num(nominal) >= 0;
  const borrowed = num(borrowedSlots);
  return `${fmt(used)}/${limited ? fmt(nominal) : '-'}` +
    (borrowed ? ` <span class="borrowed">(${fmt(borrowed)} borrowed)</span>` : '');
}
// Bytes in binary units, as `queue describe` writes them ("6 GiB").
function fmtBytes(v) {
  const b = num(v);
  for (const [unit, size] of [['TiB', 2 ** 40], ['GiB', 2 ** 30], ['MiB', 2 ** 20], ['KiB', 2 ** 10]]) {
    if (b >= size) return `${+(b / size).toFixed(1)} ${unit}`;
  }
  return `${b} B`;
}
const fmtCpus = v => String(+num(v).toFixed(3));
// "h100 5/4 (1 borrowed)" per flavor the queue holds a quota for or uses
// (Queue.nominal_gpu_flavors, QueueStatus.used_gpu_flavors / borrowed_gpu_flavors).
function flavorCell(used, nominal, borrowed) {
  const names = [...new Set([...Object.keys(nominal || {}), ...Object.keys(used || {})])].sort();
  if (!names.length) return '<span class="muted">none</span>';
  return names.map(f => `${esc(f)} ${quotaCell((used || {})[f], (nominal || {})[f], (borrowed || {})[f])}`).join(', ');
}

function queuesView(main) {
  tableView(main, 'Queues', 'queues', ['Queue', 'Cohort', 'GPU (used/quota)', 'CPU (used/quota)', 'CPUs (used/quota)',
                                       'Memory (used/quota)', 'GPU flavors (used/quota)', 'Pending jobs',
                                       'Running jobs', 'Max job', 'Default priority'],
            '/api/queues', 'queues', st => {
    const q = st.queue || {};
    return `<tr><td>${esc(q.name)}</td><td>${q.cohort ? esc(q.cohort) : '<span class="muted">none</span>'}</td>` +
      `<td>${quotaCell(st.used_gpu, q.nominal_gpu, st.borrowed_gpu)}</td>` +
      `<td>${quotaCell(st.used_cpu, q.nominal_cpu, st.borrowed_cpu)}</td>` +
      `<td>${quotaCell(st.used_cpus, q.nominal_cpus, st.borrowed_cpus, fmtCpus)}</td>` +
      `<td>${quotaCell(st.used_memory_bytes, q.nominal_memory_bytes, st.borrowed_memory_bytes, fmtBytes)}</td>` +
      `<td>${flavorCell(st.used_gpu_flavors, q.nominal_gpu_flavors, st.borrowed_gpu_flavors)}</td>` +
      `<td>${num(st.pending_jobs)}</td><td>${num(st.running_jobs)}</td>` +
      `<td>${num(q.max_job_size) ? num(q.max_job_size) : '<span class="muted">no limit</span>'}</td>` +
      `<td>${num(q.default_priority)}</td></tr>`;
  }, 'No queues defined: every job runs in one unlimited queue.');
}

// The coordinator's state store, when its writes fail (ListWorkers' store).
function storeBanner(r) {
  const s = r.store || {};
  if (!s.failing) return '';
  return `<p class="alert" id="store-failing">Coordinator store failing since ${esc(fmtTime(s.failing_since))}: ` +
    `${esc(String(s.failed_writes || 0))} writes failed (${esc(s.last_error)}). Workers stay connected; ` +
    'their telemetry waits and job changes are retried.</p>';
}

// --- one job ----------------------------------------------------------------
function lineChart(id, yLabel, datasets, color, xLabel) {
  return new Chart(document.getElementById(id), {
    type: 'line',
    data: {datasets: datasets.map(label => ({label, data: [], pointRadius: 1.5, borderWidth: 1.5, tension: 0.1,
                                             borderColor: color, backgroundColor: color}))},
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
      // x is a step or an epoch: whole numbers, never a tick at epoch 1.5.
      scales: {x: {type: 'linear', ticks: {precision: 0}, title: {display: true, text: xLabel}},
               y: {title: {display: true, text: yLabel}}},
      plugins: {legend: {display: datasets.length > 1}},
    },
  });
}

function jobView(main, id) {
  main.innerHTML = `
    <h1>${esc(id)} <span id="job-state" class="state">…</span></h1>
    <p class="facts"><span id="job-reason" class="muted"></span></p>
    <p class="facts"><span id="job-progress"></span><span id="job-rate"></span><span id="job-eta"></span><span id="job-owner"></span><span id="job-lineage"></span></p>
    <p class="facts" id="job-model" hidden>Final model <code id="job-model-path"></code>
       <span id="job-model-worker" class="muted"></span> fetch it with <code id="job-model-fetch"></code></p>
    <div class="charts" id="charts"><p class="muted" id="no-metrics">No metrics reported yet.</p></div>
    <h2>Events</h2>
    <table id="events"><thead><tr><th>#</th><th>Time</th><th>Attempt</th><th>Rank</th><th>Event</th><th>State</th><th>Message</th></tr></thead><tbody></tbody></table>
    <h2>Logs</h2>
    <p>Attempt <select id="log-attempt"></select> Rank <select id="log-rank"></select>
       <span class="muted">(last 500 lines, refreshed while the job runs)</span></p>
    <pre class="logs" id="logs"></pre>`;
  // A chart appears with the first point of what it shows: a job that
  // reports no throughput (a command job) gets no empty throughput chart,
  // and each custom scalar (trainctl.report(val_f1=...)) gets its own.
  const charts = new Map();
  const COLORS = ['#8b5cf6', '#ec4899', '#14b8a6', '#64748b', '#ef4444', '#84cc16'];
  let customCharts = 0;
  const chart = (id, title, yLabel, color, xLabel = 'step') => {
    let c = charts.get(id);
    if (c) return c;
    document.getElementById('no-metrics')?.remove();
    const div = document.createElement('div');
    div.className = 'chart';
    const h2 = document.createElement('h2');
    h2.textContent = title;
    const box = document.createElement('div');
    box.className = 'box';
    const canvas = document.createElement('canvas');
    canvas.id = id;
    box.appendChild(canvas);
    div.append(h2, box);
    document.getElementById('charts').appendChild(div);
    c = lineChart(id, yLabel, [yLabel], color || COLORS[customCharts++ % COLORS.length], xLabel);
    charts.set(id, c);
    return c;
  };
  const loss = () => chart('loss-chart', 'Training loss (rank 0)', 'loss', '#3b82f6');
  // The engine evaluates at each epoch's end (x: epoch); a script's eval
  // reports (trainctl.report(eval_accuracy=...)) are placed by step.
  const evalChart = (byStep) => {
    const c = byStep ? chart('eval-chart', 'Eval accuracy (rank 0)', 'accuracy', '#16a34a')
                     : chart('eval-chart', 'Eval accuracy (rank 0, per epoch)', 'accuracy', '#16a34a', 'epoch');
    c.options.scales.y.suggestedMin = 0;
    c.options.scales.y.suggestedMax = 1;
    return c;
  };
  const evalLoss = () => chart('eval-loss-chart', 'Eval loss (rank 0)', 'eval loss', '#0ea5e9');
  const rate = () => chart('throughput-chart', 'Throughput (samples/s, all ranks)', 'samples/s', '#f59e0b');
  // Throughput: the ranks' windows summed per (attempt, step).
  const rateByStep = new Map();
  let metricsToken = '';
  let eventsAfter = 0;
  let terminalSeen = false;
  let continuedBy = [];
  let logsWorld = -1, logsAttempts = -1;

  const addPoints = (attempt, points) => {
    for (const p of points) {
      const step = num(p.epoch) * num(p.steps_per_epoch) + num(p.step);
      if (num(p.rank) === 0) {
        for (const [name, v] of Object.entries(p.scalars || {}).sort()) {
          chart('scalar-' + name, `${name} (rank 0)`, name).data.datasets[0].data.push({x: step, y: num(v)});
        }
      }
      if (p.kind === 'KIND_EPOCH_END') {
        if (num(p.rank) === 0 && p.eval) evalChart(false).data.datasets[0].data.push({x: num(p.epoch) + 1, y: num(p.eval.accuracy)});
        continue;
      }
      // A script's evaluation: only what it reported (JSON leaves out the rest).
      if (p.kind === 'KIND_EVAL') {
        if (num(p.rank) === 0 && p.eval?.accuracy !== undefined) evalChart(true).data.datasets[0].data.push({x: step, y: num(p.eval.accuracy)});
        if (num(p.rank) === 0 && p.eval?.loss !== undefined) evalLoss().data.datasets[0].data.push({x: step, y: num(p.eval.loss)});
        continue;
      }
      // A field a point carries is in its JSON (a reported 0 too); one it
      // does not (a script's report that named no loss) is left out.
      if (num(p.rank) === 0 && p.loss !== undefined) loss().data.datasets[0].data.push({x: step, y: num(p.loss)});
      if (!num(p.samples_per_sec)) continue;
      const key = attempt + ':' + step;
      const entry = rateByStep.get(key);
      if (entry) { entry.y += num(p.samples_per_sec); }
      else {
        const point = {x: step, y: num(p.samples_per_sec)};
        rateByStep.set(key, point);
        rate().data.datasets[0].data.push(point);
      }
    }
  };

  const fetchMetrics = async () => {
    // Every page stored so far, then what arrived since (resume_token).
    for (let pages = 0; pages < 50; pages++) {
      const r = await getJson(`/api/jobs/${encodeURIComponent(id)}/metrics?page_token=${encodeURIComponent(metricsToken)}`);
      for (const b of r.batches || []) addPoints(num(b.attempt), b.points || []);
      metricsToken = r.next_page_token || r.resume_token || metricsToken;
      if (!r.next_page_token) break;
    }
    for (const c of charts.values()) c.update();
  };

  const fetchLogs = async () => {
    const att = document.getElementById('log-attempt').value;
    const rank = document.getElementById('log-rank').value;
    const q = new URLSearchParams({tail: '500'});
    if (att) q.set('attempt', att);
    if (rank !== '' && rank !== 'all') q.set('rank', rank);
    const r = await getJson(`/api/jobs/${encodeURIComponent(id)}/logs?${q}`);
    if (r.world_size !== logsWorld || r.attempts !== logsAttempts) {
      logsWorld = r.world_size; logsAttempts = r.attempts;
      const rs = document.getElementById('log-rank'), as = document.getElementById('log-attempt');
      const keepR = rs.value, keepA = as.value;
      rs.innerHTML = '<option value="all">all</option>' + Array.from({length: logsWorld}, (_, i) => `<option>${i}</option>`).join('');
      as.innerHTML = Array.from({length: logsAttempts}, (_, i) => `<option>${logsAttempts - i}</option>`).join('');
      if (keepR) rs.value = keepR;
      if (keepA) as.value = keepA;
    }
    const pre = document.getElementById('logs');
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.textContent = (r.lines || []).map(l => `[${num(l.rank)}] ${l.text}`).join('\n');
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  };
  document.getElementById('log-rank').onchange = () => fetchLogs().catch(e => setStatus(e.message, true));
  document.getElementById('log-attempt').onchange = () => fetchLogs().catch(e => setStatus(e.message, true));

  let tick = 0;
  poll(async () => {
    const r = await getJson(`/api/jobs/${encodeURIComponent(id)}?events_after=${eventsAfter}`);
    const j = r.job, s = stateName(j.state), p = j.progress || {};
    const stateEl = document.getElementById('job-state');
    stateEl.textContent = s;
    stateEl.className = 'state ' + s;
    const reason = document.getElementById('job-reason');
    reason.textContent = j.state_reason || '';
    reason.parentElement.hidden = !j.state_reason;
    document.getElementById('job-progress').innerHTML = progressCell(p, s);
    sizeBars(document.getElementById('job-progress'));
    document.getElementById('job-rate').textContent = p.samples_per_sec ? `${fmtRate(p.samples_per_sec)} samples/s` : '';
    document.getElementById('job-eta').textContent = num(p.eta_seconds) > 0 && !TERMINAL.has(s) ? `ETA ${Math.round(num(p.eta_seconds))} s` : '';
    document.getElementById('job-owner').textContent = j.owner ? `owner ${j.owner}` : '';
    // Lineage: the job this one continues (resume_from) and, once it ended,
    // the jobs that continue it: links.
    const from = (j.spec && j.spec.resume_from && j.spec.resume_from.job) || '';
    const link = id => `<a href="/jobs/${encodeURIComponent(id)}">${esc(id)}</a>`;
    let lineage = from ? `continues ${link(from)}` : '';
    if (TERMINAL.has(s) && !terminalSeen) {
      const all = await getJson('/api/jobs');
      continuedBy = (all.jobs || []).filter(o => o.spec && o.spec.resume_from && o.spec.resume_from.job === id)
                                    .map(o => o.id).reverse();
    }
    if (continuedBy.length) lineage += (lineage ? '; ' : '') + 'continued by ' + continuedBy.map(link).join(', ');
    document.getElementById('job-lineage').innerHTML = lineage;
    // The final model (rank 0's record of it) and the CLI command that
    // downloads it through the coordinator.
    const model = document.getElementById('job-model');
    model.hidden = !j.final_model;
    if (j.final_model) {
      document.getElementById('job-model-path').textContent = j.final_model;
      document.getElementById('job-model-worker').textContent = j.final_model_worker ? `on worker ${j.final_model_worker};` : '';
      document.getElementById('job-model-fetch').textContent = `trainctl fetch ${id}`;
    }
    const tbody = document.querySelector('#events tbody');
    for (const e of r.events || []) {
      eventsAfter = Math.max(eventsAfter, num(e.seq));
      const tr = document.createElement('tr');
      for (const v of [e.seq, fmtTime(e.time), num(e.attempt) || '', num(e.rank) >= 0 ? num(e.rank) : '', e.type, stateName(e.state), e.message]) {
        const td = document.createElement('td');
        td.textContent = v ?? '';
        tr.appendChild(td);
      }
      tr.children[1].className = 'time';
      tbody.appendChild(tr);
    }
    await fetchMetrics();
    if (tick++ % 2 === 0 || TERMINAL.has(s)) await fetchLogs();
    // One last round after the job ended (its final points and lines), then stop.
    if (TERMINAL.has(s)) { if (terminalSeen) return false; terminalSeen = true; }
  });
}

const main = document.getElementById('main');
const path = location.pathname;
if (path.startsWith('/jobs/')) jobView(main, decodeURIComponent(path.slice('/jobs/'.length)));
else if (path === '/workers') workersView(main);
else if (path === '/queues') queuesView(main);
else jobsView(main);
