"""The bytes workload identity ids take in what `fleetprof loadgen` sends: the identity_id varints of its CPU batches'
process entries, its sampled launches and its NVML polls' device and process rows, per CPU sample, by replaying
loadgen's draws for the same seed (no broker). bench/fleet.py measures the topics' totals; this splits out the ids.

    .venv/bin/python bench/identity_bytes.py [--nodes 100] [--duration 120] [--window 10] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas.cpu_batch_writer import long_bytes  # noqa: E402
from simulate.synthetic_fleet import SyntheticFleet  # noqa: E402

SECOND_NS = 10**9


def id_bytes(nodes: int, duration: float, window: float, seed: int, rate: float, launch_rate: float) -> dict:
    """Id bytes per record kind over the run loadgen would send (the same draws, in the same order)."""
    fleet = SyntheticFleet(seed=seed)
    sim = [fleet.node(i) for i in range(nodes)]
    window_ns, per_window = round(window * SECOND_NS), round(rate * window)
    windows = math.ceil(duration / window - 1e-9)
    out = dict.fromkeys(("cpu_bytes", "process_entries", "launch_bytes", "launches", "metrics_bytes", "polls"), 0)
    start = 1_764_000_000 * SECOND_NS  # aligned: every window has window / 1 s polls, as in loadgen
    for w in range(windows):
        for node in sim:
            _, procs, _ = fleet.cpu_window(node, per_window)
            out["cpu_bytes"] += sum(len(long_bytes(p["identity_id"])) for p in procs)
            out["process_entries"] += len(procs)
            launches, _ = fleet.gpu_window(node, start + w * window_ns, window_ns, launch_rate)
            out["launch_bytes"] += sum(len(long_bytes(r["identity_id"])) for r in launches)
            out["launches"] += len(launches)
            for t in range(start + w * window_ns, start + (w + 1) * window_ns, SECOND_NS):
                poll = fleet.metrics(node, t)
                out["metrics_bytes"] += sum(len(long_bytes(r["identity_id"])) for r in poll["devices"] +
                                            poll["processes"])
                out["polls"] += 1
    samples = nodes * windows * per_window
    out["samples"] = samples
    out["per_cpu_sample"] = {k: round(out[f"{k}_bytes"] / samples, 4) for k in ("cpu", "launch", "metrics")}
    out["definitions"] = sum(len(n.identities) for n in sim)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds")
    ap.add_argument("--window", type=float, default=10.0, help="seconds")
    ap.add_argument("--seed", type=int, default=1, help="bench/fleet.py runs loadgen with --seed 1")
    ap.add_argument("--rate", type=float, default=152.0)
    ap.add_argument("--launch-rate", type=float, default=2.0)
    a = ap.parse_args()
    print(json.dumps(id_bytes(a.nodes, a.duration, a.window, a.seed, a.rate, a.launch_rate), indent=2))


if __name__ == "__main__":
    main()
