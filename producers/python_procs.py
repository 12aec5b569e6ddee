"""Which sampled processes are CPython, and the BPF side's entry for each (`py_procs` in python.bpf.h).

A process is CPython when one of its executable mappings is a file that defines the interpreter
(producers/python_runtime.py: the executable itself, or a libpython). Files are looked at once per build id. The
entry tells the walker where `_PyRuntime` is in that process and the struct offsets of its version; user space keeps
the same facts (`PythonProcess`) to read code objects and to put Python frames in place of the evaluator's native
frames. An interpreter whose frames cannot be walked (before 3.11, a free-threaded build, a version without known
offsets) is said once per file in one log line and counted: its samples keep their native frames.
"""

from __future__ import annotations

import ctypes as ct
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from producers.elf_symbols import ElfError, read_load_segments
from producers.mapped_files import file_of_mapping, load_bias
from producers.process_info import Mapping
from producers.python_offsets import PythonOffsets, walk_values
from producers.python_runtime import PythonRuntime, read_python_runtime

log = logging.getLogger("fleetprof.python")

# Keep in step with python.bpf.h.
PY_PROC_FIELDS = ("runtime", "interpreters_head", "threads_head", "interp_next", "tstate_next",
                  "tstate_native_thread_id", "tstate_frame", "cframe_current_frame", "frame_code", "frame_previous",
                  "frame_instr", "frame_owner", "frame_is_entry", "code_adaptive", "owner_cstack")
PY_STATS = ("samples", "threads_without_state", "frames", "frames_unreadable", "chains_cut_at_frame_limit",
            "threads_idle")


@dataclass(frozen=True)
class PythonProcess:
    pid: int
    version: str
    offsets: PythonOffsets
    runtime: int  # _PyRuntime's address in the process
    eval_start: int  # the process's addresses of _PyEval_EvalFrameDefault: [eval_start, eval_end)
    eval_end: int




class PythonProcs:
    """The CPython processes among those loaded, and their `py_procs` entries in the attached program."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[PythonRuntime | None, list[tuple[int, int, int]]]] = {}  # build id -> found
        self._procs: dict[int, PythonProcess] = {}
        self._table: Any = None
        self._stats: Any = None
        self._lock = threading.Lock()
        self.counts = {"processes_walked": 0, "processes_unsupported": 0}

    def attach(self, bpf: Any) -> None:
        self._table = bpf[b"py_procs"]
        self._stats = bpf[b"py_stats"]

    @property
    def attached(self) -> bool:
        """Whether a program holds the entries (another one, the GPU probes', may then read them)."""
        return self._table is not None

    def get(self, pid: int) -> PythonProcess | None:
        return self._procs.get(pid)

    def load(self, pid: int, mappings: list[Mapping]) -> PythonProcess | None:
        """Look at a process (new, or with new mappings): its entry written when it runs a CPython the walker
        knows, removed when it no longer does (exec)."""
        found = None
        for m in mappings:
            if not m.path.startswith("/") or not m.build_id:
                continue
            runtime, segments = self._file(pid, m)
            if runtime is None:
                continue
            bias = load_bias(segments, m.start, m.file_offset)
            if bias is None or not (m.start <= runtime.eval_start + bias < m.limit):
                continue  # another mapping of the file holds its code
            if runtime.offsets is None:
                self.counts["processes_unsupported"] += 1
                break
            found = PythonProcess(pid, runtime.version, runtime.offsets, runtime.runtime + bias,
                                  runtime.eval_start + bias, runtime.eval_end + bias)
            break
        with self._lock:
            if found is None:
                if self._procs.pop(pid, None) is not None:
                    self._delete(pid)
                return None
            if self._procs.get(pid) != found:
                self._write(found)
                self._procs[pid] = found
                self.counts["processes_walked"] += 1
        return found

    def forget_exited(self) -> int:
        gone = [pid for pid in list(self._procs) if not os.path.exists(f"/proc/{pid}")]
        with self._lock:
            for pid in gone:
                self._procs.pop(pid, None)
                self._delete(pid)
        return len(gone)

    def counters(self) -> dict[str, int]:
        out = {f"python_{name}": 0 for name in PY_STATS}
        if self._stats is not None:
            for i, name in enumerate(PY_STATS):
                try:
                    out[f"python_{name}"] = sum(int(v) for v in self._stats[ct.c_int(i)])
                except (KeyError, OSError):
                    pass
        out.update({f"python_{k}": v for k, v in self.counts.items()}, python_processes=len(self._procs))
        return out

    def _file(self, pid: int, m: Mapping) -> tuple[PythonRuntime | None, list[tuple[int, int, int]]]:
        known = self._files.get(m.build_id)
        if known is not None:
            return known
        path = file_of_mapping(pid, m)
        if path is None:
            return None, []  # not kept: the next look may read it
        runtime = read_python_runtime(path)
        segments: list[tuple[int, int, int]] = []
        if runtime is not None:
            try:
                segments = read_load_segments(path)
            except ElfError:
                runtime = None
            if runtime is not None and runtime.offsets is None:
                log.info("CPython %s in %s: %s; its processes get native frames only", runtime.version, m.path,
                         runtime.unsupported)
        self._files[m.build_id] = (runtime, segments)
        return runtime, segments

    def _write(self, proc: PythonProcess) -> None:
        if self._table is None:
            return
        leaf = self._table.Leaf()
        values = dict(walk_values(proc.offsets), runtime=proc.runtime, owner_cstack=proc.offsets.owner_cstack)
        for name in PY_PROC_FIELDS:
            setattr(leaf, name, values[name])
        try:
            self._table[ct.c_uint32(proc.pid)] = leaf
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception when the map is full
            log.warning("Python frames of pid %d not walked: %s", proc.pid, exc)

    def _delete(self, pid: int) -> None:
        if self._table is None:
            return
        try:
            del self._table[ct.c_uint32(pid)]
        except KeyError:
            pass
