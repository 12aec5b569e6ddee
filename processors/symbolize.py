"""symbolize: a raw CpuStackBatch in, a CpuSamples record out (frames, stacks by stable id, summed counts).

Pure: the symbol tables are handed in; nothing here reads a socket or a file. Names are demangled (C++, Rust).
Addresses that cannot be resolved stay visible as `[unknown] <binary>+0x<offset>` so nothing silently disappears.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from processors.demangle import demangle
from processors.stack_ids import frame_id, stack_id
from processors.symbol_tables import SymbolTable, as_u64
from schemas.packed_stacks import PackedStacks
from schemas.wire import (
    KERNEL_BINARY,
    LONG_MAX,
    LONG_MIN,
    LOST_STACK_BINARY,
    LOST_STACK_FRAME,
    LOST_STACK_NAME,
    PYTHON_FRAME_TAG,
    TRUNCATED_BINARY,
    TRUNCATED_FRAME,
    UNKNOWN_BINARY,
    python_frame_parts,
)

_DELETED = " (deleted)"

TableLookup = Callable[[str], SymbolTable | None]

# What symbolizing did to each address (`flags` of _user_frames/_kernel_frames), so a caller can keep per-stack
# results: UNKNOWN counts in SymbolizeStats.unknown_frames; MISSING (its table is absent) and PY_UNKNOWN (its code
# object is not in the process's list, counted once per batch) make a result that must not be reused.
UNKNOWN, MISSING, TRUNCATED, LOST, PY_UNKNOWN = 1, 2, 4, 8, 16


def clamp_long(n: int) -> int:
    """A sum of Avro longs kept an Avro long: counts from a message may be anything, and a sum the codec cannot
    encode would stop the runner when it writes the output."""
    return LONG_MIN if n < LONG_MIN else LONG_MAX if n > LONG_MAX else n


@dataclass
class FrameMemo:
    """Frame and stack ids already computed, bounded so a long-running processor does not grow forever."""

    max_entries: int = 2_000_000
    frames: dict = field(default_factory=dict)  # key -> frame id
    by_id: dict = field(default_factory=dict)  # frame id -> (frame_id, function, binary, kind, build id)
    stacks: dict = field(default_factory=dict)  # tuple(frame ids) -> stack id
    # (build id, binary) -> frame id by symbol index (0: not yet), the frames' keys (build id, binary, index) as an
    # array, so the symbols a batch hits are found with one numpy indexing
    by_symbol: dict = field(default_factory=dict)

    def frame(self, key: object, function: str, binary: str, kind: str, build_id: str = "") -> int:
        fid = self.frames.get(key)
        if fid is None:
            if len(self.frames) >= self.max_entries:
                self.frames.clear()
                self.by_id.clear()
                self.by_symbol.clear()
            fid = frame_id(function, binary, kind)
            self.frames[key] = fid
            self.by_id[fid] = (fid, function, binary, kind, build_id)
        return fid

    def symbol_ids(self, key: tuple[str, str], symbols: int) -> np.ndarray:
        """The frame ids by symbol index of one table (`symbols` long) as one binary names it."""
        ids = self.by_symbol.get(key)
        if ids is None or len(ids) != symbols:
            ids = self.by_symbol[key] = np.zeros(symbols, dtype=np.int64)
        return ids

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
    truncated_stacks: int = 0  # user stacks the agent marked as not walked to their root
    lost_stacks: int = 0  # samples whose stack (or its kernel part) the agent's full stack map lost
    missing_build_ids: set[str] = field(default_factory=set)
    # user-space build ids with frames left unknown (table missing, or no symbol covers the address): what a
    # second symbol source such as debuginfod may improve
    unknown_build_ids: set[str] = field(default_factory=set)


@functools.lru_cache(maxsize=65536)
def binary_name(path: str) -> str:
    if path.endswith(_DELETED):
        path = path[: -len(_DELETED)]
    return os.path.basename(path) or path or "[anon]"


def _resolve(ids: np.ndarray, where: np.ndarray, keys: np.ndarray, make) -> None:
    """ids[where] = frame id of each key, computing each distinct key once (`make(key) -> frame id`)."""
    if len(where) == 0:
        return
    uniq, inverse = np.unique(keys, return_inverse=True)
    fids = np.fromiter((make(int(k)) for k in uniq), dtype=np.int64, count=len(uniq))
    ids[where] = fids[inverse]


def _resolve_symbols(ids: np.ndarray, where: np.ndarray, syms: np.ndarray, known: np.ndarray, make) -> None:
    """_resolve for symbol indexes, through `known` (frame id by symbol index, 0: not computed yet)."""
    if len(where) == 0:
        return
    got = known[syms]
    todo = got == 0
    if todo.any():
        for s in np.unique(syms[todo]).tolist():
            known[s] = make(s)
        got = known[syms]
    ids[where] = got


def map_addresses(procs: list[tuple[dict, PackedStacks]], groups: dict[tuple[str, str], int]) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """Each user address's (build id, binary) group (-1: in no mapping of its process) and its file offset, for
    every process at once: one searchsorted per process, the rest on the whole batch."""
    maps = [m for proc, _ in procs for m in sorted(proc["mappings"], key=lambda m: m["start"])]
    addrs = _cat([st.user_addrs for _, st in procs]).view(np.uint64)
    if not maps:
        return np.full(len(addrs), -1, dtype=np.int64), addrs
    starts = as_u64([m["start"] for m in maps])
    limits = as_u64([m["limit"] for m in maps])
    offsets = as_u64([m["file_offset"] for m in maps])
    mgroup = np.array([groups.setdefault((m["build_id"], binary_name(m["path"])), len(groups)) for m in maps],
                      dtype=np.int64)
    first = np.cumsum([0] + [len(proc["mappings"]) for proc, _ in procs]).tolist()  # each process's mappings
    mi = _cat([np.searchsorted(starts[lo:hi], st.user_addrs.view(np.uint64), side="right").astype(np.int64) - 1
               for (_, st), lo, hi in zip(procs, first[:-1], first[1:], strict=True)])
    safe = np.minimum(np.maximum(mi, 0) + np.repeat(first[:-1], [len(st.user_addrs) for _, st in procs]),
                      len(maps) - 1)
    mapped = (mi >= 0) & (addrs < limits[safe])
    group = np.where(mapped, mgroup[safe], -1)
    file_off = np.where(mapped, addrs - starts[safe] + offsets[safe], addrs)
    return group, file_off


def _python_frames(ids: np.ndarray, sel: np.ndarray, words: np.ndarray, owner: np.ndarray, code_tables: list[list],
                   memo: FrameMemo, stats: SymbolizeStats, flags: np.ndarray | None = None) -> None:
    """Python frames (schemas/wire.py python_frame) named `qualname (file:line)` from their process's code_objects."""
    bad: set[int] = set()

    def make(key: int) -> int:
        proc, word = divmod(key, 1 << 64)
        index, line = python_frame_parts(word)
        table = code_tables[proc]
        if index >= len(table):
            stats.unknown_frames += 1
            bad.add(key)
            return memo.frame(("py?", proc, word), f"{UNKNOWN_BINARY} python frame {index}", UNKNOWN_BINARY, "UNKNOWN")
        code = table[index]
        qualname, file = code["qualname"], code["file"]
        return memo.frame(("py", qualname, file, line), f"{qualname} ({file}:{line})", file, "INTERPRETED")
    if len(sel) == 0:
        return
    keys = [int(p) << 64 | int(w) for p, w in zip(owner[sel].tolist(), words.tolist(), strict=True)]
    uniq = {k: make(k) for k in dict.fromkeys(keys)}
    ids[sel] = np.fromiter((uniq[k] for k in keys), dtype=np.int64, count=len(keys))
    if bad and flags is not None:
        flags[sel[np.array([k in bad for k in keys])]] |= PY_UNKNOWN


