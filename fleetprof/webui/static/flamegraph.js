// The flame graph: an icicle (root on top) drawn on a canvas, so that 100k distinct stacks render in well under a
// second, which SVG or one DOM element per frame cannot do. The call tree is built by tree.js; colors come from
// colors.js. The canvas is as tall as the deepest frame drawn, so no row is clipped and no empty area is left.

import { ROOT_COLOR, MATCH_COLOR, diffColor, frameCategory, frameColor, textColor } from "./colors.js";
import { formatValue, percent } from "./format.js";
import { buildTree } from "./tree.js";

export { buildTree } from "./tree.js";
export { formatValue, percent } from "./format.js";

const ROW = 17; // px per stack level
const MIN_PX = 0.5; // narrower frames (and everything under them) are not drawn
const MIN_CHANGED_PX = 3; // in a diff, a frame whose color shows a change is drawn at least this wide
const CHANGED = 0.025; // ... that is, a change of at least this fraction of the color scale (the first shade)
const LABEL_MIN_PX = 24;
const FONT = "11px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";

function escapeRegExp(text) {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

export class FlameGraph {
  /** canvas: where to draw; tooltip: an absolutely placed element; onChange(graph): after each draw. */
  constructor(canvas, tooltip, onChange = () => {}) {
    this.canvas = canvas;
    this.tooltip = tooltip;
    this.onChange = onChange;
    this.data = null;
    this.model = null;
    this.unit = "samples";
    this.focus = 0;
    this.match = null; // Uint8Array over frames: 1 where the search matches
    this.matched = 0;
    this.renders = 0;
    this.lastRenderMs = 0;
    this.drawn = { node: [], x: [], w: [] };
    this.category = []; // per frame: its colors.js category
    this._frameColors = [];
    this.colorBy = "binary"; // or "language"
    this.mergeProcesses = false;
    this.diffScale = 1;
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
    this.data = data;
    this.unit = data.unit || "samples";
    this._build(search);
    this.lastRenderMs = performance.now() - started;
    return this.lastRenderMs;
  }

  /** With `merge`, the processes' stacks merge (no root frame per process); drawn again. */
  setMergeProcesses(merge) {
    this.mergeProcesses = Boolean(merge);
    if (this.data) this._build(this.searchText || "");
  }

  _build(search) {
    const m = buildTree(this.data, this.mergeProcesses);
    this.model = m;
    this.focus = 0;
    this._paint();
    if (m.diff) {
      // color scale: the largest change in any frame's share of its range
      let largest = 0;
      for (let i = 1; i < m.count; i++) largest = Math.max(largest, Math.abs(this._delta(i)));
      this.diffScale = largest || 1;
    }
    this._search(search);
    this.draw();
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

  /** Whether node i's color shows a change (diff mode). */
  changed(i) {
    return this.model.diff && Math.abs(this._delta(i)) >= CHANGED * this.diffScale;
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
    if (i === 0) return ROOT_COLOR;
    if (this.match && this.match[m.frame[i]]) return MATCH_COLOR;
    if (!m.diff) return this._frameColors[m.frame[i]];
    return diffColor(this._delta(i), this.diffScale);
  }

  name(i) {
    return i === 0 ? "all" : this.model.frames[this.model.frame[i]];
  }

  binary(i) {
    return i === 0 ? "" : this.model.binaries[this.model.frameBinary[this.model.frame[i]]];
  }

  /** The nodes to draw at the current zoom, {node, x, w} in CSS pixels for a graph `width` wide: ancestors of the
   * focus across the width, then its subtree, frames under MIN_PX left out with everything under them, except that
   * in a diff a changed frame is drawn at least MIN_CHANGED_PX wide, last, so nothing covers it. */
  _layout(width) {
    const m = this.model;
    const out = { node: [], x: [], w: [] };
    const late = { node: [], x: [] };
    const focus = this.focus;
    const focusTotal = m.total[focus];
    if (focusTotal <= 0) return out;
    const scale = width / focusTotal;
    const x0 = m.x[focus];
    const add = (i, x, w) => {
      out.node.push(i);
      out.x.push(x);
      out.w.push(w);
    };
    for (let a = m.parent[focus]; a >= 0; a = m.parent[a]) add(a, 0, width);
    for (let i = focus, stop = m.end[focus]; i < stop;) {
      const w = m.total[i] * scale;
      if (w < MIN_CHANGED_PX && m.diff && m.total[i] > 0 && this.changed(i)) {
        late.node.push(i);
        late.x.push(Math.min((m.x[i] - x0) * scale, width - MIN_CHANGED_PX));
        i++;
        continue;
      }
      if (w < MIN_PX) {
        i = m.end[i];
        continue;
      }
      add(i, (m.x[i] - x0) * scale, w);
      i++;
    }
    late.node.forEach((i, k) => add(i, late.x[k], MIN_CHANGED_PX));
    return out;
  }

  draw() {
    const m = this.model;
    if (!m) return;
    const canvas = this.canvas;
    const width = Math.max(100, canvas.parentElement.clientWidth);
    const layout = this._layout(width);
    let deepest = 0;
    for (const i of layout.node) if (m.depth[i] > deepest) deepest = m.depth[i];
    const height = (deepest + 1) * ROW + 1;
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
    this.drawn = layout;
    for (let k = 0; k < layout.node.length; k++) this._rect(ctx, layout.node[k], layout.x[k], layout.w[k], charWidth);
    this.renders += 1;
    this.onChange(this);
  }

  _rect(ctx, i, x, w, charWidth) {
    const y = this.model.depth[i] * ROW;
    ctx.fillStyle = this._color(i);
    ctx.fillRect(x, y, w > 2 ? w - 1 : w, ROW - 1);
    if (w >= LABEL_MIN_PX) {
      const name = this.name(i);
      const fits = Math.floor((w - 6) / charWidth);
      const label = name.length <= fits ? name : `${name.slice(0, Math.max(0, fits - 1))}…`;
      const plain = i > 0 && !this.model.diff && !(this.match && this.match[this.model.frame[i]]);
      ctx.fillStyle = plain ? textColor(this.category[this.model.frame[i]]) : "#111";
      ctx.fillText(label, x + 3, y + ROW / 2);
    }
  }

  /** The node drawn at canvas CSS pixel (px, py), or -1: the last drawn wins (drawn over the others). */
  nodeAt(px, py) {
    const depth = Math.floor(py / ROW);
    const { node, x, w } = this.drawn;
    const m = this.model;
    for (let k = node.length - 1; k >= 0; k--) {
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
    this.category = m.frames.map((name, f) => frameCategory(name, m.binaries[m.frameBinary[f]],
      this.language(f, true), this.colorBy));
    this._frameColors = m.frames.map((name, f) => frameColor(this.category[f], name));
  }

  /** The language of node i (of frame i, with `isFrame`): "unknown" where the answer says none. */
  language(i, isFrame = false) {
    const m = this.model;
    const frame = isFrame ? i : m.frame[i];
    return (!isFrame && i === 0) ? "" : (m.languages[m.frameLanguage[frame]] || "unknown");
  }

  /** The legend: per color category, the total value of the stacks with a frame of it (callees included, each
   * stack counted once however often the category recurs in it), largest first, as [category, value]. */
  categoryTotals() {
    const m = this.model;
    const index = new Map();
    const frameCat = new Int32Array(m.frames.length);
    this.category.forEach((c, f) => {
      if (!index.has(c)) index.set(c, index.size);
      frameCat[f] = index.get(c);
    });
    const onPath = new Int32Array(index.size);
    const pathCat = new Int32Array(m.maxDepth + 2);
    const sums = new Float64Array(index.size);
    let depth = 0;
    for (let i = 1; i < m.count; i++) {
      const d = m.depth[i];
      for (; depth >= d; depth--) onPath[pathCat[depth]]--;
      const c = frameCat[m.frame[i]];
      if (onPath[c] === 0) sums[c] += m.total[i];
      onPath[c]++;
      pathCat[d] = c;
      depth = d;
    }
    const byName = (a, b) => (a < b ? -1 : a > b ? 1 : 0);
    return [...index.keys()].map((c, k) => [c, sums[k]]).filter(([, v]) => v > 0)
      .sort((a, b) => b[1] - a[1] || byName(a[0], b[0]));
  }

  _hover(e) {
    const i = this.nodeAt(e.offsetX, e.offsetY);
    if (i < 0) {
      this.tooltip.hidden = true;
      return;
    }
    const d = this.describe(i);
    const unit = this.unit;
    const what = i > 0 && this.language(i) === "process" ? "  (process)" : d.binary ? `  (${d.binary})` : "";
    let text = `${d.name}${what}\n`
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
