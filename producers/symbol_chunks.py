"""One symbol table as SymbolChunk records (schemas/symbol_chunk.v1.avsc), each under a message-size limit.

Chunks are cut by encoded bytes, not by symbol count: names vary from a few bytes (C) to hundreds (Rust, C++
templates), and 5,000 of librustc_driver's encode to more than Kafka's default message limit. A symbol's cost is
bounded from above (two longs, a length and the name's UTF-8 bytes), so a chunk is never over the limit unless a
single name is.
"""

from __future__ import annotations

import numpy as np

from schemas.wire import DEFAULT_MAX_BYTES

# Avro's variable-length longs take at most 10 bytes; a string's length prefix at most 5 for any real name.
_LONG_MAX_BYTES = 10
_SYMBOL_OVERHEAD = 2 * _LONG_MAX_BYTES + 5  # address, size, name length
# The single-object header (10 bytes), chunk index and count, the enum, the arrays' block counts and ends.
_FIXED_OVERHEAD = 10 + 2 * 5 + 1 + 3 * (2 * _LONG_MAX_BYTES + 1) + 2 * _LONG_MAX_BYTES


def chunk_symbol_table(build_id: str, binary: str, kind: str, load_segments: list[dict], addrs: list[int],
                       sizes: list[int], names: list[str], max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[dict]:
    """SymbolChunk records of one table (addresses and sizes already as Avro longs), each encoding to at most
    `max_bytes` (None: one chunk). Always at least one chunk, so a table without symbols still publishes its build id
    and segments."""
    header = _FIXED_OVERHEAD + len(build_id.encode()) + len(binary.encode()) + 3 * _LONG_MAX_BYTES * len(load_segments)
    bounds = _chunk_bounds([len(n.encode()) + _SYMBOL_OVERHEAD for n in names],
                           None if max_bytes is None else max_bytes - header)
    return [{"build_id": build_id, "binary": binary, "kind": kind, "chunk_index": i, "chunk_count": len(bounds),
             "load_segments": load_segments, "addrs": addrs[lo:hi], "sizes": sizes[lo:hi], "names": names[lo:hi]}
            for i, (lo, hi) in enumerate(bounds)]


def _chunk_bounds(costs: list[int], budget: int | None) -> list[tuple[int, int]]:
    """[lo, hi) index ranges, greedily as long as their costs fit `budget`; one symbol at least per range."""
    if budget is None or not costs:
        return [(0, len(costs))]
    ends = np.cumsum(np.asarray(costs, dtype=np.int64))
    bounds, lo = [], 0
    while lo < len(costs):
        spent = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, spent + budget, side="right")))
        bounds.append((lo, hi))
        lo = hi
    return bounds
