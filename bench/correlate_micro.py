"""Correlator.process alone, µs per event, on synthetic one-to-one launches and kernels (no Kafka, no symbolization,
no changelog): the join's own cost on its common path, for before/after comparisons of the join code.

    .venv/bin/python bench/correlate_micro.py [--pairs 100000] [--repeat 5] [--graph-kernels 0]

Records are dicts as the codec decodes them (GpuLaunch v3, GpuKernel v2: every field present). Launches and kernels
alternate in blocks of 50 (launch first, its kernel 50 events later), over 100 pids of one node. --graph-kernels N
adds a second run where every launch is a graph launch replaying N kernels. Prints the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from processors.correlate import KERNEL, LAUNCH, CorrelateConfig, Correlator, Outcome  # noqa: E402

T0 = 1_767_000_000_000_000_000
ADDRS = [0x401000 + 16 * i for i in range(12)]


def events(pairs: int, graph_kernels: int = 0) -> list[tuple[int, dict]]:
    out: list[tuple[int, dict]] = []
    block = 50
    for b in range(0, pairs, block):
        launches, kernels = [], []
        for i in range(b, min(b + block, pairs)):
            pid = 1000 + i % 100
            t = T0 + i * 10_000
            launches.append((LAUNCH, {
                "node": "node-1", "pid": pid, "tid": pid, "process_start_ns": 5, "time_ns": t, "correlation_id": i,
                "callback_id": 211, "api_name": "cudaLaunchKernel", "weight": 1, "nvtx_range": "",
                "graph": graph_kernels > 0, "user_addrs": ADDRS, "mappings": [], "code_objects": [],
                "simulated": False}))
            for k in range(max(graph_kernels, 1)):
                kernels.append((KERNEL, {
                    "node": "node-1", "pid": pid, "process_start_ns": 5, "correlation_id": i,
                    "start_ns": t + 1000 + k * 10, "end_ns": t + 1005 + k * 10, "device_id": 0, "stream_id": 7,
                    "kernel_name": "ampere_sgemm_128x64_tn", "activity": "KERNEL", "bytes": 0, "copy_kind": "",
                    "memory_kinds": "", "graph_id": 3 if graph_kernels else 0, "graph_node_id": k,
                    "simulated": False}))
        out += launches + kernels
    return out


def run(evs: list[tuple[int, dict]]) -> tuple[float, Outcome]:
    corr = Correlator(CorrelateConfig())
    out = Outcome()
    process = corr.process
    offsets = [0, 0]
    gc.collect()
    t0 = time.perf_counter()
    for side, rec in evs:
        process(0, side, offsets[side], rec, out)
        offsets[side] += 1
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--graph-kernels", type=int, default=0)
    args = ap.parse_args()
    for label, n in (("one-to-one", 0), (f"graph x{args.graph_kernels}", args.graph_kernels)):
        if label != "one-to-one" and not n:
            continue
        pairs = args.pairs if not n else max(1, args.pairs // n)
        evs = events(pairs, n)
        best, out = min((run(evs) for _ in range(args.repeat)), key=lambda r: r[0])
        print(f"{label}: {len(evs)} events, {len(out.matches)} matches, {len(out.unmatched)} unmatched, "
              f"best {best * 1e3:.1f} ms = {best / len(evs) * 1e6:.3f} µs/event")


if __name__ == "__main__":
    main()
