"""The CIEs and FDEs of an .eh_frame or .debug_frame section, read straight from its bytes, and every FDE's rules
(producers/unwind_rules.py) collected into flat arrays: no Python object per row, and one per FDE only while it is
read, so that a binary of hundreds of MB costs arrays, not lists.

pyelftools decodes the same (elftools.dwarf.callframe) 20-40 times slower (bench/unwind_tables.py): it builds an
object for every instruction and row. FDEs that run the same program from the same CIE (about half do) are executed
once. Hostile bytes never raise here: an entry that cannot be read is skipped and counted, and the walk stops at the
first length that runs past the section's end (nothing after it can be found).
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from producers.unwind_rules import (
    ABSOLUTE,
    BROKEN,
    INITIAL_STATE,
    RA_OTHER,
    REG_RA,
    SIGNAL_CODE,
    UNSUPPORTED_CODE,
    BadProgram,
    execute,
    sleb,
    uleb,
)

M64 = (1 << 64) - 1
MAX_PC = 0xFFFFFFFF  # a row's pc is a u32; the end of the last FDE is a row too
MAX_MEMO = 1 << 14  # distinct FDE programs remembered per section (a few MB)
_U32, _U64, _S32S32 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<ii")
# DW_EH_PE value formats: (size, signed); 0x01 and 0x09 are LEB128
_FIXED = {0x00: (8, False), 0x02: (2, False), 0x03: (4, False), 0x04: (8, False),
          0x0A: (2, True), 0x0B: (4, True), 0x0C: (8, True)}
_PCREL_SDATA4 = 0x1B  # what gcc and ld use for FDE addresses: 4 bytes, signed, relative to the field


@dataclass(frozen=True)
class Bases:
    """The addresses that DW_EH_PE_textrel and DW_EH_PE_datarel values are relative to."""

    text: int = 0
    data: int = 0


class Cie:
    """What an FDE needs of its CIE."""

    __slots__ = ("caf", "daf", "fde_enc", "has_z", "signal", "broken", "seg_size", "rules0", "state")

    def __init__(self) -> None:
        self.caf, self.daf = 1, 1  # code and data alignment factors
        self.fde_enc = 0x00  # DW_EH_PE_absptr
        self.has_z = self.signal = self.broken = False
        self.seg_size = 0
        self.rules0: tuple[int, int] = (0, RA_OTHER)  # (rbp, ra) after the initial instructions: DW_CFA_restore's
        self.state: tuple = INITIAL_STATE


class CfiRows:
    """The FDEs kept (inside the code, below 2**32), in the order read, with their rows: locations relative to the
    FDE's start and rule codes."""

    def __init__(self, code_ranges: list[tuple[int, int]] | None = None) -> None:
        self.code_ranges = code_ranges  # executable [start, end) ranges an FDE must lie in; None: any
        self.fde_start = array("I")
        self.fde_end = array("I")
        self.fde_rows = array("I")  # rows of each FDE, in order
        self.row_loc = array("I")
        self.row_code = array("Q")
        self.stats = {"cies": 0, "fdes": 0, "fdes_skipped": 0, "fdes_broken": 0, "signal_fdes": 0,
                      "fdes_outside_code": 0, "fdes_past_32_bits": 0}

    def __len__(self) -> int:
        return len(self.fde_start)


def read_encoded(d: bytes, p: int, enc: int, section_addr: int, bases: Bases) -> tuple[int, int]:
    """A DW_EH_PE-encoded pointer at d[p] (d starting at section_addr): (value, next p). The indirect bit (0x80) is
    the caller's to judge; DW_EH_PE_funcrel values come back unrelocated."""
    app, fmt = enc & 0x70, enc & 0x0F
    if app == 0x50:  # DW_EH_PE_aligned: an absolute pointer at the next 8-byte boundary
        p = ((section_addr + p + 7) & ~7) - section_addr
    here = section_addr + p
    if fmt == 0x01:
        v, p = uleb(d, p)
    elif fmt == 0x09:
        v, p = sleb(d, p)
    else:
        size_signed = _FIXED.get(fmt)
        if size_signed is None:
            raise BadProgram(f"pointer encoding 0x{enc:02x}")
        size, signed = size_signed
        if p + size > len(d):
            raise BadProgram("pointer past the end")
        v = int.from_bytes(d[p:p + size], "little", signed=signed)
        p += size
    if app == 0x10:
        v += here
    elif app == 0x20:
        v += bases.text
    elif app == 0x30:
        v += bases.data
    elif app not in (0x00, 0x40, 0x50):
        raise BadProgram(f"pointer application 0x{enc:02x}")
    return v & M64, p


