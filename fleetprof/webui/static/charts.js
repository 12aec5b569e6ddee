// The metric charts (uPlot, vendored under vendor/): NVML device and per-process series and profile activity, all
// on the page's time range. Dragging across any chart selects a time range: onSelect(sinceMs, untilMs), and every
// chart shows the selection. Times are the page's one format (format.js: 24-hour UTC) on the axis and in the hover
// legend; value axes start at 0, end on a round value and carry round ticks, each labelled with its unit.

/* global uPlot */

import { TIME_ZONE, formatNumber, formatTicks, formatTime, formatTimeTick, niceMax, niceTicks } from "./format.js";

const GIB = 2 ** 30;
const HEIGHT = 150;
const SERIES_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];

// Each chart: where its series come from, and one line per series per field (value * scale).
const CHARTS = [
  { id: "util", title: "GPU utilization (%)", unit: "%", source: "devices", y: [0, 100],
    lines: [{ field: "gpu_util_pct" }] },
  { id: "memory", title: "GPU memory used (GiB)", unit: "GiB", source: "devices",
    lines: [{ field: "mem_used_bytes", scale: 1 / GIB }] },
  { id: "clocks", title: "Clocks (MHz): SM, memory dashed", unit: "MHz", source: "devices",
    lines: [{ field: "sm_clock_mhz", suffix: " SM" }, { field: "mem_clock_mhz", suffix: " mem", dash: [5, 4] }] },
  { id: "power", title: "Power (W), power limit dashed", unit: "W", source: "devices",
    lines: [{ field: "power_mw", scale: 1e-3 }, { field: "power_limit_mw", scale: 1e-3, suffix: " limit", dash: [6, 4] }] },
  { id: "temperature", title: "Temperature (°C)", unit: "°C", source: "devices", lines: [{ field: "temperature_c" }] },
  { id: "pcie", title: "PCIe (MB/s): TX, RX dashed", unit: "MB/s", source: "devices",
    lines: [{ field: "pcie_tx_kbps", scale: 1 / 1024, suffix: " TX" },
      { field: "pcie_rx_kbps", scale: 1 / 1024, suffix: " RX", dash: [5, 4] }] },
  { id: "process-util", title: "GPU utilization per process (%)", unit: "%", source: "processes", y: [0, 100],
    lines: [{ field: "sm_util_pct" }] },
  { id: "process-memory", title: "GPU memory per process (GiB)", unit: "GiB", source: "processes",
    lines: [{ field: "used_memory_bytes", scale: 1 / GIB }] },
];
const AXIS_SIZE = 62; // px for a value axis: its ticks and its unit label

/** A value axis on `scale`, labelled with its unit, ticks at round values from 0. */
function valueAxis(scale, unit, extra = {}) {
  return { scale, label: unit, labelSize: 14, labelFont: "11px system-ui, sans-serif", size: AXIS_SIZE,
    splits: (u, axisIdx, min, max) => niceTicks(min, max), values: (u, vals) => formatTicks(vals), ...extra };
}

/** A scale from 0 to a round value above its data (or a fixed range). */
function valueScale(fixed) {
  return fixed ? { range: () => fixed } : { range: (u, min, max) => [0, niceMax(max)] };
}

function seriesLabel(source, s) {
  if (source === "devices") return `${s.node} gpu${s.gpu_index}${s.parent_uuid ? ` ${s.uuid.slice(0, 12)}` : ""}`;
  return `${s.node} ${s.comm || "?"} ${s.pid} gpu${s.gpu_index}`;
}

/** uPlot's columnar data from series with their own timestamps: one sorted x (seconds), nulls where absent. */
function align(columns) {
  const times = new Set();
  for (const c of columns) for (const t of c.t) times.add(t);
  const xs = [...times].sort((a, b) => a - b);
  const at = new Map(xs.map((t, i) => [t, i]));
  const data = [xs.map((t) => t / 1000)];
  for (const c of columns) {
    const ys = new Array(xs.length).fill(null);
    c.t.forEach((t, i) => { ys[at.get(t)] = c.v[i] === null || c.v[i] === undefined ? null : c.v[i] * (c.scale ?? 1); });
    data.push(ys);
  }
  return data;
}

// x ticks: the page's time format cut to the ticks' spacing (seconds only when they are less than a minute apart,
// the date when they span days)
function timeTicks(u, splits, axisIdx, space, incr) {
  return splits.map((s) => formatTimeTick(s * 1000, incr, u.scales.x.max - u.scales.x.min));
}

const hoverValue = (u, v) => formatNumber(v);

export class Charts {
  constructor(container, onSelect) {
    this.container = container;
    this.onSelect = onSelect;
    this.plots = [];
    this.range = null; // [sinceMs, untilMs]
    this.selection = null;
    this.dragging = false;
    new ResizeObserver(() => this._resize()).observe(container);
    document.addEventListener("mouseup", () => setTimeout(() => { this.dragging = false; }));
  }

  _width() {
    const columns = this.container.clientWidth > 1100 ? 2 : 1;
    return Math.max(280, Math.floor((this.container.clientWidth - 16 * columns) / columns));
  }

