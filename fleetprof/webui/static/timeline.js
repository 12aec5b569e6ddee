// The GPU timeline: the sampled kernels, copies and sets of a short range (GET /api/timeline, fleetprof/webui/
// timeline.py) as bars at their start and end, one lane per stream, grouped per GPU, drawn on a canvas (100k bars: no
// element per bar). Wheel zooms around the cursor, dragging pans, a double click shows the whole range again. Hover
// names a bar (kind, duration, bytes, weight, NVTX range, CUDA graph, launching stack); a click selects its stack in
// the flame graph, and the frame the flame graph has selected highlights the bars whose stack runs through it.
// The canvas carries data-bars, data-lanes (bars per lane) and data-highlighted for tests.

import { formatValue, niceTicks } from "./format.js";

const AXIS = 22; // px: the time axis on top
const GROUP = 18; // px: a GPU's header row
const LANE = 18; // px: a stream's row
const BAR = 14; // px: a bar's height in its lane
const GUTTER = 130; // px: lane labels on the left
const LABEL_MIN_PX = 40; // a bar this wide gets its name written on it
const FONT = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
const STACK_LINES = 24; // the hover shows at most this many frames, the leaf end
export const KIND_COLORS = { kernel: "rgb(39, 174, 96)", copy: "rgb(41, 128, 185)", set: "rgb(230, 126, 34)",
  collective: "rgb(142, 68, 173)" };
export const KIND_NOTES = { kernel: "kernel", copy: "memory copy", set: "memory set",
  collective: "NCCL collective" };

function formatBytes(n) {
  if (n >= 2 ** 30) return `${(n / 2 ** 30).toFixed(2)} GiB`;
  if (n >= 2 ** 20) return `${(n / 2 ** 20).toFixed(2)} MiB`;
  if (n >= 2 ** 10) return `${(n / 2 ** 10).toFixed(1)} KiB`;
  return `${n} B`;
}

