"""The unwind table compiler on call-frame information written byte by byte (tests/unwind_builder.py): every DW_CFA
instruction and pointer encoding, exact rows, and the hostile inputs no compiler emits."""

from __future__ import annotations

import struct
import time
import zlib

import pytest

from producers.unwind_tables import (
    CFA_DEREF_RBP,
    CFA_DEREF_RSP,
    CFA_END,
    CFA_NONE,
    CFA_PLT,
    CFA_RBP,
    CFA_RSP,
    CFA_SIGNAL,
    CFA_UNSUPPORTED,
    RBP_AT_RBP,
    RBP_SAME,
    RBP_SAVED,
    RBP_UNKNOWN,
    UnwindTable,
    UnwindTableError,
    compile_unwind_table,
    compile_unwind_table_bytes,
)
from tests.unwind_builder import SHF_COMPRESSED, STD_CIE, Frames, elf_image, sleb, uleb

F = 0x2000  # where the functions of these tests start


def adv(n: int) -> bytes:
    return bytes([0x40 | n])


def cfa_offset(n: int) -> bytes:
    return b"\x0e" + uleb(n)


def offset(reg: int, factored: int) -> bytes:
    return bytes([0x80 | reg]) + uleb(factored)


def expr(*ops: bytes) -> bytes:
    body = b"".join(ops)
    return b"\x0f" + uleb(len(body)) + body


PUSH_RBP = cfa_offset(16) + offset(6, 2)  # after `push rbp`
PLT_EXPR = expr(b"\x77" + sleb(8), b"\x80\x00", b"\x3f\x1a", b"\x3b", b"\x2a\x33\x24\x22")  # T = 11


def rows(table: UnwindTable) -> list[tuple[int, int, int, int, int]]:
    """(pc, cfa_kind, cfa_offset, rbp_kind, rbp_offset) per row."""
    return [(pc, ck, co, rk, ro) for pc, co, ro, ck, rk in table.array().tolist()]


def compiled(frames: Frames, **kw) -> UnwindTable:
    return compile_unwind_table_bytes(elf_image({".eh_frame": (frames.addr, frames.bytes())}, **kw))


def one_fde(instr: bytes, length: int = 0x20, cie_instr: bytes = STD_CIE, **cie) -> list[tuple]:
    frames = Frames()
    frames.fde(frames.cie(cie_instr, **cie), F, length, instr)
    return rows(compiled(frames))


def stepped(*steps: tuple[bytes, tuple]) -> None:
    """Each step's instructions, then one byte further: the rule there must be the step's (kind, off, rkind, roff)."""
    got = one_fde(b"".join(instr + adv(1) for instr, _ in steps), length=len(steps))
    want, last = [], None
    for i, (_, rule) in enumerate(steps):
        if rule != last:
            want.append((F + i, *rule))
            last = rule
    assert got == [*want, (F + len(steps), CFA_NONE, 0, RBP_SAME, 0)]


def test_a_frame_pointer_prologue_and_epilogue():
    instr = adv(1) + PUSH_RBP + adv(3) + b"\x0d\x06" + adv(0x10) + b"\x0c\x07\x08"
    assert one_fde(instr) == [(F, CFA_RSP, 8, RBP_SAME, 0), (F + 1, CFA_RSP, 16, RBP_SAVED, -16),
                              (F + 4, CFA_RBP, 16, RBP_SAVED, -16), (F + 0x14, CFA_RSP, 8, RBP_SAVED, -16),
                              (F + 0x20, CFA_NONE, 0, RBP_SAME, 0)]


def test_remember_and_restore_state_around_an_early_return():
    instr = adv(1) + PUSH_RBP + adv(4) + b"\x0a" + cfa_offset(8) + b"\xc6" + adv(1) + b"\x0b" + adv(3)
    assert one_fde(instr, 0x10) == [(F, CFA_RSP, 8, RBP_SAME, 0), (F + 1, CFA_RSP, 16, RBP_SAVED, -16),
                                    (F + 5, CFA_RSP, 8, RBP_SAME, 0), (F + 6, CFA_RSP, 16, RBP_SAVED, -16),
                                    (F + 0x10, CFA_NONE, 0, RBP_SAME, 0)]