def _header(d: bytes, pos: int) -> tuple[int, int, int, int] | None:
    """(body, end, id, id size) of the entry at pos, or None when its length does not fit the section."""
    if pos < 0 or pos + 4 > len(d):
        return None
    length = _U32.unpack_from(d, pos)[0]
    if length == 0xFFFFFFFF:
        if pos + 12 > len(d):
            return None
        length, body, idsize = _U64.unpack_from(d, pos + 4)[0], pos + 12, 8
    else:
        body, idsize = pos + 4, 4
    end = body + length
    if length < idsize or end > len(d):
        return None
    ident = (_U32 if idsize == 4 else _U64).unpack_from(d, body)[0]
    return body, end, ident, idsize


def _is_cie(ident: int, idsize: int, eh: bool) -> bool:
    return ident == 0 if eh else ident == (0xFFFFFFFF if idsize == 4 else M64)


def parse_cie(d: bytes, pos: int, eh: bool, section_addr: int, bases: Bases) -> Cie | None:
    """The CIE at pos, or None when there is none or it cannot be read."""
    try:
        return _parse_cie(d, pos, eh, section_addr, bases)
    except (BadProgram, IndexError, ValueError, struct.error):
        return None


def _parse_cie(d: bytes, pos: int, eh: bool, section_addr: int, bases: Bases) -> Cie | None:
    head = _header(d, pos)
    if head is None or not _is_cie(head[2], head[3], eh):
        return None
    body, end, _, idsize = head
    cie = Cie()
    p = body + idsize
    version = d[p]
    if version not in (1, 3, 4):
        return None
    nul = d.index(b"\0", p + 1, end)
    aug, p = d[p + 1:nul], nul + 1
    address_size = 8
    if aug.startswith(b"eh"):  # gcc before 3.0: the address of the exception table
        aug, p = aug[2:], p + 8
    if version >= 4:
        address_size, cie.seg_size, p = d[p], d[p + 1], p + 2
    cie.caf, p = uleb(d, p)
    cie.daf, p = sleb(d, p)
    if version == 1:
        ra_column, p = d[p], p + 1
    else:
        ra_column, p = uleb(d, p)
    if not eh:
        cie.fde_enc = {8: 0x00, 4: 0x03, 2: 0x02}.get(address_size, -1)
    if aug.startswith(b"z"):
        cie.has_z = True
        size, p = uleb(d, p)
        q, p = p, p + size
        for ch in aug[1:]:
            if ch == 0x52:  # 'R': the FDE address encoding
                cie.fde_enc, q = d[q], q + 1
            elif ch == 0x50:  # 'P': the personality routine (its encoding, then the pointer), not needed here
                _, q = read_encoded(d, q + 1, d[q], section_addr, bases)
            elif ch == 0x4C:  # 'L': the LSDA encoding (the pointer is in each FDE's augmentation data)
                q += 1
            elif ch == 0x53:  # 'S': a signal frame
                cie.signal = True
            elif ch not in (0x42, 0x47):  # 'B', 'G' (AArch64) need nothing; an unknown one may change anything after
                return None
    elif aug:
        return None  # an augmentation without its length: where the instructions begin is unknown
    if p > end or cie.fde_enc < 0 or cie.fde_enc & 0x80 or cie.caf == 0:
        return None
    _, _, state, flags = execute(d, p, end, cie.caf, cie.daf, (0, RA_OTHER), INITIAL_STATE)
    cie.broken = bool(flags & BROKEN) or ra_column != REG_RA
    cie.state, cie.rules0 = state, (state[3], state[4])
    return cie


def _loc_reader(enc: int, section_addr: int, bases: Bases, start: int) -> Callable[[bytes, int], tuple[int, int]]:
    """DW_CFA_set_loc's operand, relative to the FDE's start."""

    def read(d: bytes, p: int) -> tuple[int, int]:
        v, p = read_encoded(d, p, enc, section_addr, bases)
        return v - start, p

    return read


