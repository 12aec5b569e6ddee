"""The correlator's symbolized launch stacks, cached. A launch stack is symbolized by the symbolize stage's row
resolver (the same FrameMemo ids as CPU stacks) the first time a process shows it; what it resolves to depends only
on each address's binary and offset in that binary, so the result is also kept under that form of the stack: the
same code path in another process (its own address-space layout: another trainer of the job, a restarted one, the
same image on another node) costs a lookup instead of a symbolization. Pure but for the bounded caches."""

from __future__ import annotations

from itertools import chain

import numpy as np

from processors.demangle import demangle
from processors.stack_ids import stack_id
from processors.symbolize import (
    MISSING,
    PY_UNKNOWN,
    UNKNOWN,
    FrameMemo,
    SymbolizeStats,
    TableLookup,
    map_addresses,
    user_frame_ids,
)
from schemas.packed_stacks import PackedStacks, concat_ranges
from schemas.wire import GPU_BINARY, GPU_KERNEL_KIND

Frame = tuple[int, str, str, str, str]  # (frame_id, function, binary, kind, build id), as FrameMemo.by_id holds them
Symbolized = tuple[tuple[int, ...], tuple[Frame, ...]]  # frame ids root first, their definitions


class LaunchStacks:
    """Symbolized launch stacks by (mappings id, stack number, kernel name), and by the stack's (binary, offset)
    form, bounded. A stack symbolized while one of its tables was missing is not kept, so it is symbolized again once
    the table arrives."""

    def __init__(self, memo: FrameMemo | None = None, max_entries: int = 200_000) -> None:
        self.memo = memo if memo is not None else FrameMemo()
        self.max_entries = max_entries
        self.cpu: dict[tuple, Symbolized] = {}
        self.gpu: dict[tuple, tuple[int, tuple[int, ...], tuple[Frame, ...]]] = {}
        # (binary-relative bytes, code objects) -> (symbolized, unknown frames in it): see the module's docstring
        self.by_offsets: dict[tuple[bytes, tuple], tuple[Symbolized, int]] = {}
        self.binaries: dict[tuple[str, str], int] = {}  # (build id, binary) -> its number in by_offsets keys

    def resolve(self, matches: list[tuple], tables: TableLookup, stats: SymbolizeStats) -> list[tuple]:
        """(stack id, frame ids root first, frame definitions) of each match's GPU stack."""
        if len(self.gpu) > self.max_entries or len(self.cpu) > self.max_entries or \
                len(self.by_offsets) > self.max_entries:
            self.gpu.clear()
            self.cpu.clear()
            self.by_offsets.clear()
        gpu = self.gpu
        out = [gpu.get((m[2], m[11], m[10])) for m in matches]  # most are known: one lookup each
        if None not in out:
            return out
        todo = [i for i, hit in enumerate(out) if hit is None]
        misses: dict[tuple, tuple[list, tuple, tuple]] = {}
        for i in todo:
            m = matches[i]
            key = (m[2], m[11])
            if key not in self.cpu and key not in misses:
                misses[key] = (m[3], m[4], m[12])
        uncached = self._symbolize(misses, tables, stats) if misses else {}
        for i in todo:
            m = matches[i]
            gkey = (m[2], m[11], m[10])
            hit = gpu.get(gkey)  # an earlier match of this call may have added it
            if hit is None:
                cpu = self.cpu.get(gkey[:2])
                hit = self._with_kernel(cpu if cpu is not None else uncached[gkey[:2]], m[10])
                if cpu is not None:
                    gpu[gkey] = hit
            out[i] = hit
        return out

    def _with_kernel(self, cpu: Symbolized, name: str) -> tuple[int, tuple[int, ...], tuple[Frame, ...]]:
        kid = self.memo.frame(("gpu", name), demangle(name), GPU_BINARY, GPU_KERNEL_KIND)
        ids = cpu[0] + (kid,)
        return stack_id(ids), ids, cpu[1] + (self.memo.by_id[kid],)

    def _symbolize(self, misses: dict[tuple, tuple[list, tuple, tuple]], tables: TableLookup,
                   stats: SymbolizeStats) -> dict[tuple, Symbolized]:
        """Every missed stack at once: the stacks of one process (same mappings id, same code objects) as one
        pseudo-process, so its mappings are laid out once; a stack whose (binary, offset) form is known is looked
        up, the others are resolved together. Returns the ones not cached (a table was missing)."""
        order = list(misses)
        procs = _pseudo_processes(misses, order)
        groups: dict[tuple[str, str], int] = {}
        group, file_off = map_addresses(procs, groups)
        lens = np.concatenate([st.user_lens for _, st in procs])
        bounds = np.concatenate(([0], np.cumsum(lens))).tolist()
        number = np.array([self.binaries.setdefault(g, len(self.binaries)) for g in groups] + [-1], dtype=np.int64)
        rows = np.stack([number[group], file_off.view(np.int64)], axis=1)  # no group (-1): the last number, -1
        forms = [(rows[bounds[i]:bounds[i + 1]].tobytes(), misses[key][2]) for i, key in enumerate(order)]
        first: dict[tuple, int] = {}  # form -> the first missed stack of the call with it
        todo = []
        for i, form in enumerate(forms):
            if form not in first:
                first[form] = i
                if form not in self.by_offsets:
                    todo.append(i)
        fresh = self._resolve(todo, procs, group, file_off, lens, bounds, forms, groups, tables, stats) if todo \
            else {}
        uncached = {}
        for i, key in enumerate(order):
            hit = self.by_offsets.get(forms[i])
            (ids, frames), unknown = hit if hit is not None else fresh[first[forms[i]]]
            stats.frames += len(ids)
            stats.unknown_frames += unknown
            if hit is None:
                uncached[key] = (ids, frames)  # a table was missing: used for this call, symbolized again next time
            else:
                self.cpu[key] = (ids, frames)
        return uncached

    def _resolve(self, todo: list[int], procs: list, group: np.ndarray, file_off: np.ndarray, lens: np.ndarray,
                 bounds: list[int], forms: list[tuple], groups: dict[tuple[str, str], int], tables: TableLookup,
                 stats: SymbolizeStats) -> dict[int, tuple[Symbolized, int]]:
        """The stacks `todo` (indexes into forms) symbolized together; each complete one kept under its form.
        Returns (symbolized, unknown frames) of the ones that are not complete (a table was missing)."""
        sel = concat_ranges(np.array([bounds[i] for i in todo], dtype=np.int64), lens[todo])
        owner = np.repeat(np.arange(len(procs)), [len(st.user_addrs) for _, st in procs])[sel]
        flags = np.zeros(len(sel), dtype=np.int8)
        call = SymbolizeStats()
        ids = user_frame_ids(group[sel], file_off[sel], lens[todo], groups, tables, self.memo, call, owner,
                             [proc["code_objects"] for proc, _ in procs], flags)
        stats.missing_build_ids |= call.missing_build_ids
        stats.unknown_build_ids |= call.unknown_build_ids
        uids = ids.tolist()
        unknown = np.cumsum(np.concatenate(([0], (flags & (UNKNOWN | PY_UNKNOWN)) != 0))).tolist()
        missing = np.cumsum(np.concatenate(([0], (flags & MISSING) != 0))).tolist()
        by_id = self.memo.by_id
        incomplete = {}
        at = 0
        for i in todo:
            end = at + bounds[i + 1] - bounds[i]
            frame_ids = tuple(uids[at:end][::-1])  # leaf-first addresses, root-first frames
            value = ((frame_ids, tuple(by_id[f] for f in dict.fromkeys(frame_ids))), unknown[end] - unknown[at])
            if missing[end] > missing[at]:
                incomplete[i] = value
            else:
                self.by_offsets[forms[i]] = value
            at = end
        return incomplete


def _pseudo_processes(misses: dict[tuple, tuple[list, tuple, tuple]], order: list[tuple]) -> list[tuple]:
    """The missed stacks as (process, PackedStacks), one process per (mappings id, code objects), `order` rearranged
    in place so the stacks of a process are consecutive."""
    by_proc: dict[tuple, list[tuple]] = {}
    for key in order:
        by_proc.setdefault((key[0], misses[key][2]), []).append(key)
    order.clear()
    procs = []
    for (_, codes), keys in by_proc.items():
        addrs = [misses[k][1] for k in keys]
        lens = np.fromiter(map(len, addrs), dtype=np.int64, count=len(addrs))
        user = np.fromiter(chain.from_iterable(addrs), dtype=np.int64, count=int(lens.sum()))
        none = np.zeros(len(keys), np.int64)
        procs.append(({"mappings": misses[keys[0]][0],
                       "code_objects": [{"qualname": q, "file": f, "first_line": n} for q, f, n in codes]},
                      PackedStacks(none, none, user, lens, np.zeros(0, np.int64), none)))
        order.extend(keys)
    return procs


__all__ = ["Frame", "LaunchStacks", "Symbolized"]
