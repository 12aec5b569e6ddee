"""Symbol tables cut into SymbolChunk records by encoded bytes: every chunk fits the message limit, whatever the
names' lengths, and the chunks put back together are the table."""

from __future__ import annotations

import numpy as np

from processors.symbol_tables import table_from_chunks
from producers.elf_symbols import ElfSymbols, symbol_chunks
from producers.kallsyms import KernelSymbols, kernel_symbol_chunks
from schemas.single_object import encode
from schemas.wire import DEFAULT_MAX_BYTES


def _rust_like(count: int, name_len: int) -> ElfSymbols:
    """A table like librustc_driver's: many long demangled names (the one that broke 5,000-symbol chunks)."""
    names = [f"<rustc_middle::ty::Ty as core::fmt::Debug>::fmt::h{i:016x}".ljust(name_len, "_") for i in range(count)]
    addrs = np.arange(count, dtype=np.uint64) * 16 + 0x10000
    return ElfSymbols("/opt/rust/lib/librustc_driver.so", "ab" * 20, ".symtab", addrs,
                      np.full(count, 16, np.uint64), names, np.array([0], np.uint64), np.array([0], np.uint64),
                      np.array([count * 16 + 0x10000], np.uint64))


def test_long_names_are_chunked_under_the_message_limit_and_round_trip() -> None:
    syms = _rust_like(20_000, 250)  # ~5.5 MB of names; 5,000 of them alone encode to ~1.3 MB
    chunks = symbol_chunks(syms)
    sizes = [len(encode("SymbolChunk", c)) for c in chunks]
    assert max(sizes) <= DEFAULT_MAX_BYTES and len(chunks) >= 6
    assert max(sizes) > DEFAULT_MAX_BYTES * 0.9  # chunks are filled, not cut needlessly small
    assert {c["chunk_count"] for c in chunks} == {len(chunks)} and [c["chunk_index"] for c in chunks] == \
        list(range(len(chunks)))
    table = table_from_chunks(list(reversed(chunks)))
    assert table.names == syms.names and np.array_equal(table.starts, syms.addrs)


def test_a_smaller_limit_is_kept_and_none_means_one_chunk() -> None:
    syms = _rust_like(3_000, 120)
    for limit in (64 * 1024, 8 * 1024):
        chunks = symbol_chunks(syms, max_bytes=limit)
        assert all(len(encode("SymbolChunk", c)) <= limit for c in chunks)
        assert sum(len(c["names"]) for c in chunks) == len(syms)
    (whole,) = symbol_chunks(syms, max_bytes=None)
    assert whole["names"] == syms.names


def test_a_name_longer_than_the_limit_gets_a_chunk_of_its_own() -> None:
    names = ["a", "b" * 5000, "c"]
    chunks = kernel_symbol_chunks(KernelSymbols("k1", [1 << 63, (1 << 63) + 16, (1 << 63) + 32], names),
                                  max_bytes=2048)
    assert [c["names"] for c in chunks] == [["a"], ["b" * 5000], ["c"]]  # the middle one cannot fit: sent alone


def test_an_empty_table_still_publishes_its_build_id() -> None:
    (chunk,) = kernel_symbol_chunks(KernelSymbols("k2", [], []))
    assert (chunk["build_id"], chunk["chunk_count"], chunk["names"]) == ("k2", 1, [])
