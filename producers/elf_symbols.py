"""An ELF file's build id, PT_LOAD segments and function symbols, as numpy arrays, and its SymbolChunk records.

pyelftools reads the headers; the symbol table itself is parsed in bulk (numpy structured arrays over the raw
section bytes), because pyelftools builds one Python object per symbol and a 100k-symbol library must take well
under a second. Any file that is not a well-formed ELF gives a one-line ElfError, never another exception: the agent
meets truncated, deleted and half-written binaries and must keep running.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, TypeVar

import numpy as np
from elftools.elf.elffile import ELFFile

from producers.elf_headers import PT_NOTE, read_headers
from producers.symbol_chunks import chunk_symbol_table
from schemas.wire import DEFAULT_MAX_BYTES

FALLBACK_PREFIX = "sha256:"  # marks a build id made from the file's bytes (the file has no GNU build id)
NT_GNU_BUILD_ID = 3
STT_FUNC, STT_GNU_IFUNC = 2, 10
SHN_UNDEF = 0
EM_ARM = 40
T = TypeVar("T")
# alias preference at one address: global (and GNU unique) over weak over local, then shortest, then lexicographic
_BIND_RANK = np.full(16, 3, dtype=np.int64)
_BIND_RANK[[1, 10]] = 0  # STB_GLOBAL, STB_GNU_UNIQUE
_BIND_RANK[2] = 1  # STB_WEAK
_BIND_RANK[0] = 2  # STB_LOCAL


class ElfError(Exception):
    """A file that cannot be read as an ELF file; the message is one line naming the file and the reason."""


class ElfUnreadable(ElfError):
    """The file could not be opened or read (gone, no permission): another path to the same file may do."""


@dataclass
class ElfSymbols:
    """One ELF file's identity and function table. Addresses are ELF virtual addresses, sorted, one name each."""

    path: str
    build_id: str  # GNU build id as hex, or FALLBACK_PREFIX + a hash of the file
    section: str  # ".symtab", ".dynsym" or "" (no symbol table)
    addrs: np.ndarray  # uint64, sorted, unique
    sizes: np.ndarray  # uint64; 0 means "up to the next symbol"
    names: list[str]
    seg_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # PT_LOAD, sorted by offset
    seg_vaddrs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    seg_memsz: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))

    @property
    def binary(self) -> str:
        return os.path.basename(self.path)

    @property
    def fallback_id(self) -> bool:
        """True when the file has no GNU build id and build_id is a hash of its bytes."""
        return self.build_id.startswith(FALLBACK_PREFIX)

    def __len__(self) -> int:
        return len(self.names)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _read_at(f: BinaryIO, file_size: int, offset: int, size: int, what: str) -> bytes:
    """Bytes [offset, offset+size) of the file, or ElfError when they lie past its end."""
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ElfError(f"{what} at 0x{offset:x}+0x{size:x} lies past the end of the file (0x{file_size:x} bytes)")
    f.seek(offset)
    return f.read(size)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _note_build_id(data: bytes, little: bool, align: int) -> str:
    """The GNU build id in a run of ELF notes, as hex, or ""."""
    fmt = "<III" if little else ">III"
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(fmt, data, pos)
        name_at = pos + 12
        desc_at = name_at + _align(namesz, align)
        if desc_at + descsz > len(data):
            break
        if ntype == NT_GNU_BUILD_ID and data[name_at:name_at + namesz].rstrip(b"\0") == b"GNU" and descsz:
            return data[desc_at:desc_at + descsz].hex()
        pos = desc_at + _align(descsz, align)
    return ""


def _file_hash_id(f: BinaryIO) -> str:
    f.seek(0)
    digest = hashlib.file_digest(f, "sha256").hexdigest()
    return FALLBACK_PREFIX + digest[: 64 - len(FALLBACK_PREFIX)]  # build_id fits in 64 characters


def _build_id(elf: ELFFile, f: BinaryIO, file_size: int, sections: list | None = None) -> str:
    """From the PT_NOTE segments first (a few program headers: cheap, and where the loader sees it), else from the
    note sections (.note.gnu.build-id first; files whose notes are in no segment). `sections` are read only then."""
    little = elf.little_endian
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_NOTE":
            data = _read_at(f, file_size, seg["p_offset"], seg["p_filesz"], "PT_NOTE segment")
            found = _note_build_id(data, little, 8 if seg["p_align"] == 8 else 4)
            if found:
                return found
    notes = [s for s in (sections if sections is not None else elf.iter_sections()) if s["sh_type"] == "SHT_NOTE"]
    notes.sort(key=lambda s: s.name != ".note.gnu.build-id")
    for sec in notes:
        data = _read_at(f, file_size, sec["sh_offset"], sec["sh_size"], f"note section {sec.name}")
        found = _note_build_id(data, little, 8 if sec["sh_addralign"] == 8 else 4)
        if found:
            return found
    return ""


