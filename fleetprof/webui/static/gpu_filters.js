// The GPU flame graph's copy and NVTX choices (issue 16): kernels, memory copies and sets, or both ("what"); only the
// time under an NVTX range ("nvtx_range": a range name, or a path prefix "step > forward"); and the NVTX level (the
// range path as "[nvtx] <range>" frames between the process and the launching stack). Kept apart from app.js, which
// calls these where it reads and writes its other filters; the server's rules: fleetprof/gpu_filters.py.

const $ = (id) => document.getElementById(id);
const WHAT = ["all", "kernels", "copies"];

/** The choices' starting state, as app.js's state holds them. */
export function gpuDefaults() {
  return { what: "all", nvtxRange: "", nvtxLevel: false };
}

/** The API parameters of the choices ("" leaves one out): the GPU flame graph's alone. */
export function gpuParams(state) {
  if (state.kind !== "gpu") return {};
  return { what: state.what === "all" ? "" : state.what, nvtx_range: state.nvtxRange,
    nvtx_level: state.nvtxLevel ? "1" : "" };
}

/** The choices from the page's URL parameters `q` into `state`. */
export function readGpuURL(q, state) {
  state.what = WHAT.includes(q.get("what")) ? q.get("what") : "all";
  state.nvtxRange = q.get("nvtx_range") || "";
  state.nvtxLevel = q.get("nvtx_level") === "1";
}

/** The controls as the state says; shown for GPU time only. */
export function syncGpuControls(state) {
  $("gpu-depth-controls").hidden = state.kind !== "gpu";
  $("gpu-what").value = state.what;
  $("nvtx-level").checked = state.nvtxLevel;
  if (document.activeElement !== $("nvtx-range")) $("nvtx-range").value = state.nvtxRange;
}

/** What the flame graph's title adds for the answer's filters. */
export function gpuTitleParts(filters) {
  const parts = [];
  if (filters.what === "kernels") parts.push("kernels only");
  if (filters.what === "copies") parts.push("memory copies and sets only");
  if (filters.nvtx_range) parts.push(`under NVTX range “${filters.nvtx_range}”`);
  if (filters.nvtx_level) parts.push("NVTX ranges as frames");
  return parts;
}

/** Listen to the controls: each change updates `state` and calls `reload`. */
export function wireGpuControls(state, reload) {
  $("gpu-what").addEventListener("change", (e) => {
    state.what = e.target.value;
    reload();
  });
  $("nvtx-level").addEventListener("change", (e) => {
    state.nvtxLevel = e.target.checked;
    reload();
  });
  $("nvtx-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.nvtxRange = $("nvtx-range").value.trim();
    reload();
  });
}
