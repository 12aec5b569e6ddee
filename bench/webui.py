"""The web UI's flame graph render time for 10k and 100k distinct stacks, next to d3-flame-graph in the same Chromium
in the same run.

    .venv/bin/python bench/webui.py [--sizes 10000,100000] [--runs 3] [--width 1200]

Stacks: synthetic, distinct, 10 to 40 frames deep, from a call graph where popular callees are taken more often (so
stacks share prefixes, as real ones do), ~20k function names in ~24 binaries, long-tailed counts. Measured in Debian's
headless chromium (driven by playwright), each run on a fresh page, median of --runs:
- fleetprof: the text of a /api/flamegraph answer (built by fleetprof.webui.model and orjson, as the server does it
  from the rows of flamegraph_ids_cpu and flamegraph_names_cpu, each stack under its process's root frame)
  → JSON.parse → call tree, layout and canvas draw (static/flamegraph.js) → two animation frames (painted);
- peer, d3-flame-graph 5.0.0 (SVG, on d3 7), the flame graph library many profilers embed: the text of its input, a
  nested {name, value, children} tree → JSON.parse → d3.select().datum().call(flamegraph()) → two animation frames.
  Both skip frames narrower than 0.5 px; the peer's transitions are off. It is fetched with `npm pack` into a
  temporary directory at bench time (never vendored).
Also printed: the server side's encoding of those rows into the compact answer's JSON (Python, median of --runs),
the answer's size, and with --server the whole /api/flamegraph answer (the two ClickHouse queries on chDB, encoding,
compression as Chromium asks for it: zstd) from a real API over a temporary chDB store holding the same stacks as CPU
samples, timed from Python until the body is received and unpacked (median of --runs).
Writes bench/out/webui.json.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import itertools
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.render_page import CHROMIUM_ARGS, measure, npm_pack, page_html, serve  # noqa: E402
from fleetprof.webui import STATIC_DIR, model  # noqa: E402

try:
    from compression import zstd  # Python 3.14 and later
except ImportError:
    from backports import zstd

PEER_PACKAGES = ["d3-flame-graph@5.0.0", "d3@7.9.0"]
FANOUT = 8  # callees per (function, depth); the first are taken far more often than the last
CUMULATIVE = list(itertools.accumulate(1 / (j + 1) ** 1.3 for j in range(FANOUT)))
BROWSER_ACCEPT_ENCODING = "gzip, deflate, br, zstd"  # what Chromium sends
UNPACK = {"identity": bytes, "gzip": gzip.decompress, "zstd": zstd.decompress}

HEAD = """<style>body { margin: 0; } #wrap { position: relative; width: %(width)dpx; }</style>
<script src="peer/d3/dist/d3.min.js"></script>
<script src="peer/d3-flame-graph/dist/d3-flamegraph.umd.min.js"></script>"""
SCRIPT = """import { FlameGraph } from "./fleetprof/flamegraph.js";
window.bench = {
  fleetprof: (name) => timed(name, (data) => {
    const graph = new FlameGraph(document.getElementById("flame"), document.getElementById("tip"));
    graph.setData(data);
    return () => ({ setDataMs: graph.lastRenderMs, nodes: graph.model.count, drawn: graph.drawn.node.length });
  }),
  peer: (name) => timed(name, (tree) => {
    const chart = flamegraph.default().width(%(width)d).minFrameSize(0.5).transitionDuration(0);
    d3.select("#peer").datum(tree).call(chart);
    return () => ({ drawn: document.querySelectorAll("#peer svg g").length });
  }),
};"""


def synthetic_stacks(count: int, seed: int = 7) -> list[tuple[list[str], list[str], int]]:
    """`count` distinct (functions, binaries, value) stacks, 10-40 deep, sharing prefixes."""
    rng = random.Random(seed)
    vocabulary = 20_000
    names = [f"{rng.choice(['ns', 'torch', 'at', 'c10', 'std', 'app', 'nccl'])}::"
             f"{rng.choice(['run', 'call', 'dispatch', 'launch', 'copy', 'reduce', 'step', 'load'])}_"
             f"{rng.choice(['impl', 'kernel', 'op', 'fn', 'loop', 'batch'])}_{i}" for i in range(vocabulary)]
    binaries = [f"lib{n}.so" for n in ("torch_cpu", "torch_cuda", "c10", "cudart", "nccl", "cublas", "python3.11",
                                       "ssl", "z", "stdc++", "m", "pthread", "gomp", "numpy", "arrow", "protobuf",
                                       "grpc", "jemalloc", "cudnn", "nvrtc")] + ["python3.11", "[kernel.kallsyms]",
                                                                                  "app", "[gpu]"]
    binary_of = [binaries[(i * 2654435761) % len(binaries)] for i in range(vocabulary)]
    roots = [0, 1, 2, 3]
    seen: set[tuple[int, ...]] = set()
    out = []
    while len(out) < count:
        depth = rng.randint(10, 40)
        f = roots[min(int(rng.expovariate(1.5)), len(roots) - 1)]
        stack = []
        for d in range(depth):
            stack.append(f)
            j = bisect.bisect(CUMULATIVE, rng.random() * CUMULATIVE[-1])
            f = (f * 1_000_003 + d * 7_919 + j * 104_729 + 17) % vocabulary
        key = tuple(stack)
        if key in seen:
            continue
        seen.add(key)
        out.append(([names[i] for i in stack], [binary_of[i] for i in stack], int(rng.paretovariate(1.2) * 10)))
    return out


def nested_tree(stacks: list[tuple[list[str], list[str], int]]) -> dict:
    """d3-flame-graph's input: {name, value (total), children}, children merged by name."""
    root: dict = {"name": "all", "value": 0, "children": {}}
    for functions, _, value in stacks:
        node = root
        node["value"] += value
        for name in functions:
            node = node["children"].setdefault(name, {"name": name, "value": 0, "children": {}})
            node["value"] += value

    def freeze(node: dict) -> dict:
        children = [freeze(c) for c in node["children"].values()]
        return {"name": node["name"], "value": node["value"], "children": children}

    return freeze(root)


