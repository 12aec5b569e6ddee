"""The information the fleet bench's simulated data puts into what the store keeps, in bytes per CPU sample over a
day: a floor under any lossless encoding of the same tables at the same resolutions and retentions (issue 18 part
4), next to what bench/storage_day.py measured.

    .venv/bin/python bench/storage_floor.py [--measured bench/out/storage_day.json] [--detail-hours 7]

Per table, from the simulator's own laws (simulate/synthetic_fleet.py, simulate/synthetic_workload.py), at the
fleet bench's per-node load (152 CPU samples/s, 8 GPUs x 2 sampled launches/s, NVML once a second):
  * cpu_samples: the entropy of a window's counts, a multinomial of 1,520 samples over the node's (process, stack)
    keys with the simulator's Zipf probabilities (Poissonized: the sum of the keys' Poisson entropies less the
    total's), per sample. Exact for the model; an encoder that must learn the probabilities needs more.
  * gpu_kernel_samples: per sampled launch, its kernel's duration (lognormal around the kernel's median, at 1 ns)
    and its weight (uniform over [1, 2 x 2,500)), stored as duration x weight and weight; x 0.67 rows a launch
    (the run's: a row sums the launches of one key and window, which loses a little), a lower bound.
  * gpu_timeline: per launch its start (a sorted uniform point in the window, ~20 per GPU), duration and weight
    (its correlation id is the running sum of weights: nothing more); kept the detail hours.
  * NVML 1 s: per GPU reading the noise of utilization (N(0, 4) points), memory utilization (N(0, 3)), used memory
    (N(0, 100) pages of 2 MiB), power (N(0, 5 W) around the utilization's level), temperature (N(0, 1)) and the
    two PCIe rates (uniform over 10 M values); the process readings repeat their GPU's values (no information).
    Kept the detail hours.
  * NVML 10 s: per GPU bucket, of each field, the last reading and the sum of the other nine (a lower bound: the
    minimum and maximum carry more); process buckets again repeat their GPU's.
  * the hourly rollups and the rest: as measured (a few hundredths).
Prints the floors, the measured bytes beside them and the totals at the detail tier's hours.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simulate.synthetic_binaries import op_class  # noqa: E402
from simulate.synthetic_fleet import SyntheticFleet  # noqa: E402
from simulate.synthetic_workload import GPU_KERNELS, TRUE_LAUNCH_RATE  # noqa: E402

RATE, WINDOW_S, GPUS, LAUNCH_RATE = 152.0, 10.0, 8, 2.0  # CPU samples/s, s, GPUs and sampled launches/s per node
GAUSS = math.log2(math.sqrt(2 * math.pi * math.e))  # bits of N(0, 1) read to whole units, ~2.05
KERNEL_ROWS_PER_LAUNCH = 128_121 / 192_000  # bench/storage_day.py's run: rows of gpu_kernel_samples per launch


def poisson_bits(lam: float) -> float:
    if lam <= 0:
        return 0.0
    k = np.arange(int(lam + 20 * math.sqrt(lam) + 30) + 1)
    logp = k * math.log(lam) - lam - np.array([math.lgamma(x + 1) for x in k])
    p = np.exp(logp)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def cpu_samples_bits_per_sample(fleet: SyntheticFleet) -> tuple[float, int]:
    """Entropy of one window's counts per (process, symbolized stack) key, per sample; and the number of keys."""
    keys: dict[tuple, float] = {}
    for i, p in enumerate(fleet.probs):
        tpl = int(fleet.pair_tpl[i])
        key = (int(fleet.pair_proc[i]), tuple(fleet.templates.frames[tpl]))
        keys[key] = keys.get(key, 0.0) + float(p)
    n = RATE * WINDOW_S
    bits = sum(poisson_bits(n * q) for q in keys.values()) - poisson_bits(n)
    return bits / n, len(keys)


