"""The simulated libcupti (native/sim/cupti/, libcupti_simulated.so): its gcc build, and a launch-bound run of the
CUPTI shim against it that counts the kernel records CUPTI delivers and the shim processes per launch.

The run is what an attached agent costs the CUDA process on the CUPTI side, without a GPU and without BPF: the child
process loads the simulated libcupti and the shim as the CUDA driver would, raises one of the shim's probe semaphores
as the kernel does when an agent attaches a uprobe, launches from several threads back to back
(simcupti_launch_loop), then reads the simulator's counters and the shim's own (`shim_counters`, through its symbol
table).

    .venv/bin/python -m simulate.cupti [--launches 200000] [--threads 2] [--kernels 1] [--activity sampled|always]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from elftools.elf.elffile import ELFFile

from producers.cupti_shim import build_shim, cuda_include_dirs
from producers.native_build import NativeLibrary, build

SIMULATED_CUPTI = NativeLibrary(
    name="simulated_cupti",
    sources=("sim/cupti/simulated_cupti.c", "sim/cupti/simulated_records.c", "sim/cupti/simulated_workloads.c"),
    output="libcupti_simulated.so", cflags=("-fvisibility=hidden", "-pthread"), ldflags=("-pthread",),
    soname="libcupti_simulated.so",
    include_dirs=cuda_include_dirs)

# struct shim_counters in native/cupti_shim/shim.h, in order (its symbol's size is checked against this)
SHIM_COUNTERS = ("launches", "launches_sampled", "launches_nested", "launches_failed", "kernels", "kernels_skipped",
                 "kernels_unseen", "kernels_incomplete", "records_dropped", "buffers_refused", "activity_enables",
                 "activity_refused", "copies", "sets", "memory_skipped", "memory_unseen", "memory_incomplete",
                 "graph_kernels", "graph_launches", "graph_launches_sampled", "records_implausible", "gpu_ns",
                 "launch_ranges", "nvtx_messages_cut", "nvtx_paths_cut", "nvtx_too_deep", "nvtx_pops_unmatched",
                 "nvtx_starts_refused")


def build_simulated_cupti(force: bool = False) -> Path:
    """libcupti_simulated.so, built now if missing or stale."""
    return build(SIMULATED_CUPTI, force=force)


def symbol_offset(library: Path, name: str) -> tuple[int, int]:
    """(offset from the start of the library's lowest mapping, size) of a symbol in its .symtab."""
    with library.open("rb") as f:
        elf = ELFFile(f)
        symbol = next(s for s in elf.get_section_by_name(".symtab").iter_symbols() if s.name == name)
        base = min(seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD")
    return symbol["st_value"] - base, symbol["st_size"]


def _mapped_base(library: Path) -> int:
    path = os.path.realpath(library)
    with open("/proc/self/maps") as maps:
        return min(int(line.split("-")[0], 16) for line in maps if line.rstrip().endswith(path))


def _wait_state(cupti: ctypes.CDLL, want: int, mask: int, seconds: float = 5.0) -> int:
    deadline = time.monotonic() + seconds
    while cupti.simcupti_state() & mask != want and time.monotonic() < deadline:
        time.sleep(0.005)
    return cupti.simcupti_state()


def _counters(cupti: ctypes.CDLL, shim_counters: Any) -> dict[str, Any]:
    return {"records_delivered": cupti.simcupti_records_delivered(), "enables": cupti.simcupti_activity_calls(0),
            "disables": cupti.simcupti_activity_calls(1), "shim": dict(zip(SHIM_COUNTERS, shim_counters, strict=True))}


def _child(plan: dict[str, Any]) -> dict[str, Any]:
    """In the child: attach, run the launch loop, flush, and read both sides' counters (what the loop added)."""
    cupti = ctypes.CDLL(plan["cupti"], mode=ctypes.RTLD_GLOBAL)
    cupti.simcupti_records_delivered.restype = ctypes.c_uint64
    cupti.simcupti_activity_calls.restype = ctypes.c_uint64
    cupti.simcupti_launch_loop.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint64]
    cupti.simcupti_launch.argtypes = [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int, ctypes.c_int]
    shim_path = Path(plan["shim"])
    shim = ctypes.CDLL(str(shim_path))
    shim.InitializeInjection()
    base = _mapped_base(shim_path)
    offset, size = plan["counters"]
    shim_counters = (ctypes.c_uint64 * (size // 8)).from_address(base + offset)
    if plan["attach"]:
        ctypes.c_ushort.from_address(base + plan["semaphore"]).value = 1  # an agent attached
        _wait_state(cupti, 1, 1)
        deadline = time.monotonic() + 5
        while shim_counters[0] == 0 and time.monotonic() < deadline:  # until the shim sees launches
            cupti.simcupti_launch(0, 211, b"cudaLaunchKernel", b"k_ready", 1, 0, 0, 0, 0)
            time.sleep(0.001)
        cupti.cuptiActivityFlushAll(0)  # one flush at a time: the watcher's are done too when this returns
    state = cupti.simcupti_state()
    before = _counters(cupti, shim_counters)
    t0, cpu0 = time.monotonic(), time.process_time()
    threads = cupti.simcupti_launch_loop(plan["threads"], plan["launches"] // plan["threads"], plan["kernels"],
                                         plan["gap_ns"])
    seconds = time.monotonic() - t0
    cupti.cuptiActivityFlushAll(0)  # the records' processing counts too
    cpu_s = time.process_time() - cpu0
    after = _counters(cupti, shim_counters)
    run = {k: after[k] - before[k] for k in ("records_delivered", "enables", "disables")}
    return {**run, "state": state, "threads": threads, "seconds": round(seconds, 4), "cpu_s": round(cpu_s, 4),
            "shim": {k: v - before["shim"][k] for k, v in after["shim"].items()}}


def launch_bound(launches: int = 200_000, threads: int = 2, kernels: int = 1, activity: str = "sampled",
                 gap_ns: int = 5000, api_ns: int = 0, attach: bool = True,
                 env: dict[str, str] | None = None) -> dict[str, Any]:
    """One launch-bound run of the shim on the simulated CUPTI, in a child process, attached (or not): what CUPTI
    delivered, what the shim processed and sampled, the per-launch figures, and the process's CPU time for the
    launches and the records' processing. Each thread does `gap_ns` of CPU work before each launch and each launch
    API call `api_ns` between its callbacks (SIMULATED_CUPTI_API_NS); the run must last a few of the rate limit's
    100 ms windows for the sampled fraction to be the rate's. `env` adds to the child's environment
    (FLEETPROF_LAUNCH_RATE, ...)."""
    shim = build_shim()
    counters = symbol_offset(shim, "shim_counters")
    if counters[1] != 8 * len(SHIM_COUNTERS):
        raise RuntimeError(f"shim_counters has {counters[1] // 8} fields, simulate/cupti.py names "
                           f"{len(SHIM_COUNTERS)}: update SHIM_COUNTERS from native/cupti_shim/shim.h")
    plan = {"cupti": str(build_simulated_cupti()), "shim": str(shim), "launches": launches, "threads": threads,
            "kernels": kernels, "gap_ns": gap_ns, "attach": attach,
            "semaphore": symbol_offset(shim, "fleetprof_kernel_launch_semaphore")[0],
            "counters": counters}
    child_env = {k: v for k, v in os.environ.items() if k not in ("FLEETPROF_CUPTI_RECORD", "CUDA_INJECTION64_PATH")}
    child_env |= {"FLEETPROF_CUPTI_ACTIVITY": activity, "FLEETPROF_CUPTI_LIBRARY": plan["cupti"],
                  # room for every record of an `always` run between two flushes: a drop would hide CUPTI's work
                  "FLEETPROF_CUPTI_BUFFERS": "64", "SIMULATED_CUPTI_API_NS": str(api_ns), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "simulate.cupti", "--child", json.dumps(plan)], capture_output=True,
                          text=True, timeout=300, env=child_env, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise RuntimeError(f"the launch-bound run failed: {done.stderr.strip()[-500:]}")
    run = json.loads(done.stdout)
    shim_side = run["shim"]
    total = max(shim_side["launches"], 1)
    run |= {"activity": activity, "launches": launches, "kernels_per_launch": kernels, "gap_ns": gap_ns,
            "api_ns": api_ns, "stderr": done.stderr,
            "sampled_fraction": shim_side["launches_sampled"] / total,
            "records_per_launch": run["records_delivered"] / total,
            "processed_per_launch": shim_side["kernels"] / total,
            "cpu_ns_per_launch": run["cpu_s"] * 1e9 / launches}
    run["ratio_to_sampled"] = run["records_per_launch"] / (kernels * run["sampled_fraction"]) \
        if shim_side["launches_sampled"] else None
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", type=int, default=1, help="kernels per launch (a graph launch makes several)")
    parser.add_argument("--activity", choices=("sampled", "always"), default="sampled")
    parser.add_argument("--gap-ns", type=int, default=5000, help="CPU work before each launch, per thread")
    parser.add_argument("--api-ns", type=int, default=0, help="time inside each launch API call")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    run = launch_bound(args.launches, args.threads, args.kernels, args.activity, args.gap_ns, args.api_ns)
    print(json.dumps({k: v for k, v in run.items() if k != "stderr"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
