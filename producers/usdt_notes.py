"""The fleetprof USDT probes as an ELF file declares them: its `.note.stapsdt` entries, and where each probe site
keeps its arguments (register, memory or constant), decoded into what the BPF side reads (struct arg_spec in
producers/bpf/gpu_probes.bpf.c). x86_64 and aarch64 operand forms.
"""

from __future__ import annotations

import logging
import platform
import re
import struct
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile

log = logging.getLogger("fleetprof.gpu_probes")

PROVIDER = "fleetprof"
# probe name -> (wrapper name prefix in BPF_SOURCE, argument count)
PROBES = {"kernel_launch": ("launch", 3), "kernel_executed": ("executed", 6), "launch_weight": ("weight", 2),
          "launch_range": ("range", 2), "graph_kernel_executed": ("graph", 8), "memory_executed": ("memory", 9)}

ARG_REG, ARG_MEM, ARG_CONST = 1, 2, 3
NO_REG = 0xFF


class NoteError(ValueError):
    """A file or probe note that cannot be used; the message is one line."""


@dataclass(frozen=True)
class ArgSpec:
    kind: int  # ARG_REG, ARG_MEM, ARG_CONST (as in struct arg_spec)
    size: int = 8
    base: int = NO_REG  # pt_regs word index
    index: int = NO_REG
    scale: int = 1
    disp: int = 0


@dataclass(frozen=True)
class ProbeSite:
    probe: str  # a key of PROBES
    offset: int  # file offset of the probe's instruction: where the uprobe goes
    ref_ctr_offset: int  # file offset of its semaphore (0: none)
    args: tuple[ArgSpec, ...]


# x86_64: register names -> struct pt_regs word index (r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di orig_ax
# ip cs flags sp ss). The high-byte registers (ah...) are left out on purpose: the value is not in the low bits.
_X86_REGS = {name: i for i, names in (
    (0, "r15 r15d r15w r15b"), (1, "r14 r14d r14w r14b"), (2, "r13 r13d r13w r13b"), (3, "r12 r12d r12w r12b"),
    (4, "rbp ebp bp bpl"), (5, "rbx ebx bx bl"), (6, "r11 r11d r11w r11b"), (7, "r10 r10d r10w r10b"),
    (8, "r9 r9d r9w r9b"), (9, "r8 r8d r8w r8b"), (10, "rax eax ax al"), (11, "rcx ecx cx cl"),
    (12, "rdx edx dx dl"), (13, "rsi esi si sil"), (14, "rdi edi di dil"), (16, "rip"), (19, "rsp esp sp spl"),
) for name in names.split()}
_X86_RIP = 16
_X86_MEM = re.compile(r"(?:(?P<disp>[-+]?(?:0x[0-9a-fA-F]+|\d+))|(?P<sym>[A-Za-z_.$][\w.$@]*)(?P<add>[-+]\d+)?)?"
                      r"\((?:%(?P<base>\w+))?(?:,%(?P<index>\w+)(?:,(?P<scale>\d+))?)?\)")
# aarch64: x0..x30 and sp, then pc (struct pt_regs starts with user_pt_regs: regs[31], sp, pc).
_ARM_REGS = {**{f"x{i}": i for i in range(31)}, **{f"w{i}": i for i in range(31)}, "sp": 31, "wsp": 31}
_ARM_MEM = re.compile(r"\[(?P<base>\w+)(?:,\s*#?(?P<disp>[-+]?(?:0x[0-9a-fA-F]+|\d+)))?\]")
MAX_REG = {"x86_64": 20, "aarch64": 32}


def _int(text: str) -> int:
    return int(text, 0)


def parse_arg(text: str, arch: str = "x86_64", pc: int = 0, symbols: dict[str, int] | None = None) -> ArgSpec:
    """One `size@operand` of a stapsdt note; `pc` is the probe's address and `symbols` the file's, for operands
    relative to the instruction pointer. NoteError when the operand is not one this reader handles."""
    size_text, at, operand = text.rpartition("@")
    size = abs(_int(size_text)) if at and size_text.lstrip("-+").isdigit() else 8
    if size not in (1, 2, 4, 8):
        raise NoteError(f"argument size {size} in {text!r}")
    if arch == "x86_64":
        if operand.startswith("%"):
            if operand[1:] not in _X86_REGS:
                raise NoteError(f"register {operand!r}")
            return ArgSpec(ARG_REG, size, _X86_REGS[operand[1:]])
        if operand.startswith("$") and re.fullmatch(r"[-+]?(0x[0-9a-fA-F]+|\d+)", operand[1:]):
            return ArgSpec(ARG_CONST, size, disp=_int(operand[1:]))
        m = _X86_MEM.fullmatch(operand)
        if m is None or (m["base"] and m["base"] not in _X86_REGS) or (m["index"] and m["index"] not in _X86_REGS):
            raise NoteError(f"operand {operand!r}")
        base = _X86_REGS[m["base"]] if m["base"] else NO_REG
        disp = _int(m["disp"]) if m["disp"] else 0
        if m["sym"]:  # sym(%rip): the symbol's own address, found from the probe's (the uprobe sees ip == pc)
            if base != _X86_RIP or not symbols or m["sym"] not in symbols:
                raise NoteError(f"symbol operand {operand!r}")
            disp = symbols[m["sym"]] + (int(m["add"]) if m["add"] else 0) - pc
        elif base == _X86_RIP:
            raise NoteError(f"numeric %rip operand {operand!r}")
        index = _X86_REGS[m["index"]] if m["index"] else NO_REG
        return ArgSpec(ARG_MEM, size, base, index, int(m["scale"] or 1), disp)
    if arch == "aarch64":
        if operand in _ARM_REGS:
            return ArgSpec(ARG_REG, size, _ARM_REGS[operand])
        if re.fullmatch(r"#?[-+]?(0x[0-9a-fA-F]+|\d+)", operand):
            return ArgSpec(ARG_CONST, size, disp=_int(operand.lstrip("#")))
        m = _ARM_MEM.fullmatch(operand)
        if m is None or m["base"] not in _ARM_REGS:
            raise NoteError(f"operand {operand!r}")
        return ArgSpec(ARG_MEM, size, _ARM_REGS[m["base"]], disp=_int(m["disp"]) if m["disp"] else 0)
    raise NoteError(f"no argument decoding for {arch}")


