"""Where CPython keeps what a stack walk reads, per version (x86_64, release builds).

3.11 and 3.12: a table, checked against each interpreter's own headers by tests/test_python_offsets.py (offsetof
compiled with Py_BUILD_CORE). 3.13+: the `_Py_DebugOffsets` the interpreter carries at the start of `_PyRuntime`
(initialized data, so read from the ELF file itself), its layout per minor version below; the 3.13 table stays as
the check. The BPF walker (producers/bpf/python.bpf.h) gets the `WALK_FIELDS`; the code-object reader
(producers/python_code.py) the rest.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields, replace

NONE = 0xFFFF  # an offset the version does not have (python.bpf.h PY_NONE)


@dataclass(frozen=True)
class PythonOffsets:
    version: tuple[int, int]
    # the walk (python.bpf.h struct py_proc)
    interpreters_head: int
    threads_head: int
    interp_next: int  # the next (older) interpreter: subinterpreters come before the main one
    tstate_next: int
    tstate_native_thread_id: int
    tstate_frame: int  # 3.11, 3.12: cframe; 3.13+: current_frame
    cframe_current_frame: int  # NONE: tstate_frame holds the frame itself
    frame_code: int
    frame_previous: int
    frame_instr: int
    frame_owner: int
    frame_is_entry: int  # NONE from 3.12: a frame owned by the C stack marks the entry instead
    code_adaptive: int
    owner_cstack: int  # 0xff: no such owner
    # code objects, strings and bytes (user space)
    code_filename: int
    code_name: int
    code_qualname: int
    code_firstlineno: int
    code_linetable: int
    unicode_length: int
    unicode_state: int
    unicode_ascii_size: int  # sizeof(PyASCIIObject): a compact ASCII string's characters follow it
    unicode_compact_size: int  # sizeof(PyCompactUnicodeObject): any other compact string's follow it
    bytes_size: int
    bytes_sval: int


WALK_FIELDS = ("interpreters_head", "threads_head", "interp_next", "tstate_next", "tstate_native_thread_id",
               "tstate_frame", "cframe_current_frame", "frame_code", "frame_previous", "frame_instr", "frame_owner",
               "frame_is_entry", "code_adaptive")

TABLE = {
    (3, 11): PythonOffsets((3, 11), interpreters_head=40, threads_head=16, interp_next=0, tstate_next=8,
                           tstate_native_thread_id=160,
                           tstate_frame=56, cframe_current_frame=8, frame_code=32, frame_previous=48, frame_instr=56,
                           frame_owner=69, frame_is_entry=68, code_adaptive=184, owner_cstack=0xFF,
                           code_filename=112, code_name=120, code_qualname=128, code_firstlineno=72,
                           code_linetable=136, unicode_length=16, unicode_state=32, unicode_ascii_size=48,
                           unicode_compact_size=72, bytes_size=16, bytes_sval=32),
    (3, 12): PythonOffsets((3, 12), interpreters_head=40, threads_head=72, interp_next=0, tstate_next=8,
                           tstate_native_thread_id=144,
                           tstate_frame=56, cframe_current_frame=0, frame_code=0, frame_previous=8, frame_instr=56,
                           frame_owner=70, frame_is_entry=NONE, code_adaptive=192, owner_cstack=3,
                           code_filename=112, code_name=120, code_qualname=128, code_firstlineno=68,
                           code_linetable=136, unicode_length=16, unicode_state=32, unicode_ascii_size=40,
                           unicode_compact_size=56, bytes_size=16, bytes_sval=32),
    (3, 13): PythonOffsets((3, 13), interpreters_head=632, threads_head=7344, interp_next=7264, tstate_next=8,
                           tstate_native_thread_id=160, tstate_frame=72, cframe_current_frame=NONE, frame_code=0,
                           frame_previous=8, frame_instr=56, frame_owner=70, frame_is_entry=NONE, code_adaptive=200,
                           owner_cstack=3, code_filename=112, code_name=120, code_qualname=128, code_firstlineno=68,
                           code_linetable=136, unicode_length=16, unicode_state=32, unicode_ascii_size=40,
                           unicode_compact_size=56, bytes_size=16, bytes_sval=32),
}

DEBUG_COOKIE = b"xdebugpy"
# _Py_DebugOffsets of 3.13 (Include/internal/pycore_runtime.h): every field a uint64_t, sections in this order.
_DEBUG_LAYOUT_3_13 = (
    "cookie", "version", "free_threaded",
    "runtime.size", "runtime.finalizing", "runtime.interpreters_head",
    "interp.size", "interp.id", "interp.next", "interp.threads_head", "interp.gc", "interp.imports_modules",
    "interp.sysdict", "interp.builtins", "interp.ceval_gil", "interp.gil_runtime_state",
    "interp.gil_runtime_state_enabled", "interp.gil_runtime_state_locked", "interp.gil_runtime_state_holder",
    "tstate.size", "tstate.prev", "tstate.next", "tstate.interp", "tstate.current_frame", "tstate.thread_id",
    "tstate.native_thread_id", "tstate.datastack_chunk", "tstate.status",
    "frame.size", "frame.previous", "frame.executable", "frame.instr_ptr", "frame.localsplus", "frame.owner",
    "code.size", "code.filename", "code.name", "code.qualname", "code.linetable", "code.firstlineno",
    "code.argcount", "code.localsplusnames", "code.localspluskinds", "code.co_code_adaptive",
    "pyobject.size", "pyobject.ob_type",
    "type.size", "type.tp_name", "type.tp_repr", "type.tp_flags",
    "tuple.size", "tuple.ob_item", "tuple.ob_size",
    "list.size", "list.ob_item", "list.ob_size",
    "dict.size", "dict.ma_keys", "dict.ma_values",
    "float.size", "float.ob_fval",
    "long.size", "long.lv_tag", "long.ob_digit",
    "bytes.size", "bytes.ob_size", "bytes.ob_sval",
    "unicode.size", "unicode.state", "unicode.length", "unicode.asciiobject_size",
    "gc.size", "gc.collecting",
)
DEBUG_LAYOUTS = {(3, 13): _DEBUG_LAYOUT_3_13}
DEBUG_BYTES = max(len(layout) for layout in DEBUG_LAYOUTS.values()) * 8  # what to read from _PyRuntime's start


class UnsupportedPython(ValueError):
    """An interpreter whose frames cannot be walked; the message says why in one line."""


def version_of(hexversion: int) -> tuple[int, int]:
    return (hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF


def from_debug_offsets(data: bytes) -> PythonOffsets:
    """The offsets a 3.13+ interpreter states in its `_Py_DebugOffsets` (the first bytes of `_PyRuntime`)."""
    if data[:8] != DEBUG_COOKIE:
        raise UnsupportedPython("_PyRuntime does not start with the debug offsets' cookie")
    version = version_of(struct.unpack_from("<Q", data, 8)[0])
    layout = DEBUG_LAYOUTS.get(version)
    if layout is None:
        raise UnsupportedPython(f"no known layout of the debug offsets of CPython {version[0]}.{version[1]}")
    if len(data) < len(layout) * 8:
        raise UnsupportedPython("the debug offsets are cut short")
    d = dict(zip(layout, struct.unpack_from(f"<{len(layout)}Q", data), strict=True))
    if d["free_threaded"]:
        raise UnsupportedPython(f"a free-threaded build of CPython {version[0]}.{version[1]}")
    base = TABLE[version]  # what the debug offsets do not state (the owner's values, sizes of compact strings)
    return replace(base, interpreters_head=d["runtime.interpreters_head"], threads_head=d["interp.threads_head"],
                   interp_next=d["interp.next"],
                   tstate_next=d["tstate.next"], tstate_native_thread_id=d["tstate.native_thread_id"],
                   tstate_frame=d["tstate.current_frame"], frame_code=d["frame.executable"],
                   frame_previous=d["frame.previous"], frame_instr=d["frame.instr_ptr"], frame_owner=d["frame.owner"],
                   code_adaptive=d["code.co_code_adaptive"], code_filename=d["code.filename"],
                   code_name=d["code.name"], code_qualname=d["code.qualname"],
                   code_firstlineno=d["code.firstlineno"], code_linetable=d["code.linetable"],
                   unicode_length=d["unicode.length"], unicode_state=d["unicode.state"],
                   unicode_ascii_size=d["unicode.asciiobject_size"],
                   unicode_compact_size=d["unicode.asciiobject_size"] + 16,
                   bytes_size=d["bytes.ob_size"], bytes_sval=d["bytes.ob_sval"])


def offsets_for(hexversion: int, runtime_head: bytes | None = None) -> PythonOffsets:
    """The offsets of an interpreter of `hexversion` (PY_VERSION_HEX); `runtime_head`: the first DEBUG_BYTES of
    its `_PyRuntime`, used from 3.13 on. UnsupportedPython says why a version has none."""
    version = version_of(hexversion)
    if version >= (3, 13):
        if runtime_head is None:
            raise UnsupportedPython(f"CPython {version[0]}.{version[1]} without its debug offsets")
        found = from_debug_offsets(runtime_head)
        if found.version != version:
            raise UnsupportedPython(f"debug offsets of {found.version} in CPython {version[0]}.{version[1]}")
        return found
    if version in TABLE:
        return TABLE[version]
    raise UnsupportedPython(f"CPython {version[0]}.{version[1]}: no known offsets (3.11 and later are walked)")


def walk_values(offsets: PythonOffsets) -> dict[str, int]:
    """The fields python.bpf.h's struct py_proc takes, by name."""
    return {f.name: getattr(offsets, f.name) for f in fields(offsets) if f.name in WALK_FIELDS}