def launch_bits(fleet: SyntheticFleet) -> tuple[float, float, float]:
    """Bits of a sampled launch's duration (given its kernel), weight, and start within its GPU's window."""
    paths = fleet.launch_paths
    weights = np.arange(1, len(paths) + 1) ** -fleet.zipf_s
    weights /= weights.sum()
    duration = 0.0
    for w, tpl in zip(weights, paths, strict=True):
        kernels = GPU_KERNELS[op_class(fleet.templates.ops[tpl])]
        for _, median_us, sigma in kernels:  # lognormal: log2(median) + log2(sigma * sqrt(2 pi e)), in ns
            duration += w / len(kernels) * (math.log2(median_us * 1000) + math.log2(sigma) + GAUSS)
    weight = math.log2(2 * round(TRUE_LAUNCH_RATE / LAUNCH_RATE) - 1)
    per_gpu = LAUNCH_RATE * WINDOW_S  # launches of one GPU in a window, sorted: log2 C(N, n) / n
    start = math.log2(WINDOW_S * 1e9) - math.lgamma(per_gpu + 1) / math.log(2) / per_gpu
    return duration, weight, start


def nvml_bits() -> tuple[float, float]:
    """Bits of one GPU's 1 s reading, and of its 10 s bucket's (last, sum of the other nine) per field."""
    sigmas = {"gpu_util": 4, "mem_util": 3, "mem_used_pages": 100, "power_mw": 5000, "temperature": 1}
    pcie = math.log2(10_000_000)
    reading = sum(math.log2(s) + GAUSS for s in sigmas.values()) + 2 * pcie
    nine = 3  # the sum of nine: sigma x 3
    bucket = reading + sum(math.log2(s * nine) + GAUSS for s in sigmas.values()) \
        + 2 * (math.log2(nine * 10_000_000 / math.sqrt(12)) + GAUSS)
    return reading, bucket


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", type=Path, default=ROOT / "bench" / "out" / "storage_day.json")
    ap.add_argument("--detail-hours", type=float, default=7.0, help="hours the detail tier holds (TTL + its drop)")
    args = ap.parse_args()
    fleet = SyntheticFleet(seed=1)
    detail = min(args.detail_hours / 24, 1.0)
    cpu, keys = cpu_samples_bits_per_sample(fleet)
    duration, weight, start = launch_bits(fleet)
    reading, bucket = nvml_bits()
    launches_per_sample = GPUS * LAUNCH_RATE / RATE
    floors = {  # bytes per CPU sample over a day
        "cpu_samples": cpu / 8,
        "gpu_kernel_samples": KERNEL_ROWS_PER_LAUNCH * (duration + weight) / 8 * launches_per_sample,
        "gpu_timeline": (start + duration + weight) / 8 * launches_per_sample * detail,
        "gpu_device_metrics": reading / 8 * GPUS / RATE * detail,
        "gpu_device_metrics_10s": bucket / 8 * GPUS / WINDOW_S / RATE,
        "gpu_process_metrics": 0.0,
        "gpu_process_metrics_10s": 0.0,
    }
    measured = json.loads(args.measured.read_text())["tables"] if args.measured.exists() else {}
    print(f"cpu_samples: {keys} keys per node, {cpu:.3f} bits a sample; a launch: duration {duration:.1f}, weight "
          f"{weight:.1f}, start {start:.1f} bits; an NVML reading {reading:.1f} bits, a 10 s bucket {bucket:.1f}")
    print(f"{'table':26} {'floor':>7} {'measured':>9}   bytes per CPU sample over a day, detail tier "
          f"{args.detail_hours:g} h")
    rest = sum(t["per_sample_day"] for name, t in measured.items() if name not in floors)
    for name, floor in floors.items():
        got = measured.get(name, {}).get("per_sample_day")
        print(f"{name:26} {floor:>7.3f} {'' if got is None else f'{got:>9.3f}'}")
    print(f"{'the rest (as measured)':26} {rest:>7.3f} {rest:>9.3f}")
    total_measured = sum(t["per_sample_day"] for t in measured.values()) if measured else float("nan")
    print(f"{'all':26} {sum(floors.values()) + rest:>7.3f} {total_measured:>9.3f}")


if __name__ == "__main__":
    main()