def _file_offset(vaddr: int, loads: list[tuple[int, int, int]]) -> int:
    """The file offset of an address inside a PT_LOAD's file-backed part."""
    for offset, start, filesz in loads:
        if start <= vaddr < start + filesz:
            return vaddr - start + offset
    raise NoteError(f"address 0x{vaddr:x} is in no loaded part of the file")


def _symbols(elf: ELFFile) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in (".dynsym", ".symtab"):
        sec = elf.get_section_by_name(name)
        if sec is not None and hasattr(sec, "iter_symbols"):
            out.update((s.name, int(s["st_value"])) for s in sec.iter_symbols() if s.name and s["st_value"])
    return out


def read_probe_sites(path: str, arch: str | None = None) -> tuple[list[ProbeSite], int]:
    """The fleetprof probe sites of an ELF file and how many of them cannot be decoded; ([], 0) for a file without
    them. NoteError (one line) when the file is malformed; OSError when it cannot be read."""
    arch = arch or platform.machine()
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return [], 0
            f.seek(0)
            elf = ELFFile(f)
            notes = elf.get_section_by_name(".note.stapsdt")
            if notes is None:
                return [], 0
            data = notes.data()
            base_sec = elf.get_section_by_name(".stapsdt.base")
            loads = [(int(s["p_offset"]), int(s["p_vaddr"]), int(s["p_filesz"]))
                     for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
            end = "<" if elf.little_endian else ">"
            word = "Q" if elf.elfclass == 64 else "I"
            align = 8 if notes["sh_addralign"] == 8 else 4
            sites, unsupported, symbols = [], 0, None
            for desc in _stapsdt_notes(data, end, align):
                pc, note_base, sem = struct.unpack_from(end + word * 3, desc)
                fields = desc[struct.calcsize(word * 3):].split(b"\0")
                if len(fields) < 3 or fields[0] != PROVIDER.encode():
                    continue
                probe, arg_text = fields[1].decode(errors="replace"), fields[2].decode(errors="replace")
                if probe not in PROBES:
                    continue
                if base_sec is not None and note_base:  # prelinked: the note's addresses moved with the file
                    delta = int(base_sec["sh_addr"]) - note_base
                    pc, sem = pc + delta, (sem + delta if sem else 0)
                try:
                    if "(%rip)" in arg_text and symbols is None:
                        symbols = _symbols(elf)
                    args = tuple(parse_arg(a, arch, pc, symbols) for a in arg_text.split())
                    if len(args) != PROBES[probe][1]:
                        raise NoteError(f"{probe} has {len(args)} arguments, not {PROBES[probe][1]}")
                    sites.append(ProbeSite(probe, _file_offset(pc, loads), _file_offset(sem, loads) if sem else 0,
                                           args))
                except NoteError as exc:
                    log.info("%s: probe %s:%s skipped: %s", path, PROVIDER, probe, exc)
                    unsupported += 1
            return sites, unsupported
    except OSError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many kinds on malformed input
        raise NoteError(f"{path}: malformed ELF: {type(exc).__name__}: {' '.join(str(exc).split())}") from None


def _stapsdt_notes(data: bytes, end: str, align: int) -> list[bytes]:
    """The descriptors of the NT_STAPSDT (3) notes named "stapsdt" in a note section."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from(end + "III", data, pos)
        name_at = pos + 12
        desc_at = name_at + (namesz + align - 1) // align * align
        if desc_at + descsz > len(data):
            break
        if ntype == 3 and data[name_at:name_at + namesz].rstrip(b"\0") == b"stapsdt":
            out.append(data[desc_at:desc_at + descsz])
        pos = desc_at + (descsz + align - 1) // align * align
    return out
