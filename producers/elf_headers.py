"""An ELF file's program and section headers read with struct, for the two questions the agent asks of every file
every process maps when it starts: its build id (a PT_NOTE segment), and whether it could be a CPython (does its
dynamic string table name `_PyRuntime`).

pyelftools answers both, but it builds an object per segment and per section on the way (a PT_DYNAMIC segment
alone scans the sections for its string table): 0.02-0.03 s a file, 7 s of an agent's start-up on a machine whose
processes map ~180 files (profiled). Reading the headers directly takes well under a millisecond a file. Anything
unusual (no PT_NOTE with a build id, a header that does not parse) is left to the pyelftools paths, which stay the
reference.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

PT_NOTE = 4
SHT_DYNSYM = 11
SHT_STRTAB = 3
MAX_HEADERS = 4096  # more program or section headers than any real file has: a corrupt count


@dataclass(frozen=True)
class Segment:
    type: int
    offset: int
    filesz: int
    align: int


@dataclass(frozen=True)
class Section:
    type: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True)
class Headers:
    little: bool
    segments: list[Segment]
    sections: list[Section]


def read_headers(f: BinaryIO, file_size: int) -> Headers | None:
    """The file's program and section headers, or None when its ELF header does not parse as one."""
    f.seek(0)
    ident = f.read(64)
    if len(ident) < 52 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        return None
    is64, little = ident[4] == 2, ident[5] == 1
    e = "<" if little else ">"
    if is64:
        phoff, shoff = struct.unpack_from(e + "QQ", ident, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", ident, 54)
    else:
        phoff, shoff = struct.unpack_from(e + "II", ident, 28)
        phentsize, phnum, shentsize, shnum = struct.unpack_from(e + "HHHH", ident, 42)
    # the fields kept, in Segment's and Section's order; the others skipped (x)
    phdr = e + ("I4xQ16xQ8xQ" if is64 else "II8xI8xI")  # type, offset, filesz, align
    shdr = e + ("4xI16xQQI" if is64 else "4xI8xIII")  # type, offset, size, link
    return Headers(little, [Segment(*t) for t in _table(f, file_size, phoff, phentsize, phnum, phdr)],
                   [Section(*t) for t in _table(f, file_size, shoff, shentsize, shnum, shdr)])


def _table(f: BinaryIO, file_size: int, offset: int, entsize: int, count: int, fmt: str) -> list[tuple[int, ...]]:
    entry = struct.Struct(fmt)
    if not offset or not count or count > MAX_HEADERS or entsize < entry.size or offset + entsize * count > file_size:
        return []  # none, or not a table that can be read (extended numbering, a corrupt count): the caller falls back
    f.seek(offset)
    raw = f.read(entsize * count)
    return [entry.unpack_from(raw, i * entsize) for i in range(count)]


def dynamic_strings(f: BinaryIO, file_size: int, headers: Headers) -> bytes | None:
    """The string table of the dynamic symbols (.dynstr), or None when the file has none that can be read."""
    dynsym = next((s for s in headers.sections if s.type == SHT_DYNSYM), None)
    if dynsym is None or not 0 < dynsym.link < len(headers.sections):
        return None
    strtab = headers.sections[dynsym.link]
    if strtab.type != SHT_STRTAB or strtab.offset + strtab.size > file_size:
        return None
    f.seek(strtab.offset)
    return f.read(strtab.size)
