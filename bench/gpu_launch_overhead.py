"""What the GPU probes add to each kernel launch: ns per launch with the agent's GPU collector attached vs detached,
in the same run, on the same processes. The added ns per sampled launch is the figure (goal: at most 2 µs; about 0
when detached).

    .venv/bin/python bench/gpu_launch_overhead.py [--launches 200000] [--reps 5] [--rate 1000]

Needs root (BPF) and gcc. Two launchers, each a C loop of zero-duration launches, timed by the CPU time of the
whole launcher process (CLOCK_PROCESS_CPUTIME_ID; wall time is kept in the JSON):
- emitter: fires the fleetprof probes itself (fleetprof_probes.h + the shared per-thread rate limit,
  fleetprof_ratelimit.h) as the CUPTI shim does: kernel_launch on the launching thread; kernel_executed either left
  out (the shim fires it on CUPTI's buffer thread) or fired right after on the same thread (the worst case); and
  once from 60 frames deeper (the stack walk's cost). A build without probes is the floor.
- simulator: gpusim_launch() of libfleetprof_gpusim.so in a loop, synchronizing every 1024 launches (its device
  thread fires kernel_executed), when the simulator builds.
Each runs with every launch sampled (rate 0) and with `--rate` sampled launches per second per thread. Rounds:
detached, attached (GpuProbeCollector, its rings drained by a thread meanwhile), detached again; the median of
`--reps` repetitions of each. The BPF programs' own run time per hit (kernel.bpf_stats_enabled, on for the
attached round only) tells the program from the trap around it. Prints a table and writes
bench/out/gpu_launch_overhead.json.

First, without root or BPF (alone with --cupti-only): the CUPTI side of being attached, the shim on the simulated
CUPTI (simulate/cupti.py) with its kernel records on only around sampled launches (FLEETPROF_CUPTI_ACTIVITY=sampled)
and on all the time (always): kernel records CUPTI delivers and the shim processes per launch against the fraction of
launches sampled (goal: at most 1.1x), for `--launches` launches on 2 threads with 5 µs of CPU work before each, with
no time inside the launch API and with 2 µs (a real cudaLaunchKernel's order, the time another thread's sampled
launch holds records on); and the launching process's CPU ns per launch, records' processing included, detached and
attached in both modes, on one thread launching back to back.

Also without root (alone with --records-only): what the shim spends per activity record it reads, copy records
(memory_executed's path) next to graph kernel records, timed inside the flushes of tests/cupti_graph_replay.c on the
simulated CUPTI (the simulated record iteration included; the probes' semaphores down, so no BPF); and per NVTX
push/pop pair through the real NVTX3 library (tests/cupti_nvtx_workload.c): no injection library (NVTX's own
no-op), the shim injected with no agent attached (a load, a branch and a depth counter), and attached (the message
copied; the record file raises launch_range's semaphore as an agent would). Goal: at most 50 ns per push/pop
attached.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from producers.cupti_shim import build_shim, nvtx_include_dir  # noqa: E402
from producers.gpu_probes import GpuProbeCollector  # noqa: E402
from producers.native_build import NATIVE, PROBES_INCLUDE  # noqa: E402
from producers.probe_finder import ProbeFinder  # noqa: E402
from producers.process_info import ProcessCache  # noqa: E402
from simulate.cupti import SHIM_COUNTERS, build_simulated_cupti, launch_bound, symbol_offset  # noqa: E402

# Every launcher answers "run N" with: wall ns and CPU ns (the whole process: the simulator's device thread too)
# per launch, launches sampled, weight sum (of this round).
EMITTER_C = r"""
#define FLEETPROF_DEFINE_PROBE_SEMAPHORES
#include "fleetprof_probes.h"
#include "fleetprof_ratelimit.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static fleetprof_ratelimit_t rl;
static uint32_t rate, next_corr = 1;
static int launch_only;  /* kernel_executed left to another thread, as CUPTI's activity buffers are */
static int in_range;     /* each launch inside an NVTX range: launch_range fires before kernel_launch, as the shim */
static unsigned long sampled, weights;

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t mono_ns(void) { return clock_ns(CLOCK_MONOTONIC); }