def fetch_peer(into: Path) -> None:
    """d3-flame-graph and d3 from the npm registry, unpacked under into/peer/<package>/."""
    for tgz in npm_pack(PEER_PACKAGES, into, "bench/webui.py"):
        name = "d3-flame-graph" if tgz.name.startswith("d3-flame-graph") else "d3"
        with tarfile.open(tgz) as tar:
            tar.extractall(into / "peer" / name, filter="data")
        (into / "peer" / name / "package").rename(into / "peer" / name / "_")
        for item in (into / "peer" / name / "_").iterdir():
            item.rename(into / "peer" / name / item.name)


def stored_form(stacks: list[tuple[list[str], list[str], int]]) -> tuple[list[tuple], list[tuple]]:
    """`stacks` as the store holds them: (frame_id, function, binary) per distinct function, and (stack_id,
    frame_ids, value) per stack; flamegraph_names_cpu's and flamegraph_ids_cpu's rows over them."""
    ids: dict[str, int] = {}
    names, rows = [], []
    for k, (functions, binaries, value) in enumerate(stacks):
        for name, binary in zip(functions, binaries, strict=True):
            if name not in ids:
                ids[name] = len(ids) + 1
                names.append((ids[name], name, binary))
        rows.append((k + 1, [ids[name] for name in functions], value))
    return names, rows


