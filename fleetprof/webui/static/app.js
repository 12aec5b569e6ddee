// The page: a time range, node and process filters, the metric charts, and the flame graph of the range or of the
// part of it selected on a chart. The state lives in the URL, so a view can be reloaded and shared.
// window.fleetprof exposes the state, the charts and the flame graph (tests and the browser console read them).

import { Charts } from "./charts.js";
import { FlameGraph, binaryColor, formatValue, languageColor, percent } from "./flamegraph.js";

const $ = (id) => document.getElementById(id);

const state = {
  sinceText: "1h", // the range as asked for (relative or absolute), resolved by the server into sinceMs / untilMs
  untilText: "now",
  sinceMs: 0,
  untilMs: 0,
  selection: null, // [sinceS, untilS]: whole seconds, the flame graph's range when set
  baseline: null, // [sinceS, untilS]: the range a diff compares with
  diff: false,
  kind: "cpu",
  node: "",
  pid: 0,
  search: "",
  colorBy: "binary", // the flame graph's colors: "binary" or "language"
};

const app = { state, charts: null, flame: null, pending: 0, flameVersion: 0, chartsVersion: 0, flameData: null,
  lastError: "", renderMs: 0, simulated: { charts: false, flame: false } };
window.fleetprof = app;

function query(values) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(values)) if (v !== "" && v !== 0 && v !== null && v !== undefined) q.set(k, v);
  return q.toString();
}

async function getJSON(path, values) {
  const response = await fetch(`${path}?${query(values)}`);
  let body;
  try {
    body = await response.json();
  } catch {
    throw new Error(`${path}: HTTP ${response.status}`);
  }
  if (!response.ok) throw new Error(body.error || `${path}: HTTP ${response.status}`);
  return body;
}

// Only the latest request of each kind may draw: a slow answer to an older one is dropped.
const latest = {};
async function track(name, work) {
  const ticket = (latest[name] = (latest[name] || 0) + 1);
  app.pending += 1;
  status("loading…");
  try {
    const result = await work(() => ticket === latest[name]);
    if (ticket === latest[name]) status("");
    return result;
  } catch (err) {
    app.lastError = err.message;
    status(err.message, true);
    return null;
  } finally {
    app.pending -= 1;
  }
}

function status(text, error = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", error);
}

const utc = (ms) => new Date(ms).toISOString().replace(".000Z", "Z");
const clock = (s) => new Date(s * 1000).toISOString().slice(11, 19);

function wholeRange() {
  return [Math.floor(state.sinceMs / 1000), Math.ceil(state.untilMs / 1000)];
}

function flameRange() {
  return state.selection || wholeRange();
}

function filters() {
  return { node: state.node, pid: state.pid };
}

// --- the URL ---

function readURL() {
  const q = new URLSearchParams(location.search);
  state.sinceText = q.get("since") || state.sinceText;
  state.untilText = q.get("until") || state.untilText;
  state.kind = q.get("kind") === "gpu" ? "gpu" : "cpu";
  state.node = q.get("node") || "";
  state.pid = Number(q.get("pid")) || 0;
  state.search = q.get("search") || "";
  const pair = (text) => {
    const parts = (text || "").split(",").map(Number);
    return parts.length === 2 && parts.every(Number.isFinite) && parts[0] < parts[1] ? parts : null;
  };
  state.selection = pair(q.get("sel"));
  state.baseline = pair(q.get("base"));
  state.diff = Boolean(state.baseline) && q.get("diff") === "1";
}

function writeURL() {
  const q = query({ since: state.sinceText, until: state.untilText, kind: state.kind === "cpu" ? "" : state.kind,
    node: state.node, pid: state.pid, sel: state.selection ? state.selection.join(",") : "",
    base: state.baseline ? state.baseline.join(",") : "", diff: state.diff ? "1" : "", search: state.search });
  history.replaceState(null, "", `${location.pathname}?${q}`);
}

// --- loading ---

