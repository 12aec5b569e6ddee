"""Unwind tables of real binaries: programs built here with gcc (frame pointers, none, a realigned stack, PLT stubs,
_start, .debug_frame), the rules pyelftools decodes from the same files, glibc's signal trampoline, the vDSO, the
on-disk cache, and mutated .eh_frame sections that must never make the compiler raise."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import pytest
from elftools.dwarf.callframe import FDE, CallFrameInfo, RegisterRule
from elftools.dwarf.dwarf_expr import DWARFExprParser
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings

from producers.unwind_cache import UnwindTableCache
from producers.unwind_tables import (
    CFA_DEREF_RBP,
    CFA_DEREF_RSP,
    CFA_END,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    RBP_AT_RBP,
    RBP_SAME,
    RBP_SAVED,
    RBP_UNKNOWN,
    ROW,
    ROW_DTYPE,
    UnwindTable,
    compile_unwind_table,
    compile_unwind_table_bytes,
    rows_to_text,
)
from tests.elf_helpers import gcc_build, libc_path, unavailable
from tests.fuzz import targets
from tests.fuzz.records import EDITS, mutate

PROGRAM = """
#include <alloca.h>
#include <stdio.h>
#include <string.h>
__attribute__((noinline)) long work(long *v, int n) {
    long acc = 0;
    for (int i = 0; i < n; i++) { acc += v[i] * (i + 1); if (acc > 1000000) acc = acc / 3 + v[0]; }
    printf("%ld\\n", acc);
    return acc;
}
/* stack arguments, a 64-byte aligned local and alloca: gcc realigns the stack through a DRAP register */
__attribute__((noinline)) long realigned(int n, long a, long b, long c, long d, long e, long g, long h) {
    _Alignas(64) long buf[16];
    long *p = alloca(n * sizeof(long));
    memset(buf, n, sizeof buf);
    p[0] = g + h + a + b + c + d + e;
    buf[2] = work(p, 1);
    return work(buf, n);
}
int main(int argc, char **argv) { (void)argv; return (int)realigned(argc + 3, 1, 2, 3, 4, 5, 6, 7); }
"""
BUILDS = {"fp": ["-fno-omit-frame-pointer"], "nofp": ["-fomit-frame-pointer"],
          "debug": ["-fno-omit-frame-pointer", "-g", "-fno-asynchronous-unwind-tables"],
          "debugz": ["-fno-omit-frame-pointer", "-g", "-fno-asynchronous-unwind-tables", "-gz=zlib"]}
FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SEEDS = sorted((targets.CORPUS / "unwind").glob("*.elf"))


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("unwind")
    return {name: gcc_build(tmp, name, PROGRAM, "-O2", "-fcf-protection=none", *flags)
            for name, flags in BUILDS.items()}


class Program:
    """A built program: its functions (address, size, bytes), its sections, its table."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            symtab = elf.get_section_by_name(".symtab")
            self.symbols = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols() if s["st_value"]}
            text = elf.get_section_by_name(".text")
            self.text_addr, self.text = text["sh_addr"], text.data()
            self.sections = {s.name: s["sh_addr"] for s in elf.iter_sections()}
        self.table = compile_unwind_table(path)

    def code(self, name: str) -> tuple[int, bytes]:
        addr, size = self.symbols[name]
        return addr, self.text[addr - self.text_addr:addr - self.text_addr + size]

    def rules(self, name: str) -> list[tuple[int, int, int, int, int]]:
        """(pc, cfa_kind, cfa_offset, rbp_kind, rbp_offset) of the rows inside a function."""
        addr, size = self.symbols[name]
        return [(pc, ck, co, rk, ro) for pc, co, ro, ck, rk in self.table.array().tolist() if addr <= pc < addr + size]


def test_a_function_with_a_frame_pointer(programs):
    prog = Program(programs["fp"])
    addr, code = prog.code("work")
    assert code[0] == 0x55  # push rbp
    mov = code.index(b"\x48\x89\xe5")  # mov rbp, rsp
    assert prog.table.rule_at(addr) == (CFA_RSP, 8, RBP_SAME, 0)
    assert prog.table.rule_at(addr + 1) == (CFA_RSP, 16, RBP_SAVED, -16)
    assert prog.table.rule_at(addr + mov + 3) == (CFA_RBP, 16, RBP_SAVED, -16)
    ret = code.index(b"\xc9\xc3") + 1  # leave; ret
    assert prog.table.rule_at(addr + ret)[:2] == (CFA_RSP, 8)
    assert any(r[1:3] == (CFA_RBP, 16) for r in prog.rules("work") if r[0] > addr + ret)  # blocks after the ret


