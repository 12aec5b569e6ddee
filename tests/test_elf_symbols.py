"""producers.elf_symbols against readelf and nm on this machine's real libraries, plus files built here with gcc:
no build id, truncated and garbage files, and a 100k-function library."""

from __future__ import annotations

import glob
import hashlib
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest

from processors.symbol_tables import table_from_chunks
from producers.elf_symbols import FALLBACK_PREFIX, ElfError, ElfSymbols, read_build_id, read_elf_symbols, symbol_chunks
from schemas.single_object import encode
from tests.elf_helpers import (
    NmTable,
    libc_path,
    many_functions_library,
    need,
    readelf_build_id,
    readelf_loads,
    readelf_types,
    small_library,
)
from tests.elf_helpers import system_elves as _system_elves

SYSTEM = _system_elves()
BIND_RANK = {"T": 0, "i": 0, "W": 1, "t": 2}  # nm letter -> the alias preference elf_symbols applies


def _one_line_error(path: Path | str) -> str:
    with pytest.raises(ElfError) as info:
        read_elf_symbols(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path)), message
    return message


@pytest.mark.parametrize("path", SYSTEM, ids=os.path.basename)
def test_build_id_and_segments_match_readelf(path: str) -> None:
    need("readelf")
    syms = read_elf_symbols(path)
    expected = readelf_build_id(path)
    assert expected, f"{path} has no build id: pick another system file"
    assert syms.build_id == expected == read_build_id(path)
    assert not syms.fallback_id
    got = list(zip(syms.seg_offsets.tolist(), syms.seg_vaddrs.tolist(), syms.seg_memsz.tolist(), strict=True))
    assert got == readelf_loads(path)


def check_against_nm(syms: ElfSymbols, path: str) -> None:
    """Same function addresses as nm (T/t/W/i, nonzero), and at each address the alias the preference picks."""
    nm = NmTable(path, dynamic=syms.section == ".dynsym")
    mine = dict(zip(syms.addrs.tolist(), syms.names, strict=True))
    assert len(mine) == len(syms.names), "one name per address"
    assert np.all(np.diff(syms.addrs.astype(np.int64)) > 0) if len(syms.addrs) > 1 else True
    only_nm = set(nm.names) - set(mine)
    if only_nm:  # nm's W is any weak non-object symbol: allowed only when it is not a function
        types = readelf_types(path)
        functions = [(hex(a), n) for a in only_nm for n in nm.names[a] if types.get(n) in ("FUNC", "IFUNC")]
        assert not functions, f"functions nm lists that the table lacks: {functions[:10]}"
    assert not set(mine) - set(nm.names), "addresses nm does not list as code"
    for addr, name in mine.items():
        assert name in nm.names[addr], (hex(addr), name, nm.names[addr])
        best = min(nm.names[addr], key=lambda n, a=addr: (BIND_RANK[nm.letters[(a, n)]], len(n), n))
        if nm.letters[(addr, best)] != "i":  # nm's i hides the binding, so the rank of ifuncs is unknown
            assert name == best, (hex(addr), name, nm.names[addr])


@pytest.mark.parametrize("path", SYSTEM, ids=os.path.basename)
def test_functions_match_nm(path: str) -> None:
    syms = read_elf_symbols(path)
    assert syms.section in (".symtab", ".dynsym")
    check_against_nm(syms, path)


def test_symtab_library_with_aliases_matches_nm(tmp_path: Path) -> None:
    path = small_library(tmp_path)
    syms = read_elf_symbols(path)
    assert syms.section == ".symtab"
    check_against_nm(syms, str(path))
    names = set(syms.names)
    assert {"visible_one", "hidden_two", "visible_three", "weak_four"} <= names
    assert "alias_of_three" not in names  # same address as visible_three, both global: the shorter name wins


def test_chunks_round_trip_through_symbol_tables() -> None:
    syms = read_elf_symbols(libc_path())
    chunks = symbol_chunks(syms, max_bytes=16 * 1024)
    assert len(chunks) > 1 and all(c["kind"] == "ELF" for c in chunks)
    assert all(len(encode("SymbolChunk", c)) <= 16 * 1024 for c in chunks)
    assert {c["binary"] for c in chunks} == {"libc.so.6"} and {c["build_id"] for c in chunks} == {syms.build_id}
    table = table_from_chunks(list(reversed(chunks)))
    assert table.names == syms.names
    assert np.array_equal(table.starts, syms.addrs)
    assert np.array_equal(table.seg_offsets, syms.seg_offsets) and np.array_equal(table.seg_sizes, syms.seg_memsz)
    sized = syms.sizes > 0
    assert np.array_equal(table.ends[sized], syms.addrs[sized] + syms.sizes[sized])
    # the Avro contract: every chunk encodes with the real schema
    from schemas import single_object

    for chunk in chunks[:2]:
        assert single_object.decode(single_object.encode("SymbolChunk", chunk))[1] == chunk