async function loadAll() {
  writeURL();
  await track("charts", async (current) => {
    const ts = await getJSON("api/timeseries", { since: state.sinceText, until: state.untilText, ...filters() });
    if (!current()) return;
    state.sinceMs = ts.since_ms;
    state.untilMs = ts.until_ms;
    $("since").value = utc(ts.since_ms);
    $("until").value = utc(ts.until_ms);
    const [a, b] = wholeRange();
    if (state.selection && (state.selection[1] <= a || state.selection[0] >= b)) state.selection = null;
    app.charts.selection = state.selection && state.selection.map((s) => s * 1000);
    app.charts.update(ts);
    setSimulated("charts", ts.simulated);
    $("truncated").hidden = !ts.truncated;
    app.chartsVersion += 1;
    await loadFilters();
  });
  if (state.untilMs) await loadFlame(); // else the range did not resolve: keep that error on screen
}

async function loadFilters() {
  const range = { since: state.sinceMs / 1000, until: state.untilMs / 1000 };
  const [nodes, processes] = await Promise.all([getJSON("api/nodes", range),
    getJSON("api/processes", { ...range, node: state.node })]);
  const nodeSelect = $("node");
  nodeSelect.replaceChildren(new Option("all nodes", ""));
  const names = nodes.nodes.map((n) => n.node);
  if (state.node && !names.includes(state.node)) names.push(state.node);
  for (const name of names) nodeSelect.append(new Option(name, name));
  nodeSelect.value = state.node;
  const procSelect = $("process");
  procSelect.replaceChildren(new Option("all processes", ""));
  const procs = processes.processes.slice().sort((a, b) => a.node.localeCompare(b.node) || a.pid - b.pid);
  for (const p of procs) procSelect.append(new Option(`${p.comm || "?"} ${p.pid} · ${p.node}`, `${p.node}|${p.pid}`));
  procSelect.value = state.pid ? `${state.node}|${state.pid}` : "";
}

async function loadFlame() {
  writeURL();
  updateLabels();
  await track("flame", async (current) => {
    const [since, until] = flameRange();
    let data;
    if (state.diff && state.baseline) {
      data = await getJSON("api/flamegraph/diff", { kind: state.kind, since, until, base_since: state.baseline[0],
        base_until: state.baseline[1], ...filters() });
    } else {
      data = await getJSON("api/flamegraph", { kind: state.kind, since, until, ...filters() });
    }
    if (!current()) return;
    app.flameData = data;
    app.renderMs = app.flame.setData(data, state.search);
    setSimulated("flame", data.simulated);
    renderFlameInfo();
    app.flameVersion += 1;
  });
}

// The banner stays while the charts or the flame graph show readings of the simulated NVML library.
function setSimulated(source, simulated) {
  app.simulated[source] = Boolean(simulated);
  $("simulated").hidden = !(app.simulated.charts || app.simulated.flame);
}

// --- labels, legend, exports ---

function updateLabels() {
  const [since, until] = flameRange();
  $("range-label").textContent = `${state.selection ? "selected" : "whole range"}: ${utc(since * 1000)} – `
    + `${utc(until * 1000)} (${until - since} s)`;
  $("baseline-label").textContent = state.baseline ? `baseline ${clock(state.baseline[0])}–${clock(state.baseline[1])}`
    : "";
  $("diff").disabled = !state.baseline;
  $("diff").checked = state.diff;
  $("clear-selection").disabled = !state.selection;
  for (const format of ["pprof", "folded", "speedscope"]) {
    $(`export-${format}`).href = `api/export?${query({ kind: state.kind, format, since, until, ...filters() })}`;
  }
  for (const radio of document.querySelectorAll("input[name=kind]")) radio.checked = radio.value === state.kind;
}

