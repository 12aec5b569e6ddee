"""Check the CUPTI shim on a machine with a real NVIDIA GPU, against torch.profiler and nvidia-smi (run through
tests/gpu/validate.sh). Needs python3 with torch (CUDA), gcc and the CUDA headers (the nvidia-* wheels, or a CUDA
toolkit); no bcc, no package manager, no install of fleetprof: it runs from the repository.

1. Builds the shim (producers.cupti_shim); without <sys/sdt.h> it builds the same sources with -DFLEETPROF_NO_SDT
   (no probes: the self-check file is all this check needs).
2. Runs tests/gpu/train_loop.py five times, the same steps each time: plain; with the shim injected and idle (no
   agent, no record: its cost when nothing is attached); with the shim recording (FLEETPROF_CUPTI_RECORD: kernel
   records on all the time); under torch.profiler; with the shim recording and kernel records on only around the
   launches its rate limit samples (FLEETPROF_CUPTI_ACTIVITY=sampled, the default when an agent attaches). The shim
   and torch.profiler cannot share one process: CUPTI has one subscriber and one set of activity-buffer callbacks
   per process.
3. Prints per-kernel GPU time both ways with their ratio (goal: within 5%); for the sampled run, whether kernel
   records came for the sampled launches and (nearly) only for them (goal: at most 1% of sampled launches without
   one, at most 1.1 records per record of a sampled launch), which real CUPTI does not document, and its step time
   against the run with records on all the time; and NVML readings (nvidia-ml-py, if importable) against
   nvidia-smi; writes the summary to $OUT/gpu_validation.json when OUT is set.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GOAL = 0.05  # per-kernel GPU time within 5% of torch.profiler's
SIGNIFICANT = 0.01  # kernels below this share of the GPU time are listed but not held to the goal
SAMPLED_MISSING = 0.01  # sampled launches allowed without a kernel record (a graph of copies only has none)
SAMPLED_EXTRA = 1.1  # kernel records allowed per record of a sampled launch (the rest: other threads' launches)
SMI_FIELDS = ("utilization.gpu", "memory.used", "power.draw", "temperature.gpu", "clocks.sm")
CANNOT_RUN = 2


def die(message: str) -> None:
    """One line on stderr, exit status 2: the check could not run (distinct from 1, a failed comparison)."""
    print(f"validate: {message}", file=sys.stderr)
    raise SystemExit(CANNOT_RUN)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Validate the CUPTI shim against torch.profiler and nvidia-smi.")
    parser.add_argument("--steps", type=int, default=200, help="measured training steps per run")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that has torch")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None,
                        help="folder for gpu_validation.json [default $OUT]")
    parser.add_argument("--run-timeout", type=float, default=90.0, help="seconds allowed per training run")
    parser.add_argument("--work", type=Path, default=None, help="folder for records and traces [default: a temp dir]")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.run_timeout <= 0:
        parser.error("--steps and --run-timeout must be positive")
    return args


# ---- building the shim ----

def local_cuda_include_dirs() -> list[str]:
    """Include folders of a local CUDA toolkit (CUDA_HOME, /usr/local/cuda*), CUPTI's extras folder first."""
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    dirs: list[str] = []
    for home in filter(None, homes):
        for sub in ("extras/CUPTI/include", "include", *glob.glob(f"{home}/targets/*/include")):
            path = sub if sub.startswith("/") else f"{home}/{sub}"
            if os.path.isdir(path) and path not in dirs:
                dirs.append(path)
    return dirs


def gcc_command(spec: Any, include_dirs: Iterable[Path | str], output: Path, no_sdt: bool) -> list[str]:
    """The builder's gcc command for `spec` (producers.native_build), optionally without probes."""
    native = ROOT / "native"
    return ["gcc", "-O2", "-g", "-fPIC", "-shared", "-fno-omit-frame-pointer", "-Wall", "-Werror", *spec.cflags,
            *(["-DFLEETPROF_NO_SDT"] if no_sdt else []), f"-I{native / 'include'}",
            *[f"-I{d}" for d in include_dirs], *[str(native / s) for s in spec.sources], "-o", str(output),
            f"-Wl,-soname,{spec.soname}", *spec.ldflags]


