"""GPU samples from the correlator's matches: each launch stack symbolized (processors/launch_stacks.py: the symbolize
stage's row resolver and FrameMemo ids), the demangled kernel as the leaf frame, GPU
time = kernel duration x launch weight, summed per (window, node, pid, identity, device, stream, stack, kernel, NVTX
range, memory kinds). Pure. The identity is the launching process's (its GpuLaunch's identity_id).

Copies and sets are rows like kernels: their label ('[memcpy HtoD]', '[memset]') is the kernel_name and the leaf
frame (kind GPU_KERNEL: GpuFrameKind has no other GPU kind, and the label's brackets tell them apart), bytes x weight
summed beside the time, their memory kinds part of the row's key. Every match is also one timeline record of its
window, with the sample's stack id (launching stack and leaf)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from processors.correlate import KERNEL, LAUNCH, SIDES
from processors.launch_stacks import LaunchStacks
from processors.symbolize import SymbolizeStats, TableLookup, clamp_long
from schemas.wire import GPU_BINARY, GPU_KERNEL_KIND, LONG_MIN

NewDefinitions = Callable[[list[int], Callable[[int], Iterable[int]]], tuple[list[int], set[int]]]


def build_gpu_samples(matches: list[tuple], unmatched: list[tuple], window_ns: int, stacks: LaunchStacks,
                      tables: TableLookup, stats: SymbolizeStats | None = None,
                      new_definitions: NewDefinitions | None = None) -> list[dict]:
    """GpuSamples records, one per (node, window) touched by the matches and unmatched counts of one call. Each
    carries the definitions of the stacks its samples name and of their frames; with `new_definitions` (see
    SentDefinitions.new_ids) only those it returns: the ones not sent yet, built and sized alone."""
    stats = stats if stats is not None else SymbolizeStats()
    resolved = stacks.resolve(matches, tables, stats)
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    defs: dict[int, tuple] = {}
    simulated: set[tuple[str, int]] = set()  # (node, window) with a kernel from a simulated GPU library
    timelines: dict[tuple[str, int], list[dict]] = defaultdict(list)
    timeline: list[dict] = []
    last_node, last_window = None, None  # whose timeline `timeline` is: consecutive matches mostly share it
    for m, (sid, ids, frames) in zip(matches, resolved, strict=True):
        node, pid, weight, kstart, duration, device, stream, name, nbytes, nvtx = m[0], m[1], m[5], m[6], m[7], m[8], \
            m[9], m[10], m[16], m[14]
        window = kstart - kstart % window_ns
        if window < LONG_MIN:  # times near -2^63 floor below it
            window = LONG_MIN
        if window != last_window or node != last_node:
            last_node, last_window = node, window
            timeline = timelines[(node, window)]
        if m[13]:
            simulated.add((node, window))
        ident = m[21] if len(m) > 21 else 0
        cell = sums[(node, window, pid, ident, device, stream, sid, name, nvtx, m[17])]
        cell[0] += duration * weight
        cell[1] += weight
        cell[2] += nbytes * weight
        if sid not in defs:
            defs[sid] = (ids, frames)
        timeline.append({"pid": pid, "device": device, "stream": stream, "start_ns": kstart,
                         "end_ns": kstart + duration, "activity": m[15], "name": name, "stack_id": sid,
                         "weight": weight, "bytes": nbytes, "nvtx_range": nvtx, "graph_id": m[18],
                         "graph_node_id": m[19], "correlation_id": m[20], "identity_id": ident})
    lost: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for node, pid, t, side, reason, duration, weight in unmatched:
        cell = lost[(node, clamp_long(t - t % window_ns), pid, side, reason)]  # times near -2^63 floor below it
        cell[0] += 1
        cell[1] += duration
        cell[2] += weight
    records: dict[tuple[str, int], dict] = {}

    def record(node: str, window: int) -> dict:
        rec = records.get((node, window))
        if rec is None:
            rec = records[(node, window)] = {"node": node, "window_start_ns": window, "window_ns": window_ns,
                                              "frames": [], "stacks": [], "samples": [], "unmatched": [],
                                              "timeline": timelines.get((node, window), []),
                                              "simulated": (node, window) in simulated}
        return rec

    for (node, window, pid, ident, device, stream, sid, name, nvtx, kinds), (ns, launches, nbytes) in sums.items():
        record(node, window)["samples"].append({
            "pid": pid, "comm": "", "container_id": "", "identity_id": ident, "device": device, "stream": stream,
            "stack_id": sid,
            "kernel_name": name, "duration_ns": clamp_long(ns), "launches": clamp_long(launches),
            "nvtx_range": nvtx, "bytes": clamp_long(nbytes), "memory_kinds": kinds})
    for (node, window, pid, side, reason), (events, ns, launches) in lost.items():
        record(node, window)["unmatched"].append({"pid": pid, "side": SIDES[side], "reason": reason,
                                                  "events": events, "duration_ns": clamp_long(ns),
                                                  "launches": clamp_long(launches)})
    for rec in records.values():
        rec["timeline"].sort(key=_start)
        sids = list(dict.fromkeys(s["stack_id"] for s in rec["samples"]))
        if new_definitions is None:
            fdefs = {f[0]: f for sid in sids for f in defs[sid][1]}
        else:
            sids, fids = new_definitions(sids, lambda sid: defs[sid][0])
            fdefs = {f[0]: f for sid in sids for f in defs[sid][1] if f[0] in fids}
        rec["stacks"] = [{"stack_id": sid, "frame_ids": list(defs[sid][0])} for sid in sids]
        rec["frames"] = [{"frame_id": f[0], "function": f[1], "binary": f[2], "kind": f[3], "build_id": f[4]}
                         for f in fdefs.values()]
    return list(records.values())


def _start(t: dict) -> int:
    return t["start_ns"]


def _frame_bytes(f: dict) -> int:
    return len(f["function"]) * 4 + len(f["binary"]) + len(f.get("build_id", "")) + 24


def _stack_bytes(s: dict) -> int:
    return 10 * len(s["frame_ids"]) + 12


def _sample_bytes(s: dict) -> int:
    return 4 * (len(s["kernel_name"]) + len(s["comm"]) + len(s["container_id"]) + len(s.get("nvtx_range", "")) +
                len(s.get("memory_kinds", ""))) + 90


def _timeline_bytes(t: dict) -> int:
    return 4 * (len(t["name"]) + len(t["nvtx_range"])) + 130


def estimated_bytes(rec: dict) -> int:
    """An upper bound of the encoded GpuSamples record's size, without encoding it."""
    timeline = rec.get("timeline", ())
    return (64 + 4 * len(rec["node"]) + sum(map(_frame_bytes, rec["frames"])) + sum(map(_stack_bytes, rec["stacks"]))
            + sum(map(_sample_bytes, rec["samples"])) + 48 * len(rec["unmatched"])
            + 4 * sum([len(t["name"]) + len(t["nvtx_range"]) for t in timeline]) + 130 * len(timeline))


