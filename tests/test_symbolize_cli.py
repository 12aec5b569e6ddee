"""`fleetprof symbolize --elf`: agrees with eu-addr2line -f and with nm on real system libraries and on a
.symtab library built here; hex parsing, --offsets and one-line errors."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.commands.symbolize import parse_address, symbolize
from producers.elf_symbols import read_elf_symbols
from tests.elf_helpers import NmTable, eu_addr2line_functions, libc_path, need, run, small_library, system_elves

SAMPLES = 200


def symbolize_cli(*args: str) -> tuple[int, list[str]]:
    for command in COMMANDS:  # what `fleetprof`'s main() registers
        cli.add_command(command)
    result = CliRunner().invoke(cli, ["symbolize", *args], env={"DEBUGINFOD_URLS": None})
    return result.exit_code, result.output.splitlines()


def sample_addresses(nm: NmTable, count: int, seed: int) -> list[int]:
    """Addresses strictly inside sized functions, chosen by nm (not by the table under test)."""
    rng = random.Random(seed)
    sized = sorted(a for a, s in nm.sizes.items() if s > 0)
    starts = rng.sample(sized, min(count, len(sized)))
    return sorted(a + rng.randrange(nm.sizes[a]) for a in starts)


def same_function(a: str, b: str, nm: NmTable) -> bool:
    """Equal names, or aliases: names nm lists at one same address."""
    return a == b or bool(nm.addr_of.get(a, set()) & nm.addr_of.get(b, set()))


def without_dwarf(path: str, tmp_path: Path) -> str:
    """The file itself, or a copy without its DWARF when it has some: eu-addr2line -f names DWARF scopes (inlined
    callees, `f` for the symbol `f.cold`), while the symbolizer, like nm, reads the symbol table."""
    if ".debug_info" not in run("readelf", "-SW", path):
        return path
    copy = tmp_path / ("nodwarf-" + os.path.basename(path))
    run(need("strip"), "--strip-debug", "-o", str(copy), path)
    return str(copy)


def check_file(path: str, tmp_path: Path, seed: int) -> None:
    nm = NmTable(path, dynamic=read_elf_symbols(path).section == ".dynsym")
    addrs = sample_addresses(nm, SAMPLES, seed)
    assert addrs, "no sized functions to sample"
    code, ours = symbolize_cli("--elf", path, *[f"{a:x}" for a in addrs])
    assert code == 0, ours
    assert len(ours) == len(addrs)
    (tmp_path / "no-debug").mkdir(exist_ok=True)
    theirs = eu_addr2line_functions(without_dwarf(path, tmp_path), addrs, tmp_path / "no-debug")
    for addr, mine, eu in zip(addrs, ours, theirs, strict=True):
        expected = nm.containing(addr)
        assert mine in expected or any(same_function(mine, n, nm) for n in expected), (hex(addr), mine, expected)
        assert same_function(mine, eu, nm), (hex(addr), mine, eu)


@pytest.mark.parametrize("path", system_elves(), ids=os.path.basename)
def test_agrees_with_eu_addr2line_and_nm_on_system_files(path: str, tmp_path: Path) -> None:
    check_file(path, tmp_path, seed=len(path))


def test_agrees_on_a_symtab_library(tmp_path: Path) -> None:
    check_file(str(small_library(tmp_path)), tmp_path, seed=1)


def test_offsets_and_misses(tmp_path: Path) -> None:
    path = str(small_library(tmp_path))
    nm = NmTable(path, dynamic=False)
    (start,) = nm.addr_of["visible_three"]
    code, lines = symbolize_cli("--elf", path, "--offsets", hex(start), f"{start + 1:X}", "0", "ffffffffffffffff")
    assert code == 0
    assert lines == ["visible_three+0x0", "visible_three+0x1", "??", "??"]
    code, lines = symbolize_cli("--elf", path, f"0x{start + 1:x}")
    assert (code, lines) == (0, ["visible_three"])


def test_bad_hex_is_one_line_error() -> None:
    for bad in ("xyz", "0x", "-1", "1" * 17 + "0"):
        code, lines = symbolize_cli("--elf", libc_path(), "1000", bad)
        assert code != 0 and len(lines) == 1 and "Error:" in lines[0] and repr(bad) in lines[0], (bad, lines)
    with pytest.raises(ValueError):
        parse_address("12g")
    assert parse_address("0XfF") == 255


def test_bad_elf_is_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x7fELF" + bytes(100))
    for path in (tmp_path / "junk", tmp_path / "absent"):
        code, lines = symbolize_cli("--elf", str(path), "1000")
        assert code != 0 and len(lines) == 1 and str(path) in lines[0], lines


def test_registered_with_help() -> None:
    assert symbolize in COMMANDS
    code, lines = symbolize_cli("--help")
    assert code == 0 and any("--offsets" in line for line in lines)
