"""Unwind tables for the BPF stack walker: an x86_64 ELF file's call-frame information (.eh_frame, then .debug_frame
for what .eh_frame leaves uncovered) compiled into compact rows, one per address where the rule changes.

The rows are the contract with the walker, 12 bytes each, little-endian (ROW):

    struct unwind_row { u32 pc; s32 cfa_offset; s16 rbp_offset; u8 cfa_kind; u8 rbp_kind; };

`pc` is an ELF virtual address; the row's rule holds up to the next row's pc. Rows are sorted, pcs strictly
increasing, and no two neighbours carry the same rule. CFA_* and RBP_* (producers/unwind_rules.py) say what the
kinds mean; CFA_NONE rows mark the gaps between FDEs and the end of the last one. A file whose covered addresses do
not fit in 32 bits (a kernel image, say) gets UnwindTableError: the walker's pc is a u32. So does a file that is no
x86_64 ELF file at all; anything less (broken entries, hostile instructions) costs only the rows it spoils, counted
in `stats`.
"""

from __future__ import annotations

import gc
import heapq
import os
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from producers.unwind_cfi import CfiRows, read_cfi
from producers.unwind_elf import CfiSources, Image, UnwindTableError, locate
from producers.unwind_rules import (
    CFA_DEREF_RBP,
    CFA_DEREF_RSP,
    CFA_END,
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    NONE_CODE,
    RBP_AT_RBP,
    RBP_SAME,
    RBP_SAVED,
    RBP_UNKNOWN,
    ROW,
    code_fields,
)

__all__ = ["CFA_DEREF_RBP", "CFA_DEREF_RSP", "CFA_END", "CFA_NONE", "CFA_PLT", "CFA_RBP", "CFA_RSP", "CFA_SIGNAL",
           "CFA_UNSUPPORTED", "RBP_AT_RBP", "RBP_SAME", "RBP_SAVED", "RBP_UNKNOWN", "ROW", "ROW_DTYPE", "UnwindTable",
           "UnwindTableError", "compile_unwind_table", "compile_unwind_table_bytes", "rows_to_text"]

ROW_DTYPE = np.dtype([("pc", "<u4"), ("cfa_offset", "<i4"), ("rbp_offset", "<i2"), ("cfa_kind", "u1"),
                      ("rbp_kind", "u1")])
_PACKED = np.dtype([("pc", "<u4"), ("code", "<u8")])  # the same 12 bytes: the rule as one rule code
SCATTER_ROWS = 1 << 18  # rows moved at a time into address order
CFA_NAMES = {CFA_NONE: "none", CFA_RSP: "rsp", CFA_RBP: "rbp", CFA_PLT: "plt", CFA_DEREF_RBP: "*rbp",
             CFA_DEREF_RSP: "*rsp", CFA_SIGNAL: "signal", CFA_END: "end", CFA_UNSUPPORTED: "unsupported"}


@dataclass
class UnwindTable:
    """Packed rows (ROW each) and what compiling them met: entries read, skipped, cut short, rows unsupported."""

    rows: bytes
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.rows) // ROW.size

    def array(self) -> np.ndarray:
        """The rows as a structured array (ROW_DTYPE), without a copy."""
        return np.frombuffer(self.rows, ROW_DTYPE)

    def rule_at(self, pc: int) -> tuple[int, int, int, int]:
        """(cfa_kind, cfa_offset, rbp_kind, rbp_offset) for an address, as the walker finds it."""
        packed = np.frombuffer(self.rows, _PACKED)
        i = int(np.searchsorted(packed["pc"], pc, side="right")) - 1
        return code_fields(int(packed["code"][i])) if i >= 0 else (CFA_NONE, 0, RBP_SAME, 0)


