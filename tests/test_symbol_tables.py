"""Symbol tables: chunk assembly, zero-size symbols, segments, and the memory bound."""

import numpy as np

from processors.symbol_tables import SymbolTables, as_u64, table_from_chunks
from schemas.wire import u64_to_long


def chunk(build_id="b", index=0, count=1, addrs=(), sizes=(), names=(), segments=()):
    return {"build_id": build_id, "binary": "lib.so", "kind": "ELF", "chunk_index": index, "chunk_count": count,
            "load_segments": list(segments), "addrs": list(addrs), "sizes": list(sizes), "names": list(names)}


def test_zero_size_symbols_reach_the_next_one_and_gaps_miss():
    t = table_from_chunks([chunk(addrs=[0x100, 0x200, 0x300], sizes=[0, 0x10, 0], names=["a", "b", "c"])])
    got = t.lookup(as_u64([0x0FF, 0x100, 0x1FF, 0x200, 0x20F, 0x210, 0x2FF, 0x300, 0xFFF, 0x1000,
                           u64_to_long(2**64 - 1)]))
    assert got.tolist() == [-1, 0, 0, 1, 1, -1, -1, 2, 2, -1, -1]  # the last zero-size symbol ends at its page


def test_chunks_in_any_order_and_unsorted_symbols_assemble_sorted():
    tables = SymbolTables()
    assert tables.add_chunk(chunk(index=1, count=2, addrs=[0x50, 0x10], sizes=[8, 8], names=["z", "x"])) is None
    assert "b" not in tables
    t = tables.add_chunk(chunk(index=0, count=2, addrs=[0x30], sizes=[8], names=["y"]))
    assert t is not None and tables.get("b") is t
    assert t.names == ["x", "y", "z"]
    assert t.starts.tolist() == [0x10, 0x30, 0x50]


def test_file_offsets_map_through_load_segments():
    t = table_from_chunks([chunk(segments=[{"file_offset": 0x2000, "vaddr": 0x3000, "memsz": 0x800},
                                           {"file_offset": 0, "vaddr": 0, "memsz": 0x1000}])])
    assert t.to_vaddr(np.array([0x10, 0x2010, 0x1800], dtype=np.uint64)).tolist() == [0x10, 0x3010, 0x1800]


def test_memory_bound_evicts_least_recently_used_and_counts_it():
    tables = SymbolTables(max_symbols=4, max_partial=1)
    for b in ("p", "q", "r"):
        tables.add_chunk(chunk(build_id=b, addrs=[1, 2], sizes=[1, 1], names=["f", "g"]))
        if b == "q":
            tables.get("p")  # p becomes the most recently used
    assert "p" in tables and "r" in tables and "q" not in tables
    assert tables.evicted == 1
    tables.add_chunk(chunk(build_id="s", index=0, count=2))
    tables.add_chunk(chunk(build_id="t", index=0, count=2))
    assert tables.partial_dropped == 1