def _user_frames(group: np.ndarray, file_off: np.ndarray, is_leaf: np.ndarray, groups: dict[tuple[str, str], int],
                 tables: TableLookup, memo: FrameMemo, stats: SymbolizeStats,
                 owner: np.ndarray | None = None, code_tables: list[list] | None = None,
                 flags: np.ndarray | None = None) -> np.ndarray:
    """The frame id of every user address of the batch, one table lookup per binary; Python frames from the code
    objects of their process (`owner`: each address's index into `code_tables`). `flags` (when given) gets what
    happened to each address (UNKNOWN, MISSING, ...)."""
    flags = flags if flags is not None else np.zeros(len(group), dtype=np.int8)
    ids = np.zeros(len(group), dtype=np.int64)
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(-1, len(groups) + 1))
    orphans = order[bounds[0]:bounds[1]]
    cut = orphans[file_off[orphans] == TRUNCATED_FRAME]  # the agent's mark: the stack did not reach its root
    lost = orphans[file_off[orphans] == LOST_STACK_FRAME]  # the agent's mark: its stack map was full
    orphans = orphans[(file_off[orphans] != TRUNCATED_FRAME) & (file_off[orphans] != LOST_STACK_FRAME)]
    python = (file_off[orphans] >> np.uint64(56)) == PYTHON_FRAME_TAG
    if owner is not None and code_tables is not None and python.any():
        _python_frames(ids, orphans[python], file_off[orphans[python]], owner, code_tables, memo, stats, flags)
        orphans = orphans[~python]
    stats.unknown_frames += len(orphans)
    flags[orphans] |= UNKNOWN
    flags[cut] |= TRUNCATED
    flags[lost] |= LOST
    stats.truncated_stacks += len(cut)
    _resolve(ids, cut, file_off[cut], lambda _: memo.frame("truncated", TRUNCATED_BINARY, TRUNCATED_BINARY, "UNKNOWN"))
    stats.lost_stacks += len(lost)
    _resolve(ids, lost, file_off[lost], lambda _: memo.frame("lost", LOST_STACK_NAME, LOST_STACK_BINARY, "UNKNOWN"))
    _resolve(ids, orphans, file_off[orphans],
             lambda a: memo.frame(("?", a), f"{UNKNOWN_BINARY} 0x{a:x}", UNKNOWN_BINARY, "UNKNOWN"))
    for (build_id, binary), g in groups.items():
        sel = order[bounds[g + 1]:bounds[g + 2]]
        if len(sel) == 0:
            continue
        off = file_off[sel]
        table = tables(build_id) if build_id else None
        if table is None:
            if build_id:
                stats.missing_build_ids.add(build_id)
            syms = np.full(len(sel), -1)
            flags[sel] |= MISSING
        else:
            # a return address points past its call; step back one byte so it lands in the caller
            syms = table.lookup(table.to_vaddr(off - (~is_leaf[sel]).astype(np.uint64)))
        known = syms >= 0
        if table is not None:
            names = table.names
            kind = _frame_kind(table)
            gnu = _gnu_build_id(build_id)
            _resolve_symbols(ids, sel[known], syms[known], memo.symbol_ids((build_id, binary), len(names)),
                             lambda s, t=build_id, b=binary, n=names, k=kind, g=gnu: memo.frame(
                                 (t, b, s), demangle(n[s]), b, k(n[s]), g))
        flags[sel[~known]] |= UNKNOWN
        unknown = int((~known).sum())
        stats.unknown_frames += unknown
        if unknown and build_id:
            stats.unknown_build_ids.add(build_id)
        _resolve(ids, sel[~known], off[~known],
                 lambda o, b=binary: memo.frame((b, o), f"{UNKNOWN_BINARY} {b}+0x{o:x}", b, "UNKNOWN"))
    return ids


