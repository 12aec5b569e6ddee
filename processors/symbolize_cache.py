"""symbolize_batch's result with each stack row symbolized once: a node sends the same stacks window after window,
so the symbolize stage keeps each row's symbolized stack (by the process's mappings and code objects and the row's
addresses) and symbolizes only the rows it has not seen. The record it builds is the one symbolize_batch gives.

A row is not kept when a table it needed was missing (it may arrive), or when one of its Python frames named a code
object its process did not send (counted once per batch); everything kept is dropped when a table present before is
replaced or evicted (SymbolTables.generation), or when the caller says the frames changed (`clear`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from processors.symbol_tables import SymbolTable
from processors.symbolize import (
    LOST,
    MISSING,
    PY_UNKNOWN,
    TRUNCATED,
    UNKNOWN,
    FrameMemo,
    RowFrames,
    SymbolizeStats,
    TableLookup,
    clamp_long,
    resolve_rows,
)
from schemas.packed_stacks import PackedStacks, lengths_to_offsets
from schemas.wire import LONG_MAX, LONG_MIN

_COLUMNS = [f.name for f in dataclasses.fields(PackedStacks)]
# (stack id, frame ids root first, frames, unknown frames, truncated, lost, user build ids left unknown or None)
Row = tuple[int, tuple[int, ...], int, int, int, int, frozenset | None]


def _frame_def(f: tuple) -> dict:
    return {"frame_id": f[0], "function": f[1], "binary": f[2], "kind": f[3], "build_id": f[4]}


@dataclass
class Symbolized:
    """One batch symbolized: the CpuSamples record's parts, with its frame and stack definitions made on demand
    (a stage sends most of them only once)."""

    head: dict  # node, window_start_ns, window_ns, simulated, frequency_hz
    stacks: dict[int, tuple[int, ...]]  # stack id -> frame ids, in first-seen order
    samples: list[dict]
    samples_bytes: int  # their share of estimated_bytes
    cache: StackCache

    def frame_ids(self) -> set[int]:
        return set().union(*self.stacks.values())

    def estimated_bytes(self, stack_ids: list[int] | None = None, frame_ids: set[int] | None = None) -> int:
        """symbolize.estimated_bytes of the record `record(stack_ids, frame_ids)` gives, without building it: each
        frame once, by the cache's dense frame numbers."""
        cache = self.cache
        sids = self.stacks if stack_ids is None else stack_ids
        frames = 0
        if frame_ids is not None:
            frames = int(cache.frame_size[[cache.numbers[f] for f in frame_ids]].sum()) if frame_ids else 0
        elif sids:
            used = np.zeros(cache.frames, dtype=bool)
            used[np.concatenate([cache.stack_frames[s] for s in sids])] = True
            frames = int(cache.frame_size[:cache.frames][used].sum())
        stacks = sum(len(self.stacks[s]) for s in sids) * 10 + 12 * len(sids)
        return 64 + len(self.head["node"]) + frames + stacks + self.samples_bytes

    def record(self, stack_ids: list[int] | None = None, frame_ids: set[int] | None = None) -> dict:
        """The CpuSamples record; with only the given stack and frame definitions when given."""
        defs, sdefs = self.cache.frame_defs, self.cache.stack_defs
        sids = list(self.stacks) if stack_ids is None else stack_ids
        fids = self.frame_ids() if frame_ids is None else frame_ids
        return {**self.head, "frames": [defs[f] for f in sorted(fids)], "stacks": [sdefs[s] for s in sids],
                "samples": self.samples}


@dataclass
class StackCache:
    """Symbolized rows by (process context, user addresses, kernel addresses), bounded."""

    max_rows: int = 1_000_000
    generation: int = -1  # of the SymbolTables the rows were made with
    rows: dict[tuple[int, bytes, bytes], Row] = field(default_factory=dict)
    contexts: dict[tuple, int] = field(default_factory=dict)  # (kernel build id, mappings, code objects) -> id
    frame_defs: dict[int, dict] = field(default_factory=dict)  # frame id -> FrameDef record
    stack_defs: dict[int, dict] = field(default_factory=dict)  # stack id -> StackDef record
    # each frame's number (0, 1, ...) and its share of estimated_bytes by number; each stack's frames by number
    numbers: dict[int, int] = field(default_factory=dict)
    frame_size: np.ndarray = field(default_factory=lambda: np.zeros(1024, dtype=np.int64))
    stack_frames: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return len(self.numbers)

    def clear(self) -> None:
        for d in (self.rows, self.contexts, self.frame_defs, self.stack_defs, self.numbers, self.stack_frames):
            d.clear()

    def context(self, kernel_build_id: str, proc: dict) -> int:
        key = (kernel_build_id, tuple(tuple(m.values()) for m in proc["mappings"]),
               tuple(tuple(c.values()) for c in proc.get("code_objects") or ()))
        cid = self.contexts.get(key)
        if cid is None:
            cid = self.contexts[key] = len(self.contexts)
        return cid

    def define(self, ids: tuple[int, ...], sid: int, memo: FrameMemo) -> None:
        if sid in self.stack_defs:
            return
        numbers = self.numbers
        for f in ids:
            if f not in numbers:
                d = self.frame_defs[f] = _frame_def(memo.by_id[f])
                n = numbers[f] = len(numbers)
                if n >= len(self.frame_size):
                    self.frame_size = np.concatenate([self.frame_size, np.zeros_like(self.frame_size)])
                self.frame_size[n] = len(d["function"]) + len(d["binary"]) + len(d["build_id"]) + 24
        self.stack_defs[sid] = {"stack_id": sid, "frame_ids": list(ids)}
        self.stack_frames[sid] = np.array([numbers[f] for f in ids], dtype=np.int64)


