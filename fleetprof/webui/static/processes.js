// The process filter: a searchable list of the range's processes, the busiest first (by CPU samples, then GPU time),
// named "command pid · node" with their share, and the kernel's own threads (kworker/*, ksoftirqd/*, ...: the
// /api/processes answer marks them) in one group at the end, folded until opened or until a search matches them.
// Typing filters the list by command, pid or node; Enter or a click picks, Escape closes.

import { percent } from "./format.js";

export function processLabel(p) {
  return `${p.comm || "?"} ${p.pid} · ${p.node}`;
}

export class ProcessPicker {
  /** input: the text field; list: the element that holds the entries; onPick(process or null for all). */
  constructor(input, list, onPick) {
    this.input = input;
    this.list = list;
    this.onPick = onPick;
    this.processes = [];
    this.selected = null; // {node, pid}
    this.kernelOpen = false;
    this.active = -1; // the highlighted entry among the shown ones
    this.typed = false; // whether the text is a search (typed since the list opened) or the picked process's name
    input.addEventListener("focus", () => {
      input.select();
      this.typed = false;
      this.open();
    });
    input.addEventListener("input", () => {
      this.typed = true;
      this.open();
    });
    input.addEventListener("blur", () => setTimeout(() => this.close(), 150));
    input.addEventListener("keydown", (e) => this._key(e));
    // mousedown, not click: the input's blur would close the list first
    list.addEventListener("mousedown", (e) => {
      e.preventDefault();
      const entry = e.target.closest("li");
      if (!entry) return;
      if (entry.classList.contains("group")) {
        this.kernelOpen = !this.kernelOpen;
        this.render();
      } else {
        this._pick(entry);
      }
    });
  }

  /** The /api/processes answer's rows, and the process shown as picked (null: all). */
  set(processes, selected) {
    this.processes = processes;
    this.selected = selected;
    this.totalCpu = processes.reduce((s, p) => s + p.cpu_samples, 0);
    this.totalGpu = processes.reduce((s, p) => s + p.gpu_ns, 0);
    this._showSelected();
  }

  _showSelected() {
    const s = this.selected;
    const p = s && this.processes.find((q) => q.node === s.node && q.pid === s.pid);
    this.input.value = s ? (p ? processLabel(p) : `${s.pid} · ${s.node}`) : "";
  }

  open() {
    this.list.hidden = false;
    this.render();
  }

  close() {
    this.list.hidden = true;
    this.active = -1;
    this.typed = false;
    this._showSelected();
  }

  /** The processes the typed text matches, user processes first, in the answer's order (the busiest first). */
  matching() {
    const words = this.typed ? this.input.value.trim().toLowerCase().split(/\s+/).filter(Boolean) : [];
    const match = (p) => words.every((w) => processLabel(p).toLowerCase().includes(w));
    const found = this.processes.filter(match);
    return { user: found.filter((p) => !p.kernel_thread), kernel: found.filter((p) => p.kernel_thread),
      searching: words.length > 0 };
  }

  _share(p) {
    const parts = [];
    if (p.cpu_samples) parts.push(`${percent(p.cpu_samples, this.totalCpu)} CPU`);
    if (p.gpu_ns) parts.push(`${percent(p.gpu_ns, this.totalGpu)} GPU`);
    return parts.join(" · ");
  }

  _entry(p) {
    const li = document.createElement("li");
    li.dataset.value = `${p.node}|${p.pid}`;
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = processLabel(p);
    const share = document.createElement("span");
    share.className = "share";
    share.textContent = this._share(p);
    li.append(name, share);
    if (p.kernel_thread) li.classList.add("kernel-thread");
    return li;
  }

  render() {
    const { user, kernel, searching } = this.matching();
    const items = [];
    if (!searching) {
      const all = document.createElement("li");
      all.dataset.value = "";
      all.innerHTML = '<span class="name">all processes</span>';
      items.push(all);
    }
    for (const p of user) items.push(this._entry(p));
    if (kernel.length) {
      const group = document.createElement("li");
      group.className = "group";
      const open = this.kernelOpen || searching;
      const cpu = kernel.reduce((s, p) => s + p.cpu_samples, 0);
      group.textContent = `${open ? "▾" : "▸"} kernel threads (${kernel.length}) · ${percent(cpu, this.totalCpu)} CPU`;
      items.push(group);
      if (open) for (const p of kernel) items.push(this._entry(p));
    }
    if (!items.length) {
      const none = document.createElement("li");
      none.className = "none";
      none.textContent = "no process matches";
      items.push(none);
    }
    this.list.replaceChildren(...items);
    this.active = Math.min(this.active, this._choices().length - 1);
    this._highlight();
  }

  _choices() {
    return [...this.list.querySelectorAll("li[data-value]")];
  }

  _highlight() {
    this._choices().forEach((li, k) => li.classList.toggle("active", k === this.active));
  }

  _key(e) {
    const choices = this._choices();
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      if (this.list.hidden) this.open();
      const step = e.key === "ArrowDown" ? 1 : -1;
      this.active = Math.max(0, Math.min(choices.length - 1, this.active + step));
      this._highlight();
    } else if (e.key === "Enter") {
      e.preventDefault();
      const entry = choices[this.active >= 0 ? this.active : 0];
      if (entry) this._pick(entry);
    } else if (e.key === "Escape") {
      this.input.blur();
    }
  }

  _pick(entry) {
    const value = entry.dataset.value;
    if (value) {
      const [node, pid] = value.split("|");
      this.selected = { node, pid: Number(pid) };
    } else {
      this.selected = null;
    }
    this.input.blur();
    this.close();
    this.onPick(this.selected);
  }
}