def rows_to_text(table: UnwindTable) -> str:
    """One line per row, for reading by eye: `0x401000 rsp+8 rbp=cfa-16`."""
    lines = []
    for pc, cfa_offset, rbp_offset, cfa_kind, rbp_kind in table.array().tolist():
        cfa = CFA_NAMES.get(cfa_kind, str(cfa_kind))
        if cfa_kind in (CFA_RSP, CFA_RBP, CFA_DEREF_RBP, CFA_DEREF_RSP):
            cfa += f"{cfa_offset:+d}"
        elif cfa_kind == CFA_PLT:
            cfa = f"plt rsp{cfa_offset:+d} (+8 from rip&15 >= {rbp_offset})"
        rbp = {RBP_SAME: "", RBP_SAVED: f" rbp=cfa{rbp_offset:+d}", RBP_UNKNOWN: " rbp=?",
               RBP_AT_RBP: f" rbp=*(rbp{rbp_offset:+d})"}.get(rbp_kind, "")
        lines.append(f"0x{pc:x} {cfa}{rbp if cfa_kind != CFA_PLT else ''}")
    return "\n".join(lines) + ("\n" if lines else "")


def _paint(members: list[tuple[int, int, int, list[int], list[int]]]) -> tuple[list[int], list[int], list[int],
                                                                                set[int]]:
    """Rows for FDEs whose ranges overlap, sorted by start: each address takes the rule of the first FDE read that
    covers it (.eh_frame before .debug_frame). members: (start, end, order read, pcs, codes). Returns the rows (pcs,
    codes, sort ranks: 0 for the CFA_NONE at the end) and the orders of the FDEs that own some of the addresses."""
    bounds = sorted({m[0] for m in members} | {m[1] for m in members})
    pcs: list[int] = []
    codes: list[int] = []
    owners: set[int] = set()
    heap: list[tuple[int, int]] = []
    j = 0
    for k in range(len(bounds) - 1):
        b, nb = bounds[k], bounds[k + 1]
        while j < len(members) and members[j][0] <= b:
            heapq.heappush(heap, (members[j][2], j))
            j += 1
        while heap and members[heap[0][1]][1] <= b:
            heapq.heappop(heap)
        if not heap:  # cannot happen (the members' union has no hole), but a gap is what it would be
            pcs.append(b)
            codes.append(NONE_CODE)
            continue
        _, _, order, own_pcs, own_codes = members[heap[0][1]]
        owners.add(order)
        i = bisect_right(own_pcs, b) - 1
        pcs.append(b)
        codes.append(own_codes[i])
        i += 1
        while i < len(own_pcs) and own_pcs[i] < nb:
            pcs.append(own_pcs[i])
            codes.append(own_codes[i])
            i += 1
    ranks = [1] * len(pcs)
    pcs.append(bounds[-1])
    codes.append(NONE_CODE)
    ranks.append(0)
    return pcs, codes, ranks, owners