def _per_row(flags: np.ndarray, bounds: np.ndarray, bit: int) -> np.ndarray:
    """How many of each row's addresses have `bit` (rows: flags[bounds[i]:bounds[i + 1]])."""
    cs = np.concatenate(([0], np.cumsum((flags & bit) != 0)))
    return cs[bounds[1:]] - cs[bounds[:-1]]


def _row_stats(r: RowFrames) -> list[tuple[int, int, int, frozenset | None]]:
    """(unknown frames, truncated, lost, user build ids left unknown) of each row, from its addresses' flags."""
    unknown = _per_row(r.uflags, r.ub, UNKNOWN)
    kunknown = _per_row(r.kflags, r.kb, UNKNOWN)
    truncated, lost = _per_row(r.uflags, r.ub, TRUNCATED).tolist(), _per_row(r.uflags, r.ub, LOST).tolist()
    by_group = {g: b for (b, _), g in r.groups.items()}
    out = []
    for i, (u, k) in enumerate(zip(unknown.tolist(), kunknown.tolist(), strict=True)):
        bids = None
        if u:
            sl = slice(int(r.ub[i]), int(r.ub[i + 1]))
            gs = r.group[sl][(r.uflags[sl] & UNKNOWN) != 0]
            bids = frozenset(by_group[g] for g in set(gs.tolist()) if g >= 0 and by_group[g]) or None
        out.append((u + k, truncated[i], lost[i], bids))
    return out


def _select(misses: list[tuple[dict, PackedStacks, list[int]]]) -> list[tuple[dict, PackedStacks]]:
    """Each process with only its missed rows: one gather over every process's arrays at once, then views."""
    sts = [st for _, st, _ in misses]
    whole = PackedStacks(*(np.concatenate([getattr(st, c) for st in sts]) for c in _COLUMNS))
    first = lengths_to_offsets(np.array([len(st) for st in sts], dtype=np.int64))
    part = whole.select(np.concatenate([np.asarray(rows, dtype=np.int64) + first[i]
                                        for i, (_, _, rows) in enumerate(misses)]))
    n = lengths_to_offsets(np.array([len(rows) for _, _, rows in misses], dtype=np.int64))
    uo, ko = lengths_to_offsets(part.user_lens)[n].tolist(), lengths_to_offsets(part.kernel_lens)[n].tolist()
    n = n.tolist()
    return [(proc, PackedStacks(part.tids[n[i]:n[i + 1]], part.counts[n[i]:n[i + 1]], part.user_addrs[uo[i]:uo[i + 1]],
                                part.user_lens[n[i]:n[i + 1]], part.kernel_addrs[ko[i]:ko[i + 1]],
                                part.kernel_lens[n[i]:n[i + 1]]))
            for i, (proc, _, _) in enumerate(misses)]


def _resolve_misses(misses: list[tuple[dict, PackedStacks, list[int]]], kernel_table: SymbolTable | None,
                    tables: TableLookup, memo: FrameMemo, stats: SymbolizeStats) -> tuple[list, list, list, list, list,
                                                                                          list, list]:
    """resolve_rows over the missed rows: (user frames, kernel frames, their offsets per row, each row's stats,
    whether each row may be kept)."""
    r = resolve_rows(_select(misses), kernel_table, tables, memo, stats)
    bad = MISSING | PY_UNKNOWN
    keep = ((_per_row(r.uflags, r.ub, bad) + _per_row(r.kflags, r.kb, bad)) == 0).tolist()
    return r.uids.tolist(), r.kids.tolist(), r.ub.tolist(), r.kb.tolist(), _row_stats(r), keep