def _sym_dtype(elfclass: int, little: bool, entsize: int) -> np.dtype:
    e = "<" if little else ">"
    if elfclass == 64:  # Elf64_Sym: name u32, info u8, other u8, shndx u16, value u64, size u64
        names = ["name", "info", "other", "shndx", "value", "size"]
        formats, offsets, base = [e + "u4", "u1", "u1", e + "u2", e + "u8", e + "u8"], [0, 4, 5, 6, 8, 16], 24
    else:  # Elf32_Sym: name u32, value u32, size u32, info u8, other u8, shndx u16
        names = ["name", "value", "size", "info", "other", "shndx"]
        formats, offsets, base = [e + "u4", e + "u4", e + "u4", "u1", "u1", e + "u2"], [0, 4, 8, 12, 13, 14], 16
    if entsize == 0:
        entsize = base
    if entsize < base:
        raise ElfError(f"symbol entry size {entsize} is smaller than Elf{elfclass}_Sym ({base})")
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": entsize})


def _functions(syms: np.ndarray, strtab: bytes, arm: bool) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Defined functions at nonzero addresses, one per address (aliases resolved), sorted by address."""
    kind = syms["info"] & 0xF
    value = syms["value"].astype(np.uint64)
    if arm:  # the low bit of a Thumb function's address is the instruction-set flag, not part of the address
        value = np.where((kind == STT_FUNC) | (kind == STT_GNU_IFUNC), value & ~np.uint64(1), value)
    keep = ((kind == STT_FUNC) | (kind == STT_GNU_IFUNC)) & (syms["shndx"] != SHN_UNDEF) & (value != 0) \
        & (syms["name"] != 0)
    addr, size = value[keep], syms["size"][keep].astype(np.uint64)
    name_off = syms["name"][keep].astype(np.int64)
    rank = _BIND_RANK[syms["info"][keep] >> 4]
    buf = np.frombuffer(strtab, dtype=np.uint8)
    if len(name_off) and int(name_off.max()) >= len(buf):
        raise ElfError(f"symbol name offset 0x{int(name_off.max()):x} lies outside the string table")
    nuls = np.flatnonzero(buf == 0)
    ends = np.append(nuls, len(buf))[np.searchsorted(nuls, name_off)]
    name_len = ends - name_off
    order = np.lexsort((name_len, rank, addr))
    addr, size, name_off, name_len, rank = addr[order], size[order], name_off[order], name_len[order], rank[order]
    if len(addr) == 0:
        return addr, size, []
    first = np.flatnonzero(np.r_[True, addr[1:] != addr[:-1]])
    count = np.diff(np.append(first, len(addr)))
    # an alias may be a size-0 label on a sized function: the group keeps its largest size
    group_size = np.maximum.reduceat(size, first)
    chosen = first.copy()
    nxt = np.minimum(first + 1, len(addr) - 1)
    tied = np.flatnonzero((count > 1) & (rank[nxt] == rank[first]) & (name_len[nxt] == name_len[first]))
    for g in tied.tolist():  # equal rank and length: the lexicographically smallest name, decided in Python (rare)
        lo, hi = int(first[g]), int(first[g] + count[g])
        same = [i for i in range(lo, hi) if rank[i] == rank[lo] and name_len[i] == name_len[lo]]
        chosen[g] = min(same, key=lambda i: strtab[name_off[i]:name_off[i] + name_len[i]])
    offs, lens = name_off[chosen].tolist(), name_len[chosen].tolist()
    names = [strtab[o:o + n].decode("utf-8", "replace") for o, n in zip(offs, lens, strict=True)]
    return addr[first], group_size, names


def _read(path: str) -> ElfSymbols:
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        magic = f.read(4)
        if magic != b"\x7fELF":
            raise ElfError("not an ELF file" + (" (empty)" if not magic else f" (starts with {magic!r})"))
        f.seek(0)
        elf = ELFFile(f)
        little, elfclass = elf.little_endian, elf.elfclass
        sections = list(elf.iter_sections())
        build_id = _build_id(elf, f, file_size, sections) or _file_hash_id(f)
        loads = sorted((int(s["p_offset"]), int(s["p_vaddr"]), int(s["p_memsz"]))
                       for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")
        segs = np.array(loads, dtype=np.uint64).reshape(-1, 3)
        table = next((s for s in sections if s["sh_type"] == "SHT_SYMTAB"), None) \
            or next((s for s in sections if s["sh_type"] == "SHT_DYNSYM"), None)
        result = ElfSymbols(path, build_id, "", np.zeros(0, np.uint64), np.zeros(0, np.uint64), [],
                            segs[:, 0], segs[:, 1], segs[:, 2])
        if table is None:
            return result
        link = table["sh_link"]
        if not 0 < link < len(sections) or sections[link]["sh_type"] != "SHT_STRTAB":
            raise ElfError(f"{table.name} links to section {link}, which is not a string table")
        strsec = sections[link]
        dtype = _sym_dtype(elfclass, little, table["sh_entsize"])
        raw = _read_at(f, file_size, table["sh_offset"], table["sh_size"], f"symbol table {table.name}")
        strtab = _read_at(f, file_size, strsec["sh_offset"], strsec["sh_size"], f"string table {strsec.name}")
        syms = np.frombuffer(raw, dtype=dtype, count=len(raw) // dtype.itemsize)
        result.addrs, result.sizes, result.names = _functions(syms, strtab, elf["e_machine"] in ("EM_ARM", EM_ARM))
        result.section = ".symtab" if table["sh_type"] == "SHT_SYMTAB" else ".dynsym"
        return result


def _guarded(path: str | os.PathLike, parse: Callable[[str], T]) -> T:
    """parse(path), with every failure turned into a one-line ElfError naming the file."""
    path = os.fspath(path)
    try:
        return parse(path)
    except ElfError as exc:
        raise ElfError(f"{path}: {_one_line(str(exc))}") from None
    except OSError as exc:
        raise ElfUnreadable(f"{path}: cannot read: {_one_line(exc.strerror or str(exc))}") from None
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on malformed input; the contract is one
        raise ElfError(f"{path}: malformed ELF: {_one_line(f'{type(exc).__name__}: {exc}')}") from None


def _read_build_id(path: str) -> str:
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise ElfError("not an ELF file")
        file_size = os.fstat(f.fileno()).st_size
        found = _segment_build_id(f, file_size)  # the common case, without pyelftools' per-segment objects
        if found:
            return found
        f.seek(0)
        elf = ELFFile(f)
        return _build_id(elf, f, file_size) or _file_hash_id(f)


def _segment_build_id(f: BinaryIO, file_size: int) -> str:
    """The build id in a PT_NOTE segment, read through the bare headers (producers/elf_headers.py), or ""."""
    headers = read_headers(f, file_size)
    for seg in headers.segments if headers is not None else ():
        if seg.type == PT_NOTE and seg.offset + seg.filesz <= file_size:
            f.seek(seg.offset)
            found = _note_build_id(f.read(seg.filesz), headers.little, 8 if seg.align == 8 else 4)
            if found:
                return found
    return ""


def read_elf_symbols(path: str | os.PathLike) -> ElfSymbols:
    """Build id, PT_LOAD segments and function table of one ELF file (.symtab, else .dynsym)."""
    return _guarded(path, _read)


def read_build_id(path: str | os.PathLike) -> str:
    """Just the build id (GNU build id hex, else FALLBACK_PREFIX + file hash); no symbol parsing."""
    return _guarded(path, _read_build_id)


def _longs(values: np.ndarray) -> list[int]:
    """uint64 addresses as Avro longs (same bits)."""
    return values.astype(np.uint64).view(np.int64).tolist()


def symbol_chunks(path_or_tables: str | os.PathLike | ElfSymbols,
                  max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[dict]:
    """SymbolChunk records (kind ELF) of one file, each encoding to at most `max_bytes` (None: one chunk)."""
    syms = path_or_tables if isinstance(path_or_tables, ElfSymbols) else read_elf_symbols(path_or_tables)
    segs = [{"file_offset": o, "vaddr": v, "memsz": m} for o, v, m in
            zip(_longs(syms.seg_offsets), _longs(syms.seg_vaddrs), _longs(syms.seg_memsz), strict=True)]
    return chunk_symbol_table(syms.build_id, syms.binary, "ELF", segs, _longs(syms.addrs), _longs(syms.sizes),
                              syms.names, max_bytes)


def _read_load_segments(path: str) -> list[tuple[int, int, int]]:
    with open(path, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise ElfError("not an ELF file")
        f.seek(0)
        return sorted((int(s["p_offset"]), int(s["p_vaddr"]), int(s["p_filesz"]))
                      for s in ELFFile(f).iter_segments() if s["p_type"] == "PT_LOAD")


def read_load_segments(path: str | os.PathLike) -> list[tuple[int, int, int]]:
    """(file offset, virtual address, size in the file) of each PT_LOAD segment, by offset."""
    return _guarded(path, _read_load_segments)
