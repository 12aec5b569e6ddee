"""The x86_64 unwind rule of one address, as the BPF stack walker reads it, and the DW_CFA interpreter that turns a
CIE's or FDE's call-frame instructions into those rules, one per address where the rule changes.

A rule travels as one integer, its "code": the last 8 bytes of a `struct unwind_row` (see producers/unwind_tables.py)
read as a little-endian u64, so a table row is (pc: u32, code: u64) and rows compare and merge by their codes.
"""

from __future__ import annotations

import struct

# struct unwind_row { u32 pc; s32 cfa_offset; s16 rbp_offset; u8 cfa_kind; u8 rbp_kind; }, little-endian
ROW = struct.Struct("<IihBB")

CFA_NONE = 0  # no FDE covers the address
CFA_RSP = 1  # CFA = RSP + cfa_offset
CFA_RBP = 2  # CFA = RBP + cfa_offset
CFA_PLT = 3  # CFA = RSP + cfa_offset + ((RIP & 15) >= rbp_offset ? 8 : 0): a PLT stub
CFA_DEREF_RBP = 4  # CFA = *(RBP + cfa_offset): gcc's stack realignment (DRAP)
CFA_DEREF_RSP = 5  # CFA = *(RSP + cfa_offset)
CFA_SIGNAL = 6  # a signal frame: the registers are in the ucontext at RSP
CFA_END = 7  # the return address is undefined: the outermost frame
CFA_UNSUPPORTED = 8  # covered, but by a rule the walker cannot follow

RBP_SAME = 0  # the caller's RBP is this frame's RBP
RBP_SAVED = 1  # the caller's RBP is at CFA + rbp_offset
RBP_UNKNOWN = 2  # any other rule
RBP_AT_RBP = 3  # the caller's RBP is at RBP + rbp_offset: gcc's realigned stacks (DW_CFA_expression: breg6 N)

REG_RBP, REG_RSP, REG_RA = 6, 7, 16  # DWARF register numbers of x86_64
RA_OK, RA_UNDEFINED, RA_OTHER = 0, 1, 2  # the return address column: at CFA-8, undefined, anything else (or no rule)
CFA_BY_EXPRESSION, CFA_INVALID = -1, -2  # cfa_reg values that are no register
MAX_STATE_DEPTH = 64  # DW_CFA_remember_state nesting (gcc nests a few levels at most)
MAX_PROGRAM_BYTES = 1 << 18  # instructions read per CIE or FDE; the rest of a longer one is CFA_UNSUPPORTED
ABSOLUTE, BROKEN = 1, 2  # program flags: used DW_CFA_set_loc (rows depend on the FDE's start); stopped early
_M32 = 0xFFFFFFFF
_S32 = 1 << 31


def rule_code(cfa_kind: int, cfa_offset: int = 0, rbp_kind: int = RBP_SAME, rbp_offset: int = 0) -> int:
    return (cfa_offset & _M32) | (rbp_offset & 0xFFFF) << 32 | cfa_kind << 48 | rbp_kind << 56


def code_fields(code: int) -> tuple[int, int, int, int]:
    """(cfa_kind, cfa_offset, rbp_kind, rbp_offset) of a rule code."""
    cfa_offset = code & _M32
    rbp_offset = (code >> 32) & 0xFFFF
    return ((code >> 48) & 0xFF, cfa_offset - (1 << 32) if cfa_offset >= _S32 else cfa_offset,
            code >> 56, rbp_offset - 0x10000 if rbp_offset >= 0x8000 else rbp_offset)


NONE_CODE = rule_code(CFA_NONE)
SIGNAL_CODE = rule_code(CFA_SIGNAL)
END_CODE = rule_code(CFA_END)
UNSUPPORTED_CODE = rule_code(CFA_UNSUPPORTED)
_RSP_KIND, _RBP_KIND, _PLT_KIND = CFA_RSP << 48, CFA_RBP << 48, CFA_PLT << 48
_SAVED_KIND, _UNKNOWN_RBP, _AT_RBP_KIND = RBP_SAVED << 56, RBP_UNKNOWN << 56, RBP_AT_RBP << 56


