// The flame graph: an icicle (root on top) drawn on a canvas, so that 100k distinct stacks render in well under a
// second, which SVG or one DOM element per frame cannot do.
//
// The call tree is kept as typed arrays over its nodes in preorder (parent, frame, depth, total, self, x, end), built
// in one pass: the stacks are sorted by frame name first, so stacks that share a prefix are neighbours and each one
// only adds the nodes past its common prefix with the previous one. No per-node objects, no hash map; siblings come
// out in name order, as in flamegraph.pl. `end[i]` is one past the last node of i's subtree, so a frame too narrow to
// see skips its whole subtree while drawing.

const ROW = 17; // px per stack level
const MIN_PX = 0.5; // narrower frames (and everything under them) are not drawn
const LABEL_MIN_PX = 24;
const FONT = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
// Colors by binary: a qualitative palette (Tableau 10, teal for its grey: grey means "unknown binary" here), lightened,
// then a small lightness step per function so neighbouring frames of one binary stay apart.
const PALETTE = [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189], [140, 86, 75],
  [227, 119, 194], [188, 189, 34], [23, 190, 207], [0, 128, 128]];
const MATCH_COLOR = "#e040fb";
// Colors by language (frames.language): one hue each, and grey for frames whose language is unknown.
const LANGUAGE_COLORS = { python: [55, 118, 171], native: [230, 126, 34], kernel: [192, 57, 43], gpu: [39, 174, 96] };