def test_a_function_without_one(programs):
    prog = Program(programs["nofp"])
    addr, _ = prog.code("work")
    rules = prog.rules("work")
    assert rules[0] == (addr, CFA_RSP, 8, RBP_SAME, 0)
    assert {r[1] for r in rules} == {CFA_RSP} and max(r[2] for r in rules) > 8


@pytest.mark.parametrize("build", ["fp", "nofp"])
def test_a_realigned_stack(programs, build):
    """gcc's DRAP: CFA = r10 for a few instructions (unsupported), then *(rbp - 16); the caller's rbp is saved at
    rbp + 0 (DW_CFA_expression: breg6 0)."""
    prog = Program(programs[build])
    addr, code = prog.code("realigned")
    lea = code.index(b"\x4c\x8d\x54\x24\x08")  # lea r10, [rsp + 8]
    assert prog.table.rule_at(addr) == (CFA_RSP, 8, RBP_SAME, 0)
    assert prog.table.rule_at(addr + lea + 5)[0] == CFA_UNSUPPORTED
    assert (CFA_DEREF_RBP, -16, RBP_AT_RBP, 0) in [r[1:] for r in prog.rules("realigned")]


def test_plt_stubs_and_the_outermost_frame(programs):
    prog = Program(programs["fp"])
    plt = prog.sections[".plt"]
    assert prog.table.rule_at(plt) == (CFA_RSP, 16, RBP_SAME, 0)  # PLT0 after `push GOT+8`
    assert prog.table.rule_at(plt + 6) == (CFA_RSP, 24, RBP_SAME, 0)
    assert prog.table.rule_at(plt + 16) == (CFA_PLT, 8, RBP_SAME, 11)  # the stubs: +8 from their 11th byte on
    assert prog.table.rule_at(prog.symbols["_start"][0]) == (CFA_END, 0, RBP_SAME, 0)
    assert "plt rsp+8 (+8 from rip&15 >= 11)" in rows_to_text(prog.table)


def test_debug_frame_when_there_is_no_eh_frame_for_a_function(programs):
    prog, fp = Program(programs["debug"]), Program(programs["fp"])
    assert prog.table.stats["from_debug_frame"] >= 3  # work, realigned, main
    assert [r[1:] for r in prog.rules("work")] == [r[1:] for r in fp.rules("work")]
    assert compile_unwind_table(programs["debugz"]).rows == prog.table.rows  # the same, zlib-compressed


def test_without_section_headers_eh_frame_is_found_through_pt_gnu_eh_frame(programs):
    data = bytearray(programs["fp"].read_bytes())
    data[0x28:0x30] = bytes(8)  # e_shoff
    data[0x3C:0x40] = bytes(4)  # e_shnum, e_shstrndx
    assert compile_unwind_table_bytes(bytes(data)).rows == compile_unwind_table(programs["fp"]).rows


