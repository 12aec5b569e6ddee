"""What an unwind table is compiled from, found in an x86_64 ELF image by its own headers: the .eh_frame and
.debug_frame bytes, the bases of relative pointers, and the executable PT_LOAD ranges that FDEs must lie in.

The headers are read with struct, not pyelftools: three tables of fixed-size records, and this runs once per binary
the agent meets. A file whose section headers are missing or broken still has PT_GNU_EH_FRAME, which leads to
.eh_frame through .eh_frame_hdr (a vDSO or a binary stripped with sstrip).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from producers.unwind_cfi import BadProgram, Bases, read_encoded

EM_X86_64 = 62
PT_LOAD, PT_GNU_EH_FRAME, PF_X = 1, 0x6474E550, 1
SHT_NOBITS, SHF_COMPRESSED, ELFCOMPRESS_ZLIB = 8, 0x800, 1
MAX_DEBUG_FRAME = 1 << 30  # decompressed .debug_frame bytes (a compression bomb stops here)
MAX_NAMES = 1 << 24  # bytes of section names read
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_CHDR = struct.Struct("<IIQQ")
_M64 = (1 << 64) - 1
_WANTED = (b".eh_frame", b".debug_frame", b".zdebug_frame", b".text", b".got", b".got.plt")


class UnwindTableError(Exception):
    """A file that cannot be read as an x86_64 ELF image at all; the message is one line with the reason."""


@dataclass
class CfiSources:
    eh_frame: bytes
    eh_frame_addr: int
    debug_frame: bytes
    bases: Bases
    code_ranges: list[tuple[int, int]] | None  # executable PT_LOAD [start, end); None: no program headers


@dataclass
class _Section:
    type: int
    flags: int
    addr: int
    offset: int
    size: int


class Image:
    """An ELF image's bytes, read where needed: a file through pread (its pages stay out of this process's memory),
    or bytes already in memory."""

    def __init__(self, size: int, read: Callable[[int, int], bytes]) -> None:
        self.size, self._read = size, read

    @classmethod
    def of_bytes(cls, data: bytes) -> Image:
        return cls(len(data), lambda off, n: bytes(data[off:off + n]))

    def read(self, offset: int, n: int) -> bytes:
        """Up to n bytes at offset: fewer where the image ends."""
        if offset < 0 or n <= 0 or offset >= self.size:
            return b""
        return self._read(offset, min(n, self.size - offset))


def _sections(img: Image, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> tuple[dict[bytes, _Section],
                                                                                           _Section | None]:
    """The wanted sections by name (the first of each name) and section 0, or nothing when the table is broken."""
    if shoff == 0 or shentsize != _SHDR.size or shoff + _SHDR.size > img.size:
        return {}, None
    first = _SHDR.unpack(img.read(shoff, _SHDR.size))
    zero = _Section(first[1], first[2], first[3], first[4], first[5])
    count = shnum or first[5]  # more than 0xff00 sections: the count is in section 0's sh_size
    strndx = first[6] if shstrndx == 0xFFFF else shstrndx
    if count > (img.size - shoff) // _SHDR.size or strndx >= count:
        return {}, zero
    table = img.read(shoff, count * _SHDR.size)
    headers = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(count)]
    names = img.read(headers[strndx][4], min(headers[strndx][5], MAX_NAMES))
    found: dict[bytes, _Section] = {}
    for name, kind, flags, addr, offset, size, *_ in headers:
        stop = names.find(b"\0", name, name + 32)
        label = names[name:stop] if stop > 0 else b""
        if label in _WANTED and label not in found:
            found[label] = _Section(kind, flags, addr, offset, size)
    return found, zero


def _contents(img: Image, sec: _Section | None) -> bytes:
    """A section's bytes, as many as the image holds."""
    if sec is None or sec.type == SHT_NOBITS:
        return b""
    return img.read(sec.offset, sec.size)


def _debug_frame(img: Image, found: dict[bytes, _Section]) -> bytes:
    """.debug_frame, decompressed (SHF_COMPRESSED zlib, or the older .zdebug_frame); b"" when it cannot be read."""
    try:
        sec = found.get(b".debug_frame")
        if sec is not None:
            data = _contents(img, sec)
            if not sec.flags & SHF_COMPRESSED:
                return data
            kind, _, size, _ = _CHDR.unpack_from(data, 0)
            if kind != ELFCOMPRESS_ZLIB:
                return b""
            return zlib.decompressobj().decompress(data[_CHDR.size:], min(size, MAX_DEBUG_FRAME))
        data = _contents(img, found.get(b".zdebug_frame"))
        if data[:4] == b"ZLIB":
            return zlib.decompressobj().decompress(data[12:], min(int.from_bytes(data[4:12], "big"), MAX_DEBUG_FRAME))
    except (zlib.error, struct.error):
        pass
    return b""


def _eh_frame_from_header(img: Image, segments: list[tuple]) -> tuple[bytes, int]:
    """.eh_frame found through PT_GNU_EH_FRAME and .eh_frame_hdr: its bytes up to its segment's end, its address."""
    for kind, _, offset, vaddr, _, filesz, _, _ in segments:
        hdr = img.read(offset, 16) if kind == PT_GNU_EH_FRAME and filesz >= 8 else b""
        if len(hdr) < 8 or hdr[0] != 1:
            continue
        try:
            target, _ = read_encoded(hdr, 4, hdr[1], vaddr, Bases(data=vaddr))
        except (BadProgram, IndexError):
            continue
        for k, _, o, v, _, fs, _, _ in segments:
            if k == PT_LOAD and v <= target < v + fs:
                return img.read(o + (target - v), fs - (target - v)), target
    return b"", 0


def locate(img: Image) -> CfiSources:
    """The CFI sources of an ELF image, or UnwindTableError for anything but a 64-bit little-endian x86_64 ELF
    header. Sections and segments that are broken or cut off count as absent."""
    head = img.read(0, _EHDR.size)
    if len(head) < _EHDR.size or head[:4] != b"\x7fELF":
        raise UnwindTableError("not an ELF file")
    if head[4] != 2 or head[5] != 1:
        raise UnwindTableError("not a 64-bit little-endian ELF file")
    _, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, shstrndx = _EHDR.unpack(head)
    if machine != EM_X86_64:
        raise UnwindTableError(f"not an x86_64 ELF file (e_machine {machine})")
    found, zero = _sections(img, shoff, shentsize, shnum, shstrndx)
    if phnum == 0xFFFF and zero is not None:  # PN_XNUM: the count is in section 0's sh_info
        phnum = struct.unpack("<I", img.read(shoff + 44, 4))[0]
    segments: list[tuple] = []
    if phoff and phentsize == _PHDR.size and phoff + phnum * _PHDR.size <= img.size:
        table = img.read(phoff, phnum * _PHDR.size)
        segments = [_PHDR.unpack_from(table, i * _PHDR.size) for i in range(phnum)]
    code = [(s[3], min(s[3] + s[6], _M64)) for s in segments if s[0] == PT_LOAD and s[1] & PF_X] if segments else None
    eh = found.get(b".eh_frame")
    if eh is not None and eh.type != SHT_NOBITS:
        eh_frame, eh_addr = _contents(img, eh), eh.addr
    else:
        eh_frame, eh_addr = _eh_frame_from_header(img, segments)
    text, got = found.get(b".text"), found.get(b".got") or found.get(b".got.plt")
    return CfiSources(eh_frame, eh_addr, _debug_frame(img, found),
                      Bases(text.addr if text else 0, got.addr if got else 0), code)