def test_file_without_build_id_gets_fallback_id(tmp_path: Path) -> None:
    need("readelf")
    path = small_library(tmp_path, "-Wl,--build-id=none")
    assert readelf_build_id(str(path)) == ""
    syms = read_elf_symbols(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert syms.fallback_id and syms.build_id.startswith(FALLBACK_PREFIX) and len(syms.build_id) <= 64
    assert digest.startswith(syms.build_id[len(FALLBACK_PREFIX):])
    copy = tmp_path / "elsewhere.so"
    copy.write_bytes(path.read_bytes())
    assert read_build_id(copy) == syms.build_id  # stable: the bytes decide, not the path
    assert "visible_one" in syms.names


def test_missing_non_elf_and_empty_files(tmp_path: Path) -> None:
    assert "cannot read" in _one_line_error(tmp_path / "absent.so")
    assert "cannot read" in _one_line_error(tmp_path)
    (tmp_path / "text").write_text("hello\n")
    assert "not an ELF file" in _one_line_error(tmp_path / "text")
    (tmp_path / "empty").write_bytes(b"")
    assert "not an ELF file" in _one_line_error(tmp_path / "empty")
    with pytest.raises(ElfError):
        read_build_id(tmp_path / "text")


def test_truncated_copies_of_a_real_library(tmp_path: Path) -> None:
    data = Path(libc_path()).read_bytes()
    cuts = [4, 16, 52, 63, 64, 100, 4096, len(data) // 10, len(data) // 2, len(data) - 4096, len(data) - 1]
    for cut in cuts:
        path = tmp_path / f"libc.cut{cut}"
        path.write_bytes(data[:cut])
        _one_line_error(path)


def test_garbage_never_raises_anything_but_elf_error(tmp_path: Path) -> None:
    rng = random.Random(3)
    small = small_library(tmp_path).read_bytes()
    path = tmp_path / "garbage"
    samples = [bytes(rng.randrange(256) for _ in range(n)) for n in (1, 64, 4096)]
    samples += [b"\x7fELF" + bytes(rng.randrange(256) for _ in range(n)) for n in (12, 60, 5000)]
    for _ in range(300):  # a real file with a few bytes flipped: headers, tables and names all get hit
        mutated = bytearray(small)
        for _ in range(rng.randrange(1, 8)):
            mutated[rng.randrange(len(mutated) if rng.random() < 0.5 else 64)] = rng.randrange(256)
        samples.append(bytes(mutated))
    errors = 0
    for data in samples:
        path.write_bytes(data)
        try:
            syms = read_elf_symbols(path)
        except ElfError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(str(path))
            errors += 1
            continue
        symbol_chunks(syms)  # whatever parsed must also turn into chunks
    assert errors >= 6


def test_section_pointing_past_the_end(tmp_path: Path) -> None:
    """e_shoff beyond the file: a header that lies about the file's size."""
    data = bytearray(small_library(tmp_path).read_bytes())
    data[0x28:0x30] = (len(data) * 4).to_bytes(8, "little")  # Elf64_Ehdr.e_shoff
    path = tmp_path / "lying.so"
    path.write_bytes(bytes(data))
    _one_line_error(path)


def test_hundred_thousand_functions(tmp_path: Path) -> None:
    path = many_functions_library(tmp_path)
    start = time.perf_counter()
    syms = read_elf_symbols(path)
    elapsed = time.perf_counter() - start
    print(f"\nparsed {len(syms)} functions of {path.name} ({path.stat().st_size} bytes) in {elapsed * 1000:.0f} ms")
    assert len(syms) == 100_000
    names = set(syms.names)
    assert "fn_000000" in names and "fn_099999" in names
    assert "fn_001000_w" not in names and "fn_001000_local" not in names  # the global alias wins
    nm = NmTable(str(path), dynamic=False)
    table = table_from_chunks(symbol_chunks(syms))
    rng = random.Random(7)
    for name in rng.sample(sorted(nm.addr_of), 50):
        (addr,) = nm.addr_of[name]
        found = table.lookup(np.array([addr], dtype=np.uint64))[0]
        assert name in nm.names[int(table.starts[found])] and int(table.starts[found]) == addr


def test_build_ids_from_bare_headers_equal_pyelftools_on_this_machines_files(tmp_path: Path) -> None:
    from elftools.elf.elffile import ELFFile

    from producers.elf_headers import read_headers
    from producers.elf_symbols import _build_id, _segment_build_id

    files = sorted(p for p in glob.glob("/usr/lib/x86_64-linux-gnu/*.so*") + glob.glob("/usr/bin/*")
                   if os.path.isfile(p) and not os.path.islink(p))[:400]
    compared = 0
    for path in files:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
            size = os.fstat(f.fileno()).st_size
            fast = _segment_build_id(f, size)
            f.seek(0)
            assert fast == _build_id(ELFFile(f), f, size), path
            compared += bool(fast)
    assert compared >= 100
    # a header whose counts run past the file's end: no tables, so the pyelftools path decides
    broken = tmp_path / "broken"
    data = bytearray(Path("/usr/bin/true").read_bytes()[:64])
    data[56:58] = (4000).to_bytes(2, "little")  # e_phnum
    broken.write_bytes(bytes(data))
    with open(broken, "rb") as f:
        assert read_headers(f, 64).segments == [] and _segment_build_id(f, 64) == ""


def test_only_files_naming_pyruntime_are_read_as_cpython() -> None:
    from producers.python_runtime import _may_be_cpython, read_python_runtime

    with open("/usr/bin/python3.11", "rb") as f:
        assert _may_be_cpython(f)
    with open(glob_one("/usr/lib/x86_64-linux-gnu/libz.so.1*"), "rb") as f:
        assert not _may_be_cpython(f)
    assert read_python_runtime("/usr/bin/python3.11") is not None


def glob_one(pattern: str) -> str:
    return sorted(p for p in glob.glob(pattern) if not os.path.islink(p))[0]
