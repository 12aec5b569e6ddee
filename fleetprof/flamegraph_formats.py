"""Flame graph outputs people already use: folded stacks, JSON, speedscope, pprof and a self-contained HTML page.

Each takes (root-first function names, count) pairs and returns the file's bytes.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable

from fleetprof.pprof import pprof_bytes

Stacks = list[tuple[list[str], int]]


def _folded_frame(name: str) -> str:
    # ';' separates frames and a newline ends a stack in the folded format, so neither may appear inside a name
    return name.replace(";", ":").replace("\n", " ")


def folded(stacks: Stacks, title: str = "") -> bytes:
    """flamegraph.pl / inferno input: one 'root;...;leaf count' line per stack."""
    return "".join(f"{';'.join(_folded_frame(f) for f in fs)} {n}\n" for fs, n in stacks).encode()


def as_json(stacks: Stacks, title: str = "") -> bytes:
    return (json.dumps([{"stack": fs, "count": n} for fs, n in stacks], indent=2) + "\n").encode()


def speedscope(stacks: Stacks, title: str = "fleetprof") -> bytes:
    """speedscope's file format: one sampled profile, each stack a sample weighted by its count."""
    index: dict[str, int] = {}
    samples = [[index.setdefault(f, len(index)) for f in fs] for fs, _ in stacks]
    weights = [int(n) for _, n in stacks]
    doc = {
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "exporter": "fleetprof",
        "name": title,
        "activeProfileIndex": 0,
        "shared": {"frames": [{"name": f} for f in index]},
        "profiles": [{"type": "sampled", "name": title, "unit": "none", "startValue": 0,
                      "endValue": sum(weights), "samples": samples, "weights": weights}],
    }
    return json.dumps(doc).encode()


def tree(stacks: Stacks) -> dict:
    """The call tree: {"n": name, "v": total, "c": [children]}, children merged by name."""
    root: dict = {"n": "all", "v": 0, "c": {}}
    for fs, n in stacks:
        node = root
        node["v"] += n
        for f in fs:
            node = node["c"].setdefault(f, {"n": f, "v": 0, "c": {}})
            node["v"] += n

    def freeze(node: dict) -> dict:
        kids = sorted((freeze(c) for c in node["c"].values()), key=lambda c: -c["v"])
        return {"n": node["n"], "v": node["v"], "c": kids}

    return freeze(root)


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{head}</title>
<style>
body {{ font: 12px system-ui, sans-serif; margin: 8px; }}
#bar {{ display: flex; gap: 8px; align-items: center; margin-bottom: 6px; }}
#graph div {{ position: absolute; height: 17px; line-height: 17px; overflow: hidden; white-space: nowrap;
  box-sizing: border-box; border: 1px solid #fff; padding: 0 3px; cursor: pointer; border-radius: 2px; }}
#graph div.hit {{ background: #e040fb !important; }}
#graph {{ position: relative; }}
#info {{ color: #444; }}
#banner {{ background: #fff3cd; border: 1px solid #e0a800; padding: 4px 8px; margin-bottom: 6px; font-weight: bold; }}
</style></head><body>{banner}
<div id="bar"><b>{title}</b><input id="search" placeholder="search (regex)"><button id="reset">reset zoom</button>
<span id="info"></span></div>
<div id="graph"></div>
<script id="data" type="application/json">{data}</script>
<script>
const root = JSON.parse(document.getElementById("data").textContent);
const graph = document.getElementById("graph"), info = document.getElementById("info");
let focus = root, query = null;
function color(name) {{
  let h = 0; for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) | 0;
  return `hsl(${{20 + Math.abs(h) % 40}}, 85%, ${{55 + Math.abs(h >> 8) % 20}}%)`;
}}
function draw() {{
  graph.innerHTML = "";
  const width = graph.clientWidth || 1200, rows = [];
  (function place(node, x, depth, scale) {{
    const w = node.v * scale;
    if (w < 0.5) return;
    rows.push([node, x, depth, w]);
    let cx = x;
    for (const c of node.c) {{ place(c, cx, depth + 1, scale); cx += c.v * scale; }}
  }})(focus, 0, 0, width / focus.v);
  graph.style.height = (Math.max(...rows.map(r => r[2])) + 1) * 18 + "px";
  for (const [node, x, depth, w] of rows) {{
    const d = document.createElement("div");
    d.style.left = x + "px"; d.style.top = depth * 18 + "px"; d.style.width = w + "px";
    d.style.background = color(node.n);
    d.textContent = w > 30 ? node.n : "";
    d.title = `${{node.n}}\\n${{node.v}} samples (${{(100 * node.v / root.v).toFixed(2)}}%)`;
    if (query && query.test(node.n)) d.classList.add("hit");
    d.onclick = () => {{ focus = node; draw(); }};
    graph.appendChild(d);
  }}
  info.textContent = `${{root.v}} samples`;
}}
document.getElementById("reset").onclick = () => {{ focus = root; draw(); }};
document.getElementById("search").oninput = e => {{
  try {{ query = e.target.value ? new RegExp(e.target.value) : null; }} catch {{ query = null; }}
  draw();
}};
window.onresize = draw;
draw();
</script></body></html>
"""


def html_page(stacks: Stacks, title: str = "fleetprof flame graph", banner: str = "") -> bytes:
    """A self-contained page (no network): an icicle flame graph with click-to-zoom and regex search; `banner`, when
    given, is shown above it and added to the page's title (a warning such as "SIMULATED: ...")."""
    data = json.dumps(tree(stacks)).replace("</", "<\\/")  # never close the script element early
    head = f"{title} ({banner})" if banner else title
    shown = f'\n<div id="banner">{html.escape(banner)}</div>' if banner else ""
    return _PAGE.format(title=html.escape(title), head=html.escape(head), banner=shown, data=data).encode()


FORMATS: dict[str, Callable[..., bytes]] = {
    "folded": folded,
    "json": as_json,
    "speedscope": speedscope,
    "pprof": lambda stacks, title="": pprof_bytes(stacks),
    "html": html_page,
}
BINARY_FORMATS = {"pprof"}
