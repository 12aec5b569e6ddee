// The GPU timeline's panel: loads /api/timeline for the flame graph's range and filters, says what is shown (bars and
// the launches they stand for, whether the answer was capped, whether the data is simulated) or why nothing is (a
// range longer than the server shows, no records), and holds the canvas (timeline.js).
// .version counts finished loads and .pending says one is under way (tests wait on them).

import { KIND_COLORS, KIND_NOTES, Timeline } from "./timeline.js";

export class TimelinePanel {
  /** root: the panel's section (#timeline-panel and its children); onSelect(path, bar): a bar was clicked, with
   * its path as the flame graph builds it (process frame first). */
  constructor(root, onSelect) {
    this.root = root;
    this.el = (name) => root.querySelector(`[data-timeline=${name}]`);
    this.view = new Timeline(this.el("canvas"), this.el("tooltip"), (i) => onSelect(this.view.pathOf(i), i));
    this.el("reset").addEventListener("click", () => this.view.resetView());
    this.version = 0;
    this.pending = false;
    this.ticket = 0;
    this.data = null;
  }

  /** Show the timeline of [since, until) (epoch seconds) for node and pid ('' and 0: all) with NCCL's collectives
   * shown, hidden or alone (collectives '' or "all", "hide", "only"), kernels and/or copies (what) and under an NVTX
   * range (nvtx_range), as the GPU flame graph shows them, or hide the panel. */
  async load({ since, until, node, pid, collectives, what, nvtx_range: nvtxRange, shown }) {
    this.root.hidden = !shown;
    const ticket = ++this.ticket;
    if (!shown) { // nothing to load: done at once
      this.pending = false;
      this.version += 1;
      return;
    }
    this.pending = true;
    this._message("loading the timeline…");
    const q = new URLSearchParams({ from: since, to: until });
    if (node) q.set("node", node);
    if (pid) q.set("pid", pid);
    if (collectives && collectives !== "all") q.set("collectives", collectives);
    if (what && what !== "all") q.set("what", what);
    if (nvtxRange) q.set("nvtx_range", nvtxRange);
    try {
      const response = await fetch(`api/timeline?${q}`);
      let body;
      try {
        body = await response.json();
      } catch {
        body = { error: `api/timeline: HTTP ${response.status}` };
      }
      if (ticket !== this.ticket) return;
      if (!response.ok) {
        this._message(body.error || `api/timeline: HTTP ${response.status}`);
      } else if (body.count === 0) {
        this._message(body.expired || "No sampled GPU kernels, copies or sets in this range for these filters.");
      } else {
        this.data = body;
        this._message("");
        this.el("wrap").hidden = false;
        this.view.setData(body);
        this._describe(body);
        this.highlight(this.view.highlightPath, this.view.merged);
      }
    } catch (err) {
      if (ticket === this.ticket) this._message(err.message);
    } finally {
      if (ticket === this.ticket) {
        this.pending = false;
        this.version += 1;
      }
    }
  }

  /** The flame graph's selected frame (its path; null or empty: none): its bars highlighted, and said how many. */
  highlight(path, merged) {
    this.view.setHighlight(path, merged);
    const el = this.el("selection");
    const shown = Boolean(this.view.highlighted);
    el.hidden = !shown;
    el.textContent = shown ? `${this.view.highlightCount.toLocaleString("en-US")} bars launched through the flame `
      + `graph's selected frame (outlined): ${path[path.length - 1]}` : "";
  }

  _message(text) {
    const el = this.el("message");
    el.textContent = text;
    el.hidden = !text;
    if (text) {
      this.el("wrap").hidden = true;
      this.el("info").textContent = "";
      this.el("legend").replaceChildren();
    }
  }

  _describe(data) {
    let launches = 0;
    const perKind = new Array(data.kinds.length).fill(0);
    data.bars.weight.forEach((w, i) => {
      launches += w;
      perKind[data.bars.kind[i]] += 1;
    });
    const parts = [`${data.count.toLocaleString("en-US")} sampled records, standing for `
      + `${launches.toLocaleString("en-US")} launches (their weights)`];
    if (data.capped) {
      parts.push(`capped at ${data.limit.toLocaleString("en-US")} bars: the first by start, until `
        + `${this.view.clock(Math.max(...data.bars.start.slice(-1)))} UTC; select a shorter range to see all`);
    }
    if (data.expired) parts.push(data.expired);
    const simulated = data.simulated && data.simulated.length > 0;
    const info = this.el("info");
    info.textContent = (simulated ? "SIMULATED · " : "") + parts.join(" · ");
    info.classList.toggle("simulated", simulated);
    info.classList.toggle("capped", Boolean(data.capped));
    const items = data.kinds.map((kind, k) => {
      const item = document.createElement("span");
      item.className = "legend-item";
      const swatch = document.createElement("i");
      swatch.style.background = KIND_COLORS[kind];
      item.append(swatch, `${KIND_NOTES[kind]} ${perKind[k].toLocaleString("en-US")}`);
      return item;
    });
    const hint = document.createElement("span");
    hint.textContent = "wheel: zoom · drag: pan · double click: whole range · click a bar: its stack in the flame graph";
    this.el("legend").replaceChildren(...items, hint);
  }
}
