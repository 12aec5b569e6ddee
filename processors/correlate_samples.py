"""GPU samples from the correlator's matches: each launch stack symbolized with the symbolize stage's machinery
(symbolize_batch over the process's mappings, the same FrameMemo ids), the demangled kernel as the leaf frame, GPU
time = kernel duration x launch weight, summed per (window, node, pid, device, stream, stack, kernel). Pure."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from processors.correlate import KERNEL, LAUNCH, SIDES
from processors.demangle import demangle
from processors.stack_ids import stack_id
from processors.symbolize import FrameMemo, SymbolizeStats, TableLookup, clamp_long, symbolize_batch
from schemas.packed_stacks import PackedStacks

GPU_BINARY = "[gpu]"
GPU_KERNEL_KIND = "GPU_KERNEL"

Frame = tuple[int, str, str, str, str]  # (frame_id, function, binary, kind, build id), as FrameMemo.by_id holds them


class LaunchStacks:
    """Symbolized launch stacks by (mappings id, stack number, kernel name), bounded. A stack symbolized while one of
    its tables was missing is not kept, so it is symbolized again once the table arrives."""

    def __init__(self, memo: FrameMemo | None = None, max_entries: int = 200_000) -> None:
        self.memo = memo if memo is not None else FrameMemo()
        self.max_entries = max_entries
        self.cpu: dict[tuple, tuple[tuple[int, ...], tuple[Frame, ...]]] = {}
        self.gpu: dict[tuple, tuple[int, tuple[int, ...], tuple[Frame, ...]]] = {}

    def resolve(self, matches: list[tuple], tables: TableLookup, stats: SymbolizeStats) -> list[tuple]:
        """(stack id, frame ids root first, frame definitions) of each match's GPU stack."""
        if len(self.gpu) > self.max_entries or len(self.cpu) > self.max_entries:
            self.gpu.clear()
            self.cpu.clear()
        misses: dict[tuple, tuple[list, tuple, tuple]] = {}
        for m in matches:
            key = (m[2], m[11])
            if key not in self.cpu and key not in misses and (m[2], m[11], m[10]) not in self.gpu:
                misses[key] = (m[3], m[4], m[12])
        uncached = self._symbolize(misses, tables, stats) if misses else {}
        out = []
        for m in matches:
            gkey = (m[2], m[11], m[10])
            hit = self.gpu.get(gkey)
            if hit is None:
                cpu = self.cpu.get(gkey[:2])
                hit = self._with_kernel(cpu if cpu is not None else uncached[gkey[:2]], m[10])
                if cpu is not None:
                    self.gpu[gkey] = hit
            out.append(hit)
        return out

    def _with_kernel(self, cpu: tuple[tuple[int, ...], tuple[Frame, ...]],
                     name: str) -> tuple[int, tuple[int, ...], tuple[Frame, ...]]:
        kid = self.memo.frame(("gpu", name), demangle(name), GPU_BINARY, GPU_KERNEL_KIND)
        ids = cpu[0] + (kid,)
        return stack_id(ids), ids, cpu[1] + (self.memo.by_id[kid],)

    def _symbolize(self, misses: dict[tuple, tuple[list, tuple, tuple]], tables: TableLookup,
                   stats: SymbolizeStats) -> dict[tuple, tuple]:
        """Every missed stack at once: one pseudo-process per stack, so each comes back under its own pid. Returns
        the ones not cached (a table was missing)."""
        keys = list(misses)
        procs = []
        for i, key in enumerate(keys):
            user = np.asarray(misses[key][1], dtype=np.int64)
            stacks = PackedStacks(np.zeros(1, np.int64), np.ones(1, np.int64), user, np.array([len(user)], np.int64),
                                  np.zeros(0, np.int64), np.zeros(1, np.int64))
            codes = [{"qualname": q, "file": f, "first_line": n} for q, f, n in misses[key][2]]
            procs.append({"pid": i, "comm": "", "container_id": "", "mappings": misses[key][0], "code_objects": codes,
                          "stacks": stacks})
        call = SymbolizeStats()
        rec = symbolize_batch({"node": "", "window_start_ns": 0, "window_ns": 0, "kernel_build_id": "",
                               "processes": procs}, tables, self.memo, call)
        stats.frames += call.frames
        stats.unknown_frames += call.unknown_frames
        stats.missing_build_ids |= call.missing_build_ids
        stats.unknown_build_ids |= call.unknown_build_ids
        frames = {f["frame_id"]: (f["frame_id"], f["function"], f["binary"], f["kind"], f["build_id"])
                  for f in rec["frames"]}
        stacks = {s["stack_id"]: tuple(s["frame_ids"]) for s in rec["stacks"]}
        by_pid = {s["pid"]: stacks[s["stack_id"]] for s in rec["samples"]}
        uncached = {}
        for i, key in enumerate(keys):
            ids = by_pid.get(i, ())
            value = (ids, tuple(frames[f] for f in dict.fromkeys(ids)))
            if any(mp["build_id"] in call.missing_build_ids for mp in misses[key][0]):
                uncached[key] = value  # used for this call, symbolized again next time
            else:
                self.cpu[key] = value
        return uncached


