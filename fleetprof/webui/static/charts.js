// The metric charts (uPlot, vendored under vendor/): NVML device and per-process series and profile activity, all
// on the page's time range. Dragging across any chart selects a time range: onSelect(sinceMs, untilMs), and every
// chart shows the selection.

/* global uPlot */

const GIB = 2 ** 30;
const HEIGHT = 150;
const SERIES_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
  "#bcbd22", "#17becf"];

// Each chart: where its series come from, and one line per series per field (value * scale).
const CHARTS = [
  { id: "util", title: "GPU utilization (%)", source: "devices", y: [0, 100],
    lines: [{ field: "gpu_util_pct" }] },
  { id: "memory", title: "GPU memory used (GiB)", source: "devices",
    lines: [{ field: "mem_used_bytes", scale: 1 / GIB }] },
  { id: "clocks", title: "Clocks (MHz): SM, memory dashed", source: "devices",
    lines: [{ field: "sm_clock_mhz", suffix: " SM" }, { field: "mem_clock_mhz", suffix: " mem", dash: [5, 4] }] },
  { id: "power", title: "Power (W), power limit dashed", source: "devices",
    lines: [{ field: "power_mw", scale: 1e-3 }, { field: "power_limit_mw", scale: 1e-3, suffix: " limit", dash: [6, 4] }] },
  { id: "temperature", title: "Temperature (°C)", source: "devices", lines: [{ field: "temperature_c" }] },
  { id: "pcie", title: "PCIe (MB/s): TX, RX dashed", source: "devices",
    lines: [{ field: "pcie_tx_kbps", scale: 1 / 1024, suffix: " TX" },
      { field: "pcie_rx_kbps", scale: 1 / 1024, suffix: " RX", dash: [5, 4] }] },
  { id: "process-util", title: "GPU utilization per process (%)", source: "processes", y: [0, 100],
    lines: [{ field: "sm_util_pct" }] },
  { id: "process-memory", title: "GPU memory per process (GiB)", source: "processes",
    lines: [{ field: "used_memory_bytes", scale: 1 / GIB }] },
];

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

// x ticks in UTC, 24-hour: seconds only when the ticks are less than a minute apart, the date when they span days
function timeTicks(u, splits, axisIdx, space, incr) {
  return splits.map((s) => {
    const iso = new Date(s * 1000).toISOString();
    if (incr >= 86400) return iso.slice(5, 10);
    if (incr < 60) return iso.slice(11, 19);
    return (u.scales.x.max - u.scales.x.min > 86400 ? `${iso.slice(5, 10)} ` : "") + iso.slice(11, 16);
  });
}

function formatTick(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  if (a >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (a >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  if (a >= 100 || Number.isInteger(v)) return `${Math.round(v)}`;
  return v.toFixed(a >= 10 ? 1 : 2);
}

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
            dash: line.dash, spanGaps: false, value: (u, v) => formatTick(v) });
        }
      });
      this._add({ def, data: align(columns), series });
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
      { label: "CPU samples/s", stroke: "#d62728", width: 1.5, scale: "cpu", value: (u, v) => formatTick(v) },
      { label: "GPU kernel time (ms/s)", stroke: "#2ca02c", width: 1.5, scale: "gpu", value: (u, v) => formatTick(v) }];
    const def = { id: "activity", title: "Profiled: CPU samples/s, GPU kernel time (ms/s)", lines: [] };
    const axes = [{ scale: "cpu", values: (u, vals) => vals.map(formatTick), size: 50 },
      { scale: "gpu", side: 1, values: (u, vals) => vals.map(formatTick), size: 50, grid: { show: false } }];
    return { def, data: align(columns), series, axes, scales: { cpu: { auto: true }, gpu: { auto: true } } };
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
      series,
      scales: {
        x: { time: true, range: () => [since / 1000, until / 1000] },
        y: def.y ? { range: () => def.y } : { auto: true },
        ...(scales || {}),
      },
      axes: [{ values: timeTicks }, ...(axes || [{ values: (u, vals) => vals.map(formatTick), size: 50 }])],
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