def read_cfi(d: bytes, section_addr: int, eh: bool, bases: Bases, out: CfiRows) -> None:
    """Every FDE of the section d (an .eh_frame when `eh`, else a .debug_frame), appended to `out`."""
    stats, n, pos = out.stats, len(d), 0
    cies: dict[int, Cie | None] = {}
    memo: dict[tuple[int, bytes], tuple[list[int], list[int], int]] = {}
    code_ranges = out.code_ranges
    add_start, add_end, add_rows = out.fde_start.append, out.fde_end.append, out.fde_rows.append
    add_locs, add_codes = out.row_loc.extend, out.row_code.extend
    while pos + 4 <= n:
        length = _U32.unpack_from(d, pos)[0]
        if not length:
            if eh:
                break  # the zero terminator
            pos += 4  # .debug_frame: padding
            continue
        if 4 <= length < 0xFFFFFFF0 and length <= n - pos - 4:  # the common case, here; _header is the rest
            body, end, idsize = pos + 4, pos + 4 + length, 4
            ident = _U32.unpack_from(d, body)[0]
        else:
            head = _header(d, pos)
            if head is None:
                stats["fdes_skipped"] += 1  # a length past the end: whatever follows cannot be found
                break
            body, end, ident, idsize = head
        entry, pos = pos, end
        if _is_cie(ident, idsize, eh):
            stats["cies"] += 1
            if entry not in cies:
                cies[entry] = parse_cie(d, entry, eh, section_addr, bases)
            continue
        stats["fdes"] += 1
        cie_pos = body - ident if eh else ident
        cie = cies[cie_pos] if cie_pos in cies else cies.setdefault(
            cie_pos, parse_cie(d, cie_pos, eh, section_addr, bases))
        if cie is None:
            stats["fdes_skipped"] += 1
            continue
        try:
            p = body + idsize
            enc = cie.fde_enc
            if enc == _PCREL_SDATA4:
                v, length = _S32S32.unpack_from(d, p)
                start, p = (section_addr + p + v) & M64, p + 8
            else:
                start, p = read_encoded(d, p + cie.seg_size, enc, section_addr, bases)
                length, p = read_encoded(d, p, enc & 0x0F, 0, bases)
                length = length - (1 << 64) if length >> 63 else length  # a signed format's negative value
            if cie.has_z:
                size, p = uleb(d, p)
                p += size
        except (BadProgram, IndexError, struct.error):
            stats["fdes_skipped"] += 1
            continue
        if p > end or length < 0 or start + length > M64:
            stats["fdes_skipped"] += 1
            continue
        if length == 0:
            continue  # covers nothing
        stop = start + length
        if code_ranges is not None:
            for lo, hi in code_ranges:
                if lo <= start and stop <= hi:
                    break
            else:
                stats["fdes_outside_code"] += 1  # a function the linker dropped (address 0), or garbage
                continue
        if stop > MAX_PC:
            stats["fdes_past_32_bits"] += 1  # the caller refuses the file: a row's pc is a u32
            continue
        if cie.signal:
            pcs, codes, flags = [0], [SIGNAL_CODE], 0
            stats["signal_fdes"] += 1
        elif cie.broken:
            pcs, codes, flags = [0], [UNSUPPORTED_CODE], 0
        else:
            key = (cie_pos, d[p:end])
            hit = memo.get(key)
            if hit is None:
                read_loc = _loc_reader(enc, section_addr, bases, start)
                pcs, codes, _, flags = execute(d, p, end, cie.caf, cie.daf, cie.rules0, cie.state, read_loc)
                if not flags & ABSOLUTE and len(memo) < MAX_MEMO:
                    memo[key] = (pcs, codes, flags)
            else:
                pcs, codes, flags = hit
            if flags & BROKEN:
                stats["fdes_broken"] += 1
        if pcs[-1] >= length:  # rows past the FDE's end
            k = bisect_left(pcs, length)
            pcs, codes = pcs[:k], codes[:k]
        add_start(start)
        add_end(stop)
        add_rows(len(pcs))
        add_locs(pcs)
        add_codes(codes)