function renderFlameInfo() {
  const data = app.flameData;
  const flame = app.flame;
  const what = data.kind === "gpu" ? "GPU kernel time by launching CPU stack" : "CPU samples";
  const parts = [what, formatValue(data.total, data.unit)];
  if (data.filters.node) parts.push(`node ${data.filters.node}`);
  if (data.filters.pid) parts.push(`pid ${data.filters.pid}`);
  if (state.diff && data.base_counts) {
    parts.push(`diff vs baseline (${formatValue(data.base_total, data.unit)}): red grew, blue shrank, in share of its range`);
  }
  $("flame-title").textContent = (data.simulated ? "SIMULATED · " : "") + parts.join(" · ");
  $("flame-title").classList.toggle("simulated", Boolean(data.simulated));
  $("flame-empty").hidden = data.total > 0 || (data.base_total || 0) > 0;
  const legend = $("legend");
  legend.replaceChildren();
  if (!state.diff) {
    const byLanguage = state.colorBy === "language";
    const totals = flame.binaryTotals(state.colorBy);
    for (const [binary, value] of totals.slice(0, 12)) {
      const item = document.createElement("span");
      item.className = "legend-item";
      const swatch = document.createElement("i");
      swatch.style.background = byLanguage ? languageColor(binary) : binaryColor(binary);
      item.append(swatch, `${binary || "(unknown)"} ${percent(value, data.total)}`);
      legend.append(item);
    }
    if (totals.length > 12) legend.append(`+${totals.length - 12} more binaries`);
  }
}

function renderMatch(flame) {
  const m = flame.model;
  $("match").textContent = flame.match ? `matched ${percent(flame.matched, m.total[0])} `
    + `(${formatValue(flame.matched, flame.unit)})` : "";
  $("reset-zoom").disabled = flame.focus === 0;
  $("zoom-label").textContent = flame.focus ? `zoomed: ${flame.path(flame.focus).join(" › ")}` : "";
}

// --- events ---

function onChartSelect(aMs, bMs) {
  const since = Math.floor(aMs / 1000);
  const until = Math.max(since + 1, Math.ceil(bMs / 1000));
  state.selection = [since, until];
  app.charts.showSelection([since * 1000, until * 1000]);
  loadFlame();
}

function wire() {
  $("preset").addEventListener("change", (e) => {
    if (!e.target.value) return;
    state.sinceText = e.target.value;
    state.untilText = "now";
    state.selection = null;
    loadAll();
  });
  $("range-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.sinceText = $("since").value.trim() || "1h";
    state.untilText = $("until").value.trim() || "now";
    state.selection = null;
    $("preset").value = "";
    loadAll();
  });
  $("node").addEventListener("change", (e) => {
    state.node = e.target.value;
    state.pid = 0;
    loadAll();
  });
  $("process").addEventListener("change", (e) => {
    if (e.target.value) {
      const [node, pid] = e.target.value.split("|");
      state.node = node;
      state.pid = Number(pid);
    } else {
      state.pid = 0;
    }
    loadAll();
  });
  for (const radio of document.querySelectorAll("input[name=kind]")) {
    radio.addEventListener("change", (e) => {
      state.kind = e.target.value;
      loadFlame();
    });
  }
  $("clear-selection").addEventListener("click", () => {
    state.selection = null;
    app.charts.showSelection(null);
    loadFlame();
  });
  $("set-baseline").addEventListener("click", () => {
    state.baseline = flameRange().slice();
    state.diff = false;
    updateLabels();
    writeURL();
  });
  $("diff").addEventListener("change", (e) => {
    state.diff = e.target.checked && Boolean(state.baseline);
    loadFlame();
  });
  let typing;
  $("search").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.search = e.target.value;
      writeURL();
      app.flame.setSearch(state.search);
    }, 120);
  });
  $("reset-zoom").addEventListener("click", () => app.flame.resetZoom());
  $("color-by").addEventListener("change", (e) => {
    state.colorBy = e.target.value;
    app.flame.setColorBy(state.colorBy);
    renderFlameInfo();
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && document.activeElement !== $("search")) app.flame.resetZoom();
  });
}

function start() {
  readURL();
  $("search").value = state.search;
  app.charts = new Charts($("charts"), onChartSelect);
  app.flame = new FlameGraph($("flame"), $("tooltip"), renderMatch);
  wire();
  loadAll();
}

start();
