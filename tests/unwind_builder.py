"""Call-frame information written byte by byte, and the smallest x86_64 ELF image that carries it: exact inputs for
the unwind table tests, down to the hostile ones no compiler emits."""

from __future__ import annotations

import struct

CODE = (0x1000, 0x100000)  # the executable PT_LOAD of every image built here
STD_CIE = b"\x0c\x07\x08\x90\x01"  # DW_CFA_def_cfa rsp 8; DW_CFA_offset rip at cfa-8: what gcc's CIEs say
SHF_COMPRESSED = 0x800


def uleb(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def sleb(v: int) -> bytes:
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        done = (v == 0 and not b & 0x40) or (v == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


class Frames:
    """An .eh_frame (or, with eh=False, a .debug_frame) at `addr`, entry by entry."""

    def __init__(self, addr: int = 0x200000, eh: bool = True) -> None:
        self.addr, self.eh = addr, eh
        self.data = bytearray()

    def raw(self, body: bytes) -> int:
        """An entry with a 32-bit length; returns its offset."""
        off = len(self.data)
        self.data += struct.pack("<I", len(body)) + body
        return off

    def cie(self, instr: bytes = STD_CIE, aug: bytes = b"zR", aug_data: bytes = b"\x1b", caf: int = 1, daf: int = -8,
            ra: int = 16, version: int = 1, tail: bytes = b"") -> int:
        """tail: what comes between the augmentation string and the alignment factors (version 4's sizes)."""
        ident = b"\0\0\0\0" if self.eh else b"\xff\xff\xff\xff"
        body = ident + bytes([version]) + aug + b"\0" + tail + uleb(caf) + sleb(daf)
        body += bytes([ra]) if version == 1 else uleb(ra)
        if aug.startswith(b"z"):
            body += uleb(len(aug_data)) + aug_data
        return self.raw(body + instr)

    def fde(self, cie: int, start: int, length: int, instr: bytes = b"", aug_data: bytes | None = b"",
            address: bytes | None = None) -> int:
        """An FDE; its address pcrel sdata4 (.eh_frame) or 8 bytes absolute (.debug_frame) unless `address` (the
        encoded start and length) is given. aug_data None: the CIE has no 'z'."""
        off = len(self.data)
        if self.eh:
            pointer = struct.pack("<I", off + 4 - cie)
            if address is None:
                address = struct.pack("<iI", start - (self.addr + off + 8), length)
        else:
            pointer = struct.pack("<I", cie)
            if address is None:
                address = struct.pack("<QQ", start, length)
        aug = b"" if aug_data is None else uleb(len(aug_data)) + aug_data
        return self.raw(pointer + address + aug + instr)

    def bytes(self, terminator: bool = True) -> bytes:
        return bytes(self.data) + (b"\0\0\0\0" if terminator and self.eh else b"")


def elf_image(sections: dict[str, tuple[int, bytes]], code: tuple[int, int] | None = CODE,
              flags: dict[str, int] | None = None, machine: int = 62, extra_phdrs: list[tuple] = ()) -> bytes:
    """An ELF64 x86_64 image: one PT_LOAD R+X over `code` (none when None), `sections` as {name: (address, bytes)}
    (PROGBITS), a .shstrtab. extra_phdrs: (type, flags, offset, vaddr, filesz, memsz)."""
    flags = flags or {}
    names = b"\0.shstrtab\0" + b"".join(n.encode() + b"\0" for n in sections)
    phdrs = ([(1, 5, 0, code[0], 0, code[1] - code[0])] if code else []) + list(extra_phdrs)
    body, offsets, at = bytearray(), [], 64 + 56 * len(phdrs)
    for _, data in sections.values():
        offsets.append(at + len(body))
        body += data + b"\0" * (-len(data) % 8)
    names_at = at + len(body)
    body += names + b"\0" * (-len(names) % 8)
    shoff = at + len(body)
    shdrs = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
             struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, names_at, len(names), 0, 0, 1, 0)]
    for (name, (addr, data)), off in zip(sections.items(), offsets, strict=True):
        shdrs.append(struct.pack("<IIQQQQIIQQ", names.index(b"\0" + name.encode() + b"\0") + 1, 1,
                                 2 | flags.get(name, 0), addr, off, len(data), 0, 0, 8, 0))
    ehdr = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\x02\x01\x01" + bytes(9), 2, machine, 1, 0,
                       64 if phdrs else 0, shoff, 0, 64, 56, len(phdrs), 64, len(shdrs), 1)
    ph = b"".join(struct.pack("<IIQQQQQQ", t, f, o, v, v, fs, ms, 0x1000) for t, f, o, v, fs, ms in phdrs)
    return ehdr + ph + bytes(body) + b"".join(shdrs)
