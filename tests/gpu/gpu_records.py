"""The readers and comparisons of the GPU validation (tests/gpu/validate.py): the shim's self-check records
(FLEETPROF_CUPTI_RECORD: kernels, copies and sets, launches with their NVTX range paths) and torch.profiler's Chrome
trace, summed per kernel and per copy kind, and compared. Runs without a GPU (tests/gpu/test_validate.py)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GOAL = 0.05  # per-kernel GPU time within 5% of torch.profiler's
SIGNIFICANT = 0.01  # kernels below this share of the GPU time are listed but not held to the goal
SAMPLED_MISSING = 0.01  # sampled launches allowed without a kernel record (a graph of copies only has none)
SAMPLED_EXTRA = 1.1  # kernel records allowed per record of a sampled launch (the rest: other threads' launches)
RANGED_GOAL = 0.9  # launches inside emit_nvtx's ranges that must carry a range path

# CUPTI's CUpti_ActivityMemcpyKind and CUpti_ActivityMemoryKind as the agent labels them (plan of issue 16)
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed", 6: "device", 7: "managed"}
MEMSET_BIT = 0x100


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
        elif record["type"] in ("kernel", "memory"):  # a sampled copy's or set's record counts as a kernel's
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


def memory_label(memory_kind: int) -> str:
    """A copy's or set's label from FLEETPROF_MEMORY_KIND (native/include/fleetprof_probes.h), with its memory kinds:
    "[memcpy HtoD] pinned>device", "[memset] device"."""
    dst = MEMORY_KINDS.get(memory_kind >> 24 & 0xFF, "unknown")
    if memory_kind & MEMSET_BIT:
        return f"[memset] {dst}"
    src = MEMORY_KINDS.get(memory_kind >> 16 & 0xFF, "unknown")
    return f"[memcpy {COPY_KINDS.get(memory_kind & 0xFF, 'unknown')}] {src}>{dst}"


def read_memory_records(lines: Iterable[str], start_ns: int, end_ns: int) -> KernelTotals:
    """The shim's copies and sets that ran inside [start_ns, end_ns], per label."""
    totals = KernelTotals.empty()
    for line in lines:
        if line.strip():
            record = json.loads(line)
            if record["type"] == "memory" and start_ns <= record["start_ns"] and record["end_ns"] <= end_ns:
                totals.add(memory_label(record["memory_kind"]), record["end_ns"] - record["start_ns"])
    return totals


TORCH_MEMCPY = re.compile(r"Memcpy (\w+) \((\w+) -> (\w+)\)")
TORCH_MEMSET = re.compile(r"Memset \((\w+)\)")


def read_chrome_memory(trace: dict[str, Any]) -> KernelTotals:
    """torch.profiler's copies and sets ("gpu_memcpy", "gpu_memset": "Memcpy HtoD (Pinned -> Device)",
    "Memset (Device)"), labelled as the shim's are."""
    totals = KernelTotals.empty()
    for event in trace.get("traceEvents", []):
        cat = str(event.get("cat", "")).lower()
        if event.get("ph") != "X" or cat not in ("gpu_memcpy", "gpu_memset"):
            continue
        name = str(event.get("name", ""))
        copy, fill = TORCH_MEMCPY.match(name), TORCH_MEMSET.match(name)
        if copy:
            label = f"[memcpy {copy.group(1)}] {copy.group(2).lower()}>{copy.group(3).lower()}"
        elif fill:
            label = f"[memset] {fill.group(1).lower()}"
        else:
            label = name
        totals.add(label, round(float(event["dur"]) * 1000))
    return totals


def range_facts(lines: Iterable[str], start_ns: int | None = None, end_ns: int | None = None) -> dict[str, Any]:
    """The NVTX range paths of a run under emit_nvtx with the shim as NVTX injection: sampled launches with a path
    (goal: at least RANGED_GOAL of them), the most frequent paths, graph launches, the APIs (and threads) of the
    launches without a path, and the shim's NVTX counters. With a window, only the launches inside it count: the
    measured steps, which run inside ranges; the set-up before them (model, warm-up, graph capture) runs in none."""
    sampled = ranged = graphs = outside = 0
    paths: dict[str, int] = {}
    bare: dict[str, int] = {}
    summary: dict[str, Any] = {}
    for line in lines:
        if not line.strip():
            continue
        record = json.loads(line)
        if record["type"] == "launch" and not record["nested"] and record["weight"]:
            ts = record.get("ts_ns")
            if start_ns is not None and ts is not None and not start_ns <= ts <= (end_ns or ts):
                outside += 1
                continue
            sampled += 1
            graphs += record.get("kind") == "graph"
            path = record.get("nvtx_range")
            if path:
                ranged += 1
                paths[path] = paths.get(path, 0) + 1
            else:
                what = f"{record.get('api', '?')} (thread {record.get('tid', '?')})"
                bare[what] = bare.get(what, 0) + 1
        elif record["type"] == "summary":
            summary = {k: v for k, v in record.items() if k.startswith("nvtx_") or k == "launch_ranges"}
    top = sorted(paths.items(), key=lambda kv: -kv[1])[:10]
    unranged = sorted(bare.items(), key=lambda kv: -kv[1])[:10]
    return {"sampled": sampled, "ranged": ranged, "graph_launches": graphs, "top_paths": top, "unranged": unranged,
            "outside_window": outside, "counters": summary, "ok": sampled > 0 and ranged >= RANGED_GOAL * sampled}


def graph_kernel_count(lines: Iterable[str]) -> int:
    """Kernel records a CUDA graph replayed (graph id set) in the shim's records."""
    count = 0
    for line in lines:
        if '"graph_id"' in line:
            record = json.loads(line)
            count += record["type"] == "kernel" and record["graph_id"] != 0
    return count
