"""The web UI's GPU timeline render time for 10k and 100k bars, next to vis-timeline in the same Chromium in the same
run.

    .venv/bin/python bench/timeline_render.py [--sizes 10000,100000] [--runs 3] [--width 1200] [--peer-timeout 60]

Bars: synthetic, one minute of 8 GPUs x 4 streams (32 lanes), each lane a sequence of records with gaps, long-tailed
durations (2 µs to ~10 ms); 80% kernels, 8% NCCL collectives, 8% copies, 4% sets; 400 distinct launching stacks 12-30
frames deep; weights 1-8. Measured in Debian's headless chromium (driven by playwright), each run on a fresh page,
median of --runs:
- fleetprof: the text of an /api/timeline answer (built by fleetprof.webui.timeline and orjson from timeline_bars,
  timeline_stacks and timeline_frames rows, as the server builds it) → JSON.parse → lanes, layout and canvas draw
  (static/timeline.js) → two animation frames (painted);
- peer, vis-timeline 8.5.4 (standalone UMD build, DOM: an element per item in view), the timeline library many web
  apps embed: the text of its input ({items: [{id, group, start, end, className}], groups: [{id, content}]}, times in
  ms) → JSON.parse → new vis.Timeline(element, DataSet(items), DataSet(groups), {stack: false, ...}) → two animation
  frames; items counted as drawn once the page holds their elements. It is fetched with `npm pack` into a temporary
  directory at bench time (never vendored). A run past --peer-timeout seconds is stopped and reported as such.
Both show the whole minute across --width pixels. Also printed: the server side's building and encoding of the
answer (Python, median of --runs) and its size. Writes bench/out/timeline_render.json and a screenshot of the 100k-bar
timeline, bench/out/timeline_render.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.render_page import CHROMIUM_ARGS, measure, npm_pack, page_html, serve  # noqa: E402
from fleetprof.webui import STATIC_DIR, timeline  # noqa: E402

PEER_PACKAGE = "vis-timeline@8.5.4"
NS = 1_000_000_000
SPAN_NS = 60 * NS
GPUS, STREAMS = 8, 4
BASE_NS = 1_796_000_000 * NS  # a fixed Unix time: the answers are the same every run

HEAD = """<link rel="stylesheet" href="peer/styles/vis-timeline-graph2d.min.css">
<style>body { margin: 0; } #wrap { position: relative; width: %(width)dpx; }
.vis-item.kernel { background: rgb(39, 174, 96); } .vis-item.copy { background: rgb(41, 128, 185); }
.vis-item.set { background: rgb(230, 126, 34); } .vis-item.collective { background: rgb(142, 68, 173); }</style>
<script src="peer/standalone/umd/vis-timeline-graph2d.min.js"></script>"""
SCRIPT = """import { Timeline } from "./fleetprof/timeline.js";
window.bench = {
  fleetprof: (name) => timed(name, (data) => {
    const view = new Timeline(document.getElementById("timeline"), document.getElementById("tip"));
    view.setData(data);
    return () => ({ setDataMs: view.lastRenderMs, drawn: view.n });
  }),
  peer: (name) => timed(name, (data) => {
    new vis.Timeline(document.getElementById("peer"), new vis.DataSet(data.items), new vis.DataSet(data.groups),
      { stack: false, start: data.start, end: data.end, showTooltips: false, selectable: false,
        showCurrentTime: false, width: "%(width)dpx" });
    return () => ({ drawn: document.querySelectorAll("#peer .vis-item").length });
  }),
};"""


def synthetic_rows(count: int, seed: int = 11) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """timeline_bars rows (by start), timeline_stacks rows and timeline_frames rows for `count` records."""
    rng = random.Random(seed)
    functions = [f"{rng.choice(['torch', 'at', 'c10', 'app', 'std'])}::{rng.choice(['run', 'call', 'launch', 'step'])}"
                 f"_{i}" for i in range(2000)]
    kernels = [f"_Z{len(n)}{n}Pfi" for n in (f"gemm_kernel_{i}" for i in range(60))]
    collectives = ["ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclDevKernel_AllGather_RING_LL",
                   "ncclDevKernel_ReduceScatter_Sum_f32_RING_SIMPLE"]
    names_rows = [(i + 1, f, "libapp.so", "native") for i, f in enumerate(functions)]
    stacks = []
    for s in range(400):
        depth = rng.randint(12, 30)
        stacks.append((10_000 + s, [rng.randrange(len(functions)) + 1 for _ in range(depth)]))
    per_lane = count // (GPUS * STREAMS)
    rows = []
    for lane in range(GPUS * STREAMS):
        device, stream = divmod(lane, STREAMS)
        n = per_lane + (1 if lane < count % (GPUS * STREAMS) else 0)
        mean_ns = SPAN_NS / max(1, n)
        t = rng.uniform(0, mean_ns)
        for _ in range(n):
            duration = min(mean_ns * 0.7, 2_000 + rng.paretovariate(1.3) * mean_ns * 0.05)
            roll = rng.random()
            activity, name, nbytes = "KERNEL", rng.choice(kernels), 0
            if roll < 0.08:
                name = rng.choice(collectives)
            elif roll < 0.16:
                activity, name, nbytes = "MEMCPY", rng.choice(["[memcpy HtoD]", "[memcpy DtoH]"]), 1 << 20
            elif roll < 0.20:
                activity, name, nbytes = "MEMSET", "[memset]", 1 << 16
            start = BASE_NS + int(t)
            rows.append(("bench", device, stream, 100, "train", start, start + int(duration), activity, name,
                         rng.choice(stacks)[0], rng.randint(1, 8), nbytes, "step > forward", 0, 0))
            t += duration + rng.uniform(0, mean_ns * 1.4)
    rows.sort(key=lambda r: r[5])
    return rows, stacks, names_rows


def peer_input(payload: dict) -> dict:
    """vis-timeline's input for the same bars: an item per bar in its group (lane), times in ms."""
    base_ms = int(payload["since_ns"]) / 1e6
    bars, lanes = payload["bars"], payload["lanes"]
    kinds = payload["kinds"]
    items = [{"id": i, "group": int(lane), "start": base_ms + s / 1e6, "end": base_ms + e / 1e6,
              "className": kinds[int(k)], "content": ""}
             for i, (lane, s, e, k) in enumerate(zip(bars["lane"], bars["start"], bars["end"], bars["kind"],
                                                    strict=True))]
    groups = [{"id": i, "content": f"GPU {lane['device']} stream {lane['stream']}"} for i, lane in enumerate(lanes)]
    return {"items": items, "groups": groups, "start": base_ms, "end": base_ms + payload["span_ns"] / 1e6}


