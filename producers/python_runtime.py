"""Recognizing a CPython interpreter in an ELF file (the executable, or a libpython it loads), from .dynsym alone, so
stripped binaries count: `_PyRuntime` (the runtime state), `Py_Version` (PY_VERSION_HEX, 3.11+) and
`_PyEval_EvalFrameDefault` (the native frame that runs Python frames). Looked up through the GNU hash table, so a
large library costs a few milliseconds whether or not it is Python.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from producers.elf_headers import dynamic_strings, read_headers
from producers.python_offsets import DEBUG_BYTES, PythonOffsets, UnsupportedPython, offsets_for


@dataclass(frozen=True)
class PythonRuntime:
    """What one interpreter file tells: addresses are the file's virtual addresses (add the mapping's bias)."""

    hexversion: int
    runtime: int  # _PyRuntime
    eval_start: int  # _PyEval_EvalFrameDefault: [eval_start, eval_end)
    eval_end: int
    offsets: PythonOffsets | None
    unsupported: str = ""  # why offsets is None

    @property
    def version(self) -> str:
        return f"{self.hexversion >> 24}.{(self.hexversion >> 16) & 0xFF}.{(self.hexversion >> 8) & 0xFF}"


def _read_vaddr(elf: ELFFile, vaddr: int, size: int) -> bytes | None:
    """`size` bytes of the file's initialized data at virtual address `vaddr`, or None outside every segment's file
    part."""
    for seg in elf.iter_segments("PT_LOAD"):
        start, filesz = seg["p_vaddr"], seg["p_filesz"]
        if start <= vaddr and vaddr + size <= start + filesz:
            stream = elf.stream
            stream.seek(seg["p_offset"] + vaddr - start)
            return stream.read(size)
    return None


def read_python_runtime(path: str) -> PythonRuntime | None:
    """The interpreter `path` holds, or None when it is not CPython (or not one this recognizes: before 3.11 there is
    no Py_Version, and a 3.10 is reported by the caller from its name)."""
    try:
        with open(path, "rb") as f:
            if not _may_be_cpython(f):
                return None
            elf = ELFFile(f)
            table = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
            if table is None:
                return None
            runtime = table.get_symbol("_PyRuntime")
            evaluator = table.get_symbol("_PyEval_EvalFrameDefault")
            if runtime is None or evaluator is None:
                return None
            version_sym = table.get_symbol("Py_Version")
            raw = _read_vaddr(elf, version_sym["st_value"], 4) if version_sym is not None else None
            hexversion = struct.unpack("<I", raw)[0] if raw else 0
            head = _read_vaddr(elf, runtime["st_value"], DEBUG_BYTES)
    except (OSError, ELFError, struct.error, ValueError):
        return None
    start = evaluator["st_value"]
    found = PythonRuntime(hexversion, runtime["st_value"], start, start + max(evaluator["st_size"], 1), None)
    if not hexversion:
        return replace_unsupported(found, "CPython before 3.11 (no Py_Version): native frames only")
    try:
        return PythonRuntime(hexversion, found.runtime, found.eval_start, found.eval_end,
                             offsets_for(hexversion, head))
    except UnsupportedPython as exc:
        return replace_unsupported(found, str(exc))


def _may_be_cpython(f: BinaryIO) -> bool:
    """False when the bare headers show a dynamic string table without `_PyRuntime` (most mapped files): their
    full read through pyelftools is skipped. True when it may be one, or the headers cannot tell."""
    size = os.fstat(f.fileno()).st_size
    headers = read_headers(f, size)
    strings = dynamic_strings(f, size, headers) if headers is not None else None
    f.seek(0)
    # no leading NUL: the linker may store the name as the tail of a longer one
    return strings is None or b"_PyRuntime\0" in strings


def replace_unsupported(found: PythonRuntime, why: str) -> PythonRuntime:
    return PythonRuntime(found.hexversion, found.runtime, found.eval_start, found.eval_end, None, why)
