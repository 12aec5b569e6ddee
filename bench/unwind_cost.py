"""What unwinding user stacks from call-frame tables costs, next to walking frame pointers, in one run:

    .venv/bin/python bench/unwind_cost.py [--seconds 1.5] [--bpf-reps 3] [--agent-seconds 30] [--launches 100000]
                                          [--reps 3] [--parts bpf,agent,gpu]

Needs root (BPF, perf), gcc and Kafka for a local broker (infra/setup.sh). Prints a table and writes
bench/out/unwind_cost.json.

1. bpf: the CPU sampler's own BPF time per sample (kernel.bpf_stats_enabled; the run time of `on_cpu_clock` from
   /proc/self/fdinfo, which holds its tail-called `cpu_unwind` too: the kernel times a program where it is entered,
   so cpu_unwind's own count stays 0) on a C workload that recurses until its stack is 20, 60 or 120 frames deep and
   spins there. The recursion is linked in twice: built -O2 -fomit-frame-pointer (walked from the tables) and
   -fno-omit-frame-pointer (the peer: the sampler without tables walks it by frame pointers); main has frame pointers
   so that the peer reaches libc. One process; two samplers compiled once (with tables, without), each filtered on
   its pid, take turns: the one whose phase it is has its CPU-clock events (999 Hz) opened on that process alone, so
   every run of its program is a sample of the workload; the order swaps every round. The stacks' frame counts come
   from the samples themselves.
2. agent: bench/unwind_cost_agent.py: the whole agent at 19 Hz with tables and with frame pointers only, and
   `perf record --call-graph dwarf -a` at 19 Hz, all over the same seconds; the agent's RSS and the tables' rows
   and bytes.
3. gpu: the launch probe's cost at 30 frames: bench/gpu_launch_overhead.py's emitter (kernel_launch only, every
   launch sampled) built without and with frame pointers, 24 levels of `deeper` under main (30 frames in all, the
   probe's own included), and with frame pointers straight from main (5 frames); rounds detached, then twice in
   turn attached walking frame pointers only and attached with tables (the emitters' tables loaded), detached
   again; CPU ns per launch (the median of every pass's repetitions), and the launch program's own run time per
   hit (bpf_stats: it holds the tail-called gpu_unwind's) for each launcher and pass.
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

from bench.gpu_launch_overhead import EMITTER_C, Launcher, gcc, rounds  # noqa: E402
from bench.unwind_cost_agent import agent_part, print_agent  # noqa: E402
from producers.cpu_sampler import CpuSampler  # noqa: E402
from producers.gpu_probes import GpuProbeCollector  # noqa: E402
from producers.native_build import PROBES_INCLUDE  # noqa: E402
from producers.probe_finder import ProbeFinder  # noqa: E402
from producers.process_info import ProcessCache, process_info  # noqa: E402
from producers.unwind_maps import UnwindLoader  # noqa: E402
from schemas.wire import TRUNCATED_FRAME  # noqa: E402

CACHE = ROOT / "bench" / "out" / "unwind_cost_tables"  # tables compiled once, kept between runs
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
DEPTHS = (20, 60, 120)
BELOW = 5  # frames that are not the recursion: spin, main, __libc_start_call_main, __libc_start_main, _start
GPU_DEPTH = 24  # `deeper` levels under main: 30 frames with the probe's own, `deeper`(24..0), main and libc's 3
HZ = 999

RECURSE_C = r"""
#include <time.h>
extern volatile unsigned long sink;
extern double until;
__attribute__((noinline)) void SPIN(void) {
    struct timespec ts;
    do {
        for (int i = 0; i < 200000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &ts);
    } while (ts.tv_sec + ts.tv_nsec / 1e9 < until);
}
__attribute__((noinline)) void DOWN(int d) {
    volatile char pad[48];
    pad[d % 48] = (char)d;
    if (d > 1) DOWN(d - 1); else SPIN();
    sink += pad[0];  /* after the call: not a tail call */
}
"""

MAIN_C = r"""
#include <stdio.h>
#include <time.h>
#include <unistd.h>
volatile unsigned long sink;
double until;
void down_nofp(int), down_fp(int);
int main(void) {
    alarm(900);
    char kind[8];
    int depth;
    double secs;
    struct timespec ts;
    while (scanf("%7s %d %lf", kind, &depth, &secs) == 3) {  /* "nofp|fp DEPTH SECONDS": recurse, spin, answer */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        until = ts.tv_sec + ts.tv_nsec / 1e9 + secs;
        if (kind[0] == 'n') down_nofp(depth); else down_fp(depth);
        printf("done\n");
        fflush(stdout);
    }
    return 0;
}
"""


def build_workload(tmp: Path) -> Path:
    (tmp / "rec.c").write_text(RECURSE_C)
    (tmp / "main.c").write_text(MAIN_C)
    steps = [["-fomit-frame-pointer", "-DDOWN=down_nofp", "-DSPIN=spin_nofp", "-c", "rec.c", "-o", "nofp.o"],
             ["-fno-omit-frame-pointer", "-DDOWN=down_fp", "-DSPIN=spin_fp", "-c", "rec.c", "-o", "fp.o"],
             ["-fno-omit-frame-pointer", "main.c", "nofp.o", "fp.o", "-o", "recurse"]]
    for step in steps:
        done = subprocess.run(["gcc", "-O2", *step], cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"gcc failed: {done.stderr.strip()[:400]}")
    return tmp / "recurse"


def _prog_stats(sampler: CpuSampler) -> dict[str, tuple[int, int]]:
    """(run_time_ns, run_cnt) of the sampler's perf_event programs, from /proc/self/fdinfo."""
    out = {}
    for name in (b"on_cpu_clock", b"cpu_unwind"):
        fn = sampler._bpf.funcs.get(name)
        if fn is None:
            continue
        with open(f"/proc/self/fdinfo/{fn.fd}") as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        out[name.decode()] = (int(info.get("run_time_ns", 0)), int(info.get("run_cnt", 0)))
    return out