class BadProgram(Exception):
    """Internal: instructions that cannot be read or followed any further."""


def uleb(d: bytes, p: int) -> tuple[int, int]:
    """An unsigned LEB128 at d[p]; at most 10 bytes (64 bits), longer ones are hostile."""
    value = shift = 0
    while True:
        b = d[p]
        p += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, p
        shift += 7
        if shift >= 70:
            raise BadProgram("LEB128 longer than 10 bytes")


def sleb(d: bytes, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = d[p]
        p += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return (value - (1 << shift) if b & 0x40 else value), p
        if shift >= 70:
            raise BadProgram("LEB128 longer than 10 bytes")


def _fits32(v: int) -> bool:
    return -_S32 <= v < _S32


def cfa_expression_code(expr: bytes) -> int:
    """The rule code (its CFA part) of a DW_CFA_def_cfa_expression the walker knows, else -1: `breg7 N; breg16 0;
    lit15; and; litT; ge; lit3; shl; plus` (a PLT stub), `bregR N; deref` and `bregR N`, R being RSP or RBP."""
    if len(expr) < 2 or expr[0] not in (0x70 + REG_RSP, 0x70 + REG_RBP):
        return -1
    try:
        n, p = sleb(expr, 1)
    except (BadProgram, IndexError):
        return -1
    if not _fits32(n):
        return -1
    rest, rsp = expr[p:], expr[0] == 0x70 + REG_RSP
    if not rest:
        return rule_code(CFA_RSP if rsp else CFA_RBP, n)
    if rest == b"\x06":  # DW_OP_deref
        return rule_code(CFA_DEREF_RSP if rsp else CFA_DEREF_RBP, n)
    if rsp and len(rest) == 9 and rest[:4] == b"\x80\x00\x3f\x1a" and 0x30 <= rest[4] <= 0x4F \
            and rest[5:] == b"\x2a\x33\x24\x22":
        return rule_code(CFA_PLT, n, RBP_SAME, rest[4] - 0x30)
    return -1


def _saved_rbp(offset: int) -> int:
    """The RBP part of a code for "saved at CFA + offset"."""
    return _SAVED_KIND | (offset & 0xFFFF) << 32 if -0x8000 <= offset < 0x8000 else _UNKNOWN_RBP


def _at_rbp(d: bytes, start: int, end: int) -> int:
    """The RBP part of a code for `DW_CFA_expression rbp: DW_OP_breg6 N` (the caller's RBP saved at RBP + N, as gcc
    says it in functions that realign the stack), else RBP_UNKNOWN's."""
    if end - start < 2 or d[start] != 0x76:  # DW_OP_breg6
        return _UNKNOWN_RBP
    offset, q = sleb(d, start + 1)
    if q != end or not -0x8000 <= offset < 0x8000:
        return _UNKNOWN_RBP
    return _AT_RBP_KIND | (offset & 0xFFFF) << 32


def state_code(cfa_reg: int, cfa_off: int, cfa_x: int, rbp: int, ra: int) -> int:
    """The rule code of an interpreter state; `rbp` is already the RBP part of a code."""
    if ra:
        return END_CODE if ra == RA_UNDEFINED else UNSUPPORTED_CODE
    if cfa_reg == REG_RSP:
        return (cfa_off & _M32) | _RSP_KIND | rbp if -_S32 <= cfa_off < _S32 else UNSUPPORTED_CODE
    if cfa_reg == REG_RBP:
        return (cfa_off & _M32) | _RBP_KIND | rbp if -_S32 <= cfa_off < _S32 else UNSUPPORTED_CODE
    if cfa_reg == CFA_BY_EXPRESSION and cfa_x >= 0:
        return cfa_x if cfa_x & (0xFF << 48) == _PLT_KIND else cfa_x | rbp
    return UNSUPPORTED_CODE


# the state before a CIE's initial instructions: no CFA, no rule for RBP (same value) nor for the return address
INITIAL_STATE = (CFA_INVALID, 0, -1, 0, RA_OTHER)


def execute(d: bytes, p: int, end: int, caf: int, daf: int, rules0: tuple[int, int], state: tuple,
            read_loc=None) -> tuple[list[int], list[int], tuple, int]:
    """Run the instructions d[p:end] from `state` (cfa_reg, cfa_off, cfa_x, rbp, ra).

    Returns the rows (locations relative to the start, strictly increasing, the first at 0; codes, no two equal in a
    row), the final state and the flags. `rules0`: the (rbp, ra) rules DW_CFA_restore goes back to. `read_loc(d, p)`
    decodes a DW_CFA_set_loc operand to (location relative to the start, next p); None: set_loc is not allowed. An
    instruction that cannot be read or followed makes the rule at its location, and after, CFA_UNSUPPORTED.
    """
    cfa_reg, cfa_off, cfa_x, rbp, ra = state
    rbp0, ra0 = rules0
    pcs: list[int] = []
    codes: list[int] = []
    stack: list[tuple] = []
    loc = flags = 0
    last = -1  # no row yet
    if end - p > MAX_PROGRAM_BYTES:
        end, flags = p + MAX_PROGRAM_BYTES, BROKEN
    try:
        while p < end:
            op = d[p]
            p += 1
            if op >= 0x40:
                reg = op & 0x3F
                if op < 0x80:  # DW_CFA_advance_loc
                    delta = reg * caf
                elif op < 0xC0:  # DW_CFA_offset
                    v = d[p]
                    p += 1
                    if v >= 0x80:
                        v, p = uleb(d, p - 1)
                    if reg == REG_RBP:
                        rbp = _saved_rbp(v * daf)
                    elif reg == REG_RA:
                        ra = RA_OK if v * daf == -8 else RA_OTHER
                    continue
                else:  # DW_CFA_restore
                    if reg == REG_RBP:
                        rbp = rbp0
                    elif reg == REG_RA:
                        ra = ra0
                    continue
            elif op == 0x0E:  # DW_CFA_def_cfa_offset
                v = d[p]
                p += 1
                if v >= 0x80:
                    v, p = uleb(d, p - 1)
                if cfa_reg == CFA_BY_EXPRESSION:
                    cfa_x = -1
                else:
                    cfa_off = v
                continue
            elif op == 0x00:  # DW_CFA_nop
                continue
            elif op == 0x0A:  # DW_CFA_remember_state
                if len(stack) >= MAX_STATE_DEPTH:
                    raise BadProgram("remember_state nested too deep")
                stack.append((cfa_reg, cfa_off, cfa_x, rbp, ra))
                continue
            elif op == 0x0B:  # DW_CFA_restore_state
                if not stack:
                    raise BadProgram("restore_state without remember_state")
                cfa_reg, cfa_off, cfa_x, rbp, ra = stack.pop()
                continue
            elif op == 0x02:  # DW_CFA_advance_loc1
                delta = d[p] * caf
                p += 1
            elif op == 0x03:  # DW_CFA_advance_loc2
                delta = (d[p] | d[p + 1] << 8) * caf
                p += 2
            elif op == 0x04:  # DW_CFA_advance_loc4
                delta = int.from_bytes(d[p:p + 4], "little") * caf
                p += 4
            elif op == 0x0C or op == 0x12:  # DW_CFA_def_cfa, DW_CFA_def_cfa_sf
                cfa_reg, p = uleb(d, p)
                if op == 0x0C:
                    cfa_off, p = uleb(d, p)
                else:
                    cfa_off, p = sleb(d, p)
                    cfa_off *= daf
                continue
            elif op == 0x0D:  # DW_CFA_def_cfa_register
                v, p = uleb(d, p)
                cfa_reg = CFA_INVALID if cfa_reg == CFA_BY_EXPRESSION else v
                continue
            elif op == 0x13:  # DW_CFA_def_cfa_offset_sf
                v, p = sleb(d, p)
                if cfa_reg == CFA_BY_EXPRESSION:
                    cfa_x = -1
                else:
                    cfa_off = v * daf
                continue
            elif op == 0x0F:  # DW_CFA_def_cfa_expression
                n, p = uleb(d, p)
                cfa_reg, cfa_x = CFA_BY_EXPRESSION, cfa_expression_code(d[p:p + n])
                p += n
                continue
            elif op == 0x05 or op == 0x11 or op == 0x2F:
                # DW_CFA_offset_extended, _offset_extended_sf, DW_CFA_GNU_negative_offset_extended
                reg, p = uleb(d, p)
                if op == 0x11:
                    v, p = sleb(d, p)
                else:
                    v, p = uleb(d, p)
                    if op == 0x2F:
                        v = -v
                if reg == REG_RBP:
                    rbp = _saved_rbp(v * daf)
                elif reg == REG_RA:
                    ra = RA_OK if v * daf == -8 else RA_OTHER
                continue
            elif op == 0x06 or op == 0x07 or op == 0x08:  # DW_CFA_restore_extended, _undefined, _same_value
                reg, p = uleb(d, p)
                if reg == REG_RBP:
                    rbp = rbp0 if op == 0x06 else 0
                elif reg == REG_RA:
                    ra = ra0 if op == 0x06 else RA_UNDEFINED if op == 0x07 else RA_OTHER
                continue
            elif op == 0x09 or op == 0x14 or op == 0x15:  # DW_CFA_register, _val_offset, _val_offset_sf
                reg, p = uleb(d, p)
                if op == 0x15:
                    _, p = sleb(d, p)
                else:
                    _, p = uleb(d, p)
                if reg == REG_RBP:
                    rbp = _UNKNOWN_RBP
                elif reg == REG_RA:
                    ra = RA_OTHER
                continue
            elif op == 0x10 or op == 0x16:  # DW_CFA_expression, DW_CFA_val_expression
                reg, p = uleb(d, p)
                n, p = uleb(d, p)
                expr_start, p = p, p + n
                if reg == REG_RBP:
                    rbp = _at_rbp(d, expr_start, p) if op == 0x10 else _UNKNOWN_RBP
                elif reg == REG_RA:
                    ra = RA_OTHER
                continue
            elif op == 0x2E:  # DW_CFA_GNU_args_size
                _, p = uleb(d, p)
                continue
            elif op == 0x01 and read_loc is not None:  # DW_CFA_set_loc
                target, p = read_loc(d, p)
                if target < loc:
                    raise BadProgram("set_loc goes backwards")
                delta = target - loc
                flags |= ABSOLUTE
            elif op == 0x1D:  # DW_CFA_MIPS_advance_loc8
                delta = int.from_bytes(d[p:p + 8], "little") * caf
                p += 8
            else:
                raise BadProgram(f"unknown DW_CFA opcode 0x{op:02x}")
            if delta > 0:  # an advance: the rule so far holds from loc up to loc + delta
                code = state_code(cfa_reg, cfa_off, cfa_x, rbp, ra)
                if code != last:
                    pcs.append(loc)
                    codes.append(code)
                    last = code
                loc += delta
        if p > end:
            raise BadProgram("an operand runs past the end of the entry")
    except (BadProgram, IndexError):
        flags |= BROKEN
    if flags & BROKEN:
        if last != UNSUPPORTED_CODE:
            pcs.append(loc)
            codes.append(UNSUPPORTED_CODE)
        return pcs, codes, (CFA_INVALID, 0, -1, _UNKNOWN_RBP, RA_OTHER), flags
    code = state_code(cfa_reg, cfa_off, cfa_x, rbp, ra)
    if code != last:
        pcs.append(loc)
        codes.append(code)
    return pcs, codes, (cfa_reg, cfa_off, cfa_x, rbp, ra), flags
