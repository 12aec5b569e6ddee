"""Python frames put in place: each sample's raw Python part (python.bpf.h) merged into its native stack, each code
object named, and the frames written as the wire's Python frame words (schemas/wire.py) with a per-process table
of the code objects they name.

Merge rule: the native stack, leaf first, holds one `_PyEval_EvalFrameDefault` frame per call of the evaluator; the
Python frames, innermost first, come in runs, each ending at an entry frame (the first frame that call ran). The
n-th evaluator frame from the leaf is replaced by the n-th run. So native → Python → C extension → native library →
Python callback comes out in the order it ran. A stack whose runs and evaluator frames do not pair up (a walk cut
short on either side) keeps what pairs, puts the remaining Python frames at the root end, and is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from producers.cpu_sampler import Sample
from producers.python_code import CodeObject, ProcessMemory, ReadFailed, read_code, still_same
from producers.python_procs import PythonProcess, PythonProcs
from schemas.wire import PYTHON_MAX_CODE_OBJECTS, TRUNCATED_FRAME, python_frame

log = logging.getLogger("fleetprof.python")

PY_MARK = 0xFFFF_FFFF_FFFF_FFFD  # python.bpf.h PY_MARK: the Python part of a sample's user stack follows
PY_ENTRY = 1 << 63
UNREADABLE = "[unreadable code object]"
RawFrame = tuple[int, int, bool]  # (code object address, instruction offset in code units, entry frame)


def split_raw(user: list[int]) -> tuple[list[int], list[RawFrame], bool]:
    """(native part, Python frames innermost first, whether the Python part was cut) of a sample's user stack."""
    if PY_MARK not in user:
        return user, [], False
    at = user.index(PY_MARK)
    frames, cut = [], False
    for word in user[at + 1:]:
        if word == TRUNCATED_FRAME:
            cut = True
            break
        frames.append((word & 0xFFFF_FFFF_FFFF, (word >> 48) & 0x7FFF, bool(word & PY_ENTRY)))
    return user[:at], frames, cut


def runs(frames: list[RawFrame]) -> list[list[RawFrame]]:
    """The Python frames in runs, one per evaluator call, innermost first; a last run without its entry frame (a
    chain cut short) is kept as it is."""
    out: list[list[RawFrame]] = [[]]
    for f in frames:
        out[-1].append(f)
        if f[2]:
            out.append([])
    return [r for r in out if r]


def merge(native: list[int], frames: list[RawFrame], eval_start: int, eval_end: int,
          name: Callable[[RawFrame], int]) -> tuple[list[int], bool]:
    """The merged user stack (leaf first) and whether every run met its evaluator frame. `name` turns a Python
    frame into its wire word."""
    pending = runs(frames)
    out: list[int] = []
    for addr in native:
        if eval_start <= addr < eval_end and pending:
            out.extend(name(f) for f in pending.pop(0))
        else:
            out.append(addr)
    whole = not pending
    if pending:  # the native walk ended before the evaluator frames did: keep the Python frames, at the root end
        at = out.index(TRUNCATED_FRAME) if TRUNCATED_FRAME in out else len(out)
        out[at:at] = [name(f) for run in pending for f in run]
    return out, whole


def _as_records(pid: int, table: dict[tuple[str, str, int], int]) -> list[dict]:
    if len(table) > PYTHON_MAX_CODE_OBJECTS:  # not in any window seen so far; said, not sent wrong
        log.warning("pid %d: %d code objects in one window, over the wire's limit", pid, len(table))
    return [{"qualname": q, "file": f, "first_line": line} for (q, f, line) in table]


@dataclass
class _Process:
    memory: ProcessMemory
    codes: dict[int, CodeObject] = field(default_factory=dict)  # address -> what it held when read
    checked: set[int] = field(default_factory=set)  # addresses checked again this window