def _delta(a: dict, b: dict) -> tuple[int, int]:
    """(ns of both programs, runs of on_cpu_clock) between two _prog_stats."""
    return sum(b[k][0] - a[k][0] for k in b), b["on_cpu_clock"][1] - a["on_cpu_clock"][1]


def _sample_only(sampler: CpuSampler, pid: int | None) -> None:
    """The sampler's CPU-clock events on `pid` alone (a per-task event on each CPU: it fires only while that process
    runs, so every run of the program is one of its samples), or on nothing (None)."""
    bpf, bcc = sampler._bpf, sampler._bcc
    key = (bcc.PerfType.SOFTWARE, bcc.PerfSWConfig.CPU_CLOCK)
    if key in bpf.open_perf_events:
        bpf.detach_perf_event(*key)
    if pid is not None:
        bpf.attach_perf_event(ev_type=key[0], ev_config=key[1], fn_name=b"on_cpu_clock", sample_freq=HZ, pid=pid)


def timed_phase(sampler: CpuSampler, proc: subprocess.Popen, command: str) -> tuple[int, int, list]:
    """One phase: the sampler's events on the workload alone while it runs `command` (a line it answers when done);
    (the sampler's BPF ns, its program's runs, the samples)."""
    sampler.drain()
    _sample_only(sampler, proc.pid)
    before = _prog_stats(sampler)
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    proc.stdout.readline()
    ns, runs = _delta(before, _prog_stats(sampler))
    _sample_only(sampler, None)
    return ns, runs, sampler.drain()


def _frames(samples: list, pid: int) -> dict[int, int]:
    """The workload's samples by user frames walked."""
    counts: dict[int, int] = {}
    for p, _, user, _, n in samples:
        if p == pid:
            k = sum(1 for a in user if a != TRUNCATED_FRAME)
            counts[k] = counts.get(k, 0) + n
    return counts


def _median(values: list[float]) -> float:
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


WALKS = ("stacks_reached_root", "stacks_ended_by_frame_pointer", "stacks_truncated", "stacks_without_tables")