export class Timeline {
  /** canvas: where to draw; tooltip: an absolutely placed element; onSelect(bar): a bar was clicked. */
  constructor(canvas, tooltip, onSelect = () => {}) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onSelect = onSelect;
    this.data = null;
    this.view = [0, 1]; // ns from the range's start: what the width shows
    this.highlightPath = null; // the flame graph's selected frame, as its path from the root
    this.merged = false; // the flame graph's processes merged: paths have no process frame
    this.highlighted = null; // Uint8Array per bar, or null
    this.lastRenderMs = 0;
    this.renders = 0;
    this._drag = null;
    canvas.addEventListener("wheel", (e) => this._wheel(e), { passive: false });
    canvas.addEventListener("mousedown", (e) => { this._drag = { x: e.offsetX, view: this.view.slice(), moved: false }; });
    canvas.addEventListener("mousemove", (e) => this._move(e));
    canvas.addEventListener("mouseup", (e) => this._up(e));
    canvas.addEventListener("mouseleave", () => { this._drag = null; this.tooltip.hidden = true; });
    canvas.addEventListener("dblclick", () => this.resetView());
    new ResizeObserver(() => { if (this.data) this.draw(); }).observe(canvas.parentElement);
  }

  /** Show an /api/timeline answer; returns the milliseconds from data to drawn. */
  setData(data) {
    const started = performance.now();
    this.data = data;
    const b = data.bars;
    const n = b.start.length;
    this.n = n;
    this.start = Float64Array.from(b.start);
    this.end = Float64Array.from(b.end);
    this.kind = Uint8Array.from(b.kind);
    this.lane = Uint32Array.from(b.lane);
    // rows: a header per GPU (node, device), then its streams; lanes arrive ordered by node, device, stream
    this.rows = [];
    this.laneRow = new Int32Array(data.lanes.length);
    let group = null;
    data.lanes.forEach((l, i) => {
      const key = `${l.node}\u0000${l.device}`;
      if (key !== group) {
        group = key;
        this.rows.push({ group: true, label: `GPU ${l.device}${data.filters?.node ? "" : ` · ${l.node}`}` });
      }
      this.laneRow[i] = this.rows.length;
      this.rows.push({ group: false, lane: i, label: `stream ${l.stream}` });
    });
    this.rowY = [];
    let y = AXIS;
    for (const row of this.rows) {
      this.rowY.push(y);
      y += row.group ? GROUP : LANE;
    }
    this.height = y + 2;
    // per lane its bars, by start (the answer's order)
    this.laneCount = new Uint32Array(data.lanes.length);
    for (let i = 0; i < n; i++) this.laneCount[this.lane[i]]++;
    this.laneBars = Array.from(this.laneCount, (c) => new Uint32Array(c));
    const fill = new Uint32Array(data.lanes.length);
    for (let i = 0; i < n; i++) this.laneBars[this.lane[i]][fill[this.lane[i]]++] = i;
    this._pathMatch = new Map();
    this.view = [0, data.span_ns];
    this._highlight();
    this.draw();
    this.lastRenderMs = performance.now() - started;
    return this.lastRenderMs;
  }

  resetView() {
    if (!this.data) return;
    this.view = [0, this.data.span_ns];
    this.draw();
  }

  /** Show [a, b] (ns from the range's start). */
  setView(a, b) {
    const span = Math.max(1000, b - a); // 1 µs at the most zoomed
    this.view = [a, a + span];
    this.draw();
  }

  /** The flame graph's selected frame (its path from the root; null: none), and whether its processes merge. */
  setHighlight(path, merged = false) {
    this.highlightPath = path && path.length ? path : null;
    this.merged = merged;
    if (!this.data) return;
    this._pathMatch = new Map();
    this._highlight();
    this.draw();
  }

  /** Bar i's path as the flame graph builds it: its process's frame, then its stack root first. */
  pathOf(i) {
    const d = this.data;
    const frames = Array.from(d.stacks[d.bars.stack[i]], (f) => d.frames[f]);
    return [d.processes[d.bars.process[i]], ...frames];
  }

  _highlight() {
    const path = this.highlightPath;
    this.highlighted = null;
    this.highlightCount = 0;
    if (!path) return;
    const d = this.data;
    const out = new Uint8Array(this.n);
    for (let i = 0; i < this.n; i++) {
      const key = d.bars.stack[i] * d.processes.length + d.bars.process[i];
      let hit = this._pathMatch.get(key);
      if (hit === undefined) {
        const full = this.pathOf(i);
        const mine = this.merged ? full.slice(1) : full;
        hit = path.length <= mine.length && path.every((name, k) => mine[k] === name) ? 1 : 0;
        this._pathMatch.set(key, hit);
      }
      out[i] = hit;
      this.highlightCount += hit;
    }
    this.highlighted = out;
  }

  _x(ns, width) {
    const [a, b] = this.view;
    return GUTTER + ((ns - a) / (b - a)) * (width - GUTTER);
  }

  draw() {
    if (!this.data) return;
    const canvas = this.canvas;
    const width = Math.max(300, canvas.parentElement.clientWidth);
    const height = this.height;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${height}px`;
    }
    this.width = width;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    this._axis(ctx, width);
    const kinds = this.data.kinds;
    const paths = kinds.map(() => new Path2D());
    const marked = new Path2D();
    const labels = [];
    const [a, b] = this.view;
    const scale = (width - GUTTER) / (b - a);
    const hl = this.highlighted;
    const acc = new Float64Array(kinds.length);
    for (let lane = 0; lane < this.laneBars.length; lane++) {
      const y = this.rowY[this.laneRow[lane]] + (LANE - BAR) / 2;
      const bars = this.laneBars[lane];
      // bars under a pixel wide: one pixel column per column they fall in, of the kind with the most time there,
      // so that 100k bars cost a few thousand rectangles and the colors say what dominates
      let column = -1;
      const flush = () => {
        if (column >= 0) paths[acc.indexOf(Math.max(...acc))].rect(column, y, 1, BAR);
        acc.fill(0);
      };
      for (let k = 0; k < bars.length; k++) {
        const i = bars[k];
        if (this.end[i] < a || this.start[i] > b) continue;
        const x0 = Math.max(GUTTER, GUTTER + (this.start[i] - a) * scale);
        const x1 = Math.min(width, GUTTER + (this.end[i] - a) * scale);
        const kind = this.kind[i];
        if (x1 - x0 < 1 && !(hl && hl[i])) {
          const c = Math.floor(x0);
          if (c !== column) {
            flush();
            column = c;
          }
          acc[kind] += this.end[i] - this.start[i] || 1;
          continue;
        }
        const w = Math.max(1, x1 - x0);
        paths[kind].rect(x0, y, w, BAR);
        if (hl && hl[i]) marked.rect(x0, y, w, BAR);
        if (w >= LABEL_MIN_PX) labels.push(i, x0, y, w);
      }
      flush();
      column = -1;
    }
    ctx.globalAlpha = hl ? 0.3 : 1;
    kinds.forEach((name, k) => {
      ctx.fillStyle = KIND_COLORS[name];
      ctx.fill(paths[k]);
    });
    ctx.globalAlpha = 1;
    if (hl) {
      kinds.forEach((name, k) => {
        ctx.save();
        ctx.clip(marked);
        ctx.fillStyle = KIND_COLORS[name];
        ctx.fill(paths[k]);
        ctx.restore();
      });
      ctx.strokeStyle = "#111";
      ctx.lineWidth = 1.5;
      ctx.stroke(marked);
    }
    this._labels(ctx, labels);
    this._gutter(ctx, width);
    this.renders += 1;
    this._expose();
  }

  _labels(ctx, labels) {
    const charWidth = ctx.measureText("mmmmmmmmmm").width / 10;
    const d = this.data;
    ctx.fillStyle = "#fff";
    for (let k = 0; k < labels.length; k += 4) {
      const [i, x, y, w] = labels.slice(k, k + 4);
      const weight = d.bars.weight[i];
      const name = d.names[d.bars.name[i]] + (weight > 1 ? ` ×${weight}` : "");
      const fits = Math.floor((w - 6) / charWidth);
      if (fits < 2) continue;
      const text = name.length <= fits ? name : `${name.slice(0, fits - 1)}…`;
      ctx.fillText(text, x + 3, y + BAR / 2 + 0.5);
    }
  }

  _gutter(ctx, width) {
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, AXIS, GUTTER - 2, this.height - AXIS);
    this.rows.forEach((row, r) => {
      const y = this.rowY[r];
      if (row.group) {
        ctx.fillStyle = "#f2f2f2";
        ctx.fillRect(0, y, width, GROUP);
        ctx.fillStyle = "#111";
        ctx.font = `600 ${FONT}`;
        ctx.fillText(row.label, 4, y + GROUP / 2);
        ctx.font = FONT;
      } else {
        ctx.fillStyle = "#555";
        ctx.fillText(`${row.label} (${this.laneCount[row.lane]})`, 14, y + LANE / 2);
      }
    });
  }

  _axis(ctx, width) {
    const [a, b] = this.view;
    const ticks = niceTicks(a, b, Math.max(2, Math.floor((width - GUTTER) / 140)));
    const step = ticks.length > 1 ? ticks[1] - ticks[0] : b - a;
    ctx.fillStyle = "#555";
    ctx.strokeStyle = "#e4e4e4";
    for (const t of ticks) {
      if (t < a || t > b) continue;
      const x = Math.round(this._x(t, width)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, AXIS - 4);
      ctx.lineTo(x, this.height);
      ctx.stroke();
      ctx.fillText(this.clock(t, step), x + 3, AXIS / 2);
    }
  }

  /** The UTC time of the range's start + ns, HH:MM:SS and as many decimals as ticks `step` ns apart need. */
  clock(ns, step = 1e9) {
    const since = BigInt(this.data.since_ns);
    const total = Number(since % 1_000_000_000n) + ns;
    const seconds = Number(since / 1_000_000_000n) + Math.floor(total / 1e9);
    const fraction = total - Math.floor(total / 1e9) * 1e9;
    const text = new Date(seconds * 1000).toISOString().slice(11, 19);
    const decimals = Math.min(9, Math.max(0, Math.ceil(-Math.log10(step / 1e9) - 1e-9)));
    return decimals ? `${text}.${String(Math.round(fraction)).padStart(9, "0").slice(0, decimals)}` : text;
  }

  /** The bar drawn at canvas CSS pixel (px, py), or -1: of overlapping ones, the shortest. */
  barAt(px, py) {
    if (!this.data || px < GUTTER) return -1;
    const r = this.rows.findIndex((row, k) => !row.group && py >= this.rowY[k] && py < this.rowY[k] + LANE);
    if (r < 0) return -1;
    const [a, b] = this.view;
    const perPx = (b - a) / (this.width - GUTTER);
    const t = a + (px - GUTTER) * perPx;
    let best = -1;
    for (const i of this.laneBars[this.rows[r].lane]) {
      if (this.start[i] - perPx <= t && t <= Math.max(this.end[i], this.start[i] + perPx)) {
        if (best < 0 || this.end[i] - this.start[i] < this.end[best] - this.start[best]) best = i;
      }
    }
    return best;
  }

  /** The middle of bar i as drawn, in canvas CSS pixels, or null when it is out of view. */
  barPoint(i) {
    const [a, b] = this.view;
    if (this.end[i] < a || this.start[i] > b) return null;
    const x0 = Math.max(GUTTER, this._x(this.start[i], this.width));
    const x1 = Math.min(this.width, this._x(this.end[i], this.width));
    return { x: (x0 + Math.max(x0 + 1, x1)) / 2, y: this.rowY[this.laneRow[this.lane[i]]] + LANE / 2 };
  }

  /** What the tooltip says about bar i, as data. */
  describe(i) {
    const d = this.data;
    const b = d.bars;
    const lane = d.lanes[b.lane[i]];
    return { name: d.names[b.name[i]], kind: d.kinds[b.kind[i]], start: this.clock(b.start[i], 1e3),
      durationNs: b.end[i] - b.start[i], weight: b.weight[i], bytes: b.bytes[i], range: d.ranges[b.range[i]],
      graph: b.graph[i], graphNode: b.graph_node[i], process: d.processes[b.process[i]], node: lane.node,
      device: lane.device, stream: lane.stream, stack: this.pathOf(i).slice(1), stackId: d.stack_ids[b.stack[i]] };
  }

  tooltipText(i) {
    const d = this.describe(i);
    const lines = [`${d.name}  (${KIND_NOTES[d.kind]})`,
      `duration ${formatValue(d.durationNs, "ns")}   start ${d.start} UTC`,
      `weight ${d.weight}: stands for ${d.weight} launch${d.weight === 1 ? "" : "es"}`];
    if (d.bytes) lines.push(`bytes ${formatBytes(d.bytes)}  (${(d.bytes / d.durationNs).toFixed(2)} GB/s)`);
    lines.push(`NVTX range ${d.range || "(none)"}`);
    if (d.graph || d.graphNode) lines.push(`CUDA graph ${d.graph} node ${d.graphNode}`);
    lines.push(`${d.process} · GPU ${d.device} stream ${d.stream}${this.data.filters?.node ? "" : ` on ${d.node}`}`);
    lines.push("launching stack (root first):");
    const stack = d.stack;
    if (stack.length > STACK_LINES) lines.push(`  … ${stack.length - STACK_LINES} frames above`);
    for (const frame of stack.slice(-STACK_LINES)) lines.push(`  ${frame}`);
    return lines.join("\n");
  }

  _expose() {
    const c = this.canvas.dataset;
    c.bars = String(this.n);
    c.lanes = JSON.stringify(this.data.lanes.map((l, i) => [`${l.node}/${l.device}/${l.stream}`, this.laneCount[i]]));
    c.highlighted = String(this.highlighted ? this.highlightCount : 0);
  }

  _wheel(e) {
    if (!this.data || e.offsetX < GUTTER) return;
    e.preventDefault();
    const [a, b] = this.view;
    const at = a + ((e.offsetX - GUTTER) / (this.width - GUTTER)) * (b - a);
    const factor = Math.exp(e.deltaY / 300);
    this.setView(at - (at - a) * factor, at + (b - at) * factor);
  }

  _move(e) {
    const drag = this._drag;
    if (drag && this.data) {
      const dx = e.offsetX - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const [a, b] = drag.view;
        const shift = (dx / (this.width - GUTTER)) * (b - a);
        this.setView(a - shift, b - shift);
        this.tooltip.hidden = true;
        return;
      }
    }
    this._hover(e);
  }

  _up(e) {
    const drag = this._drag;
    this._drag = null;
    if (drag && !drag.moved) {
      const i = this.barAt(e.offsetX, e.offsetY);
      if (i >= 0) this.onSelect(i);
    }
  }

  _hover(e) {
    const i = this.barAt(e.offsetX, e.offsetY);
    if (i < 0) {
      this.tooltip.hidden = true;
      return;
    }
    this.tooltip.textContent = this.tooltipText(i);
    this.tooltip.hidden = false;
    // in viewport pixels (position: fixed), kept inside the window
    const t = this.tooltip;
    const left = Math.min(e.clientX + 12, window.innerWidth - t.offsetWidth - 4);
    const below = e.clientY + 14;
    const top = below + t.offsetHeight > window.innerHeight ? e.clientY - t.offsetHeight - 8 : below;
    t.style.left = `${Math.max(0, left)}px`;
    t.style.top = `${Math.max(0, top)}px`;
  }
}