def _scattered(cfi: CfiRows, start: np.ndarray, end: np.ndarray, nrows: np.ndarray,
               order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of FDEs that do not overlap (what linkers write, though not in address order: hot and cold text):
    each FDE's rows moved as a block to its place in address order, a CFA_NONE after each unless the next FDE
    starts there. Nothing as big as the rows is sorted, the moves go a slice at a time, and each big array goes as
    soon as it has been used: a 500 MB binary has millions of rows."""
    gap = np.ones(len(order), bool)  # the FDE's end needs a CFA_NONE row
    gap[:-1] = end[order[:-1]] != start[order[1:]]
    block = nrows[order] + gap
    first = np.cumsum(block) - block  # where each FDE's rows go, in address order
    row0 = np.cumsum(nrows) - nrows  # where they are
    shift = np.empty(len(order), np.int64)
    shift[order] = first - row0[order]
    step = max(1, len(start) * SCATTER_ROWS // max(int(row0[-1] + nrows[-1]), 1))

    def slices():  # (rows r0:r1, where they go)
        for f0 in range(0, len(start), step):
            f1 = min(f0 + step, len(start))
            r0, r1 = int(row0[f0]), int(row0[f1 - 1] + nrows[f1 - 1])
            dest = np.repeat(shift[f0:f1], nrows[f0:f1])
            dest += np.arange(r0, r1)
            yield f0, f1, r0, r1, dest

    total = int(block.sum())
    ends, end_pcs = (first + block - 1)[gap], end[order][gap]
    pc = np.empty(total, np.uint32)
    locs = np.frombuffer(cfi.row_loc, np.uint32)
    for f0, f1, r0, r1, dest in slices():
        moved = np.repeat(start[f0:f1], nrows[f0:f1])
        moved += locs[r0:r1]
        pc[dest] = moved
    del locs
    cfi.row_loc = array("I")
    pc[ends] = end_pcs
    code = np.empty(total, np.uint64)
    codes = np.frombuffer(cfi.row_code, np.uint64)
    for _, _, r0, r1, dest in slices():
        code[dest] = codes[r0:r1]
    del codes
    cfi.row_code = array("Q")
    code[ends] = NONE_CODE
    return pc, code


def _sorted(cfi: CfiRows, start: np.ndarray, end: np.ndarray, nrows: np.ndarray, idx: np.ndarray, eh_fdes: int,
            stats: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of FDEs some of which overlap: sorted by pc, those of overlapping FDEs painted (_paint), a CFA_NONE
    at each end sorting before a row at the same pc. idx: the FDEs in address order."""
    s, e = start[idx], end[idx]
    overlap = np.zeros(len(idx), bool)
    overlap[1:] = s[1:] < np.maximum.accumulate(e)[:-1]
    cluster = np.cumsum(~overlap) - 1
    shared = np.bincount(cluster)[cluster] > 1  # FDEs that overlap another
    plain = np.zeros(len(start), bool)
    plain[idx[~shared]] = True
    row_plain = np.repeat(plain, nrows)
    locs, codes = np.frombuffer(cfi.row_loc, np.uint32), np.frombuffer(cfi.row_code, np.uint64)
    ends = e[~shared]
    parts_pc = [(np.repeat(start, nrows) + locs)[row_plain], ends]
    parts_code = [codes[row_plain], np.full(len(ends), NONE_CODE, np.uint64)]
    parts_rank = [np.ones(len(parts_pc[0]), np.uint8), np.zeros(len(ends), np.uint8)]
    del row_plain
    debug_owners = int((idx[~shared] >= eh_fdes).sum())
    if shared.any():
        first = np.cumsum(nrows) - nrows
        for group in np.split(idx[shared], np.flatnonzero(np.diff(cluster[shared])) + 1):
            spans = []
            for f in group.tolist():
                a, n, at = int(first[f]), int(nrows[f]), int(start[f])
                spans.append((at, int(end[f]), f, (locs[a:a + n].astype(np.int64) + at).tolist(),
                              codes[a:a + n].tolist()))
            g_pcs, g_codes, g_ranks, owners = _paint(spans)
            debug_owners += sum(o >= eh_fdes for o in owners)
            parts_pc.append(np.array(g_pcs, np.uint32))
            parts_code.append(np.array(g_codes, np.uint64))
            parts_rank.append(np.array(g_ranks, np.uint8))
    stats["from_debug_frame"] = debug_owners
    stats["overlapping_fdes"] = int(shared.sum())
    pc, code = np.concatenate(parts_pc), np.concatenate(parts_code)
    key = pc.astype(np.uint64) * np.uint64(2) + np.concatenate(parts_rank)  # at one pc, a CFA_NONE sorts first
    del parts_pc, parts_code, parts_rank
    order = np.argsort(key, kind="stable")
    del key
    pc, code = pc[order], code[order]
    last = np.ones(len(pc), bool)  # of the rows at one pc, the last holds: the others cover nothing
    last[:-1] = pc[1:] != pc[:-1]
    return pc[last], code[last]


def _pack(pc: np.ndarray, code: np.ndarray) -> bytearray:
    """The rows as ROWs, each the first of its run of one rule; a slice at a time (no copy of pc or code)."""
    keep = np.ones(len(code), bool)
    keep[1:] = code[1:] != code[:-1]
    out = bytearray(int(keep.sum()) * ROW.size)
    packed = np.frombuffer(out, _PACKED)
    at = 0
    for c0 in range(0, len(code), SCATTER_ROWS):
        k = keep[c0:c0 + SCATTER_ROWS]
        n = int(k.sum())
        packed["pc"][at:at + n] = pc[c0:c0 + SCATTER_ROWS][k]
        packed["code"][at:at + n] = code[c0:c0 + SCATTER_ROWS][k]
        at += n
    return out


def _assemble(cfi: CfiRows, eh_fdes: int, stats: dict[str, int]) -> bytes:
    """The packed rows of every FDE kept: sorted, overlaps resolved, gaps marked, neighbours with one rule merged."""
    start, end = np.frombuffer(cfi.fde_start, np.uint32), np.frombuffer(cfi.fde_end, np.uint32)
    nrows = np.frombuffer(cfi.fde_rows, np.uint32).astype(np.int64)
    stats["from_debug_frame"] = max(len(cfi) - eh_fdes, 0)
    stats["overlapping_fdes"] = 0
    if not len(start):
        return b""
    order = np.argsort(start, kind="stable")  # ties in the order read: .eh_frame first
    if (start[order[1:]] >= end[order[:-1]]).all():
        pc, code = _scattered(cfi, start, end, nrows, order)
    else:
        pc, code = _sorted(cfi, start, end, nrows, order, eh_fdes, stats)
    cfi.row_loc, cfi.row_code = array("I"), array("Q")
    del start, end, nrows, order
    out = _pack(pc, code)
    del pc, code
    kinds = np.frombuffer(out, _PACKED)["code"] >> np.uint64(48) & np.uint64(0xFF)
    stats["unsupported_rows"] = int((kinds == CFA_UNSUPPORTED).sum())
    del kinds
    return bytes(out)


def _compile(img: Image) -> UnwindTable:
    src: CfiSources = locate(img)
    cfi = CfiRows(src.code_ranges)
    collecting = gc.isenabled()
    gc.disable()  # the reader makes millions of small acyclic objects: each collection would walk them all
    try:
        if src.eh_frame:
            read_cfi(src.eh_frame, src.eh_frame_addr, True, src.bases, cfi)
        eh_fdes, fdes = len(cfi), cfi.stats["fdes"]
        if src.debug_frame:
            read_cfi(src.debug_frame, 0, False, src.bases, cfi)
    finally:
        if collecting:
            gc.enable()
    del src
    stats = dict(cfi.stats)
    stats["debug_frame_fdes"] = stats["fdes"] - fdes
    if stats["fdes_past_32_bits"]:
        raise UnwindTableError(f"{stats['fdes_past_32_bits']} FDEs cover addresses past 32 bits (a row's pc is a u32)")
    rows = _assemble(cfi, eh_fdes, stats)
    stats["rows"] = len(rows) // ROW.size
    return UnwindTable(rows, stats)


def compile_unwind_table_bytes(data: bytes) -> UnwindTable:
    """The unwind table of an ELF image in memory (a vDSO copied from a process)."""
    return _compile(Image.of_bytes(data))


def compile_unwind_table(path: str | os.PathLike) -> UnwindTable:
    """The unwind table of an ELF file; only its headers and CFI sections are read."""
    try:
        with open(path, "rb") as f:
            fd = f.fileno()
            return _compile(Image(os.fstat(fd).st_size, lambda off, n: os.pread(fd, n, off)))
    except OSError as exc:
        raise UnwindTableError(f"{os.fspath(path)}: {exc.strerror or exc}") from exc
    except UnwindTableError as exc:
        raise UnwindTableError(f"{os.fspath(path)}: {exc}") from None