def bpf_part(tmp: Path, seconds: float, reps: int) -> dict:
    """Two samplers (tables, frame pointers) compiled once, sampling the workload in turns: per depth, one phase
    each, their order swapped every round; the median per phase over `reps` rounds."""
    binary = build_workload(tmp)
    proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    loader = UnwindLoader(CACHE)
    # one process: few distinct stacks, so the smallest stack maps
    samplers = {"tables": CpuSampler(HZ, pid_filter=proc.pid, stack_entries=16384, unwind=loader),
                "frame_pointers": CpuSampler(HZ, pid_filter=proc.pid, stack_entries=16384)}
    out: dict = {"hz": HZ, "seconds": seconds, "reps": reps}
    pairs = [("tables", "nofp"), ("frame_pointers", "fp")]
    raw: dict = {(mode, build, frames): [] for mode, build in pairs for frames in DEPTHS}
    raw["frame_pointers", "nofp", DEPTHS[-1]] = []  # what frame pointers make of code built without them
    try:
        for mode, sampler in samplers.items():
            t0 = time.monotonic()
            sampler.start()
            out[f"{mode}_compile_s"] = round(time.monotonic() - t0, 1)
            out[f"{mode}_unwinding"] = sampler.unwinding
            _sample_only(sampler, None)
        loader.load(proc.pid, process_info(proc.pid).mappings)
        loader.wait_idle(120)
        for r in range(reps):
            order = [(m, b, f) for f in DEPTHS for m, b in (pairs if r % 2 == 0 else pairs[::-1])]
            for mode, build, frames in [*order, ("frame_pointers", "nofp", DEPTHS[-1])]:
                sampler = samplers[mode]
                walks0 = loader.counters()
                ns, runs, samples = timed_phase(sampler, proc, f"{build} {frames - BELOW} {seconds}")
                seen = _frames(samples, proc.pid)
                walks1 = loader.counters()
                raw[mode, build, frames].append({
                    "runs": runs, "samples": sum(seen.values()), "bpf_ns": ns, "lost": sampler.lost_samples,
                    "ns_per_sample": round(ns / runs) if runs else None, "frames": seen})
                if mode == "tables":  # how the walks ended (the tables program's counts)
                    raw[mode, build, frames][-1]["walks"] = {k: walks1[k] - walks0[k] for k in WALKS}
        out["loader"] = {k: loader.counters()[k] for k in ("files", "rows_used", "processes")}
    finally:
        for sampler in samplers.values():
            if sampler._bpf is not None:
                _sample_only(sampler, proc.pid)  # close() detaches what is attached
            sampler.close()
        loader.close()
        proc.stdin.close()
        proc.kill()
        proc.wait()
    rows = []
    for (mode, build, frames), runs in raw.items():
        per = [r["ns_per_sample"] for r in runs if r["ns_per_sample"]]
        seen: dict[int, int] = {}
        for r in runs:
            for k, n in r["frames"].items():
                seen[k] = seen.get(k, 0) + n
        top = max(seen, key=seen.get) if seen else None
        rows.append({"mode": mode, "build": build, "frames": frames, "ns_per_sample": round(_median(per)),
                     "min": min(per), "max": max(per), "samples": sum(r["samples"] for r in runs),
                     "stack_frames": top, "share": round(seen[top] / sum(seen.values()), 3) if seen else 0,
                     "runs": runs})
    out["rows"] = rows
    by = {(r["mode"], r["build"], r["frames"]): r["ns_per_sample"] for r in rows}
    out["ratio_tables_fp"] = {f: round(by["tables", "nofp", f] / by["frame_pointers", "fp", f], 2) for f in DEPTHS}
    lo, hi = DEPTHS[0], DEPTHS[-1]
    out["ns_per_frame"] = {m: round((by[m, b, hi] - by[m, b, lo]) / (hi - lo), 1) for m, b in pairs}
    return out


