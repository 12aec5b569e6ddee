"""Check the CUPTI shim on a machine with a real NVIDIA GPU, against torch.profiler and nvidia-smi (run through
tests/gpu/validate.sh). Needs python3 with torch (CUDA), gcc and the CUDA headers (the nvidia-* wheels, or a CUDA
toolkit); no bcc, no package manager, no install of fleetprof: it runs from the repository.

1. Builds the shim (producers.cupti_shim); without <sys/sdt.h> it builds the same sources with -DFLEETPROF_NO_SDT
   (no probes: the self-check file is all this check needs).
2. Runs tests/gpu/train_loop.py six times, the same steps each time (each step: a training step, a captured CUDA
   graph replayed, host<->device copies from and to pageable and pinned memory, a memset): plain; with the shim
   injected and idle (no agent, no record: its cost when nothing is attached); with the shim recording
   (FLEETPROF_CUPTI_RECORD: kernel, copy and set records on all the time); under torch.profiler; with the shim
   recording and records on only around the launches its rate limits sample (FLEETPROF_CUPTI_ACTIVITY=sampled, the
   default when an agent attaches); and (fewer steps) under torch.autograd.profiler.emit_nvtx with the shim also the
   NVTX injection library (NVTX_INJECTION64_PATH), every launch sampled. The shim and torch.profiler cannot share
   one process: CUPTI has one subscriber and one set of activity-buffer callbacks per process.
3. Prints per-kernel GPU time both ways with their ratio (goal: within 5%), the same per copy kind and memory kinds
   ("[memcpy HtoD] pinned>device", "[memset] device"), the graph kernels the shim saw; for the NVTX run, the share of
   sampled launches that carry a range path (goal: at least 90%) and the most frequent paths; for the sampled run,
   whether kernel
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
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from the repository: tests.gpu.gpu_records, producers

from tests.gpu.gpu_records import (  # noqa: E402  (re-exported: tests/gpu/test_validate.py reads them here)
    GOAL,
    SIGNIFICANT,
    KernelTotals,
    compare,
    demangle,
    format_table,
    graph_kernel_count,
    range_facts,
    read_chrome_memory,
    read_chrome_trace,
    read_memory_records,
    read_records,
    rename,
    sampled_facts,
)

__all__ = ["KernelTotals", "compare", "demangle", "format_table", "graph_kernel_count", "range_facts",
           "read_chrome_memory", "read_chrome_trace", "read_memory_records", "read_records", "rename", "sampled_facts"]

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
    """GPU 0 read with nvidia-ml-py's plain calls (where the agent's collector cannot be imported)."""
    return {"utilization.gpu": float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "memory.used": pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "power.draw": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temperature.gpu": float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            "clocks.sm": float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))}


def collector_reading(record: dict | None) -> dict[str, float] | None:
    """GPU 0 as the agent's collector (producers.nvml_collector) put it in a GpuMetrics record, in nvidia-smi's
    units; None for a poll it did not make or a field it could not read."""
    dev = next((d for d in (record or {}).get("devices", []) if d["index"] == 0 and not d["parent_uuid"]), None)
    fields = ("gpu_util_pct", "mem_used_bytes", "power_mw", "temperature_c", "sm_clock_mhz")
    if dev is None or any(dev[f] is None for f in fields):
        return None
    return {"utilization.gpu": float(dev["gpu_util_pct"]), "memory.used": dev["mem_used_bytes"] / 2**20,
            "power.draw": dev["power_mw"] / 1000.0, "temperature.gpu": float(dev["temperature_c"]),
            "clocks.sm": float(dev["sm_clock_mhz"])}


class NvmlSampler:
    """Pairs of (NVML, nvidia-smi) readings of GPU 0, taken back to back while a run goes on. NVML is read by the
    agent's own collector when it imports here (what fleetprof stores), else by nvidia-ml-py's plain calls."""

    def __init__(self) -> None:
        self.pairs: list[dict[str, Any]] = []
        self.note = ""
        self.source = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._collector: Any = None
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
        try:
            from producers.nvml_collector import NvmlCollector
            collector = NvmlCollector("validate")
            if collector.open():
                self._collector, self.source = collector, "the agent's collector (producers.nvml_collector)"
        except ImportError as exc:
            self.source = f"nvidia-ml-py directly (the agent's collector does not import here: {exc})"
        if not self.source:
            self.source = "nvidia-ml-py directly (the agent's collector did not open)"
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _reading(self) -> dict[str, float] | None:
        if self._collector is None:
            return nvml_reading(self._pynvml, self._handle)
        return collector_reading(self._collector.poll(time.time_ns()))

    def _run(self) -> None:
        while not self._stop.wait(1.0 if self._collector is not None else 0.5):  # its period: at least 1 s
            try:
                nvml = self._reading()
                if nvml is None:
                    continue
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
        if self._collector is not None:
            self._collector.close()

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
        return "\n".join(lines + [f"({len(self.pairs)} back-to-back pairs; NVML read by {self.source})"])


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
    nvtx_record = work / "records_nvtx.jsonl"
    nvtx_record.unlink(missing_ok=True)
    nvtx_env = {**base, "CUDA_INJECTION64_PATH": str(shim), "NVTX_INJECTION64_PATH": str(shim),
                "FLEETPROF_CUPTI_RECORD": str(nvtx_record), "FLEETPROF_LAUNCH_RATE": "0"}
    runs["shim_nvtx"] = train(args.python, work / "nvtx.json", nvtx_env, args.run_timeout,
                              ["--steps", str(min(args.steps, 50)), "--nvtx"])
    nvtx_run = runs["shim_nvtx"]
    ranges = range_facts(nvtx_record.read_text().splitlines() if nvtx_record.exists() else [],
                         nvtx_run["start_ns"], nvtx_run["end_ns"])

    window = runs["shim_record"]
    shim_totals, facts = read_records(record.read_text().splitlines(), window["start_ns"], window["end_ns"])
    shim_totals = rename(shim_totals, demangle(shim_totals.ns))
    chrome = json.loads(trace.read_text())
    torch_totals = read_chrome_trace(chrome)
    result = compare(shim_totals, torch_totals)
    lines = record.read_text().splitlines()
    copies = compare(read_memory_records(lines, window["start_ns"], window["end_ns"]), read_chrome_memory(chrome))
    graph_kernels = graph_kernel_count(lines)
    print(f"\nGPU: {window['device']}  torch {window['torch']}  CUDA {window['cuda']}  steps {args.steps}")
    print(f"clock: {facts.get('clock')} (measured offset {facts.get('clock_measured_offset_ns')} ns); "
          f"{facts['kernels_in_window']} kernels in the window, {facts['kernels_outside_window']} outside; "
          f"{facts['kernels_with_launch']} with a recorded launch; {facts['launches']} launches "
          f"(+{facts['nested_launches']} nested)")
    print(f"summary: {facts.get('summary')}")
    print("\nper-kernel GPU time, shim vs torch.profiler (separate runs of the same steps):")
    print(format_table(result))
    print("\nper copy kind GPU time, shim vs torch.profiler:")
    print(format_table(copies).replace("kernel ", "copy   ", 1))
    print(f"graph kernels (graph id set) in the shim's records: {graph_kernels}")
    print(f"\nNVTX (emit_nvtx, shim as injection): {ranges['ranged']} of {ranges['sampled']} sampled launches of the "
          f"measured steps with a range path ({ranges['outside_window']} before them, not counted); counters "
          f"{ranges['counters']}")
    for path, count in ranges["top_paths"][:5]:
        print(f"  {count:>7}  {path[:110]}")
    for what, count in ranges["unranged"][:5]:
        print(f"  {count:>7}  no range: {what}")
    overhead = runs["shim_idle"]["seconds_per_step"] / runs["plain"]["seconds_per_step"]
    print(f"\nstep time with the shim idle / without it: {overhead:.4f}")
    sampled["step_time_vs_always"] = runs["shim_sampled"]["seconds_per_step"] / window["seconds_per_step"]
    print(f"\nkernel records only around sampled launches: {sampled['sampled']} of {sampled['launches']} launches "
          f"sampled, {sampled['sampled_without_kernel']} of them without a kernel record; kernel records "
          f"{sampled['kernels']}, {sampled['records_per_sampled_record']} per record of a sampled launch; step time "
          f"against records on all the time (both recording to a file): {sampled['step_time_vs_always']:.4f}")
    print("\nNVML vs nvidia-smi during the recording run:")
    print(nvml.table())
    ok = result["ok"] and sampled["ok"] and copies["ok"] and ranges["ok"] and graph_kernels > 0
    verdict = "PASS" if ok else "FAIL"
    print(f"\n{verdict}: total ratio {result['total_ratio']}, {result['significant_within_goal']}/"
          f"{result['significant']} kernels with >= {SIGNIFICANT:.0%} of GPU time within {GOAL:.0%}; copies "
          f"{copies['significant_within_goal']}/{copies['significant']} kinds within {GOAL:.0%} (total ratio "
          f"{copies['total_ratio']}); {graph_kernels} graph kernels; NVTX paths "
          f"{'as expected' if ranges['ok'] else 'NOT as expected'}; sampled launches' records "
          f"{'as expected' if sampled['ok'] else 'NOT as expected'}")
    summary = {"verdict": verdict, "shim_build": how, "libcupti": cupti, "facts": facts, "comparison": result,
               "copies": copies, "graph_kernels": graph_kernels, "nvtx": ranges,
               "sampled": sampled, "runs": runs, "idle_overhead_ratio": overhead,
               "nvml": {"note": nvml.note, "source": nvml.source, "pairs": nvml.pairs}}
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_validation.json").write_text(json.dumps(summary, indent=2))
        print(f"wrote {args.out / 'gpu_validation.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