def build_gpu_samples(matches: list[tuple], unmatched: list[tuple], window_ns: int, stacks: LaunchStacks,
                      tables: TableLookup, stats: SymbolizeStats | None = None) -> list[dict]:
    """GpuSamples records, one per (node, window) touched by the matches and unmatched counts of one call."""
    stats = stats if stats is not None else SymbolizeStats()
    resolved = stacks.resolve(matches, tables, stats)
    sums: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    defs: dict[int, tuple] = {}
    simulated: set[tuple[str, int]] = set()  # (node, window) with a kernel from a simulated GPU library
    for m, (sid, ids, frames) in zip(matches, resolved, strict=True):
        node, pid, weight, kstart, duration = m[0], m[1], m[5], m[6], m[7]
        window = clamp_long(kstart - kstart % window_ns)
        if m[13]:
            simulated.add((node, window))
        cell = sums[(node, window, pid, m[8], m[9], sid, m[10])]
        cell[0] += duration * weight
        cell[1] += weight
        if sid not in defs:
            defs[sid] = (ids, frames)
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
                                              "simulated": (node, window) in simulated}
        return rec

    for (node, window, pid, device, stream, sid, name), (ns, launches) in sums.items():
        record(node, window)["samples"].append({
            "pid": pid, "comm": "", "container_id": "", "device": device, "stream": stream, "stack_id": sid,
            "kernel_name": name, "duration_ns": clamp_long(ns), "launches": clamp_long(launches)})
    for (node, window, pid, side, reason), (events, ns, launches) in lost.items():
        record(node, window)["unmatched"].append({"pid": pid, "side": SIDES[side], "reason": reason,
                                                  "events": events, "duration_ns": clamp_long(ns),
                                                  "launches": clamp_long(launches)})
    for rec in records.values():
        sids = list(dict.fromkeys(s["stack_id"] for s in rec["samples"]))
        rec["stacks"] = [{"stack_id": sid, "frame_ids": list(defs[sid][0])} for sid in sids]
        fdefs = {f[0]: f for sid in sids for f in defs[sid][1]}
        rec["frames"] = [{"frame_id": f[0], "function": f[1], "binary": f[2], "kind": f[3], "build_id": f[4]}
                         for f in fdefs.values()]
    return list(records.values())


def estimated_bytes(rec: dict) -> int:
    """An upper bound of the encoded GpuSamples record's size, without encoding it."""
    frames = sum(len(f["function"]) * 4 + len(f["binary"]) + len(f.get("build_id", "")) + 24 for f in rec["frames"])
    stacks = sum(10 * len(s["frame_ids"]) + 12 for s in rec["stacks"])
    samples = sum(4 * (len(s["kernel_name"]) + len(s["comm"]) + len(s["container_id"])) + 64 for s in rec["samples"])
    return 64 + 4 * len(rec["node"]) + frames + stacks + samples + 48 * len(rec["unmatched"])


def split_gpu_samples(rec: dict, max_bytes: int) -> list[dict]:
    """Split a GpuSamples record by its samples so each part stays under max_bytes; each part carries exactly the
    stacks and frames its samples reference, and the first one the unmatched counts."""
    if estimated_bytes(rec) <= max_bytes or len(rec["samples"]) <= 1:
        return [rec]
    stacks = {s["stack_id"]: s for s in rec["stacks"]}
    frames = {f["frame_id"]: f for f in rec["frames"]}
    parts: list[list[dict]] = [[]]
    size = 48 * len(rec["unmatched"])
    for sample in rec["samples"]:
        st = stacks[sample["stack_id"]]
        cost = 12 * len(st["frame_ids"]) + sum(4 * len(frames[i]["function"]) + 80 for i in st["frame_ids"]) + \
            4 * len(sample["kernel_name"]) + 128
        if parts[-1] and size + cost > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(sample)
        size += cost
    out = []
    for i, samples in enumerate(parts):
        used = list(dict.fromkeys(s["stack_id"] for s in samples))
        fids = list(dict.fromkeys(f for sid in used for f in stacks[sid]["frame_ids"]))
        out.append({**rec, "samples": samples, "stacks": [stacks[s] for s in used],
                    "frames": [frames[f] for f in fids], "unmatched": rec["unmatched"] if i == 0 else []})
    return out


__all__ = ["GPU_BINARY", "GPU_KERNEL_KIND", "KERNEL", "LAUNCH", "LaunchStacks", "build_gpu_samples",
           "split_gpu_samples"]