def _gpu_mode(mode: str, launchers: list[Launcher], view: Path, launches: int, reps: int) -> dict:
    """One collector (tables or frame pointers) attached to the launchers: per launcher, its rounds and the launch
    program's own run time per hit over them."""
    loader = UnwindLoader(CACHE) if mode == "tables" else None
    collector = GpuProbeCollector("bench", ProcessCache(), finder=ProbeFinder(proc=str(view)), unwind=loader)
    collector.start()
    names = {lau.proc.pid: lau.name for lau in launchers}
    frames: dict[str, dict[int, int]] = {n: {} for n in names.values()}
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            for rec in collector.poll(20)[0]:
                if rec["pid"] in names:
                    k = sum(1 for a in rec["user_addrs"] if a != TRUNCATED_FRAME - (1 << 64))
                    per = frames[names[rec["pid"]]]
                    per[k] = per.get(k, 0) + 1
    poller = threading.Thread(target=drain)
    out: dict = {"unwinding": collector.unwinding, "launchers": {}}
    try:
        collector.rescan()
        if loader is not None:
            for lau in launchers:
                loader.load(lau.proc.pid, process_info(lau.proc.pid).mappings)
            loader.wait_idle(120)
        poller.start()
        for lau in launchers:
            before = collector.program_stats().get("launch", (0, 0))
            row = rounds([lau], launches, reps)[lau.name]
            after = collector.program_stats().get("launch", (0, 0))
            hits = after[1] - before[1]
            row["bpf_ns_per_hit"] = round((after[0] - before[0]) / hits) if hits else None
            out["launchers"][lau.name] = row
    finally:
        stop.set()
        if poller.is_alive():
            poller.join()
        collector.close()
        if loader is not None:
            loader.close()
    for name, seen in frames.items():
        out["launchers"][name]["frames"] = max(seen, key=seen.get) if seen else None
    return out


def gpu_part(tmp: Path, launches: int, reps: int, passes: int = 2) -> dict:
    """Rounds detached; then `passes` times frame pointers and tables in turn; detached again. Per launcher and
    mode, the median CPU ns per launch over every pass's repetitions."""
    (tmp / "emitter.c").write_text(EMITTER_C)
    gcc(f"-I{PROBES_INCLUDE}", str(tmp / "emitter.c"), "-o", str(tmp / "emitter_fp"))
    gcc("-fomit-frame-pointer", f"-I{PROBES_INCLUDE}", str(tmp / "emitter.c"), "-o", str(tmp / "emitter_nofp"))
    launchers = [Launcher("built without frame pointers", [str(tmp / "emitter_nofp"), "0", "launch", str(GPU_DEPTH)]),
                 Launcher("built with frame pointers", [str(tmp / "emitter_fp"), "0", "launch", str(GPU_DEPTH)]),
                 Launcher("with frame pointers, 5 frames", [str(tmp / "emitter_fp"), "0", "launch"])]
    view = tmp / "proc"  # the collector scans only the launchers
    view.mkdir()
    for lau in launchers:
        (view / str(lau.proc.pid)).symlink_to(f"/proc/{lau.proc.pid}")
    modes = ("frame_pointers", "tables")
    result: dict = {"depth": GPU_DEPTH, "launches_per_rep": launches, "reps": reps, "passes": passes}
    runs: dict = {m: [] for m in modes}
    try:
        result["detached"] = rounds(launchers, launches, reps)
        for _ in range(passes):
            for mode in modes:
                runs[mode].append(_gpu_mode(mode, launchers, view, launches, reps))
        result["detached_again"] = rounds(launchers, launches, reps)
    finally:
        for lau in launchers:
            lau.close()
    for mode in modes:
        result[f"{mode}_unwinding"] = runs[mode][0]["unwinding"]
        result[mode] = {}
        for lau in launchers:
            per = [r["launchers"][lau.name] for r in runs[mode]]
            cpu = _median([c for p in per for c in p["all_cpu_ns"]])
            result[mode][lau.name] = {
                # every launch is sampled (rate 0): added per launch = added per sampled launch
                "ns_per_launch": cpu, "added_ns": round(cpu - result["detached"][lau.name]["ns_per_launch"], 1),
                "bpf_ns_per_hit": [p["bpf_ns_per_hit"] for p in per], "frames": [p["frames"] for p in per],
                "passes": per}
    return result