def _kernel_frames(addrs: np.ndarray, is_leaf: np.ndarray, table: SymbolTable | None, memo: FrameMemo,
                   stats: SymbolizeStats, flags: np.ndarray | None = None) -> np.ndarray:
    ids = np.zeros(len(addrs), dtype=np.int64)
    if flags is not None:
        flags[:] = UNKNOWN | (MISSING if table is None else 0)
    syms = table.lookup(addrs - (~is_leaf).astype(np.uint64)) if table is not None else np.full(len(addrs), -1)
    known = syms >= 0
    if table is not None:
        names = table.names
        by_symbol = memo.symbol_ids(("k", table.build_id, KERNEL_BINARY), len(names))
        _resolve_symbols(ids, np.flatnonzero(known), syms[known], by_symbol,
                         lambda s, t=table.build_id: memo.frame(("k", t, s), demangle(names[s]), KERNEL_BINARY,
                                                                "KERNEL", t))
    stats.unknown_frames += int((~known).sum())
    if flags is not None:
        flags[known] = 0
    _resolve(ids, np.flatnonzero(~known), addrs[~known],
             lambda a: memo.frame(("k?", a), f"{UNKNOWN_BINARY} {KERNEL_BINARY}+0x{a:x}", KERNEL_BINARY, "UNKNOWN"))
    return ids