def split_gpu_samples(rec: dict, max_bytes: int) -> list[dict]:
    """Split a GpuSamples record by its samples and timeline records so that each part's estimated_bytes stays under
    max_bytes (but for a part of one item that alone is over); each part carries exactly the stacks and frames its
    samples and timeline records reference (of those `rec` carries), and the first one the unmatched counts. Every
    sample and timeline record goes to exactly one part, in order, so the totals are those of the whole."""
    timeline = rec.get("timeline", [])
    if len(rec["samples"]) + len(timeline) <= 1 or estimated_bytes(rec) <= max_bytes:
        return [rec]
    stacks = {s["stack_id"]: s for s in rec["stacks"]}
    frames = {f["frame_id"]: f for f in rec["frames"]}
    base = 64 + 4 * len(rec["node"])
    parts: list[tuple[list, list, dict, dict]] = []  # (samples, timeline, stacks used, frames used)
    size = max_bytes + 1  # no part yet

    def defs_bytes(sid: int, part: tuple) -> int:
        st = stacks.get(sid)
        if st is None or sid in part[2]:  # defined in this part already, or sent before (not carried)
            return 0
        new = [f for f in dict.fromkeys(st["frame_ids"]) if f not in part[3] and f in frames]
        return _stack_bytes(st) + sum(_frame_bytes(frames[f]) for f in new)

    for which, items, cost_of in ((0, rec["samples"], _sample_bytes), (1, timeline, _timeline_bytes)):
        for item in items:
            sid = item["stack_id"]
            cost = cost_of(item) + (defs_bytes(sid, parts[-1]) if parts else 0)
            if not parts or (size + cost > max_bytes and (parts[-1][0] or parts[-1][1])):
                parts.append(([], [], {}, {}))
                size = base + (48 * len(rec["unmatched"]) if len(parts) == 1 else 0)
                cost = cost_of(item) + defs_bytes(sid, parts[-1])
            part = parts[-1]
            part[which].append(item)
            if sid not in part[2] and sid in stacks:
                part[2][sid] = None
                part[3].update((f, None) for f in stacks[sid]["frame_ids"] if f in frames)
            size += cost
    return [{**rec, "samples": samples, "timeline": tl, "stacks": [stacks[s] for s in used],
             "frames": [frames[f] for f in fids], "unmatched": rec["unmatched"] if i == 0 else []}
            for i, (samples, tl, used, fids) in enumerate(parts)]


__all__ = ["GPU_BINARY", "GPU_KERNEL_KIND", "KERNEL", "LAUNCH", "LaunchStacks", "build_gpu_samples",
           "split_gpu_samples"]