class PythonStacks:
    """Turns a window's samples' raw Python parts into wire frames, reading the code objects they name."""

    def __init__(self, procs: PythonProcs) -> None:
        self.procs = procs
        self._readers: dict[int, _Process | None] = {}
        self.counts = {"python_stacks": 0, "python_stacks_unpaired": 0, "python_stacks_cut": 0,
                       "python_code_objects_read": 0, "python_code_objects_unreadable": 0}

    def rewrite(self, samples: list[Sample]) -> tuple[list[Sample], dict[int, list[dict]]]:
        """The samples with their Python frames in place, and per process the code objects they refer to (the
        batch's `code_objects`: index i is frame index i)."""
        tables: dict[int, dict[tuple[str, str, int], int]] = {}
        out: list[Sample] = []
        for pid, tid, user, kernel, count in samples:
            merged = self._merge(pid, user, count, lambda pid=pid: tables.setdefault(pid, {}))
            out.append((pid, tid, user if merged is None else merged, kernel, count))
        return out, {pid: _as_records(pid, table) for pid, table in tables.items()}

    def rewrite_launch(self, pid: int, user: list[int]) -> tuple[list[int], list[dict]]:
        """One launch stack (unsigned words) with its Python frames in place, and the code objects they refer to
        (a table of the launch's own: a launch travels alone)."""
        table: dict[tuple[str, str, int], int] = {}
        merged = self._merge(pid, user, 1, lambda: table)
        return (user, []) if merged is None else (merged, _as_records(pid, table))

    def _merge(self, pid: int, user: list[int], count: int, table_of: Callable[[], dict]) -> list[int] | None:
        """The stack with its Python part merged in, numbering code objects in `table_of()`'s table; None when it
        has no Python part (the stack is the native one, mark dropped)."""
        native, frames, cut = split_raw(user)
        proc = self.procs.get(pid) if frames or cut else None
        if proc is None:
            return native if len(native) != len(user) else None
        table = table_of()
        reader = self._reader(pid)

        def name(f: RawFrame) -> int:
            code = self._code(reader, proc, f[0])
            key = (code.qualname, code.filename, code.first_line) if code else (UNREADABLE, "", 0)
            index = table.setdefault(key, len(table))
            return python_frame(index, code.line_at(f[1]) if code else 0)
        merged, whole = merge(native, frames, proc.eval_start, proc.eval_end, name)
        if cut and (not merged or merged[-1] != TRUNCATED_FRAME):
            merged.append(TRUNCATED_FRAME)
        self.counts["python_stacks"] += count
        self.counts["python_stacks_unpaired"] += 0 if whole else count
        self.counts["python_stacks_cut"] += count if cut else 0
        return merged

    def end_window(self) -> None:
        """Drop what exited processes held; check every kept code object again in the next window."""
        for pid in list(self._readers):
            reader = self._readers[pid]
            if self.procs.get(pid) is None:
                if reader is not None:
                    reader.memory.close()
                del self._readers[pid]
            elif reader is not None:
                reader.checked.clear()

    def _reader(self, pid: int) -> _Process | None:
        if pid not in self._readers:
            try:
                self._readers[pid] = _Process(ProcessMemory(pid))
            except ReadFailed:
                self._readers[pid] = None
        return self._readers[pid]

    def _code(self, reader: _Process | None, proc: PythonProcess, addr: int) -> CodeObject | None:
        if reader is None:
            self.counts["python_code_objects_unreadable"] += 1
            return None
        code = reader.codes.get(addr)
        if code is not None and (addr in reader.checked or still_same(reader.memory, proc.offsets, addr, code)):
            reader.checked.add(addr)
            return code
        try:
            code = read_code(reader.memory, proc.offsets, addr)
        except ReadFailed:
            self.counts["python_code_objects_unreadable"] += 1
            return None
        reader.codes[addr] = code
        reader.checked.add(addr)
        self.counts["python_code_objects_read"] += 1
        return code