def _gnu_build_id(build_id: str) -> str:
    """The id a frame stores: a GNU build id as it is, '' for the stand-ins (a file hash, a perf map's digest) that
    no debuginfod or pprof tool can look up."""
    return build_id if build_id and all(c in "0123456789abcdef" for c in build_id) else ""


def _native(name: str) -> str:
    return "NATIVE"


def _perf_map_kind(name: str) -> str:
    # CPython's -X perf names its trampolines "py::function:file"; other JITs' code is machine code like any other
    return "INTERPRETED" if name.startswith("py::") else "NATIVE"


def _frame_kind(table: SymbolTable) -> Callable[[str], str]:
    return _perf_map_kind if table.kind == "PERFMAP" else _native


def _cat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)


def _leaves(lengths: np.ndarray) -> np.ndarray:
    """A marker on the first (leaf) address of each stack, for stacks laid out one after another."""
    is_leaf = np.zeros(int(lengths.sum()), dtype=bool)
    starts = np.cumsum(lengths) - lengths
    is_leaf[starts[lengths > 0]] = True
    return is_leaf


def user_frame_ids(group: np.ndarray, file_off: np.ndarray, lens: np.ndarray, groups: dict[tuple[str, str], int],
                   tables: TableLookup, memo: FrameMemo, stats: SymbolizeStats, owner: np.ndarray,
                   code_tables: list[list], flags: np.ndarray) -> np.ndarray:
    """The frame id of every user address of stacks laid out one after another (`lens`, leaf first), from each
    address's group and file offset as `map_addresses` gives them; `owner`: each address's index into code_tables."""
    return _user_frames(group, file_off, _leaves(lens), groups, tables, memo, stats, owner, code_tables, flags)


@dataclass
class RowFrames:
    """The frame ids of every address of a batch's stacks, stack after stack (offsets ub/kb), with what happened to
    each address (flags) and its (build id, binary) group (-1: none; `groups` names them)."""

    uids: np.ndarray
    kids: np.ndarray
    ub: np.ndarray  # stack i's user frames: uids[ub[i]:ub[i + 1]], leaf first
    kb: np.ndarray
    uflags: np.ndarray
    kflags: np.ndarray
    group: np.ndarray
    groups: dict[tuple[str, str], int]


def resolve_rows(procs: list[tuple[dict, PackedStacks]], kernel_table: SymbolTable | None, tables: TableLookup,
                 memo: FrameMemo, stats: SymbolizeStats) -> RowFrames:
    """Every stack's frame ids, every process at once: one address array per kind, so the lookups run once per
    binary, not per process."""
    groups: dict[tuple[str, str], int] = {}
    group, file_off = map_addresses(procs, groups)
    ulens = _cat([st.user_lens for _, st in procs])
    owner = np.repeat(np.arange(len(procs)), [len(st.user_addrs) for _, st in procs])
    uflags = np.zeros(len(group), dtype=np.int8)
    uids = _user_frames(group, file_off, _leaves(ulens), groups, tables, memo, stats, owner,
                        [proc.get("code_objects") or [] for proc, _ in procs], uflags)
    klens = _cat([st.kernel_lens for _, st in procs])
    kaddrs = _cat([st.kernel_addrs for _, st in procs]).view(np.uint64)
    kflags = np.zeros(len(kaddrs), dtype=np.int8)
    kids = _kernel_frames(kaddrs, _leaves(klens), kernel_table, memo, stats, kflags)
    stats.frames += len(uids) + len(kids)
    return RowFrames(uids, kids, np.concatenate(([0], np.cumsum(ulens))), np.concatenate(([0], np.cumsum(klens))),
                     uflags, kflags, group, groups)