def print_bpf(r: dict) -> None:
    print(f"BPF time per sample, {r['hz']} Hz on the workload alone, samplers in turns, {r['reps']} x "
          f"{r['seconds']:g} s per phase (bpf_stats; median, min-max)")
    print(f"{'sampler':15} {'build':5} {'frames':>6} {'ns/sample':>10} {'min-max':>13} {'samples':>8} "
          f"{'frames walked (share)':>22}")
    for row in sorted(r["rows"], key=lambda x: (x["mode"] != "tables", x["build"], x["frames"])):
        spread = f"{row['min']:,}-{row['max']:,}"
        print(f"{row['mode']:15} {row['build']:5} {row['frames']:>6} {row['ns_per_sample']:>10,} {spread:>13} "
              f"{row['samples']:>8} {row['stack_frames']!s:>14} ({row['share']:.0%})")
    print(f"compiled in {r['tables_compile_s']} s ({r['tables_unwinding']}) and {r['frame_pointers_compile_s']} s "
          f"({r['frame_pointers_unwinding']})")
    print("tables on the -fomit-frame-pointer build / frame pointers on the frame-pointer build: "
          + ", ".join(f"{k} frames {v}x" for k, v in r["ratio_tables_fp"].items()))
    print("ns per frame (slope 20 -> 120): " + ", ".join(f"{k} {v}" for k, v in r["ns_per_frame"].items()))


def print_gpu(r: dict) -> None:
    print(f"\nGPU launch probe (kernel_launch only, every launch sampled; CPU ns per launch, median of {r['passes']} "
          f"passes x {r['reps']} x {r['launches_per_rep']:,}; BPF: the launch program's own ns per hit, per pass)")
    print(f"{'emitter':30} {'detached':>9} {'fp only':>9} {'added':>8} {'tables':>9} {'added':>8} {'again':>8} "
          f"{'BPF fp / tables':>24} {'frames fp / tables':>20}")
    for name, d in r["detached"].items():
        fp, tb = r["frame_pointers"][name], r["tables"][name]
        bpf = f"{fp['bpf_ns_per_hit']} / {tb['bpf_ns_per_hit']}"
        frames = f"{fp['frames'][0]} / {tb['frames'][0]}"
        print(f"{name:30} {d['ns_per_launch']:9.1f} {fp['ns_per_launch']:9.1f} {fp['added_ns']:8.1f} "
              f"{tb['ns_per_launch']:9.1f} {tb['added_ns']:8.1f} {r['detached_again'][name]['ns_per_launch']:8.1f} "
              f"{bpf:>24} {frames:>20}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="spinning seconds per phase (build x depth)")
    ap.add_argument("--bpf-reps", type=int, default=3, help="rounds of the BPF phases")
    ap.add_argument("--agent-seconds", type=float, default=30.0, help="steady seconds per agent run and perf")
    ap.add_argument("--launches", type=int, default=100_000, help="launches per repetition")
    ap.add_argument("--reps", type=int, default=3, help="GPU launch repetitions per pass")
    ap.add_argument("--parts", default="bpf,agent,gpu")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (BPF and perf -a)")
    parts = set(args.parts.split(","))
    stats_was = BPF_STATS.read_text().strip() if BPF_STATS.exists() else None
    if stats_was is not None:
        BPF_STATS.write_text("1")
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-unwind-cost-"))
    git = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                         text=True).stdout.split("\n")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result: dict = {"date": time.strftime("%Y-%m-%d"),
                    "machine": f"{platform.machine()} {os.cpu_count()} CPUs, kernel {platform.release()}",
                    "commit": head.stdout.strip(), "changed_files": [ln[3:] for ln in git if ln.strip()]}
    try:
        if "bpf" in parts:
            result["bpf"] = bpf_part(tmp, args.seconds, args.bpf_reps)
            print_bpf(result["bpf"])
        if "agent" in parts:
            result["agent"] = agent_part(args.agent_seconds, tmp)
            print_agent(result["agent"])
        if "gpu" in parts:
            result["gpu"] = gpu_part(tmp, args.launches, args.reps)
            print_gpu(result["gpu"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if stats_was is not None:
            BPF_STATS.write_text(stats_was)
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "unwind_cost.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
