"""What reading Python frames from the interpreter costs, in one run, next to py-spy:

    .venv/bin/python bench/python_cost.py [--seconds 1.5] [--reps 3] [--agent-seconds 30] [--parts bpf,agent]

Needs root (BPF), Debian's /usr/bin/python3.11 and Kafka for a local broker (infra/setup.sh). Prints a table and
writes bench/out/python_cost.json.

1. bpf: the CPU sampler's BPF time per sample (kernel.bpf_stats_enabled: the run time of `on_cpu_clock`, which holds
   its tail-called native walk and Python walk) on a stock python3.11 recursing until 10 or 50 Python frames deep
   and spinning there; two samplers (both unwinding native frames from tables; one also reading Python frames) take
   turns on that process alone (per-task CPU-clock events at 999 Hz), their order swapped every round.
2. agent: 20 busy python3.11 processes (pure Python, 10 frames deep, nice 19). Over the same seconds: the agent at
   19 Hz reading Python frames, the agent at 19 Hz without (--no-python-frames), and py-spy recording all 20 at
   19 Hz (one `py-spy record --nonblocking` per process, as py-spy takes one pid). CPU of each tool's process tree
   (utime+stime), and the agents' bytes on the wire per CPU sample (their summaries, after SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.agent_overhead import cpu_seconds, stop_all  # noqa: E402
from bench.local_ports import free_ports  # noqa: E402
from bench.unwind_cost import BPF_STATS, _median, _sample_only, timed_phase  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from producers.cpu_sampler import CpuSampler  # noqa: E402
from producers.process_info import process_info  # noqa: E402
from producers.python_procs import PythonProcs  # noqa: E402
from producers.unwind_maps import UnwindLoader  # noqa: E402

STOCK = "/usr/bin/python3.11"
CACHE = ROOT / "bench" / "out" / "unwind_cost_tables"
HZ = 999
DEPTHS = (10, 50)
WORKERS = 20
AGENT_HZ = 19

# Reads "DEPTH SECONDS" lines: recurses to DEPTH Python frames (the module's frame included), spins there for
# SECONDS, answers "done".
RECURSE = """
import sys, time
def down(n, until):
    if n > 1:
        return down(n - 1, until)
    x = 0
    while time.monotonic() < until:
        x += 1
for line in sys.stdin:
    depth, seconds = line.split()
    down(int(depth) - 1, time.monotonic() + float(seconds))
    print("done", flush=True)
"""
BUSY = """
import time
def level(n):
    if n:
        return level(n - 1)
    x = 0
    for i in range(20000):
        x += i
while True:
    level(8)
