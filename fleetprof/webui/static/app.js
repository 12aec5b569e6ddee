// The page: a time range, node and process filters, the metric charts, and the flame graph of the range or of the
// part of it selected on a chart. The state lives in the URL, so a view can be reloaded and shared.
// window.fleetprof exposes the state, the charts and the flame graph (tests and the browser console read them).

import { Charts } from "./charts.js";
import { FlameGraph } from "./flamegraph.js";
import { formatTime, formatValue, percent } from "./format.js";
import { gpuDefaults, gpuParams, gpuTitleParts, readGpuURL, syncGpuControls, wireGpuControls } from "./gpu_filters.js";
import { renderLegend } from "./legend.js";
import { ProcessPicker } from "./processes.js";
import { TimelinePanel } from "./timeline_panel.js";
import { readWorkloadURL, renderWorkloads, syncWorkloadControls, wireWorkloadControls, workloadDefaults, workloadParams,
  workloadTitleParts, workloadURL } from "./workload.js";

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
  merge: false, // the flame graph's processes merged (no root frame per process)
  collectives: "all", // GPU flame graph: NCCL collective kernels shown ("all"), left out ("hide") or alone ("only")
  ...gpuDefaults(), // GPU flame graph: what (kernels, copies), nvtxRange, nvtxLevel (gpu_filters.js)
  ...workloadDefaults(), // workload: namespace, pod, job, container filters; workloadBy: the table's grouping
};

// simulated: per source ("charts", "flame") the line the banner shows for it, "" when its data is real
const app = { state, charts: null, flame: null, processes: null, pending: 0, flameVersion: 0, chartsVersion: 0,
  workloadsVersion: 0,
  flameData: null, lastError: "", renderMs: 0, simulated: { charts: "", flame: "" } };
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


function wholeRange() {
  return [Math.floor(state.sinceMs / 1000), Math.ceil(state.untilMs / 1000)];
}

function flameRange() {
  return state.selection || wholeRange();
}

function filters() {
  return { node: state.node, pid: state.pid, ...workloadParams(state) };
}

// The flame graph's filters: the collectives choice is the GPU flame graph's alone
function flameFilters() {
  const collectives = state.kind === "gpu" && state.collectives !== "all" ? state.collectives : "";
  return { ...filters(), collectives, ...gpuParams(state) };
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
  state.merge = q.get("merge") === "1";
  state.collectives = ["hide", "only"].includes(q.get("collectives")) ? q.get("collectives") : "all";
  readGpuURL(q, state);
  readWorkloadURL(q, state);
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
    base: state.baseline ? state.baseline.join(",") : "", diff: state.diff ? "1" : "", search: state.search,
    merge: state.merge ? "1" : "", collectives: state.collectives === "all" ? "" : state.collectives,
    ...gpuParams({ ...state, kind: "gpu" }), ...workloadURL(state) });
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
    $("since").value = formatTime(ts.since_ms);
    $("until").value = formatTime(ts.until_ms);
    const [a, b] = wholeRange();
    if (state.selection && (state.selection[1] <= a || state.selection[0] >= b)) state.selection = null;
    app.charts.selection = state.selection && state.selection.map((s) => s * 1000);
    app.charts.update(ts);
    setSimulated("charts", ts.simulated_line);
    $("truncated").hidden = !ts.truncated;
    app.chartsVersion += 1;
    await loadFilters();
  });
  if (state.untilMs) await Promise.all([loadFlame(), loadWorkloads()]); // else the range did not resolve
}

async function loadWorkloads() {
  writeURL();
  syncWorkloadControls(state);
  await track("workloads", async (current) => {
    const answer = await getJSON("api/workloads", { since: state.sinceMs / 1000, until: state.untilMs / 1000,
      node: state.node, by: state.workloadBy, ...workloadParams(state) });
    if (!current()) return;
    renderWorkloads(answer);
    app.workloadsVersion += 1;
  });
}

async function loadFilters() {
  const range = { since: state.sinceMs / 1000, until: state.untilMs / 1000 };
  const [nodes, processes] = await Promise.all([getJSON("api/nodes", range),
    getJSON("api/processes", { ...range, node: state.node, ...workloadParams(state) })]);
  const nodeSelect = $("node");
  nodeSelect.replaceChildren(new Option("all nodes", ""));
  const names = nodes.nodes.map((n) => n.node);
  if (state.node && !names.includes(state.node)) names.push(state.node);
  for (const name of names) nodeSelect.append(new Option(name, name));
  nodeSelect.value = state.node;
  // the answer's order: the busiest first
  app.processes.set(processes.processes, state.pid ? { node: state.node, pid: state.pid } : null);
}

async function loadFlame() {
  writeURL();
  updateLabels();
  // the GPU flame graph's range and filters, drawn bar by bar (the server refuses ranges over a few minutes)
  const [from, to] = flameRange();
  app.timeline.load({ since: from, until: to, ...flameFilters(), shown: state.kind === "gpu" });
  await track("flame", async (current) => {
    const [since, until] = flameRange();
    let data;
    if (state.diff && state.baseline) {
      data = await getJSON("api/flamegraph/diff", { kind: state.kind, since, until, base_since: state.baseline[0],
        base_until: state.baseline[1], ...flameFilters() });
    } else {
      data = await getJSON("api/flamegraph", { kind: state.kind, since, until, ...flameFilters() });
    }
    if (!current()) return;
    app.flameData = data;
    app.renderMs = app.flame.setData(data, state.search);
    setSimulated("flame", data.simulated_line);
    renderFlameInfo();
    app.flameVersion += 1;
  });
}