def fetch_peer(into: Path) -> None:
    """vis-timeline from the npm registry, unpacked under into/peer/."""
    with tarfile.open(npm_pack([PEER_PACKAGE], into, "bench/timeline_render.py")[0]) as tar:
        tar.extractall(into / "unpacked", filter="data")
    (into / "unpacked" / "package").rename(into / "peer")


def measure_apart(url: str, who: str, name: str, args: argparse.Namespace) -> dict | None:
    """One run in a child process with a browser of its own, killed (with its browser) after --peer-timeout seconds:
    a peer drawing 100k DOM elements blocks its page past anything a driver's timeout can stop. None when killed."""
    child = subprocess.Popen([sys.executable, __file__, "--measure", who, name, "--url", url, "--width",
                              str(args.width)], stdout=subprocess.PIPE, start_new_session=True)
    try:
        out, _ = child.communicate(timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return None
    if child.returncode != 0:
        raise SystemExit(f"the {who} run failed (exit {child.returncode})")
    return json.loads(out)


def measure_here(who: str, name: str, url: str, width: int) -> None:
    """--measure: one run in this process, its result as JSON on stdout."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width + 100, "height": 900})
        page.set_default_timeout(0)
        print(json.dumps(measure(page, url, who, name)))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", nargs=2, metavar=("WHO", "NAME"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--peer-timeout", type=float, default=60, help="seconds a peer run may take")
    args = parser.parse_args()
    if args.measure:
        measure_here(*args.measure, args.url, args.width)
        return
    sizes = [int(s) for s in args.sizes.split(",")]

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("bench/timeline_render.py needs Debian's chromium: bash infra/setup.sh installs it")
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                     "peer": PEER_PACKAGE, "sizes": {}}
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleetprof-timeline-bench-") as tmp:
        root = Path(tmp)
        fetch_peer(root)
        shutil.copytree(STATIC_DIR, root / "fleetprof")
        (root / "data").mkdir()
        width = {"width": args.width}
        (root / "index.html").write_text(page_html(args.width, HEAD % width, "timeline", SCRIPT % width))
        for size in sizes:
            rows, stacks, names = synthetic_rows(size)
            encode_runs = []
            for _ in range(args.runs):
                started = time.perf_counter()
                payload = timeline.timeline(list(timeline.COLUMNS), rows, stacks, names, BASE_NS, BASE_NS + SPAN_NS,
                                            max(size, timeline.BAR_LIMIT), one_node=True)
                ours = orjson.dumps({**payload, "filters": {"node": "bench", "pid": 0}},
                                    option=orjson.OPT_SERIALIZE_NUMPY)
                encode_runs.append(time.perf_counter() - started)
            (root / "data" / f"fleetprof-{size}.json").write_bytes(ours)
            peer = orjson.dumps(peer_input(orjson.loads(ours)))
            (root / "data" / f"peer-{size}.json").write_bytes(peer)
            results["sizes"][size] = {"encode_s": statistics.median(encode_runs), "answer_bytes": len(ours),
                                      "peer_input_bytes": len(peer), "lanes": len(payload["lanes"])}
        server, url = serve(root)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                results["chromium"] = browser.version
                for size in sizes:
                    for who in ("fleetprof", "peer"):
                        runs, stopped = [], False
                        for _ in range(args.runs):
                            if who == "peer":  # in a process of its own, which a timeout can kill
                                result = measure_apart(url, who, f"{who}-{size}.json", args)
                                stopped = result is None
                                runs += [] if stopped else [result]
                            else:
                                page = browser.new_page(viewport={"width": args.width + 100, "height": 900})
                                runs.append(measure(page, url, who, f"{who}-{size}.json"))
                                if size == max(sizes) and len(runs) == 1:
                                    page.locator("#wrap").screenshot(path=str(out / "timeline_render.png"))
                                page.close()
                            if stopped or (who == "peer" and runs[-1]["ms"] > 10_000):
                                break  # one run of a peer this slow says enough
                        entry: dict = {"runs": runs, "stopped_after_s": args.peer_timeout if stopped else None}
                        if runs and not stopped:
                            entry["median_ms"] = statistics.median(r["ms"] for r in runs)
                        results["sizes"][size][who] = entry
                        each = ", ".join(f"{r['ms']:.0f}" for r in runs)
                        text = (f"{entry['median_ms']:9.1f} ms  (runs: {each} ms; drawn {runs[0]['drawn']:,})"
                                if "median_ms" in entry else f"did not finish in {args.peer_timeout:.0f} s")
                        print(f"{size:>7} bars  {who:<9}  {text}", flush=True)
                browser.close()
        finally:
            server.shutdown()
    print(f"\nChromium {results['chromium']}, {results['machine']}, {args.runs} runs each, median")
    print(f"{'bars':>8} {'answer':>9} {'encode':>8} {'fleetprof':>10} {'(parse)':>8} {'vis-timeline':>14} {'ratio':>7}")
    for size, r in results["sizes"].items():
        ours, peer = r["fleetprof"], r["peer"]
        parse = statistics.median(x["parseMs"] for x in ours["runs"])
        peer_text = f"{peer['median_ms']:>12.0f}ms" if "median_ms" in peer else f">{args.peer_timeout:>11.0f}s"
        ratio = peer["median_ms"] / ours["median_ms"] if "median_ms" in peer else None
        r["ratio_peer_over_fleetprof"] = ratio
        print(f"{size:>8,} {r['answer_bytes'] / 1e6:>7.2f}MB {r['encode_s']:>7.2f}s {ours['median_ms']:>8.0f}ms "
              f"{parse:>6.0f}ms {peer_text} {f'{ratio:>6.1f}x' if ratio else '      -'}")
    (out / "timeline_render.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
