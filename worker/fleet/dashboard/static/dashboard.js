// Polls <base>/api/snapshot every second and charts the last HISTORY points. Each chart's series are
// named by the snapshot (models, workers); a chart is rebuilt when its set of names changes. The latest
// value and the largest value seen of every series are also written into the DOM (data-latest, data-max)
// for people and for the headless-browser test.
"use strict";
const HISTORY = 300;
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

// name -> function(snapshot) returning {seriesName: value}
const CHARTS = {
  backlog: (s) => Object.fromEntries(s.models.map((m) => [m.model, m.backlog])),
  tokens: (s) => ({ fleet: s.models.reduce((a, m) => a + m.tokens_out_per_s, 0) }),
  kv: (s) => Object.fromEntries(s.workers.filter((w) => !w.lost)
    .map((w) => [w.consumer, w.kv_blocks_total ? (100 * w.kv_blocks_used) / w.kv_blocks_total : 0])),
  ttft: (s) => ({ p50: s.ttft_p50_s, p99: s.ttft_p99_s }),
  dead: (s) => ({ all: s.dead_last_hour }),
};

const state = {};  // chart name -> {names, times, values: {name: []}, max: {name: n}, plot}

function record(name, t, values) {
  let st = state[name];
  const names = Object.keys(values).sort();
  if (!st) {
    st = state[name] = { names: [], times: [], values: {}, max: {}, plot: null };
  }
  for (const n of names) {
    if (!(n in st.values)) st.values[n] = st.times.map(() => null);
  }
  st.times.push(t);
  for (const n of Object.keys(st.values)) {
    const v = values[n];
    st.values[n].push(v === undefined ? null : v);
    if (v !== null && v !== undefined) st.max[n] = Math.max(st.max[n] || 0, v);
  }
  if (st.times.length > HISTORY) {
    st.times.shift();
    for (const n of Object.keys(st.values)) st.values[n].shift();
  }
  draw(name, st);
  latest(name, st, values);
}

function draw(name, st) {
  const names = Object.keys(st.values).sort();
  const data = [st.times, ...names.map((n) => st.values[n])];
  const el = document.getElementById("chart-" + name);
  if (!st.plot || st.names.join("\u0000") !== names.join("\u0000")) {
    if (st.plot) st.plot.destroy();
    st.names = names;
    const opts = {
      width: Math.max(300, el.clientWidth || 540),
      height: 220,
      series: [{}, ...names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 2 }))],
      axes: [{}, { size: 60 }],
    };
    st.plot = new uPlot(opts, data, el);
  } else {
    st.plot.setData(data);
  }
}

function latest(name, st, values) {
  const box = document.getElementById("latest-" + name);
  box.replaceChildren();
  for (const n of Object.keys(st.values).sort()) {
    const span = document.createElement("span");
    const v = values[n];
    span.className = "series";
    span.dataset.series = n;
    span.dataset.latest = v === null || v === undefined ? "" : String(v);
    span.dataset.max = String(st.max[n] || 0);
    span.dataset.points = String(st.values[n].filter((x) => x !== null).length);
    span.textContent = n + ": " + (v === null || v === undefined ? "-" : (+v).toFixed(2));
    box.appendChild(span);
  }
}

function tenants(s) {
  const body = document.querySelector("#tenants tbody");
  body.replaceChildren();
  for (const u of s.tenants) {
    const tr = document.createElement("tr");
    for (const v of [u.tenant, u.model, u.jobs, u.prompt_tokens, u.completion_tokens, u.engine_seconds.toFixed(2)]) {
      const td = document.createElement("td");
      td.textContent = String(v);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

async function poll() {
  try {
    const r = await fetch(window.CONVEYOR_BASE + "/api/snapshot", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    const t = s.taken_ms / 1000;
    for (const [name, pick] of Object.entries(CHARTS)) record(name, t, pick(s));
    tenants(s);
    const status = document.getElementById("status");
    status.textContent = `${s.workers.filter((w) => !w.lost).length} live workers, ` +
      `${s.workers.filter((w) => w.lost).length} lost; updated ${new Date(s.taken_ms).toISOString()}`;
    status.dataset.polls = String((+status.dataset.polls || 0) + 1);
  } catch (e) {
    document.getElementById("status").textContent = "snapshot failed: " + e;
  }
}

poll();
setInterval(poll, 1000);
