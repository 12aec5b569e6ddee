// The workload filters (namespace, pod, job, container: '' = all) that every request of the page carries, and the
// "GPU utilization by workload" table (GET api/workloads): per workload its GPUs, GPU-hours, mean utilization and idle
// hours over the whole range. Kept apart from app.js, which calls these where it reads and writes its other filters;
// the server's rules: sql/parts/workload_match.sql and sql/queries/gpu_utilization_by_workload.sql.

import { formatTime } from "./format.js";

const $ = (id) => document.getElementById(id);
export const FIELDS = ["namespace", "pod", "job", "container"];
const BY = ["pod", "namespace", "job", "team", "container"];

/** The filters' starting state, as app.js's state holds them. */
export function workloadDefaults() {
  return { workload: { namespace: "", pod: "", job: "", container: "" }, workloadBy: "pod" };
}

/** The API parameters of the filters ("" leaves one out). */
export function workloadParams(state) {
  return { ...state.workload };
}

/** The page URL's parameters for the filters and the table's grouping. */
export function workloadURL(state) {
  return { ...state.workload, by: state.workloadBy === "pod" ? "" : state.workloadBy };
}

/** The filters from the page's URL parameters `q` into `state`. */
export function readWorkloadURL(q, state) {
  for (const field of FIELDS) state.workload[field] = (q.get(field) || "").trim();
  state.workloadBy = BY.includes(q.get("by")) ? q.get("by") : "pod";
}

/** The inputs as the state says. */
export function syncWorkloadControls(state) {
  for (const field of FIELDS) {
    if (document.activeElement !== $(`wl-${field}`)) $(`wl-${field}`).value = state.workload[field];
  }
  $("workload-by").value = state.workloadBy;
}

/** What the flame graph's title adds for the answer's filters. */
export function workloadTitleParts(filters) {
  return FIELDS.filter((field) => filters[field]).map((field) => `${field} ${filters[field]}`);
}

/** Listen to the inputs: submitting the form sets every filter and calls `reload`; the grouping calls `regroup`. */
export function wireWorkloadControls(state, reload, regroup) {
  $("workload-form").addEventListener("submit", (e) => {
    e.preventDefault();
    for (const field of FIELDS) state.workload[field] = $(`wl-${field}`).value.trim();
    reload();
  });
  $("workload-by").addEventListener("change", (e) => {
    state.workloadBy = e.target.value;
    regroup();
  });
}

function hours(seconds) {
  return (seconds / 3600).toFixed(2);
}

/** The table of an api/workloads answer: workload, GPUs, GPU-hours, mean utilization, idle hours. */
export function renderWorkloads(answer) {
  const table = $("workload-table");
  const head = table.createTHead();
  head.replaceChildren();
  const top = head.insertRow();
  for (const name of [answer.by, "GPUs", "GPU-hours", "mean utilization", "idle hours"]) {
    const th = document.createElement("th");
    th.textContent = name;
    top.append(th);
  }
  const body = table.tBodies[0] || table.createTBody();
  body.replaceChildren();
  for (const w of answer.workloads) {
    const row = body.insertRow();
    row.dataset.workload = w.workload;
    const util = w.mean_util_pct === null ? "–" : `${w.mean_util_pct.toFixed(1)} %`;
    for (const text of [w.workload || "unattributed", String(w.gpus), hours(w.covered_s), util, hours(w.idle_s)]) {
      row.insertCell().textContent = text;
    }
  }
  $("workload-empty").hidden = answer.workloads.length > 0;
  $("workload-range").textContent = `${formatTime(answer.since_ms)} – ${formatTime(answer.until_ms)}`;
}