def symbolize_cached(batch: dict, tables: TableLookup, generation: int, memo: FrameMemo, cache: StackCache,
                     stats: SymbolizeStats) -> Symbolized:
    """symbolize_batch(batch, tables, memo, stats) as a Symbolized, with the rows `cache` holds not symbolized
    again. `generation`: the tables' (SymbolTables.generation); the cache is dropped when it changed."""
    if generation != cache.generation:
        cache.clear()
        cache.generation = generation
    if len(cache.rows) >= cache.max_rows:
        cache.clear()
    kid = batch.get("kernel_build_id") or ""
    kernel_table = tables(kid) if kid else None
    if kid and kernel_table is None:
        stats.missing_build_ids.add(kid)
    rows = cache.rows
    frames = 0
    found: list[list] = []  # per process with stacks: (proc, its rows' cached results or None)
    misses: list[tuple[dict, PackedStacks, list[int]]] = []
    keys: list[list] = []
    for proc in batch["processes"]:
        st = proc["stacks"]
        st = st if isinstance(st, PackedStacks) else PackedStacks.from_records(st)
        if not len(st):
            continue
        ctx = cache.context(kid, proc)
        ub, kb = st.user_addrs.tobytes(), st.kernel_addrs.tobytes()
        # each row's addresses as bytes: offsets by a running sum over Python ints (numpy's costs more at this size)
        uo = accumulate((st.user_lens * 8).tolist(), initial=0)
        ko = accumulate((st.kernel_lens * 8).tolist(), initial=0)
        u0, k0 = next(uo), next(ko)
        pkeys = []
        for u1, k1 in zip(uo, ko, strict=True):
            pkeys.append((ctx, ub[u0:u1], kb[k0:k1]))
            u0, k0 = u1, k1
        got = [rows.get(k) for k in pkeys]
        missed = []
        for i, row in enumerate(got):
            if row is None:
                missed.append(i)
                continue
            # a cached row's stats (the missed ones resolve_rows counts)
            frames += row[2]
            if row[3] or row[4] or row[5]:
                stats.unknown_frames += row[3]
                stats.truncated_stacks += row[4]
                stats.lost_stacks += row[5]
                if row[6]:
                    stats.unknown_build_ids |= row[6]
        if missed:
            misses.append((proc, st, missed))
        found.append([proc, st, got, missed])
        keys.append(pkeys)
    stats.frames += frames
    if misses:
        ufr, kfr, ub, kb, row_stats, keep = _resolve_misses(misses, kernel_table, tables, memo, stats)
        j = 0
        for (_, _, got, missed), pkeys in zip(found, keys, strict=True):
            for i in missed:
                ids = tuple(ufr[ub[j]:ub[j + 1]][::-1] + kfr[kb[j]:kb[j + 1]][::-1])
                sid = memo.stack(ids)
                cache.define(ids, sid, memo)
                got[i] = row = (sid, ids, len(ids), *row_stats[j])
                if keep[j]:
                    rows[pkeys[i]] = row
                j += 1
    head = {"node": batch["node"], "window_start_ns": batch["window_start_ns"], "window_ns": batch["window_ns"],
            "simulated": bool(batch.get("simulated", False)), "frequency_hz": batch.get("frequency_hz", 0)}
    return Symbolized(head, *_sample_rows(found), cache)


def _sample_rows(found: list[list]) -> tuple[dict[int, tuple[int, ...]], list[dict], int]:
    """The record's stacks and samples (counts summed per process and stack, in first-seen order) from each process's
    rows, with the samples' share of estimated_bytes."""
    stacks: dict[int, tuple[int, ...]] = {}
    procs = [(proc["pid"], proc["comm"], proc.get("container_id", ""), proc.get("identity_id", 0))
             for proc, _, _, _ in found]
    if len(set(procs)) < len(procs):  # one process listed twice: its counts are summed across the entries
        counts: dict[tuple, int] = {}
        for key, (_, st, got, _) in zip(procs, found, strict=True):
            for row, n in zip(got, st.counts.tolist(), strict=True):
                stacks[row[0]] = row[1]
                counts[(*key, row[0])] = counts.get((*key, row[0]), 0) + n
        per_proc = [(key[:4], [(key[4], c)]) for key, c in counts.items()]
    else:
        per_proc = []
        for key, (_, st, got, _) in zip(procs, found, strict=True):
            sids = [row[0] for row in got]
            stacks.update(zip(sids, [row[1] for row in got], strict=True))
            if len(set(sids)) == len(sids):  # the common case: a row per stack, each count an Avro long
                per_proc.append((key, zip(sids, st.counts.tolist(), strict=True)))
                continue
            summed: dict[int, int] = {}
            for sid, n in zip(sids, st.counts.tolist(), strict=True):
                summed[sid] = summed.get(sid, 0) + n
            per_proc.append((key, summed.items()))
    samples: list[dict] = []
    size = 0
    for (pid, comm, cid, ident), counts_of in per_proc:
        first = len(samples)
        samples += [{"pid": pid, "comm": comm, "container_id": cid, "identity_id": ident, "stack_id": sid,
                     "count": c if LONG_MIN <= c <= LONG_MAX else clamp_long(c)} for sid, c in counts_of]
        size += (len(comm) + len(cid) + 38) * (len(samples) - first)
    return stacks, samples, size