def test_every_rule_for_rbp():
    stepped((offset(6, 3), (CFA_RSP, 8, RBP_SAVED, -24)),
            (b"\x05\x06" + uleb(4), (CFA_RSP, 8, RBP_SAVED, -32)),  # offset_extended
            (b"\x11\x06" + sleb(-1), (CFA_RSP, 8, RBP_SAVED, 8)),  # offset_extended_sf
            (b"\x2f\x06" + uleb(2), (CFA_RSP, 8, RBP_SAVED, 16)),  # GNU_negative_offset_extended
            (b"\x09\x06\x03", (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # register
            (b"\x08\x06", (CFA_RSP, 8, RBP_SAME, 0)),  # same_value
            (b"\x14\x06\x02", (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # val_offset
            (b"\x07\x06", (CFA_RSP, 8, RBP_SAME, 0)),  # undefined
            (b"\x15\x06" + sleb(-2), (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # val_offset_sf
            (b"\x06\x06", (CFA_RSP, 8, RBP_SAME, 0)),  # restore_extended: no rule in the CIE
            (b"\x10\x06\x02\x76\x00", (CFA_RSP, 8, RBP_AT_RBP, 0)),  # expression breg6 0 (gcc's DRAP frames)
            (b"\x10\x06\x02\x76\x70", (CFA_RSP, 8, RBP_AT_RBP, -16)),  # breg6 -16
            (b"\x10\x06\x03\x76\x00\x06", (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # breg6 0; deref: another rule
            (b"\x16\x06\x02\x76\x00", (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # val_expression
            (offset(6, 5000), (CFA_RSP, 8, RBP_UNKNOWN, 0)),  # -40000 does not fit an s16
            (b"\xc6", (CFA_RSP, 8, RBP_SAME, 0)))  # restore


def test_every_rule_for_the_cfa():
    stepped((b"\x12\x07" + sleb(-2), (CFA_RSP, 16, RBP_SAME, 0)),  # def_cfa_sf: factored by -8
            (b"\x13" + sleb(-3), (CFA_RSP, 24, RBP_SAME, 0)),  # def_cfa_offset_sf
            (b"\x0c\x06\x10" + offset(6, 2), (CFA_RBP, 16, RBP_SAVED, -16)),
            (b"\x0c\x0a\x00", (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # from r10: gcc's DRAP prologue
            (PLT_EXPR, (CFA_PLT, 8, RBP_SAME, 11)),
            (expr(b"\x76" + sleb(-16), b"\x06"), (CFA_DEREF_RBP, -16, RBP_SAVED, -16)),
            (b"\x0e\x10", (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # def_cfa_offset on an expression
            (expr(b"\x77" + sleb(160), b"\x06"), (CFA_DEREF_RSP, 160, RBP_SAVED, -16)),
            (b"\x0d\x07", (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # def_cfa_register on an expression
            (expr(b"\x77" + sleb(24)), (CFA_RSP, 24, RBP_SAVED, -16)),
            (expr(b"\x77\x08\x06\x06"), (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # two derefs: not a form we know
            (expr(b"\x77" + sleb(8), b"\x80\x00\x3f\x1a\x50\x2a\x33\x24\x22"), (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),
            (b"\x0c\x07" + uleb(1 << 33), (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # past an s32
            (b"\x0c\x07\x08", (CFA_RSP, 8, RBP_SAVED, -16)))


def test_the_return_address_column():
    stepped((b"\x07\x10", (CFA_END, 0, RBP_SAME, 0)),  # undefined: the outermost frame
            (b"\x06\x10", (CFA_RSP, 8, RBP_SAME, 0)),  # restore_extended: at cfa-8 again
            (offset(16, 2), (CFA_UNSUPPORTED, 0, RBP_SAME, 0)),  # at cfa-16
            (b"\xd0", (CFA_RSP, 8, RBP_SAME, 0)),  # restore
            (b"\x08\x10", (CFA_UNSUPPORTED, 0, RBP_SAME, 0)))  # same_value
    assert one_fde(b"", cie_instr=b"\x0c\x07\x08") == [(F, CFA_UNSUPPORTED, 0, RBP_SAME, 0),
                                                       (F + 0x20, CFA_NONE, 0, RBP_SAME, 0)]  # no rule at all
    assert one_fde(b"", ra=15)[0][1] == CFA_UNSUPPORTED


def test_advances_factors_and_set_loc():
    frames = Frames()
    cie = frames.cie(caf=4)
    at = len(frames.data) + 17  # where this FDE's instructions start
    instr = adv(1) + cfa_offset(16) + b"\x02\x02" + cfa_offset(24) + b"\x03\x01\x00" + cfa_offset(32)
    instr += b"\x04\x01\x00\x00\x00" + cfa_offset(40) + b"\x2e\x10\x00\x00"  # GNU_args_size, nops
    set_loc = len(instr)
    instr += b"\x01" + struct.pack("<i", (F + 0x40) - (frames.addr + at + set_loc + 1)) + cfa_offset(48)
    instr += b"\x1d" + struct.pack("<Q", 2) + cfa_offset(56)  # MIPS_advance_loc8
    frames.fde(cie, F, 0x100, instr)
    at = len(frames.data) + 17
    backwards = adv(1) + b"\x01" + struct.pack("<i", (F + 0x100) - (frames.addr + at + 2)) + cfa_offset(16)
    frames.fde(cie, F + 0x100, 0x10, backwards)
    assert [r[:3] for r in rows(compiled(frames))] == [
        (F, CFA_RSP, 8), (F + 4, CFA_RSP, 16), (F + 12, CFA_RSP, 24), (F + 16, CFA_RSP, 32), (F + 20, CFA_RSP, 40),
        (F + 0x40, CFA_RSP, 48), (F + 0x48, CFA_RSP, 56), (F + 0x100, CFA_RSP, 8), (F + 0x104, CFA_UNSUPPORTED, 0),
        (F + 0x110, CFA_NONE, 0)]


def test_signal_frames_and_unknown_opcodes():
    assert one_fde(PUSH_RBP + adv(1), aug=b"zRS")[0] == (F, CFA_SIGNAL, 0, RBP_SAME, 0)
    assert one_fde(adv(1) + cfa_offset(16) + adv(1) + b"\x3f" + cfa_offset(8)) == [
        (F, CFA_RSP, 8, RBP_SAME, 0), (F + 1, CFA_RSP, 16, RBP_SAME, 0), (F + 2, CFA_UNSUPPORTED, 0, RBP_SAME, 0),
        (F + 0x20, CFA_NONE, 0, RBP_SAME, 0)]


def test_gaps_neighbours_and_overlaps():
    frames = Frames()
    cie = frames.cie()
    frames.fde(cie, F, 0x10)
    frames.fde(cie, F + 0x10, 0x10)  # starts where the one before ends, with the same rule: one row
    frames.fde(cie, F + 0x30, 0x10, adv(4) + cfa_offset(16))
    frames.fde(cie, F + 0x34, 0x4, cfa_offset(64))  # inside the one before: the first read wins
    frames.fde(cie, F + 0x80, 0x10, cfa_offset(32))
    frames.fde(cie, F + 0x40, 0x80)  # covers the one before, which was read first and keeps its range
    frames.fde(cie, F + 0x200, 0)  # empty
    table = compiled(frames)
    assert [r[:3] for r in rows(table)] == [(F, CFA_RSP, 8), (F + 0x20, CFA_NONE, 0), (F + 0x30, CFA_RSP, 8),
                                            (F + 0x34, CFA_RSP, 16), (F + 0x40, CFA_RSP, 8),
                                            (F + 0x80, CFA_RSP, 32), (F + 0x90, CFA_RSP, 8),
                                            (F + 0xC0, CFA_NONE, 0)]
    assert table.stats["overlapping_fdes"] == 4


def test_pointer_encodings_and_augmentations():
    frames, got, text = Frames(), 0x300000, 0x1000
    fixed = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}
    encodings = [0x1B, 0x00, 0x02, 0x03, 0x04, 0x0A, 0x0C, 0x01, 0x09, 0x3B, 0x2B, 0x1C]
    for k, enc in enumerate(encodings):
        if k % 3 == 0:
            cie = frames.cie(aug=b"zR", aug_data=bytes([enc]))
        elif k % 3 == 1:  # personality indirect|pcrel|sdata4, LSDA pcrel|sdata4: 4 more bytes in each FDE
            cie = frames.cie(aug=b"zPLR", aug_data=b"\x9b" + bytes(4) + b"\x1b" + bytes([enc]))
        else:  # personality DW_EH_PE_aligned: 8 bytes at the next multiple of 8 after the encoding byte
            pad = -(len(frames.data) + 18) % 8
            cie = frames.cie(aug=b"zPR", aug_data=b"\x50" + bytes(pad) + struct.pack("<Q", 0x1234) + bytes([enc]))
        start, field = F + 0x100 * k, frames.addr + len(frames.data) + 8
        value = start - {0x00: 0, 0x10: field, 0x20: text, 0x30: got}[enc & 0x70]
        fmt = enc & 0x0F
        if fmt in (0x01, 0x09):
            address = (uleb(value) + uleb(0x10)) if fmt == 0x01 else (sleb(value) + sleb(0x10))
        else:
            address = struct.pack(fixed[fmt], value) + struct.pack(fixed[fmt], 0x10)
        frames.fde(cie, start, 0x10, cfa_offset(16 + 8 * k), aug_data=bytes(4) if k % 3 == 1 else b"",
                   address=address)
    image = elf_image({".eh_frame": (frames.addr, frames.bytes()), ".got": (got, bytes(16)), ".text": (text, b"")})
    table = compile_unwind_table_bytes(image)
    assert table.stats["fdes"] == len(encodings) and table.stats["fdes_skipped"] == 0
    for k, enc in enumerate(encodings):
        assert table.rule_at(F + 0x100 * k) == (CFA_RSP, 16 + 8 * k, RBP_SAME, 0), hex(enc)


def test_debug_frame_fills_what_eh_frame_leaves_uncovered():
    eh = Frames()
    eh.fde(eh.cie(), F, 0x10, cfa_offset(16))
    debug = Frames(0, eh=False)
    v4 = debug.cie(aug=b"", version=4, tail=b"\x08\x00")  # address size 8, no segment selector
    v3 = debug.cie(aug=b"", version=3)
    debug.fde(v4, F + 8, 0x10, cfa_offset(24), aug_data=None)  # half under .eh_frame's FDE
    debug.fde(v3, F + 0x40, 0x10, cfa_offset(32), aug_data=None)
    debug.fde(v3, 0, 0x10, cfa_offset(40), aug_data=None)  # a function the linker dropped: outside the code
    expected = [(F, CFA_RSP, 16), (F + 0x10, CFA_RSP, 24), (F + 0x18, CFA_NONE, 0), (F + 0x40, CFA_RSP, 32),
                (F + 0x50, CFA_NONE, 0)]
    compressed = struct.pack("<IIQQ", 1, 0, len(debug.bytes()), 8) + zlib.compress(debug.bytes())
    for data, flags in ((debug.bytes(), {}), (compressed, {".debug_frame": SHF_COMPRESSED})):
        table = compile_unwind_table_bytes(elf_image({".eh_frame": (eh.addr, eh.bytes()), ".debug_frame": (0, data)},
                                                     flags=flags))
        assert [r[:3] for r in rows(table)] == expected
        assert table.stats["debug_frame_fdes"] == 3 and table.stats["from_debug_frame"] == 2
        assert table.stats["fdes_outside_code"] == 1


def test_64_bit_entries_and_what_follows_a_zero_terminator():
    frames = Frames()
    cie = len(frames.data)
    body = b"\0" * 8 + b"\x01zR\0\x01\x78\x10\x01\x1b" + STD_CIE
    frames.data += b"\xff\xff\xff\xff" + struct.pack("<Q", len(body)) + body
    fde = len(frames.data)
    body = struct.pack("<Q", fde + 12 - cie) + struct.pack("<iI", F - (frames.addr + fde + 20), 0x10) + b"\0"
    frames.data += b"\xff\xff\xff\xff" + struct.pack("<Q", len(body) + 2) + body + cfa_offset(16)
    frames.data += bytes(4)
    frames.fde(frames.cie(), F + 0x100, 0x10)  # after the terminator: never read
    assert [r[:3] for r in rows(compiled(frames))] == [(F, CFA_RSP, 16), (F + 0x10, CFA_NONE, 0)]


@pytest.mark.parametrize("bomb", [b"\x0a" * 200_000, b"\x0e" + b"\xff" * 1_000_000 + b"\x01", b"\x0b",
                                  b"\x0c\x07", b"\x0f\x40\x77", b"\x10\x06\x7f",
                                  b"\x00" * (1 << 19) + cfa_offset(16)])
def test_hostile_instructions_spoil_their_fde_and_nothing_else(bomb):
    """Stack bombs, endless LEB128, restore_state underflow, operands past the end, programs past the size cap:
    the rule from there on is CFA_UNSUPPORTED, the next FDE is read as usual."""
    frames = Frames()
    cie = frames.cie()
    frames.fde(cie, F, 0x10, adv(1) + bomb)
    frames.fde(cie, F + 0x10, 0x10, cfa_offset(16))
    started = time.monotonic()
    table = compiled(frames)
    assert time.monotonic() - started < 5
    assert [r[:3] for r in rows(table)] == [(F, CFA_RSP, 8), (F + 1, CFA_UNSUPPORTED, 0), (F + 0x10, CFA_RSP, 16),
                                            (F + 0x20, CFA_NONE, 0)]
    assert table.stats["fdes_broken"] == 1


def test_broken_entries_are_skipped_and_counted():
    frames = Frames()
    cie = frames.cie()
    frames.fde(cie, F, 0x10)
    frames.raw(struct.pack("<I", 4) + struct.pack("<iI", 0, 0x10) + b"\0")  # its CIE pointer points at itself
    frames.raw(struct.pack("<I", len(frames.data) + 4 - 4) + struct.pack("<iI", 0, 0x10) + b"\0")  # at an FDE
    frames.raw(struct.pack("<I", 1 << 30) + bytes(9))  # before the section
    frames.fde(frames.cie(aug=b"zXR"), F + 0x20, 0x10)  # an augmentation unknown: it may change anything after
    frames.fde(frames.raw(b"\0\0\0\0\x01xy\0\x01\x78\x10"), F + 0x40, 0x10)  # no 'z': where do its rules begin?
    frames.fde(frames.cie(version=2), F + 0x60, 0x10)
    frames.fde(cie, F + 0x80, 0x10, address=struct.pack("<ii", F - (frames.addr + len(frames.data) + 8), -16))
    frames.fde(cie, F + 0xA0, 0x10, aug_data=None, instr=uleb(1000))  # augmentation data past the end of its FDE
    frames.fde(cie, F + 0xC0, 0x10)
    frames.data += struct.pack("<I", 0xFFFFFF00) + bytes(20)  # a length past the end: the walk stops
    table = compiled(frames)
    assert [r[:3] for r in rows(table)] == [(F, CFA_RSP, 8), (F + 0x10, CFA_NONE, 0), (F + 0xC0, CFA_RSP, 8),
                                            (F + 0xD0, CFA_NONE, 0)]
    assert table.stats["fdes_skipped"] == 9


def test_addresses_past_32_bits_are_refused_and_outside_the_code_dropped():
    frames = Frames(addr=0xFFFF0000)
    frames.fde(frames.cie(), 0x1_0000_1000, 0x10)
    with pytest.raises(UnwindTableError, match="past 32 bits"):
        compiled(frames, code=None)
    table = compiled(frames)  # the code segment says where functions can be: this FDE is not among them
    assert table.count == 0 and table.stats["fdes_outside_code"] == 1


def test_a_code_segment_that_ends_past_64_bits():
    """Found by atheris: vaddr + memsz past 2**64 overflowed the range check."""
    frames = Frames()
    frames.fde(frames.cie(), F, 0x10)
    image = elf_image({".eh_frame": (frames.addr, frames.bytes())}, code=None,
                      extra_phdrs=[(1, 5, 0, (1 << 64) - 0x1000, 0, 0x10000), (1, 5, 0, 0x1000, 0, 0x10000)])
    assert [r[:3] for r in rows(compile_unwind_table_bytes(image))] == [(F, CFA_RSP, 8), (F + 0x10, CFA_NONE, 0)]


@pytest.mark.parametrize("image", [b"", b"\x7fELF", b"MZ" + bytes(100), elf_image({})[:40],
                                   b"\x7fELF\x01" + elf_image({})[5:], b"\x7fELF\x02\x02" + elf_image({})[6:],
                                   elf_image({}, machine=3)])
def test_what_is_no_x86_64_elf_image_is_refused_in_one_line(image):
    with pytest.raises(UnwindTableError) as caught:
        compile_unwind_table_bytes(image)
    assert "\n" not in str(caught.value)


def test_a_file_that_cannot_be_read(tmp_path):
    for path in (tmp_path / "missing", tmp_path):
        with pytest.raises(UnwindTableError, match=str(tmp_path)):
            compile_unwind_table(path)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(UnwindTableError, match="empty"):
        compile_unwind_table(tmp_path / "empty")


def test_no_call_frame_information_is_an_empty_table():
    table = compile_unwind_table_bytes(elf_image({".text": (0x1000, b"\xc3")}))
    assert table.rows == b"" and table.count == 0