// The banner names what on screen is simulated, per kind and node: the charts' NVML readings, the flame graph's
// samples; real data is never labelled simulated because some other kind is.
function setSimulated(source, line) {
  app.simulated[source] = line || "";
  const lines = [app.simulated.charts, app.simulated.flame].filter(Boolean);
  $("simulated").replaceChildren(...lines.map((text) => {
    const el = document.createElement("div");
    el.textContent = `${text}.`;
    return el;
  }));
  $("simulated").hidden = lines.length === 0;
}

// --- labels, legend, exports ---

function updateLabels() {
  const [since, until] = flameRange();
  $("range-label").textContent = `${state.selection ? "selected" : "whole range"}: ${formatTime(since * 1000)} – `
    + `${formatTime(until * 1000)} (${until - since} s)`;
  $("baseline-label").textContent = state.baseline ? `baseline ${formatTime(state.baseline[0] * 1000)} – `
    + `${formatTime(state.baseline[1] * 1000)}` : "";
  $("diff").disabled = !state.baseline;
  $("diff").checked = state.diff;
  $("clear-selection").disabled = !state.selection;
  for (const format of ["pprof", "folded", "speedscope"]) {
    $(`export-${format}`).href = `api/export?${query({ kind: state.kind, format, since, until, ...flameFilters(),
      processes: state.merge ? "merge" : "" })}`;
  }
  for (const radio of document.querySelectorAll("input[name=kind]")) radio.checked = radio.value === state.kind;
  $("merge-processes").checked = state.merge;
  $("collectives-control").hidden = state.kind !== "gpu";
  $("collectives").value = state.collectives;
  syncGpuControls(state);
}

function renderFlameInfo() {
  const data = app.flameData;
  const flame = app.flame;
  const what = data.kind === "gpu" ? "GPU kernel time by launching CPU stack" : "CPU samples";
  const parts = [what, formatValue(data.total, data.unit)];
  if (data.filters.node) parts.push(`node ${data.filters.node}`);
  if (data.filters.pid) parts.push(`pid ${data.filters.pid}`);
  if (data.filters.collectives === "hide") parts.push("NCCL collectives hidden");
  if (data.filters.collectives === "only") parts.push("NCCL collectives only");
  parts.push(...gpuTitleParts(data.filters), ...workloadTitleParts(data.filters));
  if (state.diff && data.base_counts) {
    parts.push(`diff vs baseline (${formatValue(data.base_total, data.unit)}): red grew, blue shrank, in share of its range`);
  }
  // simulated only when this kind's samples are, on the nodes shown (not because of the NVML readings)
  const simulated = data.simulated.length > 0;
  $("flame-title").textContent = (simulated ? "SIMULATED · " : "") + parts.join(" · ");
  $("flame-title").classList.toggle("simulated", simulated);
  $("flame-empty").hidden = data.total > 0 || (data.base_total || 0) > 0;
  renderLegend($("legend"), flame, data.total);
}

function renderMatch(flame) {
  const m = flame.model;
  $("match").textContent = flame.match ? `matched ${percent(flame.matched, m.total[0])} `
    + `(${formatValue(flame.matched, flame.unit)})` : "";
  $("reset-zoom").disabled = flame.focus === 0;
  $("zoom-label").textContent = flame.focus ? `zoomed: ${flame.path(flame.focus).join(" › ")}` : "";
  app.timeline.highlight(flame.focus ? flame.path(flame.focus) : null, state.merge);
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
  wireWorkloadControls(state, () => {
    state.pid = 0;
    loadAll();
  }, loadWorkloads);
  $("node").addEventListener("change", (e) => {
    state.node = e.target.value;
    state.pid = 0;
    loadAll();
  });
  $("merge-processes").addEventListener("change", (e) => {
    state.merge = e.target.checked;
    writeURL();
    updateLabels();
    app.flame.setMergeProcesses(state.merge);
    renderFlameInfo();
  });
  for (const radio of document.querySelectorAll("input[name=kind]")) {
    radio.addEventListener("change", (e) => {
      state.kind = e.target.value;
      loadFlame();
    });
  }
  $("collectives").addEventListener("change", (e) => {
    state.collectives = e.target.value;
    loadFlame();
  });
  wireGpuControls(state, loadFlame);
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
      if (app.flameData) renderFlameInfo();
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
  app.flame.mergeProcesses = state.merge;
  // a timeline bar selects its stack in the flame graph (zoomed to it), whose selection highlights bars again
  app.timeline = new TimelinePanel($("timeline-panel"), (path) => {
    const node = app.flame.find(...(state.merge ? path.slice(1) : path));
    if (node >= 0) app.flame.zoom(node);
  });
  app.processes = new ProcessPicker($("process"), $("process-list"), (picked) => {
    if (picked) {
      state.node = picked.node;
      state.pid = picked.pid;
    } else {
      state.pid = 0;
    }
    loadAll();
  });
  wire();
  loadAll();
}

start();
