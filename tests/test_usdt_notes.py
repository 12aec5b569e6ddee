"""The fleetprof USDT probes as ELF files declare them: argument operands decoded, probe sites as readelf shows
them, and the finder that knows which loaded objects carry them (no BPF needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from producers.probe_finder import ProbeFinder
from producers.usdt_notes import ARG_CONST, ARG_MEM, ARG_REG, NO_REG, ArgSpec, NoteError, parse_arg, read_probe_sites
from tests.elf_helpers import libc_path, need, readelf_loads, run
from tests.probe_emitters import Procs


@pytest.mark.parametrize(("text", "arch", "spec"), [
    ("-4@%esi", "x86_64", ArgSpec(ARG_REG, 4, 13)),
    ("8@%r9", "x86_64", ArgSpec(ARG_REG, 8, 8)),
    ("4@$-5", "x86_64", ArgSpec(ARG_CONST, 4, disp=-5)),
    ("8@-40(%rbp)", "x86_64", ArgSpec(ARG_MEM, 8, 4, disp=-40)),
    ("4@(%rax)", "x86_64", ArgSpec(ARG_MEM, 4, 10)),
    ("2@0x10(%rsp,%rcx,4)", "x86_64", ArgSpec(ARG_MEM, 2, 19, 11, 4, 16)),
    ("8@counter+8(%rip)", "x86_64", ArgSpec(ARG_MEM, 8, 16, NO_REG, 1, 0x4000 + 8 - 0x1100)),
    ("8@x1", "aarch64", ArgSpec(ARG_REG, 8, 1)),
    ("-4@[sp, 12]", "aarch64", ArgSpec(ARG_MEM, 4, 31, disp=12)),
    ("8@[x29]", "aarch64", ArgSpec(ARG_MEM, 8, 29)),
    ("4@#3", "aarch64", ArgSpec(ARG_CONST, 4, disp=3)),
])
def test_probe_arguments_decode(text: str, arch: str, spec: ArgSpec) -> None:
    assert parse_arg(text, arch, pc=0x1100, symbols={"counter": 0x4000}) == spec


@pytest.mark.parametrize("text", ["1@%ah", "8@%xmm0", "8@nosuch(%rip)", "8@8(%rip)", "3@%eax", "8@[q3]"])
def test_undecodable_probe_arguments_are_refused(text: str) -> None:
    with pytest.raises(NoteError):
        parse_arg(text, "aarch64" if "[" in text else "x86_64", pc=0, symbols={})


def _readelf_probes(path: Path) -> dict[str, tuple[int, int]]:
    """probe name -> (location, semaphore) as file offsets, from readelf -n and readelf -l."""
    loads = readelf_loads(str(path))
    out, name = {}, None
    for line in run("readelf", "-n", str(path)).splitlines():
        line = line.strip()
        if line.startswith("Name:"):
            name = line.split()[1]
        elif line.startswith("Location:"):
            parts = line.replace(",", "").split()
            loc, sem = int(parts[1], 16), int(parts[5], 16)
            out[name] = tuple(next(a - v + o for o, v, size in loads if v <= a < v + size) for a in (loc, sem))
    return out


def test_probe_sites_match_readelf(emitters: dict[str, Path]) -> None:
    need("readelf")
    for binary in ("libfpemit.so", "emitter_o0"):
        sites, unsupported = read_probe_sites(str(emitters[binary]))
        assert unsupported == 0
        assert {s.probe: (s.offset, s.ref_ctr_offset) for s in sites} == _readelf_probes(emitters[binary])
        assert len(sites) == 3
    o0 = {s.probe: s for s in read_probe_sites(str(emitters["emitter_o0"]))[0]}
    assert all(a.kind == ARG_MEM and a.base == 4 for a in o0["kernel_executed"].args)  # -O0: all in its frame
    for other in (emitters["emitter"], emitters["other"], libc_path()):
        assert read_probe_sites(str(other)) == ([], 0)


def test_finder_finds_only_objects_with_fleetprof_probes_and_parses_each_once(
        emitters: dict[str, Path], procs: Procs) -> None:
    for name in ("emitter", "emitter_o0", "other"):
        procs.start(emitters[name])
    # all of this machine's processes
    paths = {o.path for o in ProbeFinder().scan().values()}
    assert {str(emitters["libfpemit.so"]), str(emitters["emitter_o0"])} <= paths
    assert not paths & {str(emitters["emitter"]), str(emitters["other"]), libc_path()}
    # only the test's: each file is read once, however many processes map it
    finder = ProbeFinder(proc=str(procs.view))
    found = finder.scan()
    assert {o.path for o in found.values()} == {str(emitters["libfpemit.so"]), str(emitters["emitter_o0"])}
    assert finder.pids == 3
    parsed = finder.parsed
    procs.start(emitters["emitter"])  # maps the same files again
    assert finder.scan().keys() == found.keys() and finder.pids == 4
    assert finder.parsed == parsed


# --- BPF ---