def time_server(stacks: list[tuple[list[str], list[str], int]], runs: int, where: Path) -> dict:
    """Seconds for GET /api/flamegraph over a chDB store holding `stacks` as one window of CPU samples."""
    from datetime import UTC, datetime, timedelta

    import httpx

    from fleetprof.api import serve_api
    from fleetprof.store import open_store

    ts = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=5)
    names, ids = stored_form(stacks)
    frames = [[frame_id, name, binary, "NATIVE", ts] for frame_id, name, binary in names]
    stack_rows = [[stack_id, frame_ids, ts] for stack_id, frame_ids, _ in ids]
    samples = [[ts, "bench", 1, "bench", "", stack_id, value] for stack_id, _, value in ids]
    store = open_store(f"chdb://{where}", "bench")
    try:
        store.migrate()
        store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
        for i in range(0, len(stack_rows), 20_000):
            store.insert("stacks", stack_rows[i:i + 20_000], ["stack_id", "frame_ids", "last_seen"])
        store.insert("cpu_samples", samples, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
        api = serve_api(store, "127.0.0.1", 0)
        try:
            times = []
            params = {"since": int(ts.timestamp()) - 1, "until": int(ts.timestamp()) + 1}
            with httpx.Client(base_url=api.url, timeout=600) as http:
                for _ in range(runs):
                    started = time.perf_counter()
                    # asked as Chromium asks, and unpacked here (httpx unpacks zstd only with a package we don't use)
                    with http.stream("GET", "/api/flamegraph", params=params,
                                     headers={"Accept-Encoding": BROWSER_ACCEPT_ENCODING}) as response:
                        wire = b"".join(response.iter_raw())
                    encoding = response.headers.get("content-encoding", "identity")
                    text = UNPACK[encoding](wire)
                    times.append(time.perf_counter() - started)
                    body = json.loads(text)  # the client's work (the page's JSON.parse is timed in Chromium)
            assert len(body["stacks"]) == len(stacks), "the store must give back every stack"
            return {"median_s": statistics.median(times), "runs_s": times, "wire_bytes": len(wire),
                    "encoding": encoding}
        finally:
            api.stop()
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--width", type=int, default=1200)
    parser.add_argument("--server", action="store_true", help="also time /api/flamegraph over a chDB store")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("bench/webui.py needs Debian's chromium: bash infra/setup.sh installs it")
    results: dict = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, "
                     f"{os.cpu_count()} CPUs", "peer": PEER_PACKAGES[0], "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="fleetprof-webui-bench-") as tmp:
        root = Path(tmp)
        fetch_peer(root)
        shutil.copytree(STATIC_DIR, root / "fleetprof")
        (root / "data").mkdir()
        width = {"width": args.width}
        (root / "index.html").write_text(page_html(args.width, HEAD % width, "flame", SCRIPT % width))
        for size in sizes:
            stacks = synthetic_stacks(size)
            names, rows = stored_form(stacks)
            # the server reads these as Arrow columns; one process, as time_server stores the samples: each stack
            # under its process's root frame, as the page shows a process or a machine
            ids = model.StackIds.from_rows([(*row, "bench", 1, "bench") for row in rows])
            encode_runs = []
            for _ in range(args.runs):
                started = time.perf_counter()
                payload = model.flamegraph_of_ids(ids, names)
                ours = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY).decode()
                encode_runs.append(time.perf_counter() - started)
            encode_s = statistics.median(encode_runs)
            (root / "data" / f"fleetprof-{size}.json").write_text(ours)
            (root / "data" / f"peer-{size}.json").write_text(json.dumps(nested_tree(stacks), separators=(",", ":")))
            depths = [len(f) for f, _, _ in stacks]
            results["sizes"][size] = {"frames_total": sum(depths), "mean_depth": sum(depths) / len(depths),
                                      "distinct_frames": len(payload["frames"]), "encode_s": encode_s,
                                      "answer_bytes": len(ours),
                                      "peer_input_bytes": (root / "data" / f"peer-{size}.json").stat().st_size}
            if args.server:
                results["sizes"][size]["server"] = time_server(stacks, args.runs, root / "chdb")
        server, url = serve(root)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
                results["chromium"] = browser.version
                for size in sizes:
                    for who in ("fleetprof", "peer"):
                        runs = []
                        for _ in range(args.runs):
                            page = browser.new_page(viewport={"width": args.width + 100, "height": 900})
                            page.set_default_timeout(600_000)
                            runs.append(measure(page, url, who, f"{who}-{size}.json"))
                            page.close()
                        median = statistics.median(r["ms"] for r in runs)
                        results["sizes"][size][who] = {"median_ms": median, "runs": runs}
                        each = ", ".join(f"{r['ms']:.0f}" for r in runs)
                        print(f"{size:>7} stacks  {who:<9}  {median:9.1f} ms  (runs: {each} ms; drawn "
                              f"{runs[0]['drawn']:,})", flush=True)
                browser.close()
        finally:
            server.shutdown()
    print(f"\nChromium {results['chromium']}, {results['machine']}, {args.runs} runs each, median")
    print(f"{'stacks':>8} {'frames':>10} {'answer':>9} {'encode':>8} {'fleetprof':>10} {'(parse)':>8} "
          f"{'d3-flame-graph':>15} {'ratio':>7}")
    for size, r in results["sizes"].items():
        ours, peer = r["fleetprof"], r["peer"]
        parse = statistics.median(x["parseMs"] for x in ours["runs"])
        r["ratio_peer_over_fleetprof"] = peer["median_ms"] / ours["median_ms"]
        print(f"{size:>8,} {r['frames_total']:>10,} {r['answer_bytes'] / 1e6:>7.1f}MB {r['encode_s']:>7.2f}s "
              f"{ours['median_ms']:>8.0f}ms {parse:>6.0f}ms {peer['median_ms']:>13.0f}ms "
              f"{r['ratio_peer_over_fleetprof']:>6.1f}x")
    for size, r in results["sizes"].items():
        if "server" in r:
            print(f"{size:>8,} stacks: /api/flamegraph answered in {r['server']['median_s']:.2f} s (queries, encoding, "
                  f"{r['server']['wire_bytes'] / 1e6:.1f} MB of {r['server']['encoding']} JSON, unpacked; runs: "
                  + ", ".join(f"{t:.2f}" for t in r["server"]["runs_s"]) + " s)")
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "webui.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
