"""The struct offsets the Python frame walker reads at, against each interpreter's own headers (offsetof, compiled
with Py_BUILD_CORE) and, for 3.13, against the debug offsets the interpreter states in its `_PyRuntime`; and the
interpreters are recognized from their ELF files alone.

Interpreters: Debian's /usr/bin/python3.11 (its headers from libpython3.11-dev) and the CPython 3.13 that
infra/perf_python.sh builds; infra/setup.sh installs both, so on CI neither is skipped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from producers.python_offsets import (
    DEBUG_BYTES,
    NONE,
    TABLE,
    UnsupportedPython,
    from_debug_offsets,
    offsets_for,
)
from producers.python_runtime import read_python_runtime
from tests.elf_helpers import need, unavailable

PERF_PYTHON = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python-perf"

# what each table field is in the headers (3.11, 3.12 | 3.13): (expression for offsetof / sizeof / a value)
FIELDS = {
    "interpreters_head": "offsetof(_PyRuntimeState, interpreters.head)",
    "threads_head": "offsetof(PyInterpreterState, threads.head)",
    "interp_next": "offsetof(PyInterpreterState, next)",
    "tstate_next": "offsetof(PyThreadState, next)",
    "tstate_native_thread_id": "offsetof(PyThreadState, native_thread_id)",
    "frame_previous": "offsetof(_PyInterpreterFrame, previous)",
    "frame_owner": "offsetof(_PyInterpreterFrame, owner)",
    "code_adaptive": "offsetof(PyCodeObject, co_code_adaptive)",
    "code_filename": "offsetof(PyCodeObject, co_filename)",
    "code_name": "offsetof(PyCodeObject, co_name)",
    "code_qualname": "offsetof(PyCodeObject, co_qualname)",
    "code_firstlineno": "offsetof(PyCodeObject, co_firstlineno)",
    "code_linetable": "offsetof(PyCodeObject, co_linetable)",
    "unicode_length": "offsetof(PyASCIIObject, length)",
    "unicode_state": "offsetof(PyASCIIObject, state)",
    "unicode_ascii_size": "sizeof(PyASCIIObject)",
    "unicode_compact_size": "sizeof(PyCompactUnicodeObject)",
    "bytes_size": "offsetof(PyVarObject, ob_size)",
    "bytes_sval": "offsetof(PyBytesObject, ob_sval)",
}
BY_VERSION = {
    (3, 11): {"tstate_frame": "offsetof(PyThreadState, cframe)",
              "cframe_current_frame": "offsetof(_PyCFrame, current_frame)",
              "frame_code": "offsetof(_PyInterpreterFrame, f_code)",
              "frame_instr": "offsetof(_PyInterpreterFrame, prev_instr)",
              "frame_is_entry": "offsetof(_PyInterpreterFrame, is_entry)"},
    (3, 12): {"tstate_frame": "offsetof(PyThreadState, cframe)",
              "cframe_current_frame": "offsetof(_PyCFrame, current_frame)",
              "frame_code": "offsetof(_PyInterpreterFrame, f_code)",
              "frame_instr": "offsetof(_PyInterpreterFrame, prev_instr)",
              "owner_cstack": "FRAME_OWNED_BY_CSTACK"},
    (3, 13): {"tstate_frame": "offsetof(PyThreadState, current_frame)",
              "frame_code": "offsetof(_PyInterpreterFrame, f_executable)",
              "frame_instr": "offsetof(_PyInterpreterFrame, instr_ptr)",
              "owner_cstack": "FRAME_OWNED_BY_CSTACK"},
}


def _interpreters() -> dict[tuple[int, int], tuple[Path, Path]]:
    """(binary, include dir) per version available here: Debian's 3.11 and infra's 3.13."""
    found = {}
    if Path("/usr/bin/python3.11").exists() and Path("/usr/include/python3.11/internal").is_dir():
        found[(3, 11)] = (Path("/usr/bin/python3.11"), Path("/usr/include/python3.11"))
    if PERF_PYTHON.exists():
        real = Path(os.path.realpath(PERF_PYTHON))
        include = real.parent.parent / "include" / "python3.13"
        if include.is_dir():
            found[(3, 13)] = (real, include)
    return found


def _from_headers(include: Path, exprs: dict[str, str], tmp_path: Path) -> dict[str, int]:
    lines = [f'    printf("{name} %zu\\n", (size_t)({expr}));' for name, expr in exprs.items()]
    source = "\n".join(["#define Py_BUILD_CORE 1", "#include <Python.h>", "#include <stddef.h>", "#include <stdio.h>",
                        '#include "internal/pycore_runtime.h"', '#include "internal/pycore_interp.h"',
                        '#include "internal/pycore_frame.h"', "int main(void) {", *lines, "    return 0;", "}"])
    (tmp_path / "offsets.c").write_text(source)
    subprocess.run([need("gcc"), f"-I{include}", f"-I{include / 'internal'}", "-o", str(tmp_path / "offsets"),
                    str(tmp_path / "offsets.c")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "offsets")], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("version", [(3, 11), (3, 13)])
def test_the_table_is_what_the_interpreters_headers_say(version, tmp_path) -> None:
    found = _interpreters()
    if version not in found:
        unavailable(f"no CPython {version[0]}.{version[1]} with its internal headers (bash infra/setup.sh)")
    _, include = found[version]
    exprs = {**FIELDS, **BY_VERSION[version]}
    headers = _from_headers(include, exprs, tmp_path)
    table = TABLE[version]
    assert {name: getattr(table, name) for name in exprs} == headers
    absent = set(BY_VERSION[(3, 11)]) | {"owner_cstack"}
    for name in absent - set(exprs):
        assert getattr(table, name) in (NONE, 0xFF), name  # what the version does not have is marked so


def test_the_3_13_interpreter_states_the_same_offsets_as_the_table() -> None:
    found = _interpreters()
    if (3, 13) not in found:
        unavailable("no CPython 3.13 built by infra/perf_python.sh (bash infra/setup.sh)")
    runtime = read_python_runtime(str(found[(3, 13)][0]))
    assert runtime is not None and runtime.version.startswith("3.13.") and runtime.offsets == TABLE[(3, 13)]


@pytest.mark.parametrize("version", [(3, 11), (3, 13)])
def test_interpreters_are_recognized_from_their_elf_files(version) -> None:
    found = _interpreters()
    if version not in found:
        unavailable(f"no CPython {version[0]}.{version[1]} (bash infra/setup.sh)")
    runtime = read_python_runtime(str(found[version][0]))
    assert runtime is not None and runtime.offsets is not None
    assert runtime.eval_start < runtime.eval_end and runtime.runtime > 0
    assert runtime.version == subprocess.run([str(found[version][0]), "-c", "import platform; "
                                              "print(platform.python_version())"],
                                             capture_output=True, text=True, check=True).stdout.strip()
    assert read_python_runtime("/bin/sh") is None  # not every ELF file is an interpreter


def test_versions_without_offsets_and_free_threaded_builds_say_why() -> None:
    with pytest.raises(UnsupportedPython, match="3.10: no known offsets"):
        offsets_for(0x030A0DF0)
    with pytest.raises(UnsupportedPython, match="without its debug offsets"):
        offsets_for(0x030D05F0)
    head = bytearray(DEBUG_BYTES)
    head[:8] = b"xdebugpy"
    head[8:16] = (0x030D05F0).to_bytes(8, "little")
    head[16:24] = (1).to_bytes(8, "little")  # free_threaded
    with pytest.raises(UnsupportedPython, match="free-threaded"):
        from_debug_offsets(bytes(head))
    head[8:16] = (0x030E00F0).to_bytes(8, "little")
    with pytest.raises(UnsupportedPython, match="no known layout of the debug offsets of CPython 3.14"):
        from_debug_offsets(bytes(head))
    with pytest.raises(UnsupportedPython, match="cookie"):
        from_debug_offsets(bytes(DEBUG_BYTES))