"""


def bpf_part(seconds: float, reps: int) -> dict:
    proc = subprocess.Popen([STOCK, "-S", "-c", RECURSE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    loader, python = UnwindLoader(CACHE), PythonProcs()
    samplers = {"python": CpuSampler(HZ, pid_filter=proc.pid, stack_entries=16384, unwind=loader, python=python),
                "native_only": CpuSampler(HZ, pid_filter=proc.pid, stack_entries=16384, unwind=loader)}
    raw: dict = {(mode, depth): [] for mode in samplers for depth in DEPTHS}
    try:
        for sampler in samplers.values():
            sampler.start()
            _sample_only(sampler, None)
        time.sleep(0.5)
        mappings = process_info(proc.pid).mappings
        loader.load(proc.pid, mappings)
        python.load(proc.pid, mappings)
        loader.wait_idle(120)
        for r in range(reps):
            modes = list(samplers) if r % 2 == 0 else list(samplers)[::-1]
            for depth in DEPTHS:
                for mode in modes:
                    ns, runs, _ = timed_phase(samplers[mode], proc, f"{depth} {seconds}")
                    raw[mode, depth].append(round(ns / runs) if runs else None)
        counters = python.counters()
    finally:
        for sampler in samplers.values():
            if sampler._bpf is not None:
                _sample_only(sampler, proc.pid)
            sampler.close()
        loader.close()
        proc.stdin.close()
        proc.kill()
        proc.wait()
    rows = {f"{mode}_{depth}": _median([v for v in runs if v]) for (mode, depth), runs in raw.items()}
    extra = {d: rows[f"python_{d}"] - rows[f"native_only_{d}"] for d in DEPTHS}
    return {"hz": HZ, "seconds": seconds, "reps": reps, "ns_per_sample": rows, "python_extra_ns": extra,
            "ns_per_python_frame": round((extra[DEPTHS[-1]] - extra[DEPTHS[0]]) / (DEPTHS[-1] - DEPTHS[0]), 1),
            "frames_read": counters["python_frames"], "raw": {f"{m}_{d}": v for (m, d), v in raw.items()}}


def _agent(bootstrap: str, data: Path, node: str, python: bool) -> subprocess.Popen:
    env = dict(os.environ, FLEETPROF_KAFKA=bootstrap, FLEETPROF_DATA_DIR=str(data))
    return subprocess.Popen([sys.executable, "-m", "fleetprof", "agent", "--window", "5s", "--frequency",
                             str(AGENT_HZ), "--no-gpu", "--format", "json", "--node", node,
                             "--python-frames" if python else "--no-python-frames"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)


def agent_part(seconds: float, tmp: Path) -> dict:
    workers = [subprocess.Popen(["nice", "-n", "19", STOCK, "-S", "-c", BUSY]) for _ in range(WORKERS)]
    broker, tools = None, {}
    try:
        port, cport = free_ports(2)
        broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
        broker.start()
        create_topics(broker.bootstrap)
        tools["agent_python"] = [_agent(broker.bootstrap, tmp / "a1", "bench-python", True)]
        tools["agent_native_only"] = [_agent(broker.bootstrap, tmp / "a2", "bench-native", False)]
        time.sleep(25)  # the agents compile their BPF programs and send their first windows
        spy = Path(sys.executable).parent / "py-spy"
        tools["py_spy"] = [subprocess.Popen([str(spy), "record", "--pid", str(w.pid), "--rate", str(AGENT_HZ),
                                             "--nonblocking", "--duration", str(int(seconds + 10)), "--format",
                                             "raw", "-o", str(tmp / f"spy{i}.txt")], stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL) for i, w in enumerate(workers)]
        time.sleep(3)
        start = {k: sum(cpu_seconds(p.pid) for p in ps) for k, ps in tools.items()}
        time.sleep(seconds)
        used = {k: sum(cpu_seconds(p.pid) for p in ps) - start[k] for k, ps in tools.items()}
        summaries = {}
        for key in ("agent_python", "agent_native_only"):
            proc = tools[key][0]
            proc.terminate()
            out, _ = proc.communicate(timeout=60)
            summaries[key] = json.loads(out.splitlines()[-1]) if out.strip() else {}
    finally:
        stop_all([p for ps in tools.values() for p in ps] + workers)
        if broker is not None:
            broker.stop()
    out = {"seconds": seconds, "workers": WORKERS, "hz": AGENT_HZ,
           "cpu_share_of_a_core": {k: round(v / seconds, 4) for k, v in used.items()}}
    for key, s in summaries.items():
        sent = s.get("sent", {}).get("cpu", 0)
        out[f"{key}_bytes_per_sample"] = round(s.get("sent_bytes", {}).get("cpu", 0) / sent, 1) if sent else None
        out[f"{key}_python"] = s.get("python", {})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--agent-seconds", type=float, default=30)
    parser.add_argument("--parts", default="bpf,agent")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    parts = set(args.parts.split(","))
    result: dict = {"machine": f"{os.cpu_count()} CPUs"}
    BPF_STATS.write_text("1")
    try:
        if "bpf" in parts:
            result["bpf"] = bpf_part(args.seconds, args.reps)
            print(json.dumps(result["bpf"]["ns_per_sample"]), result["bpf"]["python_extra_ns"],
                  "ns per Python frame:", result["bpf"]["ns_per_python_frame"])
    finally:
        BPF_STATS.write_text("0")
    if "agent" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            result["agent"] = agent_part(args.agent_seconds, Path(tmp))
        print(json.dumps({k: v for k, v in result["agent"].items() if not k.endswith("_python")}))
    out = ROOT / "bench" / "out" / "python_cost.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
