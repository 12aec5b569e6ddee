"""symbolize: a raw CpuStackBatch in, a CpuSamples record out (frames, stacks by stable id, summed counts).

Pure: the symbol tables are handed in; nothing here reads a socket or a file. Addresses that cannot be resolved
stay visible as `[unknown] <binary>+0x<offset>` so nothing silently disappears.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from processors.stack_ids import frame_id, stack_id
from processors.symbol_tables import SymbolTable, as_u64

KERNEL_BINARY = "[kernel.kallsyms]"
_DELETED = " (deleted)"

TableLookup = Callable[[str], SymbolTable | None]


@dataclass
class FrameMemo:
    """Frame and stack ids already computed, bounded so a long-running processor does not grow forever."""

    max_entries: int = 2_000_000
    frames: dict = field(default_factory=dict)  # key -> (frame_id, function, binary, kind)
    stacks: dict = field(default_factory=dict)  # tuple(frame ids) -> stack id

    def frame(self, key: object, function: str, binary: str, kind: str) -> tuple[int, str, str, str]:
        hit = self.frames.get(key)
        if hit is None:
            if len(self.frames) >= self.max_entries:
                self.frames.clear()
            hit = (frame_id(function, binary, kind), function, binary, kind)
            self.frames[key] = hit
        return hit

    def stack(self, frame_ids: tuple[int, ...]) -> int:
        sid = self.stacks.get(frame_ids)
        if sid is None:
            if len(self.stacks) >= self.max_entries:
                self.stacks.clear()
            sid = stack_id(frame_ids)
            self.stacks[frame_ids] = sid
        return sid


@dataclass
class SymbolizeStats:
    frames: int = 0
    unknown_frames: int = 0
    missing_build_ids: set[str] = field(default_factory=set)


def binary_name(path: str) -> str:
    if path.endswith(_DELETED):
        path = path[: -len(_DELETED)]
    return os.path.basename(path) or path or "[anon]"


def _user_frames(proc: dict, addrs: np.ndarray, is_leaf: np.ndarray, tables: TableLookup, memo: FrameMemo,
                 stats: SymbolizeStats) -> list[tuple[int, str, str, str]]:
    """One resolved frame per user address."""
    maps = sorted(proc["mappings"], key=lambda m: m["start"])
    starts = as_u64([m["start"] for m in maps])
    limits = as_u64([m["limit"] for m in maps])
    offsets = as_u64([m["file_offset"] for m in maps])
    out: list = [None] * len(addrs)
    mi = np.searchsorted(starts, addrs, side="right").astype(np.int64) - 1 if len(maps) else np.full(len(addrs), -1)
    mapped = (mi >= 0) & (addrs < limits[np.maximum(mi, 0)]) if len(maps) else np.zeros(len(addrs), bool)
    for i in np.flatnonzero(~mapped):
        out[i] = memo.frame(("?", int(addrs[i])), f"[unknown] 0x{int(addrs[i]):x}", "[unknown]", "UNKNOWN")
        stats.unknown_frames += 1
    for m in np.unique(mi[mapped]):
        sel = np.flatnonzero(mapped & (mi == m))
        mapping = maps[m]
        binary = binary_name(mapping["path"])
        file_off = addrs[sel] - starts[m] + offsets[m]
        table = tables(mapping["build_id"]) if mapping["build_id"] else None
        if table is None:
            if mapping["build_id"]:
                stats.missing_build_ids.add(mapping["build_id"])
            syms = np.full(len(sel), -1)
        else:
            # a return address points past its call; step back one byte so it lands in the caller
            lookup_off = file_off - (~is_leaf[sel]).astype(np.uint64)
            syms = table.lookup(table.to_vaddr(lookup_off))
        build_id = mapping["build_id"]
        for j, s, off in zip(sel, syms, file_off, strict=True):
            if s >= 0:
                out[j] = memo.frame((build_id, int(s)), table.names[s], binary, "NATIVE")
            else:
                out[j] = memo.frame((binary, int(off)), f"[unknown] {binary}+0x{int(off):x}", binary, "UNKNOWN")
                stats.unknown_frames += 1
    return out


def _kernel_frames(addrs: np.ndarray, is_leaf: np.ndarray, table: SymbolTable | None, memo: FrameMemo,
                   stats: SymbolizeStats) -> list[tuple[int, str, str, str]]:
    syms = table.lookup(addrs - (~is_leaf).astype(np.uint64)) if table is not None else np.full(len(addrs), -1)
    out = []
    for a, s in zip(addrs, syms, strict=True):
        if s >= 0:
            out.append(memo.frame(("k", table.build_id, int(s)), table.names[s], KERNEL_BINARY, "KERNEL"))
        else:
            out.append(memo.frame(("k?", int(a)), f"[unknown] {KERNEL_BINARY}+0x{int(a):x}", KERNEL_BINARY,
                                  "UNKNOWN"))
            stats.unknown_frames += 1
    return out


def _flatten(stacks: list[dict], field_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All addresses of one kind in one array, with each stack's bounds and a leaf marker."""
    lengths = np.array([len(s[field_name]) for s in stacks], dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(lengths)))
    flat = [a for s in stacks for a in s[field_name]]
    addrs = as_u64(flat) if flat else np.zeros(0, np.uint64)
    is_leaf = np.zeros(len(addrs), dtype=bool)
    is_leaf[bounds[:-1][lengths > 0]] = True
    return addrs, bounds, is_leaf