  _resize() {
    // Only a change of width matters: the container's height also changes while the legends' live values change
    // under the cursor, and redrawing the selection then would cancel a drag in progress.
    const width = this._width();
    if (!this.plots.some((p) => p.width !== width)) return;
    for (const p of this.plots) p.setSize({ width, height: HEIGHT });
    this.showSelection(this.selection);
  }

  /** Draw every chart from a /api/timeseries answer. */
  update(ts) {
    for (const p of this.plots) p.destroy();
    this.plots = [];
    this.container.replaceChildren();
    this.range = [ts.since_ms, ts.until_ms];
    this._add(this._activityChart(ts));
    for (const def of CHARTS) {
      const sources = ts[def.source];
      if (!sources.length) continue;
      const columns = [];
      const series = [{}];
      sources.forEach((s, k) => {
        const color = SERIES_COLORS[k % SERIES_COLORS.length];
        for (const line of def.lines) {
          columns.push({ t: s.t, v: s[line.field], scale: line.scale });
          series.push({ label: seriesLabel(def.source, s) + (line.suffix || ""), stroke: color, width: 1.5,
            dash: line.dash, spanGaps: false, value: hoverValue });
        }
      });
      this._add({ def, data: align(columns), series, axes: [valueAxis("y", def.unit)],
        scales: { y: valueScale(def.y) } });
    }
    if (!ts.devices.length && !ts.processes.length) {
      const note = document.createElement("div");
      note.className = "chart-note";
      note.textContent = "No NVML readings in this range (no GPU, or no agent with the NVML collector).";
      this.container.append(note);
    }
    this.showSelection(this.selection);
  }

  _activityChart(ts) {
    const perSecond = ts.activity_step_ms / 1000;
    const columns = [
      { t: ts.activity.cpu.t, v: ts.activity.cpu.v.map((v) => v / perSecond) },
      { t: ts.activity.gpu.t, v: ts.activity.gpu.v.map((v) => v / 1e6 / perSecond) },
    ];
    const series = [{},
      { label: "CPU samples/s", stroke: "#d62728", width: 1.5, scale: "cpu", value: hoverValue },
      { label: "GPU kernel time (ms/s)", stroke: "#2ca02c", width: 1.5, scale: "gpu", dash: [5, 4], value: hoverValue }];
    const def = { id: "activity", title: "Profiled: CPU samples/s (left), GPU kernel time, ms/s (right, dashed)",
      lines: [] };
    // two units, two axes: CPU on the left in red, GPU on the right in green, each labelled
    const axes = [valueAxis("cpu", "CPU samples/s", { stroke: "#b71c1c" }),
      valueAxis("gpu", "GPU ms/s", { side: 1, stroke: "#1b5e20", grid: { show: false } })];
    return { def, data: align(columns), series, axes, scales: { cpu: valueScale(), gpu: valueScale() } };
  }

  _add({ def, data, series, axes, scales }) {
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.chart = def.id;
    this.container.append(box);
    const [since, until] = this.range;
    const opts = {
      title: def.title,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"), // UTC, as the CLI and the API speak
      width: this._width(),
      height: HEIGHT,
      // the hover legend's time: the page's one format
      series: [{ label: `time (${TIME_ZONE})`, value: (u, v) => (v === null || v === undefined ? "--"
        : formatTime(v * 1000)) }, ...series.slice(1)],
      scales: { x: { time: true, range: () => [since / 1000, until / 1000] }, ...scales },
      axes: [{ values: timeTicks }, ...axes],
      legend: { show: series.length <= 9 },
      cursor: {
        drag: { x: true, y: false, setScale: false },
        // the crosshair follows across charts, but a drag stays on its own chart: synced presses would make every
        // chart report a selection of its own; and while a drag is on, no chart takes the others' cursor, which
        // would move the dragged selection when the pointer crosses another chart
        sync: { key: "fleetprof", filters: { pub: (type) => type === "mousemove" || type === "mouseleave",
          sub: () => !this.dragging } },
      },
      hooks: {
        setSelect: [(u) => {
          if (u.select.width < 3) return; // a click, not a drag
          const a = u.posToVal(u.select.left, "x") * 1000;
          const b = u.posToVal(u.select.left + u.select.width, "x") * 1000;
          this.onSelect(Math.max(a, since), Math.min(b, until));
        }],
      },
    };
    const plot = new uPlot(opts, data, box);
    plot.over.addEventListener("mousedown", () => { this.dragging = true; });
    plot.fleetprofId = def.id;
    this.plots.push(plot);
  }

  /** Show [sinceMs, untilMs] as the selection on every chart (null: none). */
  showSelection(selection) {
    this.selection = selection;
    for (const p of this.plots) {
      if (!selection) {
        p.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
        continue;
      }
      const left = p.valToPos(selection[0] / 1000, "x");
      const right = p.valToPos(selection[1] / 1000, "x");
      p.setSelect({ left, width: Math.max(1, right - left), top: 0, height: p.over.clientHeight }, false);
    }
  }

  /** The page pixel of time tMs on chart `id`, at the plot's vertical middle (for tests and tools). */
  pointOf(id, tMs) {
    const p = this.plots.find((q) => q.fleetprofId === id);
    const box = p.over.getBoundingClientRect();
    return { x: box.left + p.valToPos(tMs / 1000, "x"), y: box.top + box.height / 2 };
  }
}
