"""The kernel symbol table from this machine's real /proc/kallsyms, and the parser on hand-made text."""

from __future__ import annotations

import numpy as np

from processors.symbol_tables import table_from_chunks
from producers.kallsyms import kernel_build_id, kernel_symbol_chunks, parse_kallsyms, read_kallsyms
from schemas.single_object import encode
from schemas.wire import KERNEL_BINARY
from tests.elf_helpers import unavailable

SAMPLE = """\
ffffffff81000000 T _stext
ffffffff81000000 T _text
ffffffff81000100 t helper
ffffffff81000200 D some_data
ffffffff81000300 W weak_fn
0000000000000000 T hidden_fn
ffffffffc0001000 t mod_fn\t[nf_tables]
"""


def test_parse_keeps_text_symbols_first_alias_and_strips_module_suffix() -> None:
    addrs, names, hidden = parse_kallsyms(SAMPLE)
    assert names == ["_stext", "helper", "weak_fn", "mod_fn"]
    assert addrs == [0xFFFFFFFF81000000, 0xFFFFFFFF81000100, 0xFFFFFFFF81000300, 0xFFFFFFFFC0001000]
    assert hidden == 1


def test_build_id_is_per_boot() -> None:
    a, b = kernel_build_id("6.1.0", "boot-a"), kernel_build_id("6.1.0", "boot-b")
    assert a.startswith("kernel-6.1.0-") and a != b and len(a.rsplit("-", 1)[1]) == 16
    assert kernel_build_id() == kernel_build_id()


def test_real_kallsyms_round_trips_through_chunks() -> None:
    syms = read_kallsyms()
    if not len(syms):
        unavailable(f"/proc/kallsyms shows no addresses here ({syms.hidden} hidden: kptr_restrict, not root)")
    known = next((n for n in ("do_syscall_64", "vfs_read", "schedule") if n in syms.names), None)
    assert known, "none of do_syscall_64, vfs_read, schedule in /proc/kallsyms"
    addr = syms.addrs[syms.names.index(known)]
    chunks = kernel_symbol_chunks(syms, max_bytes=256 * 1024)
    assert len(chunks) > 1 and sum(len(c["names"]) for c in chunks) == len(syms)
    assert all(len(encode("SymbolChunk", c)) <= 256 * 1024 for c in chunks)
    assert all(c["kind"] == "KERNEL" and c["binary"] == KERNEL_BINARY for c in chunks)
    for c in chunks[:2]:
        encode("SymbolChunk", c)  # negative longs for kernel addresses are valid Avro
    table = table_from_chunks(chunks)
    found = table.lookup(np.array([addr, addr + 1], dtype=np.uint64)).tolist()
    assert [table.names[i] for i in found] == [known, known]