def test_glibc_signal_trampoline():
    """__restore_rt (mov rax, 15; syscall) is covered by an 'S' CIE's FDE, starting one byte early."""
    path = libc_path()
    data = Path(path).read_bytes()
    with open(path, "rb") as f:
        text = ELFFile(f).get_section_by_name(".text")
        start, addr = text["sh_offset"], text["sh_addr"]
    at = data.index(b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05", start) - start + addr
    table = compile_unwind_table(path)
    assert table.rule_at(at) == table.rule_at(at - 1) == (CFA_SIGNAL, 0, RBP_SAME, 0)
    assert table.stats["signal_fdes"] >= 1


def test_the_vdso_of_this_process():
    with open("/proc/self/maps") as f:
        spans = [line.split()[0] for line in f if line.rstrip().endswith("[vdso]")]
    if not spans:
        unavailable("no vDSO mapped")
    lo, hi = (int(x, 16) for x in spans[0].split("-"))
    with open("/proc/self/mem", "rb") as mem:
        mem.seek(lo)
        image = mem.read(hi - lo)
    table = compile_unwind_table_bytes(image)
    assert table.count > 2 and table.stats["fdes"] > 0 and table.stats["fdes_skipped"] == 0


# ---- the rules pyelftools decodes from the same files ------------------------------------------------------------

def _expected(line: dict, signal: bool, parser: DWARFExprParser) -> tuple[int, int, int, int]:
    """pyelftools' row as the walker's rule, written independently of producers/unwind_rules.py."""
    if signal:
        return CFA_SIGNAL, 0, RBP_SAME, 0
    ra = line.get(16)
    if ra is not None and ra.type == RegisterRule.UNDEFINED:
        return CFA_END, 0, RBP_SAME, 0
    if ra is None or ra.type != RegisterRule.OFFSET or ra.arg != -8:
        return CFA_UNSUPPORTED, 0, RBP_SAME, 0
    cfa = line["cfa"]
    if cfa.expr is not None:
        ops = parser.parse_expr(cfa.expr)
        names, n = [op.op_name for op in ops], ops[0].args[0] if ops and ops[0].args else 0
        lits = [f"DW_OP_lit{i}" for i in range(32)]
        if names == ["DW_OP_breg6", "DW_OP_deref"]:
            kind = CFA_DEREF_RBP
        elif names == ["DW_OP_breg7", "DW_OP_deref"]:
            kind = CFA_DEREF_RSP
        elif names in (["DW_OP_breg7"], ["DW_OP_breg6"]):
            kind = CFA_RSP if names[0] == "DW_OP_breg7" else CFA_RBP
        elif names[:4] == ["DW_OP_breg7", "DW_OP_breg16", "DW_OP_lit15", "DW_OP_and"] and ops[1].args == [0] \
                and len(names) == 9 and names[4] in lits and names[5:] == ["DW_OP_ge", "DW_OP_lit3", "DW_OP_shl",
                                                                           "DW_OP_plus"]:
            return CFA_PLT, n, RBP_SAME, lits.index(names[4])
        else:
            return CFA_UNSUPPORTED, 0, RBP_SAME, 0
        off = n
    elif cfa.reg in (6, 7) and -(1 << 31) <= cfa.offset < 1 << 31:
        kind, off = (CFA_RSP if cfa.reg == 7 else CFA_RBP), cfa.offset
    else:
        return CFA_UNSUPPORTED, 0, RBP_SAME, 0
    rbp = line.get(6)
    if rbp is None or rbp.type in (RegisterRule.SAME_VALUE, RegisterRule.UNDEFINED):
        return kind, off, RBP_SAME, 0
    if rbp.type == RegisterRule.OFFSET and -0x8000 <= rbp.arg < 0x8000:
        return kind, off, RBP_SAVED, rbp.arg
    expr = bytes(rbp.arg) if rbp.type == RegisterRule.EXPRESSION else b""
    if expr[:1] == b"\x76" and len(expr) == 2 and expr[1] < 0x80:  # breg6 N (one-byte sleb)
        return kind, off, RBP_AT_RBP, expr[1] - 0x80 if expr[1] & 0x40 else expr[1]
    return kind, off, RBP_UNKNOWN, 0


def _fde_offsets(elf: ELFFile) -> list[int]:
    """Where the FDEs of .eh_frame start (lengths followed, CIEs left out)."""
    data, pos, out = elf.get_section_by_name(".eh_frame").data(), 0, []
    while pos + 8 <= len(data):
        length, ident = struct.unpack_from("<II", data, pos)
        if length == 0:
            break
        if ident:
            out.append(pos)
        pos += 4 + length
    return out


def agreement(path: str, table: UnwindTable, every: int = 1, debug_frame: bool = False) -> tuple[int, list[str]]:
    """pyelftools' decoded rows of every `every`-th FDE against the table: (rows compared, disagreements)."""
    checked, wrong = 0, []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        info = elf.get_dwarf_info()
        parser = DWARFExprParser(info.structs)
        if debug_frame:
            fdes = [e for e in info.CFI_entries() if isinstance(e, FDE)]
        else:  # the reader EH_CFI_entries() builds, asked for the sampled FDEs alone
            sec = info.eh_frame_sec
            reader = CallFrameInfo(sec.stream, sec.size, sec.address, info.structs, for_eh_frame=True)
            fdes = [reader._parse_entry_at(off) for off in _fde_offsets(elf)[::every]]
        for fde in fdes:
            # pyelftools cannot decode DW_CFA_GNU_args_size, which changes no rule; its def_cfa_sf factors by the
            # code alignment (a bug): leave those FDEs out
            fde.instructions = [i for i in fde.instructions if i.opcode.name != "GNU_args_size"]
            if any(i.opcode.name == "def_cfa_sf" for i in fde.instructions):
                continue
            signal = b"S" in fde.cie["augmentation"]  # pyelftools files 'S' under the key True
            start, end = fde["initial_location"], fde["initial_location"] + fde["address_range"]
            last = {line["pc"]: line for line in fde.get_decoded().table}  # the last row at a pc holds there
            for pc, line in last.items():
                if start <= pc < end:
                    checked += 1
                    want, got = _expected(line, signal, parser), table.rule_at(pc)
                    if got != want:
                        wrong.append(f"0x{pc:x}: pyelftools {want}, table {got}")
    return checked, wrong


def real_files() -> list[tuple[str, int]]:
    files = [(libc_path(), 2), ("/usr/bin/gzip", 1), (os.path.realpath("/usr/bin/python3.11"), 5)]
    return [(p, every) for p, every in files if os.path.exists(p)]


@pytest.mark.parametrize("path,every", real_files(), ids=lambda v: os.path.basename(str(v)))
def test_the_rules_pyelftools_decodes_from_real_files(path, every):
    checked, wrong = agreement(path, compile_unwind_table(path), every)
    assert checked > 500 and not wrong[:20], f"{len(wrong)} of {checked} differ"


@pytest.mark.parametrize("build", ["fp", "nofp", "debug"])
def test_the_rules_pyelftools_decodes_from_the_programs(programs, build):
    path = str(programs[build])
    checked, wrong = agreement(path, compile_unwind_table(path), debug_frame=build == "debug")
    assert checked > 10 and not wrong, wrong


# ---- the contract with the walker, the cache, hostile files ------------------------------------------------------

def test_the_row_layout():
    assert ROW.size == ROW_DTYPE.itemsize == 12
    table = compile_unwind_table("/usr/bin/gzip" if os.path.exists("/usr/bin/gzip") else sys.executable)
    first = ROW.unpack_from(table.rows, 0)
    assert first == tuple(table.array()[0].tolist())
    assert table.count == len(table.array()) == len(table.rows) // 12
    for path, _ in real_files():  # sorted, strictly increasing pcs, no two neighbours alike, a CFA_NONE last
        targets.check_unwind(Path(path).read_bytes())


def test_the_cache_builds_once_and_rebuilds_what_does_not_check_out(programs, tmp_path):
    cache = UnwindTableCache(tmp_path / "cache")
    first = cache.get("ab" * 20, programs["fp"])
    again = UnwindTableCache(tmp_path / "cache").get("ab" * 20, programs["fp"])
    assert again.rows == first.rows and again.stats == first.stats
    assert cache.get("ab" * 20, programs["fp"]).rows == first.rows
    assert (cache.builds, cache.disk_hits) == (1, 1)
    stored = cache.path_for("ab" * 20)
    assert stored.exists() and [p.name for p in stored.parent.iterdir()] == [stored.name]
    for spoil in (lambda b: b[:-5], lambda b: b[:40] + bytes([b[40] ^ 1]) + b[41:], lambda b: b"FPUNWIND\x09" + b[9:],
                  lambda b: b""):
        stored.write_bytes(spoil(stored.read_bytes()))
        assert cache.get("ab" * 20, programs["fp"]).rows == first.rows
    assert (cache.builds, cache.rejected) == (5, 4)
    assert cache.get("../../etc/x", programs["fp"]) and cache.path_for("../../etc/x").parent == tmp_path / "cache"


def test_the_fuzz_seeds_are_what_they_claim():
    tables = {p.name: compile_unwind_table(p) for p in SEEDS}
    kinds = {k for t in tables.values() for k in t.array()["cfa_kind"].tolist()}
    assert {CFA_RSP, CFA_RBP, CFA_PLT, CFA_DEREF_RBP, CFA_SIGNAL, CFA_END, CFA_UNSUPPORTED} <= kinds
    assert any(t.stats.get("from_debug_frame") for t in tables.values())


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_mutated_cfi_sections_give_rows_or_unwind_table_error(seed):
    """Edits inside .eh_frame / .debug_frame (the file's layout kept), and anywhere in the file."""
    data = seed.read_bytes()
    with open(seed, "rb") as f:
        elf = ELFFile(f)
        spans = [(s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                 if s.name in (".eh_frame", ".debug_frame", ".eh_frame_hdr")]

    @FUZZ
    @given(EDITS, EDITS)
    def check(inside, anywhere):
        image = bytearray(data)
        for off, size in spans:
            image[off:off + size] = mutate(data[off:off + size], inside)[:size].ljust(size, b"\0")
        with targets.time_limit(20):
            targets.check_unwind(bytes(image))
            targets.check_unwind(mutate(bytes(image), anywhere))

    check()


def test_the_corpus_replays():
    """Every file of the atheris corpus, crashes found earlier included."""
    for path in sorted((targets.CORPUS / "unwind").iterdir()):
        targets.check_unwind(path.read_bytes())


def test_every_truncation_of_a_seed():
    data = SEEDS[0].read_bytes()
    for cut in range(0, len(data), 5):
        targets.check_unwind(data[:cut])