def build_shim(work: Path) -> tuple[Path, str]:
    """The shim, and how it was built."""
    sys.path.insert(0, str(ROOT))
    from producers import cupti_shim
    from producers.native_build import NativeBuildError

    how = "wheel headers"
    if not os.environ.get(cupti_shim.CUDA_INCLUDE_ENV):
        try:
            cupti_shim.cuda_include_dirs()
        except NativeBuildError:
            os.environ[cupti_shim.CUDA_INCLUDE_ENV] = os.pathsep.join(local_cuda_include_dirs())
            how = "local CUDA headers"
    try:
        return cupti_shim.build_shim(), how
    except NativeBuildError as exc:
        if "sdt.h" not in str(exc):
            die(str(exc))
    output = work / cupti_shim.CUPTI_SHIM.output
    done = subprocess.run(gcc_command(cupti_shim.CUPTI_SHIM, cupti_shim.cuda_include_dirs(), output, True),
                          capture_output=True, text=True)
    if done.returncode != 0:
        die(f"building the shim failed: {done.stderr.strip()[:400]}")
    return output, how + ", no <sys/sdt.h>: built without probes (FLEETPROF_NO_SDT)"


# ---- reading both sides ----

@dataclass
class KernelTotals:
    """Per kernel name: how many ran and their summed GPU time."""

    count: dict[str, int]
    ns: dict[str, int]

    @classmethod
    def empty(cls) -> KernelTotals:
        return cls({}, {})

    def add(self, name: str, ns: int) -> None:
        self.count[name] = self.count.get(name, 0) + 1
        self.ns[name] = self.ns.get(name, 0) + ns


def read_records(lines: Iterable[str], start_ns: int, end_ns: int) -> tuple[KernelTotals, dict[str, Any]]:
    """The shim's self-check records: kernels that ran inside [start_ns, end_ns], and facts about the run."""
    totals = KernelTotals.empty()
    facts: dict[str, Any] = {"launches": 0, "nested_launches": 0, "kernels_outside_window": 0,
                             "kernels_with_launch": 0, "kernels_in_window": 0}
    launched: set[int] = set()
    kernels: list[dict[str, Any]] = []
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        kind = record["type"]
        if kind == "launch":
            launched.add(record["correlation_id"])
            facts["nested_launches" if record["nested"] else "launches"] += 1
        elif kind == "kernel":
            kernels.append(record)
        elif kind == "on":
            facts["clock"] = record["clock"]
            facts["clock_measured_offset_ns"] = record["clock_measured_offset_ns"]
            facts["activity"] = record.get("activity", "always")
        elif kind in ("summary", "start"):
            facts[kind] = {k: v for k, v in record.items() if k != "type"}
    for k in kernels:
        if start_ns <= k["start_ns"] and k["end_ns"] <= end_ns:
            totals.add(k["name"], k["end_ns"] - k["start_ns"])
            facts["kernels_in_window"] += 1
            facts["kernels_with_launch"] += k["correlation_id"] in launched
        else:
            facts["kernels_outside_window"] += 1
    return totals, facts


def sampled_facts(lines: Iterable[str]) -> dict[str, Any]:
    """The records of a run with FLEETPROF_CUPTI_ACTIVITY=sampled: did the sampled launches, and only they, get kernel
    records? Launches by correlation id (nested ones too: the kernel may carry either id); `ok` within the goals."""
    weight: dict[int, int] = {}
    outer_sampled: set[int] = set()
    launches = 0
    kernels: dict[str, int] = {"sampled": 0, "skipped": 0, "unknown": 0}
    timed: set[int] = set()
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record["type"] == "launch":
            weight[record["correlation_id"]] = record["weight"]
            if not record["nested"]:
                launches += 1
                if record["weight"]:
                    outer_sampled.add(record["correlation_id"])
        elif record["type"] == "kernel":
            w = weight.get(record["correlation_id"])
            kernels["unknown" if w is None else "sampled" if w else "skipped"] += 1
            timed.add(record["correlation_id"])
    missing = len(outer_sampled - timed)
    extra = (sum(kernels.values()) / kernels["sampled"]) if kernels["sampled"] else None
    return {"launches": launches, "sampled": len(outer_sampled), "sampled_without_kernel": missing,
            "kernels": kernels, "records_per_sampled_record": extra,
            "records_per_launch": sum(kernels.values()) / launches if launches else None,
            "ok": bool(outer_sampled) and missing <= SAMPLED_MISSING * len(outer_sampled)
            and extra is not None and extra <= SAMPLED_EXTRA}