def symbolize_batch(batch: dict, tables: TableLookup, memo: FrameMemo | None = None,
                    stats: SymbolizeStats | None = None) -> dict:
    """Resolve every stack of a CpuStackBatch and sum counts per (process, symbolized stack)."""
    memo = memo if memo is not None else FrameMemo()
    stats = stats if stats is not None else SymbolizeStats()
    kernel_table = tables(batch["kernel_build_id"]) if batch.get("kernel_build_id") else None
    if batch.get("kernel_build_id") and kernel_table is None:
        stats.missing_build_ids.add(batch["kernel_build_id"])
    frames: dict[int, tuple] = {}
    stacks: dict[int, tuple[int, ...]] = {}
    counts: dict[tuple, int] = {}
    for proc in batch["processes"]:
        st = proc["stacks"]
        if not st:
            continue
        uaddrs, ubounds, uleaf = _flatten(st, "user_addrs")
        kaddrs, kbounds, kleaf = _flatten(st, "kernel_addrs")
        ufr = _user_frames(proc, uaddrs, uleaf, tables, memo, stats)
        kfr = _kernel_frames(kaddrs, kleaf, kernel_table, memo, stats)
        stats.frames += len(ufr) + len(kfr)
        for i, s in enumerate(st):
            # leaf-first addresses become root-first frames: user root … user leaf, kernel entry … kernel leaf
            path = ufr[ubounds[i]:ubounds[i + 1]][::-1] + kfr[kbounds[i]:kbounds[i + 1]][::-1]
            ids = tuple(f[0] for f in path)
            sid = memo.stack(ids)
            if sid not in stacks:
                stacks[sid] = ids
                for f in path:
                    frames[f[0]] = f
            key = (proc["pid"], proc["comm"], proc.get("container_id", ""), sid)
            counts[key] = counts.get(key, 0) + s["count"]
    return {
        "node": batch["node"],
        "window_start_ns": batch["window_start_ns"],
        "window_ns": batch["window_ns"],
        "frames": [{"frame_id": f[0], "function": f[1], "binary": f[2], "kind": f[3]} for f in frames.values()],
        "stacks": [{"stack_id": sid, "frame_ids": list(ids)} for sid, ids in stacks.items()],
        "samples": [
            {"pid": pid, "comm": comm, "container_id": cid, "stack_id": sid, "count": n}
            for (pid, comm, cid, sid), n in counts.items()
        ],
    }