__attribute__((noinline)) void bench_launch(void) {
    uint32_t corr = next_corr++;
#ifndef NO_PROBES
    if (FLEETPROF_ANY_ENABLED()) {  /* the shim's callbacks are off while no agent is attached */
        uint32_t w = fleetprof_ratelimit_take(&rl, rate, fleetprof_ratelimit_clock_ns(), 0x9e3779b97f4a7c15ull);
        if (w) {
            sampled++;
            weights += w;
            if (w > 1) FLEETPROF_LAUNCH_WEIGHT(corr, w);
            if (in_range) FLEETPROF_LAUNCH_RANGE(corr, "train_step > forward > attention");
            FLEETPROF_KERNEL_LAUNCH(corr, 211, "benchLaunchKernel");
            if (!launch_only) {
                uint64_t t = mono_ns();
                FLEETPROF_KERNEL_EXECUTED(t, t, corr, 0, 0, "bench_zero_duration_kernel");
            }
        }
    }
#endif
    __asm__ __volatile__("" ::: "memory");
}

/* `depth` more frames of ~200 bytes under each launch: realistic stacks are deeper than this loop's */
static int depth;
__attribute__((noinline)) void deeper(int d) {
    volatile char pad[192];
    pad[0] = (char)d;
    if (d > 0) deeper(d - 1); else bench_launch();
    __asm__ __volatile__("" ::: "memory");
}

int main(int argc, char **argv) {
    alarm(1800);
    rate = argc > 1 ? (uint32_t)atoi(argv[1]) : 0;
    launch_only = argc > 2;
    in_range = argc > 2 && argv[2][0] == 'r';  /* "range": launch_only, and in a range */
    depth = argc > 3 ? atoi(argv[3]) : 0;
    char line[64];
    unsigned long n;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "run %lu", &n) != 1) continue;
        sampled = weights = 0;
        uint64_t t0 = mono_ns(), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (unsigned long i = 0; i < n; i++) {
            if (depth) deeper(depth); else bench_launch();
        }
        uint64_t t1 = mono_ns(), c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        printf("%.3f %.3f %lu %lu\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n, sampled, weights);
        fflush(stdout);
    }
    return 0;
}
"""

SIM_DRIVER_C = r"""
#include "gpusim.h"
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

int main(void) {
    alarm(1800);
    char line[64];
    unsigned long n;
    struct gpusim_stats a, b;
    while (fgets(line, sizeof line, stdin)) {
        if (sscanf(line, "run %lu", &n) != 1) continue;
        gpusim_synchronize();
        gpusim_stats(&a);
        uint64_t t0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        for (unsigned long i = 0; i < n; i++) {
            gpusim_launch("bench_zero_duration_kernel", 0, 0);
            if (i % 1024 == 1023) gpusim_synchronize();  /* stay under the device queue's depth */
        }
        gpusim_synchronize();
        uint64_t t1 = clock_ns(CLOCK_MONOTONIC), c1 = clock_ns(CLOCK_PROCESS_CPUTIME_ID);
        gpusim_stats(&b);
        printf("%.3f %.3f %lu %lu\n", (double)(t1 - t0) / n, (double)(c1 - c0) / n,
               (unsigned long)(b.launches_sampled - a.launches_sampled),
               (unsigned long)(b.weight_sum - a.weight_sum));
        fflush(stdout);
    }
    return 0;
}
"""


class Launcher:
    """One launcher process, waiting for `run N`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, **(env or {})))

    def run(self, launches: int) -> tuple[float, float, int, int]:
        """(CPU ns per launch, wall ns per launch, launches sampled, weight sum) of one round."""
        self.proc.stdin.write(f"run {launches}\n")
        self.proc.stdin.flush()
        wall, cpu, sampled, weights = self.proc.stdout.readline().split()
        return float(cpu), float(wall), int(sampled), int(weights)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