def read_chrome_trace(trace: dict[str, Any]) -> KernelTotals:
    """torch.profiler's GPU kernels (category "kernel"; durations in µs with ns precision)."""
    totals = KernelTotals.empty()
    for event in trace.get("traceEvents", []):
        if event.get("ph") == "X" and str(event.get("cat", "")).lower() == "kernel":
            totals.add(event["name"], round(float(event["dur"]) * 1000))
    return totals


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Mangled name -> demangled (as torch.profiler shows them), through c++filt when there is one."""
    names = sorted(set(names))
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True).stdout
    plain = out.splitlines()
    return dict(zip(names, plain, strict=True)) if len(plain) == len(names) else {n: n for n in names}


def rename(totals: KernelTotals, names: dict[str, str]) -> KernelTotals:
    out = KernelTotals.empty()
    for name, count in totals.count.items():
        key = names.get(name, name)
        out.count[key] = out.count.get(key, 0) + count
        out.ns[key] = out.ns.get(key, 0) + totals.ns[name]
    return out


def compare(shim: KernelTotals, torch: KernelTotals) -> dict[str, Any]:
    """Per kernel both ways, largest first, with shim/torch ratios; `ok` when every significant kernel and the total
    are within GOAL."""
    total_torch = sum(torch.ns.values())
    total_shim = sum(shim.ns.values())
    rows = []
    for name in sorted(set(shim.ns) | set(torch.ns), key=lambda n: -max(shim.ns.get(n, 0), torch.ns.get(n, 0))):
        s, t = shim.ns.get(name, 0), torch.ns.get(name, 0)
        share = t / total_torch if total_torch else 0.0
        ratio = s / t if t else None
        rows.append({"name": name, "shim_count": shim.count.get(name, 0), "torch_count": torch.count.get(name, 0),
                     "shim_ns": s, "torch_ns": t, "ratio": ratio, "share": share,
                     "within_goal": ratio is not None and abs(ratio - 1) <= GOAL})
    total_ratio = total_shim / total_torch if total_torch else None
    significant = [r for r in rows if r["share"] >= SIGNIFICANT]
    within = sum(r["within_goal"] for r in significant)
    ok = total_ratio is not None and abs(total_ratio - 1) <= GOAL and within == len(significant)
    return {"rows": rows, "shim_total_ns": total_shim, "torch_total_ns": total_torch, "total_ratio": total_ratio,
            "significant_within_goal": within, "significant": len(significant), "ok": ok}


def format_table(result: dict[str, Any], limit: int = 25) -> str:
    lines = [f"{'kernel':<70} {'n shim':>7} {'n torch':>7} {'ms shim':>9} {'ms torch':>9} {'ratio':>7}"]
    for r in result["rows"][:limit]:
        ratio = f"{r['ratio']:.4f}" if r["ratio"] is not None else "-"
        lines.append(f"{r['name'][:70]:<70} {r['shim_count']:>7} {r['torch_count']:>7} {r['shim_ns'] / 1e6:>9.3f} "
                     f"{r['torch_ns'] / 1e6:>9.3f} {ratio:>7}")
    if len(result["rows"]) > limit:
        lines.append(f"... {len(result['rows']) - limit} more kernels")
    total = result["total_ratio"]
    lines.append(f"{'TOTAL':<70} {'':>7} {'':>7} {result['shim_total_ns'] / 1e6:>9.3f} "
                 f"{result['torch_total_ns'] / 1e6:>9.3f} {total if total is None else round(total, 4)!s:>7}")
    return "\n".join(lines)


# ---- NVML against nvidia-smi ----

def parse_smi(text: str) -> list[dict[str, float | None]]:
    """`nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits` lines, one dict per GPU."""
    out = []
    for line in text.strip().splitlines():
        values = [v.strip() for v in line.split(",")]
        out.append({f: (float(v) if v.replace(".", "", 1).isdigit() else None)
                    for f, v in zip(SMI_FIELDS, values, strict=False)})
    return out


def nvml_reading(pynvml: Any, handle: Any) -> dict[str, float]:
    return {"utilization.gpu": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory.used": pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "power.draw": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature.gpu": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "clocks.sm": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))}


class NvmlSampler:
    """Pairs of (NVML, nvidia-smi) readings of GPU 0, taken back to back while a run goes on."""

    def __init__(self) -> None:
        self.pairs: list[dict[str, Any]] = []
        self.note = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml
        except ImportError:
            self.note = "nvidia-ml-py (pynvml) is not importable: NVML readings skipped"
            return
        if shutil.which("nvidia-smi") is None:
            self.note = "no nvidia-smi: NVML readings skipped"
            return
        try:
            pynvml.nvmlInit()
            self._pynvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError as exc:
            self.note = f"NVML unavailable ({exc}): NVML readings skipped"
            return
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                nvml = nvml_reading(self._pynvml, self._handle)
                smi = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(SMI_FIELDS)}",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
            except (self._pynvml.NVMLError, OSError, subprocess.TimeoutExpired) as exc:
                self.note = f"a reading failed ({exc}); kept {len(self.pairs)} pairs"
                return
            parsed = parse_smi(smi.stdout)
            if parsed:
                self.pairs.append({"nvml": nvml, "smi": parsed[0]})

    def __enter__(self) -> NvmlSampler:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def table(self) -> str:
        if not self.pairs:
            return self.note or "no NVML readings were taken"
        lines = [f"{'field':<18} {'NVML (mean)':>12} {'nvidia-smi (mean)':>18} {'max |diff|':>11}"]
        for f in SMI_FIELDS:
            both = [(p["nvml"][f], p["smi"][f]) for p in self.pairs if p["smi"].get(f) is not None]
            if both:
                mean_n = sum(n for n, _ in both) / len(both)
                mean_s = sum(s for _, s in both) / len(both)
                lines.append(f"{f:<18} {mean_n:>12.1f} {mean_s:>18.1f} {max(abs(n - s) for n, s in both):>11.1f}")
        return "\n".join(lines + [f"({len(self.pairs)} back-to-back pairs)"])


# ---- the runs ----

CUPTI_PROBE = """
import glob, os, site
import torch
torch.cuda.init()
words = open("/proc/self/maps").read().split()
found = [w for w in words if "/libcupti.so" in w]
for folder in [*site.getsitepackages(), site.getusersitepackages()]:
    found += sorted(glob.glob(os.path.join(folder, "nvidia", "**", "libcupti.so*"), recursive=True))
