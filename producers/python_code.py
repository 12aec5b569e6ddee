"""Code objects read from a CPython process's memory (/proc/PID/mem), and the line an instruction offset is on.

A code object is read once per process and address, then kept while the same address keeps naming the same
function (checked again once per window: a freed code object's address may hold another one later). Strings are
read as CPython lays out compact str objects; line numbers come from the code object's own location table
(3.11+: Objects/locations.md in CPython's source).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from producers.python_offsets import PythonOffsets

MAX_STRING_CHARS = 1024  # longer names and paths are cut (and end in "…")
MAX_LINETABLE_BYTES = 1 << 20
CODE_HEAD_BYTES = 256  # every field the reader needs lies in the first 256 bytes of a code object (3.11-3.13)


class ReadFailed(OSError):
    """Process memory that could not be read (the process exited, or the object went away)."""


@dataclass(frozen=True)
class CodeObject:
    qualname: str
    filename: str
    first_line: int
    linetable: bytes
    identity: tuple[int, int, int]  # (filename, qualname pointers, first line): what is checked again

    def line_at(self, units: int) -> int:
        """The line of the instruction `units` code units into the bytecode (first_line when it has none)."""
        return line_at(self.linetable, self.first_line, units)


class ProcessMemory:
    """Reads of one process's memory; closed when the process's reader is dropped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError as exc:
            raise ReadFailed(f"pid {pid}: {exc.strerror}") from None

    def read(self, addr: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, addr)
        except (OSError, OverflowError) as exc:
            raise ReadFailed(f"pid {self.pid}: {size} bytes at {addr:#x}: {exc}") from None
        if len(data) != size:
            raise ReadFailed(f"pid {self.pid}: {size} bytes at {addr:#x}: short read")
        return data

    def word(self, addr: int) -> int:
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def close(self) -> None:
        os.close(self._fd)


def read_str(mem: ProcessMemory, off: PythonOffsets, addr: int) -> str:
    """A compact str object at `addr` (every str a code object holds is one)."""
    head = mem.read(addr, off.unicode_state + 4)
    length = struct.unpack_from("<q", head, off.unicode_length)[0]
    state = struct.unpack_from("<I", head, off.unicode_state)[0]
    kind, compact, ascii_only = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or length < 0:
        raise ReadFailed(f"pid {mem.pid}: no compact str at {addr:#x}")
    cut = length > MAX_STRING_CHARS
    n = min(length, MAX_STRING_CHARS)
    data = mem.read(addr + (off.unicode_ascii_size if ascii_only else off.unicode_compact_size), n * kind)
    text = data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], errors="replace")
    return text + "…" if cut else text


def read_bytes(mem: ProcessMemory, off: PythonOffsets, addr: int) -> bytes:
    size = mem.word(addr + off.bytes_size)
    if not 0 <= size <= MAX_LINETABLE_BYTES:
        raise ReadFailed(f"pid {mem.pid}: a bytes object of {size} bytes at {addr:#x}")
    return mem.read(addr + off.bytes_sval, size) if size else b""


def _identity(head: bytes, off: PythonOffsets) -> tuple[int, int, int]:
    filename, qualname = (struct.unpack_from("<Q", head, o)[0] for o in (off.code_filename, off.code_qualname))
    return filename, qualname, struct.unpack_from("<i", head, off.code_firstlineno)[0]


def read_code(mem: ProcessMemory, off: PythonOffsets, addr: int) -> CodeObject:
    head = mem.read(addr, CODE_HEAD_BYTES)
    identity = _identity(head, off)
    filename, qualname, first_line = identity
    linetable = struct.unpack_from("<Q", head, off.code_linetable)[0]
    return CodeObject(read_str(mem, off, qualname), read_str(mem, off, filename), first_line,
                      read_bytes(mem, off, linetable), identity)


def still_same(mem: ProcessMemory, off: PythonOffsets, addr: int, code: CodeObject) -> bool:
    """Whether the code object at `addr` is still the one read before."""
    try:
        return _identity(mem.read(addr, CODE_HEAD_BYTES), off) == code.identity
    except ReadFailed:
        return False


def _varint(table: bytes, i: int) -> tuple[int, int]:
    b = table[i]
    value, shift, i = b & 63, 6, i + 1
    while b & 64:
        b = table[i]
        value |= (b & 63) << shift
        shift, i = shift + 6, i + 1
    return value, i


def _svarint(table: bytes, i: int) -> tuple[int, int]:
    value, i = _varint(table, i)
    return (-(value >> 1) if value & 1 else value >> 1), i


def line_at(table: bytes, first_line: int, units: int) -> int:
    """The line of code unit `units` from a 3.11+ location table; `first_line` when no entry has one."""
    line, at, i, found = first_line, 0, 0, first_line
    try:
        while i < len(table):
            head = table[i]
            code, length = (head >> 3) & 15, (head & 7) + 1
            i += 1
            has_line = True
            if code == 15:  # no location
                has_line = False
            elif code == 14:  # long form: line delta, end line delta, columns
                delta, i = _svarint(table, i)
                line += delta
                for _ in range(3):
                    _, i = _varint(table, i)
            elif code == 13:  # no columns
                delta, i = _svarint(table, i)
                line += delta
            elif code in (10, 11, 12):  # one line, 0, 1 or 2 lines below the last, and two column bytes
                line += code - 10
                i += 2
            else:  # short forms: the same line
                i += 1
            if at <= units < at + length:
                return line if has_line else found
            if has_line:
                found = line
            at += length
    except IndexError:
        pass
    return found