def gcc(*args: str) -> None:
    done = subprocess.run(["gcc", "-O2", "-g", "-fno-omit-frame-pointer", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"gcc failed: {done.stderr.strip()[:400]}")


def build(tmp: Path, rate: int) -> list[Launcher]:
    (tmp / "emitter.c").write_text(EMITTER_C)
    gcc(f"-I{PROBES_INCLUDE}", str(tmp / "emitter.c"), "-o", str(tmp / "emitter"))
    gcc(f"-I{PROBES_INCLUDE}", "-DNO_PROBES", str(tmp / "emitter.c"), "-o", str(tmp / "emitter_none"))
    launchers = [Launcher("emitter, no probes compiled in (floor)", [str(tmp / "emitter_none")]),
                 Launcher("emitter, every launch: kernel_launch only", [str(tmp / "emitter"), "0", "launch"]),
                 Launcher("emitter, kernel_launch only, 60 frames deeper", [str(tmp / "emitter"), "0", "launch", "60"]),
                 Launcher("emitter, kernel_launch in an NVTX range", [str(tmp / "emitter"), "0", "range"]),
                 Launcher("emitter, every launch: launch + executed", [str(tmp / "emitter"), "0"]),
                 Launcher(f"emitter, rate limit {rate}/s", [str(tmp / "emitter"), str(rate)])]
    # a build of the simulator of the bench's own (FLEETPROF_NATIVE_BUILD): attaching to it turns on no probes in
    # other processes that load the simulator meanwhile
    env = dict(os.environ, FLEETPROF_NATIVE_BUILD=str(tmp / "native"))
    code = "from simulate.gpu import build_gpusim; print(build_gpusim())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"simulator skipped: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return launchers
    lib = Path(done.stdout.strip())
    (tmp / "sim_driver.c").write_text(SIM_DRIVER_C)
    gcc(f"-I{NATIVE / 'sim' / 'gpu'}", str(tmp / "sim_driver.c"), f"-L{lib.parent}", "-lfleetprof_gpusim",
        f"-Wl,-rpath,{lib.parent}", "-o", str(tmp / "sim_driver"))
    driver = [str(tmp / "sim_driver")]
    launchers += [Launcher("simulator, every launch sampled", driver, {"FLEETPROF_LAUNCH_RATE": "0"}),
                  Launcher(f"simulator, rate limit {rate}/s", driver, {"FLEETPROF_LAUNCH_RATE": str(rate)})]
    return launchers


BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


def rounds(launchers: list[Launcher], launches: int, reps: int) -> dict[str, dict]:
    """Per launcher, the repetition with the median CPU ns per launch: CPU, not wall, so that another process
    taking the core meanwhile does not count (a trap's kernel time is charged to the thread that hit it)."""
    out = {}
    for lau in launchers:
        lau.run(launches // 10)  # warm: page faults, the simulator's device thread
        runs = sorted(lau.run(launches) for _ in range(reps))
        cpu, wall, sampled, weights = runs[len(runs) // 2]
        out[lau.name] = {"ns_per_launch": cpu, "wall_ns_per_launch": wall, "sampled": sampled, "weights": weights,
                         "all_cpu_ns": [r[0] for r in runs]}
    return out


def cupti_activity(launches: int, rate: int) -> dict[str, list[dict]]:
    """Kernel records per launch and CPU per launch of the shim on the simulated CUPTI, `sampled` next to `always`."""
    env = {"FLEETPROF_LAUNCH_RATE": str(rate)}
    records = []
    print(f"{'kernel records, 2 threads, 5 µs CPU work per launch':56} {'sampled':>8} {'records/launch':>15} "
          f"{'ratio':>7} {'always: records/launch':>23} {'ratio':>7}")
    for api_ns in (0, 2000):
        sampled, always = (launch_bound(launches, 2, activity=mode, api_ns=api_ns, env=env)
                           for mode in ("sampled", "always"))
        row = {"api_ns": api_ns, "sampled_fraction": sampled["sampled_fraction"],
               "sampled_records_per_launch": sampled["records_per_launch"],
               "sampled_ratio": sampled["ratio_to_sampled"], "sampled_enables": sampled["enables"],
               "sampled_skipped_records": sampled["shim"]["kernels_skipped"],
               "always_sampled_fraction": always["sampled_fraction"],
               "always_records_per_launch": always["records_per_launch"], "always_ratio": always["ratio_to_sampled"]}
        records.append(row)
        print(f"{f'  {api_ns / 1000:g} µs inside the launch API':56} {row['sampled_fraction']:8.2%} "
              f"{row['sampled_records_per_launch']:15.5f} {row['sampled_ratio']:6.3f}x "
              f"{row['always_records_per_launch']:23.5f} {row['always_ratio']:6.1f}x")
    cpu = []
    print(f"{'CPU per launch, 1 thread back to back (records processed)':56} {'ns':>8} {'records/launch':>15}")
    for label, mode, attach in (("detached", "sampled", False), ("attached, sampled", "sampled", True),
                                ("attached, always", "always", True)):
        run = launch_bound(launches, 1, activity=mode, gap_ns=0, attach=attach, env=env)
        cpu.append({"run": label, "cpu_ns_per_launch": round(run["cpu_ns_per_launch"], 1),
                    "records_per_launch": run["records_per_launch"], "sampled_fraction": run["sampled_fraction"]})
        print(f"  {label:54} {run['cpu_ns_per_launch']:8.1f} {run['records_per_launch']:15.5f}")
    return {"records": records, "cpu": cpu}


def _replay(program: Path, shim: Path, cupti: Path, nodes: int, copies: int, launches: int) -> dict:
    semaphore = symbol_offset(shim, "fleetprof_kernel_launch_semaphore")[0]
    counters = symbol_offset(shim, "shim_counters")[0]
    args = [program, cupti, shim, semaphore, counters, len(SHIM_COUNTERS), launches, nodes, 16, copies]
    env = {**os.environ, "FLEETPROF_CUPTI_LIBRARY": str(cupti), "FLEETPROF_CUPTI_ACTIVITY": "always"}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout)


def _nvtx_pair_ns(program: Path, env: dict[str, str], pairs: int, reps: int = 3) -> float:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("FLEETPROF_") and k not in ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")}
    return min(float(subprocess.run([str(program), "bench", str(pairs)], capture_output=True, text=True, check=True,
                                    env={**base, **env}).stdout) for _ in range(reps))


def records_and_nvtx(records: int = 2_000_000, pairs: int = 5_000_000) -> dict:
    """ns per copy record and per graph kernel record read by the shim; ns per NVTX push/pop pair."""
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-recbench-"))
    try:
        shim, cupti = build_shim(), build_simulated_cupti()
        replay, nvtx = tmp / "replay", tmp / "nvtx"
        gcc("-O2", "-o", str(replay), str(ROOT / "tests" / "cupti_graph_replay.c"), "-ldl")
        gcc("-O2", f"-I{nvtx_include_dir()}", "-o", str(nvtx), str(ROOT / "tests" / "cupti_nvtx_workload.c"), "-ldl",
            "-pthread")
        out: dict = {"records": records, "pairs": pairs}
        for label, nodes, copies in (("copy", 0, 1000), ("graph_kernel", 1000, 0)):
            best = float("inf")
            for _ in range(3):  # the best of three: the machine is shared
                run = _replay(replay, shim, cupti, nodes, copies, records // 1000)
                assert run["delivered"] == records and run["dropped"] == 0, run
                best = min(best, run["flush_seconds"] * 1e9 / records)
            out[f"{label}_record_ns"] = round(best, 1)
        injected = {"NVTX_INJECTION64_PATH": str(shim)}
        attached = {**injected, "CUDA_INJECTION64_PATH": str(shim), "FLEETPROF_CUPTI_LIBRARY": str(cupti),
                    "FLEETPROF_CUPTI_RECORD": "/dev/null"}
        out["nvtx_pair_ns"] = {"no injection": _nvtx_pair_ns(nvtx, {}, pairs),
                               "shim, no agent": _nvtx_pair_ns(nvtx, injected, pairs),
                               "shim, attached": _nvtx_pair_ns(nvtx, attached, pairs)}
        semaphores = [str(symbol_offset(shim, f"fleetprof_{name}_semaphore")[0])
                      for name in ("kernel_launch", "launch_range")]
        launch_env = {**injected, "CUDA_INJECTION64_PATH": str(shim), "FLEETPROF_CUPTI_LIBRARY": str(cupti),
                      "FLEETPROF_LAUNCH_RATE": "0"}
        out["sampled_launch_ns"] = {f"depth {depth}": min(float(subprocess.run(
            [str(nvtx), "launches", "200000", str(depth), *semaphores], capture_output=True, text=True, check=True,
            env={**os.environ, **launch_env}).stdout) for _ in range(3)) for depth in (0, 4, 16)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'shim read per activity record (simulated CUPTI, no BPF)':56} copy {out['copy_record_ns']:.1f} ns, "
          f"graph kernel {out['graph_kernel_record_ns']:.1f} ns")
    for label, ns in out["nvtx_pair_ns"].items():
        print(f"  NVTX push+pop pair, {label:34} {ns:8.1f} ns")
    for label, ns in out["sampled_launch_ns"].items():
        print(f"  sampled launch (simulated CUPTI), NVTX {label:18} {ns:8.1f} ns")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=200_000, help="launches per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rate", type=int, default=1000, help="sampled launches per second per thread")
    parser.add_argument("--cupti-only", action="store_true", help="only the simulated CUPTI part (no root, no BPF)")
    parser.add_argument("--records-only", action="store_true",
                        help="only the cost per copy record and per NVTX push/pop (no root, no BPF)")
    args = parser.parse_args()
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    costs = records_and_nvtx()
    if args.records_only:
        (out / "gpu_record_nvtx_cost.json").write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), **costs},
                                                                  indent=2))
        return 0
    cupti = cupti_activity(args.launches, args.rate) | {"records_and_nvtx": costs}
    if args.cupti_only:
        (out / "gpu_launch_overhead_cupti.json").write_text(json.dumps(
            {"date": time.strftime("%Y-%m-%d"), "launches": args.launches, "rate": args.rate, **cupti}, indent=2))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-gpubench-"))
    launchers = build(tmp, args.rate)
    view = tmp / "proc"  # the collector scans only the launchers: nothing else on the machine is attached
    view.mkdir()
    for lau in launchers:
        (view / str(lau.proc.pid)).symlink_to(f"/proc/{lau.proc.pid}")
    try:
        detached = rounds(launchers, args.launches, args.reps)
        collector = GpuProbeCollector("bench", ProcessCache(), finder=ProbeFinder(proc=str(view)))
        collector.start()
        attached_paths = collector.rescan()
        stop, seen = threading.Event(), {"launches": 0, "kernels": 0}

        def drain() -> None:
            while not stop.is_set():
                launches, kernels = collector.poll(20)
                seen["launches"] += len(launches)
                seen["kernels"] += len(kernels)
        poller = threading.Thread(target=drain)
        stats_was = BPF_STATS.read_text().strip() if BPF_STATS.exists() else None
        if stats_was is not None:
            BPF_STATS.write_text("1")  # the programs' own run time, apart from the trap around them
        t0 = time.monotonic()
        poller.start()
        try:
            attached = rounds(launchers, args.launches, args.reps)
        finally:
            stop.set()
            poller.join()
            attached_s = time.monotonic() - t0
            bpf = collector.program_stats()
            if stats_was is not None:
                BPF_STATS.write_text(stats_was)
            counters = collector.counters()
            collector.close()
        after = rounds(launchers, args.launches, args.reps)
    finally:
        for lau in launchers:
            lau.close()
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    floor = detached[launchers[0].name]["ns_per_launch"]
    for lau in launchers:
        d, a, d2 = detached[lau.name], attached[lau.name], after[lau.name]
        added = a["ns_per_launch"] - d["ns_per_launch"]
        rows.append({"launcher": lau.name, "detached_ns": d["ns_per_launch"], "attached_ns": a["ns_per_launch"],
                     "detached_again_ns": d2["ns_per_launch"], "added_ns_per_launch": round(added, 1),
                     "sampled_share": a["sampled"] / args.launches,
                     # only where most launches were sampled: a few sampled ones in noise say nothing
                     "added_ns_per_sampled_launch": round(added * args.launches / a["sampled"], 1)
                     if a["sampled"] >= args.launches // 2 else None,
                     "ratio_attached_detached": round(a["ns_per_launch"] / d["ns_per_launch"], 2),
                     "detached_minus_floor_ns": round(d["ns_per_launch"] - floor, 2),
                     "runs": {"detached": d, "attached": a, "detached_again": d2}})
    print(f"{'launcher':48} {'detached':>10} {'attached':>10} {'again':>8} {'added/launch':>13} "
          f"{'sampled':>8} {'added/sampled':>14} {'ratio':>7}")
    for r in rows:
        per_sampled = f"{r['added_ns_per_sampled_launch']:.0f} ns" if r["added_ns_per_sampled_launch"] else "-"
        print(f"{r['launcher']:48} {r['detached_ns']:8.1f} ns {r['attached_ns']:8.1f} ns "
              f"{r['detached_again_ns']:5.1f} ns {r['added_ns_per_launch']:10.1f} ns "
              f"{r['sampled_share']:8.1%} {per_sampled:>14} {r['ratio_attached_detached']:6.2f}x")
    drained = (seen["launches"] + seen["kernels"]) / attached_s
    print(f"attached: {attached_paths}")
    print(f"user space drained {seen['launches']} launch + {seen['kernels']} kernel records in {attached_s:.1f} s "
          f"({drained:,.0f} records/s); lost in the rings (full): {counters['lost_launches']} launch, "
          f"{counters['lost_kernels']} kernel records")
    bpf_ns = {kind: round(ns / cnt) for kind, (ns, cnt) in bpf.items() if cnt}
    if bpf_ns:
        print("BPF program run time per hit (bpf_stats): " + ", ".join(f"{k} {v} ns" for k, v in bpf_ns.items()))
    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()} {os.cpu_count()} CPUs, "
              f"kernel {platform.release()}", "launches_per_rep": args.launches, "reps": args.reps,
              "rate": args.rate, "rows": rows, "records_seen": seen, "records_drained_per_s": round(drained),
              "bpf_ns_per_hit": bpf_ns, "counters": counters, "cupti_activity": cupti}
    (out / "gpu_launch_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