found += sorted(glob.glob("/usr/local/cuda*/extras/CUPTI/lib64/libcupti.so*"))
found += sorted(glob.glob("/usr/local/cuda*/lib64/libcupti.so*"))
print(found[0] if found else "")
"""


def loaded_cupti(python: str) -> str:
    """The libcupti torch has loaded (or ships with, or the toolkit's), so the shim opens that one: never a second
    copy in the process."""
    done = subprocess.run([python, "-c", CUPTI_PROBE], capture_output=True, text=True, timeout=120)
    return done.stdout.strip() if done.returncode == 0 else ""


def train(python: str, markers: Path, env: dict[str, str], timeout: float, extra: list[str]) -> dict[str, Any]:
    cmd = [python, str(HERE / "train_loop.py"), "--markers", str(markers), *extra]
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        die(f"{' '.join(cmd[1:])} ran past {timeout:.0f} s (--run-timeout)")
    if done.returncode != 0:
        die(f"{' '.join(cmd[1:])} failed: {done.stderr.strip()[-600:]}")
    return {**json.loads(markers.read_text()), "wall_s": round(time.monotonic() - started, 2),
            "stderr": done.stderr.strip()[-600:]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import tempfile

    work = args.work or Path(tempfile.mkdtemp(prefix="fleetprof-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    shim, how = build_shim(work)
    print(f"shim: {shim} ({how})")
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_INJECTION64_PATH", "FLEETPROF_CUPTI_RECORD")}
    cupti = loaded_cupti(args.python)
    if cupti:
        base["FLEETPROF_CUPTI_LIBRARY"] = cupti
    print(f"libcupti: {cupti or 'not found through torch; the shim searches the loader path'}")
    steps = ["--steps", str(args.steps)]
    runs: dict[str, Any] = {}
    runs["plain"] = train(args.python, work / "plain.json", base, args.run_timeout, steps)
    runs["shim_idle"] = train(args.python, work / "idle.json", {**base, "CUDA_INJECTION64_PATH": str(shim)},
                              args.run_timeout, steps)
    record = work / "records.jsonl"
    record.unlink(missing_ok=True)
    with NvmlSampler() as nvml:  # during a run whose step time is not compared: nvidia-smi costs CPU
        runs["shim_record"] = train(args.python, work / "record.json",
                                    {**base, "CUDA_INJECTION64_PATH": str(shim), "FLEETPROF_CUPTI_RECORD": str(record)},
                                    args.run_timeout, steps)
    if not record.exists():
        die(f"the shim wrote no records; its stderr: {runs['shim_record']['stderr']}")
    trace = work / "trace.json"
    runs["torch_profiler"] = train(args.python, work / "profiled.json", base, args.run_timeout,
                                   [*steps, "--profile", str(trace)])
    sampled_record = work / "records_sampled.jsonl"
    sampled_record.unlink(missing_ok=True)
    # at 100 launches/s per thread, well under the loop's launch rate: most launches are skipped, and must stay untimed
    sampled_env = {**base, "CUDA_INJECTION64_PATH": str(shim), "FLEETPROF_CUPTI_RECORD": str(sampled_record),
                   "FLEETPROF_CUPTI_ACTIVITY": "sampled", "FLEETPROF_LAUNCH_RATE": "100"}
    runs["shim_sampled"] = train(args.python, work / "sampled.json", sampled_env, args.run_timeout, steps)
    sampled = sampled_facts(sampled_record.read_text().splitlines() if sampled_record.exists() else [])

    window = runs["shim_record"]
    shim_totals, facts = read_records(record.read_text().splitlines(), window["start_ns"], window["end_ns"])
    shim_totals = rename(shim_totals, demangle(shim_totals.ns))
    torch_totals = read_chrome_trace(json.loads(trace.read_text()))
    result = compare(shim_totals, torch_totals)
    print(f"\nGPU: {window['device']}  torch {window['torch']}  CUDA {window['cuda']}  steps {args.steps}")
    print(f"clock: {facts.get('clock')} (measured offset {facts.get('clock_measured_offset_ns')} ns); "
          f"{facts['kernels_in_window']} kernels in the window, {facts['kernels_outside_window']} outside; "
          f"{facts['kernels_with_launch']} with a recorded launch; {facts['launches']} launches "
          f"(+{facts['nested_launches']} nested)")
    print(f"summary: {facts.get('summary')}")
    print("\nper-kernel GPU time, shim vs torch.profiler (separate runs of the same steps):")
    print(format_table(result))
    overhead = runs["shim_idle"]["seconds_per_step"] / runs["plain"]["seconds_per_step"]
    print(f"\nstep time with the shim idle / without it: {overhead:.4f}")
    sampled["step_time_vs_always"] = runs["shim_sampled"]["seconds_per_step"] / window["seconds_per_step"]
    print(f"\nkernel records only around sampled launches: {sampled['sampled']} of {sampled['launches']} launches "
          f"sampled, {sampled['sampled_without_kernel']} of them without a kernel record; kernel records "
          f"{sampled['kernels']}, {sampled['records_per_sampled_record']} per record of a sampled launch; step time "
          f"against records on all the time (both recording to a file): {sampled['step_time_vs_always']:.4f}")
    print("\nNVML vs nvidia-smi during the recording run:")
    print(nvml.table())
    ok = result["ok"] and sampled["ok"]
    verdict = "PASS" if ok else "FAIL"
    print(f"\n{verdict}: total ratio {result['total_ratio']}, {result['significant_within_goal']}/"
          f"{result['significant']} kernels with >= {SIGNIFICANT:.0%} of GPU time within {GOAL:.0%}; sampled "
          f"launches' kernel records {'as expected' if sampled['ok'] else 'NOT as expected'}")
    summary = {"verdict": verdict, "shim_build": how, "libcupti": cupti, "facts": facts, "comparison": result,
               "sampled": sampled, "runs": runs, "idle_overhead_ratio": overhead,
               "nvml": {"note": nvml.note, "pairs": nvml.pairs}}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_validation.json").write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.out / 'gpu_validation.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
