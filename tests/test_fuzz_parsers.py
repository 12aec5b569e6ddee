"""Hostile input at the parsers: corrupt ELF files (ElfError and nothing else), malformed, giant and binary perf map
lines, kallsyms junk, symbol names built to crash or blow up the demangler, and Python code objects and location
tables read from memory that holds anything (the thread runs on while it is read)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.demangle import MAX_DEMANGLED, MAX_MANGLED, demangle, safe_to_demangle
from producers.kallsyms import parse_kallsyms
from producers.perf_map import parse_perf_map
from tests.fuzz import targets
from tests.fuzz.records import EDITS, demangle_bomb, mutate

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ELVES = sorted((targets.CORPUS / "elf").iterdir())


@pytest.mark.parametrize("seed", ELVES, ids=lambda p: p.name)
def test_corrupt_elf_files_read_or_raise_elf_error(seed, tmp_path):
    data = seed.read_bytes()

    @FUZZ
    @given(EDITS)
    def check(edits):
        targets.check_elf(mutate(data, edits), str(tmp_path))

    check()


def test_every_truncation_of_an_elf_file_reads_or_raises_elf_error(tmp_path):
    data = (targets.CORPUS / "elf" / "static.elf").read_bytes()
    for cut in range(0, len(data), 7):
        targets.check_elf(data[:cut], str(tmp_path))


def test_the_seed_elf_files_are_what_they_claim(tmp_path):
    """The seeds reach the parser's real paths: symbols, a build id, 32-bit, no symbols (stripped)."""
    from producers.elf_symbols import ElfError, read_elf_symbols

    static = read_elf_symbols(targets.CORPUS / "elf" / "static.elf")
    assert static.names == ["helper", "other", "local_fn", "_start"] or {"helper", "other"} <= set(static.names)
    assert len(static.build_id) == 40 and not static.fallback_id
    assert read_elf_symbols(targets.CORPUS / "elf" / "stripped.elf").section == ""
    assert "helper" in read_elf_symbols(targets.CORPUS / "elf" / "static32.elf").names
    with pytest.raises(ElfError):
        read_elf_symbols(targets.CORPUS / "elf" / "truncated.elf")


LINE = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda a, s, n, sep: b"%s%s%s%s%s" % (a, sep, s, sep, n),
              st.sampled_from([b"0", b"0x10", b"ffffffffffffffff", b"10000000000000000", b"-1", b"0X7f", b"g"]),
              st.sampled_from([b"0", b"1", b"ffffffffffffffff", b"", b"0x"]),
              st.sampled_from([b"f", b"py::f:x.py", b" spaced name ", b"\x00\xff", b"n\r", b"a\tb"]),
              st.sampled_from([b" ", b"\t", b"  \t"])))


@FUZZ
@given(st.lists(LINE, max_size=30), st.sampled_from([b"\n", b"\r\n", b"\n\n"]))
def test_malformed_perf_map_lines_are_skipped(lines, newline):
    targets.check_perf_map(newline.join(lines))


def test_giant_perf_map_lines_and_junk_cost_linear_time():
    with targets.time_limit(20):
        found = parse_perf_map(b"1 1 " + b"x" * (8 << 20) + b"\n" + b"2 2 y\n")
        assert [len(n) for n in found.names] == [8 << 20, 1]
        # backtracking bait: a name ending in blanks that the line's pattern cannot take, many times over
        bait = b"1 1 " + b"a " * 200_000 + b"\x0b"
        assert parse_perf_map(bait + b"\n" + b"\xff" * (4 << 20)).malformed == 2
    assert parse_perf_map(b"".join(b"%x 1 a\n" % i for i in range(1, 100)), max_entries=1).truncated


@FUZZ
@given(st.lists(st.one_of(st.text(max_size=60), st.builds(
    lambda a, t, n: f"{a} {t} {n}", st.sampled_from(["0", "ffffffff81000000", "1" * 17, "0x10", "-5", "1_0", "zz"]),
    st.sampled_from(list("tTwWdD?")), st.text(max_size=10))), max_size=40))
def test_kallsyms_junk(lines):
    targets.check_kallsyms("\n".join(lines).encode())


def test_kallsyms_addresses_beyond_64_bits_are_skipped():
    """An address of 17 hex digits made a table the codec could not encode (the agent's send would fail)."""
    assert parse_kallsyms("1" + "0" * 16 + " T big\nffffffff81000000 T ok\n") == ([0xFFFFFFFF81000000], ["ok"], 0)


# ---- the demangler: names are chosen by whoever builds the binary or names the CUDA kernel ----------------------

def test_names_that_crashed_or_exploded_the_demangler_stay_mangled():
    """Run in a child with a small stack: a guard that let one through would kill it (SIGSEGV), not fail a test."""
    script = textwrap.dedent(f"""
        import resource, sys, time
        from processors.demangle import demangle
        from tests.fuzz.records import DEMANGLER_CRASHERS, demangle_bomb
        names = list(DEMANGLER_CRASHERS.values()) + [demangle_bomb(n) for n in (12, 16, 22, 30, 40)]
        started = time.monotonic()
        out = [demangle(n) for n in names]
        assert all(len(o) <= {MAX_DEMANGLED} or o == n for o, n in zip(out, names)), [len(o) for o in out]
        print(sum(o == n for o, n in zip(out, names)), len(names))
    """)
    done = subprocess.run(["bash", "-c", f"ulimit -s 2048 && exec {sys.executable} -c \"$0\"", script],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["9", "9"]  # every one left as it was; a 12-level bomb demangles to ~150 KB


def test_the_guard_keeps_real_names():
    assert demangle("_ZNSt8_Rb_treeISt4pairIKSsSsES0_IS1_SsESt10_Select1stIS3_ESt4lessIS1_ESaIS3_EE8_M_eraseEPSt13"
                    "_Rb_tree_nodeIS3_E").startswith("std::_Rb_tree<std::pair<std::")
    assert demangle(demangle_bomb(5)).startswith("f(a*, void (*)(a*, a*)")
    assert safe_to_demangle("_Z" + "1a" * (MAX_MANGLED // 2 - 1)) and not safe_to_demangle("_Z" + "1a" * MAX_MANGLED)


@FUZZ
@given(st.text(max_size=300))
def test_random_names(name):
    targets.check_demangle(name.encode())


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_as_a_location_table(data):
    targets.check_line_table(data)


def _code_like(rnd_bytes: bytes, strings: bool) -> bytes:
    """A buffer that points into itself where code objects keep pointers, so reads go deep before they fail."""
    buf = bytearray(rnd_bytes.ljust(4096, b"\x00"))
    if strings:
        for at in range(0, 256, 8):
            buf[at:at + 8] = (0x10000 + 512 + at).to_bytes(8, "little")
    return bytes(buf)


@FUZZ
@given(st.binary(min_size=0, max_size=4096), st.booleans())
def test_code_objects_in_memory_that_holds_anything(data, strings):
    targets.check_code_object(_code_like(data, strings))
