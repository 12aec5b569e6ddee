"""Which processes are CPython (producers/python_procs.py): a stock interpreter is found with `_PyRuntime` where the
process itself has it; interpreters the walker cannot read (one that predates Py_Version, one whose debug offsets
have no known layout, a free-threaded build) are said in one log line per file, counted, and left to native frames.

The unreadable interpreters are small C programs that export what an interpreter exports (`_PyRuntime`,
`_PyEval_EvalFrameDefault`, `Py_Version`): real ELF files in real processes, standing for versions this machine
does not have.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import pytest

from producers.process_info import process_info
from producers.python_offsets import TABLE
from producers.python_procs import PythonProcs
from schemas.wire import is_python_frame, python_frame_parts
from tests.elf_helpers import need, unavailable

STOCK = Path("/usr/bin/python3.11")

# `_PyRuntime` starts with the debug offsets' cookie and version, then free_threaded, as CPython 3.13+ lays it out
FAKE_C = r"""
#include <stdint.h>
#include <unistd.h>
#ifdef VERSION
__attribute__((used)) const unsigned long Py_Version = VERSION;
#endif
__attribute__((used)) struct { char cookie[8]; uint64_t version, free_threaded; char rest[2048]; } _PyRuntime = {
    "xdebugpy", VERSION_IN_OFFSETS, FREE_THREADED};
__attribute__((used, noinline)) int _PyEval_EvalFrameDefault(int x) { return x + 1; }
int main(void) { pause(); return _PyEval_EvalFrameDefault(0); }
"""


def _fake(tmp_path: Path, name: str, *defines: str) -> Path:
    (tmp_path / f"{name}.c").write_text(FAKE_C)
    out = tmp_path / name
    subprocess.run([need("gcc"), "-O1", "-rdynamic", *defines, "-o", str(out), str(tmp_path / f"{name}.c")],
                   check=True)
    return out


def test_a_stock_interpreter_is_found_where_its_runtime_is() -> None:
    if not STOCK.exists():
        unavailable(f"no {STOCK} (bash infra/setup.sh installs Debian's python3.11)")
    child = subprocess.Popen([str(STOCK), "-S", "-c", "import ctypes, sys; print(ctypes.addressof(ctypes.c_char."
                              "in_dll(ctypes.pythonapi, '_PyRuntime')), flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        runtime = int(child.stdout.readline())
        procs = PythonProcs()
        found = procs.load(child.pid, process_info(child.pid).mappings)
        assert found is not None and found.runtime == runtime and found.offsets == TABLE[(3, 11)]
        assert found.eval_start < found.eval_end and found.version.startswith("3.11.")
        assert procs.get(child.pid) == found and procs.counters()["python_processes"] == 1
    finally:
        child.kill()
        child.wait()
    assert procs.forget_exited() == 1 and procs.get(child.pid) is None


@pytest.mark.parametrize("name, defines, why", [
    ("py310", ["-DVERSION_IN_OFFSETS=0", "-DFREE_THREADED=0"], "CPython before 3.11"),
    ("py314", ["-DVERSION=0x030E00F0", "-DVERSION_IN_OFFSETS=0x030E00F0", "-DFREE_THREADED=0"],
     "no known layout of the debug offsets of CPython 3.14"),
    ("py313t", ["-DVERSION=0x030D05F0", "-DVERSION_IN_OFFSETS=0x030D05F0", "-DFREE_THREADED=1"],
     "a free-threaded build of CPython 3.13"),
])
def test_interpreters_the_walker_cannot_read_are_said_once_and_counted(tmp_path, caplog, name, defines, why) -> None:
    caplog.set_level(logging.INFO, "fleetprof.python")
    program = _fake(tmp_path, name, *defines)
    children = [subprocess.Popen([str(program)]) for _ in range(2)]
    try:
        procs = PythonProcs()
        for child in children:
            for _ in range(50):  # until exec has happened and the program is mapped
                info = process_info(child.pid)
                if info is not None and any(m.path == str(program) for m in info.mappings):
                    break
            assert procs.load(child.pid, info.mappings) is None
    finally:
        for child in children:
            child.kill()
            child.wait()
    said = [r.getMessage() for r in caplog.records if r.name == "fleetprof.python"]
    assert len(said) == 1 and why in said[0] and "native frames only" in said[0], said
    assert procs.counters()["python_processes_unsupported"] == 2 and procs.counters()["python_processes"] == 0


# The main thread runs a subinterpreter's code (3.11's private _xxsubinterpreters): its running thread state is
# that interpreter's, not the main one's.
SUBINTERPRETER = """
import _xxsubinterpreters as interpreters
interp = interpreters.create()
interpreters.run_string(interp, "def sub_spin():\\n    x = 0\\n    while True:\\n        x += 1\\nsub_spin()\\n")
"""


def test_a_thread_running_a_subinterpreter_gets_that_interpreters_frames(tmp_path) -> None:
    from producers.cpu_sampler import CpuSampler
    from producers.python_frames import PythonStacks
    from producers.unwind_maps import UnwindLoader
    from tests.python_truth import need_bpf_and_stock_python

    need_bpf_and_stock_python()
    child = subprocess.Popen([str(STOCK), "-S", "-c", SUBINTERPRETER])
    loader, procs = UnwindLoader(tmp_path / "cache"), PythonProcs()
    sampler = CpuSampler(199, pid_filter=child.pid, unwind=loader, python=procs)
    try:
        sampler.start()
        mappings = process_info(child.pid).mappings
        loader.load(child.pid, mappings)
        assert procs.load(child.pid, mappings) is not None and loader.wait_idle()
        sampler.drain()
        time.sleep(2)
        samples, codes = PythonStacks(procs).rewrite(sampler.drain())
    finally:
        sampler.close()
        loader.close()
        child.kill()
        child.wait()
    total = sum(n for *_, n in samples)
    named = [c["qualname"] for c in codes.get(child.pid, [])]
    on_sub = sum(n for _, _, user, _, n in samples
                 if any(is_python_frame(a) and named[python_frame_parts(a)[0]] == "sub_spin" for a in user))
    assert total >= 100 and on_sub >= 0.95 * total, (total, on_sub, named)
