"""Symbol tables keyed by build id, assembled from `symbols` chunks, with vectorized address lookup."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np


class BadChunk(ValueError):
    """A SymbolChunk that cannot be part of a table (its index outside its count, arrays of different lengths)."""


def check_chunk(chunk: dict) -> None:
    """Raise BadChunk when a decoded SymbolChunk is not self-consistent: it comes from a topic anyone may write."""
    count, index = chunk["chunk_count"], chunk["chunk_index"]
    if not 0 <= index < count:
        raise BadChunk(f"symbol chunk {index} of {count} for build id {chunk['build_id'][:80]!r}")
    if not len(chunk["addrs"]) == len(chunk["sizes"]) == len(chunk["names"]):
        raise BadChunk(f"symbol chunk for build id {chunk['build_id'][:80]!r} has {len(chunk['addrs'])} addresses, "
                       f"{len(chunk['sizes'])} sizes and {len(chunk['names'])} names")


def as_u64(values: list[int]) -> np.ndarray:
    """Avro longs (addresses with the same bits) as uint64."""
    return np.asarray(values, dtype=np.int64).view(np.uint64)


@dataclass
class SymbolTable:
    build_id: str
    binary: str
    kind: str  # ELF, KERNEL or PERFMAP
    starts: np.ndarray  # uint64, sorted
    ends: np.ndarray  # uint64, exclusive
    names: list[str]
    seg_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    seg_vaddrs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    seg_sizes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))

    def __len__(self) -> int:
        return len(self.names)

    def to_vaddr(self, file_offsets: np.ndarray) -> np.ndarray:
        """File offsets to ELF virtual addresses through the PT_LOAD segments (identity without segments)."""
        if len(self.seg_offsets) == 0:
            return file_offsets
        i = np.searchsorted(self.seg_offsets, file_offsets, side="right") - 1
        i = np.clip(i, 0, len(self.seg_offsets) - 1)
        inside = (file_offsets >= self.seg_offsets[i]) & (file_offsets - self.seg_offsets[i] < self.seg_sizes[i])
        shifted = file_offsets - self.seg_offsets[i] + self.seg_vaddrs[i]
        return np.where(inside, shifted, file_offsets)

    def lookup(self, vaddrs: np.ndarray) -> np.ndarray:
        """Index of the symbol containing each address, or -1."""
        if len(self.starts) == 0:
            return np.full(len(vaddrs), -1, dtype=np.int64)
        i = np.searchsorted(self.starts, vaddrs, side="right").astype(np.int64) - 1
        ok = (i >= 0) & (vaddrs < self.ends[np.maximum(i, 0)])
        return np.where(ok, i, -1)


def table_from_chunks(chunks: list[dict]) -> SymbolTable:
    """Join the chunks of one build id (any order) into one sorted table."""
    chunks = sorted(chunks, key=lambda c: c["chunk_index"])
    first = chunks[0]
    starts = np.concatenate([as_u64(c["addrs"]) for c in chunks]) if chunks else np.zeros(0, np.uint64)
    sizes = np.concatenate([as_u64(c["sizes"]) for c in chunks])
    names = [n for c in chunks for n in c["names"]]
    order = np.argsort(starts, kind="stable")
    starts, sizes = starts[order], sizes[order]
    names = [names[i] for i in order]
    # A zero size (common in assembly and kallsyms) extends the symbol to the next one; the last such symbol ends
    # at its page's end, as perf does, rather than swallowing every higher address.
    page = np.uint64(4096)
    last_end = (starts[-1:] // page + np.uint64(1)) * page if len(starts) else starts[-1:]
    nexts = np.append(starts[1:], last_end)
    ends = np.where(sizes > 0, starts + sizes, nexts)
    segs = sorted(first["load_segments"], key=lambda s: s["file_offset"])
    return SymbolTable(
        build_id=first["build_id"], binary=first["binary"], kind=first["kind"],
        starts=starts, ends=ends, names=names,
        seg_offsets=as_u64([s["file_offset"] for s in segs]),
        seg_vaddrs=as_u64([s["vaddr"] for s in segs]),
        seg_sizes=as_u64([s["memsz"] for s in segs]),
    )


class SymbolTables:
    """Complete tables by build id, bounded by total symbols (least recently used leaves first)."""

    def __init__(self, max_symbols: int = 20_000_000, max_partial: int = 1_000) -> None:
        self.max_symbols = max_symbols
        self.max_partial = max_partial
        self._tables: OrderedDict[str, SymbolTable] = OrderedDict()
        self._partial: OrderedDict[str, dict[int, dict]] = OrderedDict()
        self._symbols = 0
        self.evicted = 0
        self.partial_dropped = 0
        # bumped whenever a table present so far is replaced or evicted: what was symbolized with it may differ now
        self.generation = 0

    def add_chunk(self, chunk: dict) -> SymbolTable | None:
        """Take one chunk; returns the table once its last chunk arrived. BadChunk for an inconsistent one."""
        check_chunk(chunk)
        build_id = chunk["build_id"]
        parts = self._partial.setdefault(build_id, {})
        parts[chunk["chunk_index"]] = chunk
        if len(parts) < chunk["chunk_count"]:
            while len(self._partial) > self.max_partial:
                self._partial.popitem(last=False)
                self.partial_dropped += 1
            return None
        del self._partial[build_id]
        table = table_from_chunks([parts[i] for i in range(chunk["chunk_count"]) if i in parts])
        self.put(table)
        return table

    def put(self, table: SymbolTable) -> None:
        old = self._tables.pop(table.build_id, None)
        if old is not None:
            self._symbols -= len(old)
            self.generation += 1
        self._tables[table.build_id] = table
        self._symbols += len(table)
        while self._symbols > self.max_symbols and len(self._tables) > 1:
            _, gone = self._tables.popitem(last=False)
            self._symbols -= len(gone)
            self.evicted += 1
            self.generation += 1

    def get(self, build_id: str) -> SymbolTable | None:
        table = self._tables.get(build_id)
        if table is not None:
            self._tables.move_to_end(build_id)
        return table

    def __contains__(self, build_id: str) -> bool:
        return build_id in self._tables

    def __len__(self) -> int:
        return len(self._tables)