def symbolize_batch(batch: dict, tables: TableLookup, memo: FrameMemo | None = None,
                    stats: SymbolizeStats | None = None) -> dict:
    """Resolve every stack of a CpuStackBatch and sum counts per (process, symbolized stack). A process's "stacks"
    may be StackCount dicts or a PackedStacks (what `cpu_batch_reader.decode_columnar` gives)."""
    memo = memo if memo is not None else FrameMemo()
    stats = stats if stats is not None else SymbolizeStats()
    kernel_table = tables(batch["kernel_build_id"]) if batch.get("kernel_build_id") else None
    if batch.get("kernel_build_id") and kernel_table is None:
        stats.missing_build_ids.add(batch["kernel_build_id"])
    procs: list[tuple[dict, PackedStacks]] = []  # the processes that have stacks, with their stacks as columns
    for proc in batch["processes"]:
        stacks = proc["stacks"]
        packed = stacks if isinstance(stacks, PackedStacks) else PackedStacks.from_records(stacks)
        if len(packed):
            procs.append((proc, packed))
    rows = resolve_rows(procs, kernel_table, tables, memo, stats)
    ufr, kfr, ub, kb = rows.uids.tolist(), rows.kids.tolist(), rows.ub.tolist(), rows.kb.tolist()
    uids, kids = rows.uids, rows.kids
    sample_counts = _cat([st.counts for _, st in procs]).tolist()
    stacks: dict[int, tuple[int, ...]] = {}
    counts: dict[tuple, int] = {}
    i = 0
    for proc, st in procs:
        pid, comm, cid, ident = proc["pid"], proc["comm"], proc.get("container_id", ""), proc.get("identity_id", 0)
        for _ in range(len(st)):
            # leaf-first addresses become root-first frames: user root … user leaf, kernel entry … kernel leaf
            ids = tuple(ufr[ub[i]:ub[i + 1]][::-1] + kfr[kb[i]:kb[i + 1]][::-1])
            sid = memo.stack(ids)
            stacks[sid] = ids
            key = (pid, comm, cid, ident, sid)
            counts[key] = counts.get(key, 0) + sample_counts[i]
            i += 1
    frames = [memo.by_id[f] for f in np.unique(np.concatenate([uids, kids])).tolist()]
    return {
        "node": batch["node"],
        "window_start_ns": batch["window_start_ns"],
        "window_ns": batch["window_ns"],
        "simulated": bool(batch.get("simulated", False)),
        "frequency_hz": batch.get("frequency_hz", 0),
        "frames": [{"frame_id": f[0], "function": f[1], "binary": f[2], "kind": f[3], "build_id": f[4]}
                   for f in frames],
        "stacks": [{"stack_id": sid, "frame_ids": list(ids)} for sid, ids in stacks.items()],
        "samples": [
            {"pid": pid, "comm": comm, "container_id": cid, "identity_id": ident, "stack_id": sid,
             "count": clamp_long(n)}
            for (pid, comm, cid, ident, sid), n in counts.items()
        ],
    }


def estimated_bytes(rec: dict) -> int:
    """An upper-bound-ish size of the encoded CpuSamples record, without encoding it."""
    frames = sum(len(f["function"]) + len(f["binary"]) + len(f.get("build_id", "")) + 24 for f in rec["frames"])
    stacks = sum(10 * len(s["frame_ids"]) + 12 for s in rec["stacks"])
    samples = sum(len(s["comm"]) + len(s["container_id"]) + 38 for s in rec["samples"])  # 10: the identity id
    return 64 + len(rec["node"]) + frames + stacks + samples


def split_samples(rec: dict, max_bytes: int) -> list[dict]:
    """Split a CpuSamples record by its samples so each part stays under max_bytes; each part carries exactly
    the stacks and frames its samples reference."""
    if estimated_bytes(rec) <= max_bytes or len(rec["samples"]) <= 1:
        return [rec]
    stacks = {s["stack_id"]: s for s in rec["stacks"]}
    frames = {f["frame_id"]: f for f in rec["frames"]}
    parts, current, size = [], [], 0
    for sample in rec["samples"]:
        st = stacks[sample["stack_id"]]
        cost = 12 * len(st["frame_ids"]) + sum(len(frames[i]["function"]) + 80 for i in st["frame_ids"]) + 64
        if current and size + cost > max_bytes:
            parts.append(current)
            current, size = [], 0
        current.append(sample)
        size += cost
    parts.append(current)
    out = []
    for samples in parts:
        used = list(dict.fromkeys(s["stack_id"] for s in samples))
        fids = list(dict.fromkeys(i for sid in used for i in stacks[sid]["frame_ids"]))
        out.append({**rec, "samples": samples, "stacks": [stacks[s] for s in used],
                    "frames": [frames[i] for i in fids]})
    return out