function hash(text) {
  let h = 2166136261; // FNV-1a
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

export function binaryColor(binary) {
  if (!binary) return "rgb(200, 200, 200)";
  const [r, g, b] = PALETTE[hash(binary) % PALETTE.length];
  return `rgb(${r}, ${g}, ${b})`;
}

export function languageColor(language) {
  const rgb = LANGUAGE_COLORS[language];
  return rgb ? `rgb(${rgb[0]}, ${rgb[1]}, ${rgb[2]})` : "rgb(200, 200, 200)";
}

function frameColor(binary, name, language = null) {
  const rgb = language === null ? (binary ? PALETTE[hash(binary) % PALETTE.length] : null) : LANGUAGE_COLORS[language];
  if (!rgb) return "rgb(205, 205, 205)";
  const [r, g, b] = rgb;
  const mix = 0.45 + (hash(name) % 7) * 0.04; // toward white: text on it stays readable
  return `rgb(${Math.round(r + (255 - r) * mix)}, ${Math.round(g + (255 - g) * mix)}, ${Math.round(b + (255 - b) * mix)})`;
}

function compareText(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The call tree of a /api/flamegraph (or /diff) answer, as typed arrays in preorder. */
export function buildTree(data) {
  const { frames, binaries, stacks, counts } = data;
  const frameBinary = data.frame_binary;
  const base = data.base_counts || null;
  const nFrames = frames.length;
  const byName = Array.from({ length: nFrames }, (_, i) => i)
    .sort((a, b) => compareText(frames[a], frames[b]) || compareText(binaries[frameBinary[a]], binaries[frameBinary[b]]));
  const rank = new Int32Array(nFrames);
  byName.forEach((f, r) => { rank[f] = r; });

  // Every stack's frames as ranks, in one flat array (stack k at [start[k], start[k + 1])): comparisons stay in one
  // typed array instead of 100k small ones.
  const n = stacks.length;
  const start = new Int32Array(n + 1);
  for (let k = 0; k < n; k++) start[k + 1] = start[k] + stacks[k].length;
  const ranks = new Int32Array(start[n]);
  let longest = 0;
  for (let k = 0; k < n; k++) {
    const s = stacks[k];
    const at = start[k];
    for (let j = 0; j < s.length; j++) ranks[at + j] = rank[s[j]];
    if (s.length > longest) longest = s.length;
  }
  const order = new Int32Array(n);
  for (let k = 0; k < n; k++) order[k] = k;
  order.sort((a, b) => {
    const ia = start[a], ib = start[b];
    const la = start[a + 1] - ia, lb = start[b + 1] - ib;
    const m = la < lb ? la : lb;
    for (let i = 0; i < m; i++) {
      const d = ranks[ia + i] - ranks[ib + i];
      if (d !== 0) return d;
    }
    return la - lb;
  });

  const capacity = start[n] + 1;
  const parent = new Int32Array(capacity);
  const frame = new Int32Array(capacity);
  const depth = new Uint16Array(capacity);
  const total = new Float64Array(capacity);
  const self = new Float64Array(capacity);
  const baseTotal = base ? new Float64Array(capacity) : null;
  const baseSelf = base ? new Float64Array(capacity) : null;
  parent[0] = -1;
  frame[0] = -1;
  const path = new Int32Array(longest + 1); // path[d]: the node at depth d of the stack being added
  let count = 1;
  let prevAt = 0;
  let prevLen = 0;
  for (let q = 0; q < n; q++) {
    const k = order[q];
    const at = start[k], len = start[k + 1] - at;
    let common = 0;
    const m = len < prevLen ? len : prevLen;
    while (common < m && ranks[at + common] === ranks[prevAt + common]) common++;
    for (let j = common; j < len; j++) {
      const node = count++;
      parent[node] = path[j];
      frame[node] = byName[ranks[at + j]];
      depth[node] = j + 1;
      path[j + 1] = node;
    }
    self[path[len]] += counts[k];
    if (base) baseSelf[path[len]] += base[k];
    prevAt = at;
    prevLen = len;
  }
  // totals: self plus the children's totals; children come after their parent in preorder
  for (let i = 0; i < count; i++) total[i] = self[i];
  for (let i = count - 1; i > 0; i--) total[parent[i]] += total[i];
  if (base) {
    for (let i = 0; i < count; i++) baseTotal[i] = baseSelf[i];
    for (let i = count - 1; i > 0; i--) baseTotal[parent[i]] += baseTotal[i];
  }

  // x: where each node starts, in value units; children follow each other from their parent's start.
  const x = new Float64Array(count);
  const next = new Float64Array(count);
  for (let i = 1; i < count; i++) {
    const p = parent[i];
    x[i] = next[p];
    next[p] += total[i];
    next[i] = x[i];
  }
  const end = new Int32Array(count);
  for (let i = 0; i < count; i++) end[i] = i + 1;
  for (let i = count - 1; i > 0; i--) if (end[i] > end[parent[i]]) end[parent[i]] = end[i];

  return {
    count, parent: parent.subarray(0, count), frame: frame.subarray(0, count), depth: depth.subarray(0, count),
    total: total.subarray(0, count), self: self.subarray(0, count), x, end, maxDepth: longest,
    baseTotal: baseTotal && baseTotal.subarray(0, count), baseSelf: baseSelf && baseSelf.subarray(0, count),
    frames, binaries, frameBinary, diff: Boolean(base),
    languages: data.languages || [], frameLanguage: data.frame_language || [],
  };
}

/** A value in the flame graph's unit, for people. */
export function formatValue(value, unit) {
  if (unit === "ns") {
    if (value >= 1e9) return `${(value / 1e9).toFixed(3)} s`;
    if (value >= 1e6) return `${(value / 1e6).toFixed(3)} ms`;
    if (value >= 1e3) return `${(value / 1e3).toFixed(1)} µs`;
    return `${value} ns`;
  }
  return `${value.toLocaleString("en-US")} ${value === 1 ? "sample" : "samples"}`;
}

export function percent(part, whole) {
  return whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "-";
}

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

export class FlameGraph {
  /** canvas: where to draw; tooltip: an absolutely placed element; onChange(graph): after each draw. */
  constructor(canvas, tooltip, onChange = () => {}) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onChange = onChange;
    this.model = null;
    this.unit = "samples";
    this.focus = 0;
    this.match = null; // Uint8Array over frames: 1 where the search matches
    this.matched = 0;
    this.renders = 0;
    this.lastRenderMs = 0;
    this.drawn = { node: [], x: [], w: [] };
    this._frameColors = [];
    this.colorBy = "binary"; // or "language"
    this._diffScale = 1;
    canvas.addEventListener("mousemove", (e) => this._hover(e));
    canvas.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    canvas.addEventListener("click", (e) => {
      const node = this.nodeAt(e.offsetX, e.offsetY);
      if (node >= 0) this.zoom(node);
    });
    new ResizeObserver(() => { if (this.model) this.draw(); }).observe(canvas.parentElement);
  }

  /** Show a /api/flamegraph or /api/flamegraph/diff answer; returns the milliseconds from data to drawn. */
  setData(data, search = "") {
    const started = performance.now();
    const m = buildTree(data);
    this.model = m;
    this.unit = data.unit || "samples";
    this.focus = 0;
    this._paint();
    if (m.diff) {
      // color scale: the largest change in any frame's share of its range
      let largest = 0;
      for (let i = 1; i < m.count; i++) largest = Math.max(largest, Math.abs(this._delta(i)));
      this._diffScale = largest || 1;
    }
    this._search(search);
    this.draw();
    this.lastRenderMs = performance.now() - started;
    return this.lastRenderMs;
  }

  setSearch(text) {
    this._search(text);
    this.draw();
  }

  zoom(node) {
    this.focus = node;
    this.draw();
  }

  resetZoom() {
    this.zoom(0);
  }

  /** The change in share of its range (new minus baseline) of node i's total, in diff mode. */
  _delta(i) {
    const m = this.model;
    const now = m.total[0] ? m.total[i] / m.total[0] : 0;
    const before = m.baseTotal[0] ? m.baseTotal[i] / m.baseTotal[0] : 0;
    return now - before;
  }

  _search(text) {
    const m = this.model;
    this.searchText = text;
    this.match = null;
    this.matched = 0;
    if (!m || !text) return;
    let re;
    try {
      re = new RegExp(text, "i");
    } catch {
      re = new RegExp(escapeRegExp(text), "i");
    }
    const match = new Uint8Array(m.frames.length);
    m.frames.forEach((name, i) => { match[i] = re.test(name) ? 1 : 0; });
    // matched value: a matching frame counts with everything under it, once, even if more matches lie below
    let matched = 0;
    for (let i = 1; i < m.count;) {
      if (match[m.frame[i]]) {
        matched += m.total[i];
        i = m.end[i];
      } else {
        i++;
      }
    }
    this.match = match;
    this.matched = matched;
  }

  _color(i) {
    const m = this.model;
    if (i === 0) return "rgb(190, 190, 190)";
    if (this.match && this.match[m.frame[i]]) return MATCH_COLOR;
    if (!m.diff) return this._frameColors[m.frame[i]];
    const t = Math.min(1, Math.abs(this._delta(i)) / this._diffScale);
    const level = Math.round(t * 20) / 20; // 21 shades: the string cache stays tiny
    const light = 96 - 46 * level;
    return this._delta(i) >= 0 ? `hsl(0, 85%, ${light}%)` : `hsl(215, 85%, ${light}%)`;
  }

  name(i) {
    return i === 0 ? "all" : this.model.frames[this.model.frame[i]];
  }

  binary(i) {
    return i === 0 ? "" : this.model.binaries[this.model.frameBinary[this.model.frame[i]]];
  }

  draw() {
    const m = this.model;
    if (!m) return;
    const canvas = this.canvas;
    const width = Math.max(100, canvas.parentElement.clientWidth);
    const height = (m.maxDepth + 1) * ROW + 1;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * dpr) || canvas.height !== Math.round(height * dpr)) {
      canvas.width = Math.round(width * dpr);
      canvas.height = Math.round(height * dpr);
      canvas.style.width = `${width}px`;
      canvas.style.height = `${height}px`;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    const charWidth = ctx.measureText("mmmmmmmmmm").width / 10;
    this.drawn = { node: [], x: [], w: [] };
    const focus = this.focus;
    const focusTotal = m.total[focus];
    if (focusTotal > 0) {
      const scale = width / focusTotal;
      const x0 = m.x[focus];
      for (let a = m.parent[focus]; a >= 0; a = m.parent[a]) this._rect(ctx, a, 0, width, charWidth);
      for (let i = focus, stop = m.end[focus]; i < stop;) {
        const w = m.total[i] * scale;
        if (w < MIN_PX) {
          i = m.end[i];
          continue;
        }
        this._rect(ctx, i, (m.x[i] - x0) * scale, w, charWidth);
        i++;
      }
    }
    this.renders += 1;
    this.onChange(this);
  }

  _rect(ctx, i, x, w, charWidth) {
    const y = this.model.depth[i] * ROW;
    ctx.fillStyle = this._color(i);
    ctx.fillRect(x, y, w > 2 ? w - 1 : w, ROW - 1);
    this.drawn.node.push(i);
    this.drawn.x.push(x);
    this.drawn.w.push(w);
    if (w >= LABEL_MIN_PX) {
      const name = this.name(i);
      const fits = Math.floor((w - 6) / charWidth);
      const label = name.length <= fits ? name : `${name.slice(0, Math.max(0, fits - 1))}…`;
      ctx.fillStyle = "#111";
      ctx.fillText(label, x + 3, y + ROW / 2);
    }
  }

  /** The node drawn at canvas CSS pixel (px, py), or -1. */
  nodeAt(px, py) {
    const depth = Math.floor(py / ROW);
    const { node, x, w } = this.drawn;
    const m = this.model;
    for (let k = 0; k < node.length; k++) {
      if (m.depth[node[k]] === depth && px >= x[k] && px < x[k] + w[k]) return node[k];
    }
    return -1;
  }

  /** Where node i was last drawn, in canvas CSS pixels, or null. */
  rectOf(i) {
    const k = this.drawn.node.indexOf(i);
    if (k < 0) return null;
    return { x: this.drawn.x[k], y: this.model.depth[i] * ROW, w: this.drawn.w[k], h: ROW - 1 };
  }

  /** The first node (preorder) whose path from the root is `names` ("main", "run", ...), or -1. */
  find(...names) {
    const m = this.model;
    let node = 0;
    for (const name of names) {
      let found = -1;
      for (let i = node + 1; i < m.end[node]; i = m.end[i]) { // children only: skip each child's subtree
        if (this.name(i) === name) {
          found = i;
          break;
        }
      }
      if (found < 0) return -1;
      node = found;
    }
    return node;
  }

  path(i) {
    const names = [];
    for (let a = i; a > 0; a = this.model.parent[a]) names.push(this.name(a));
    return names.reverse();
  }

  /** What the tooltip says about node i, as data. */
  describe(i) {
    const m = this.model;
    const out = { name: this.name(i), binary: this.binary(i), total: m.total[i], self: m.self[i], all: m.total[0] };
    if (m.diff) {
      Object.assign(out, { baseTotal: m.baseTotal[i], baseSelf: m.baseSelf[i], baseAll: m.baseTotal[0],
        delta: this._delta(i) });
    }
    return out;
  }

  /** The shown stacks as folded lines 'root;...;leaf value' (self values), in drawing order. */
  folded() {
    const m = this.model;
    const lines = [];
    for (let i = 1; i < m.count; i++) if (m.self[i] > 0) lines.push(`${this.path(i).join(";")} ${m.self[i]}`);
    return lines;
  }

  /** Color frames by "binary" or by "language", and draw again. */
  setColorBy(mode) {
    this.colorBy = mode === "language" ? "language" : "binary";
    if (this.model) {
      this._paint();
      this.draw();
    }
  }

  _paint() {
    const m = this.model;
    this._frameColors = m.frames.map((name, i) => frameColor(m.binaries[m.frameBinary[i]], name,
      this.colorBy === "language" ? this.language(i, true) : null));
  }

  /** The language of node i (of frame i, with `isFrame`): "unknown" where the answer says none. */
  language(i, isFrame = false) {
    const m = this.model;
    const frame = isFrame ? i : m.frame[i];
    return (!isFrame && i === 0) ? "" : (m.languages[m.frameLanguage[frame]] || "unknown");
  }

  /** Total value per binary (or per language, with "language") of the frames' self values, largest first: the
   * legend. */
  binaryTotals(by = "binary") {
    const m = this.model;
    const sums = new Map();
    for (let i = 1; i < m.count; i++) {
      if (m.self[i] > 0) {
        const b = by === "language" ? this.language(i) : this.binary(i);
        sums.set(b, (sums.get(b) || 0) + m.self[i]);
      }
    }
    return [...sums.entries()].sort((a, b) => b[1] - a[1]);
  }

  _hover(e) {
    const i = this.nodeAt(e.offsetX, e.offsetY);
    if (i < 0) {
      this.tooltip.hidden = true;
      return;
    }
    const d = this.describe(i);
    const unit = this.unit;
    let text = `${d.name}${d.binary ? `  (${d.binary})` : ""}\n`
      + `total ${formatValue(d.total, unit)} (${percent(d.total, d.all)})\n`
      + `self  ${formatValue(d.self, unit)} (${percent(d.self, d.all)})`;
    if (this.model.diff) {
      const sign = d.delta >= 0 ? "+" : "";
      text += `\nbaseline total ${formatValue(d.baseTotal, unit)} (${percent(d.baseTotal, d.baseAll)})`
        + `\nchange in share ${sign}${(100 * d.delta).toFixed(1)} points`;
    }
    this.tooltip.textContent = text;
    this.tooltip.hidden = false;
    const box = this.canvas.parentElement.getBoundingClientRect();
    const left = Math.min(e.clientX - box.left + 12, box.width - this.tooltip.offsetWidth - 4);
    this.tooltip.style.left = `${Math.max(0, left)}px`;
    this.tooltip.style.top = `${e.clientY - box.top + 14}px`;
  }
}
