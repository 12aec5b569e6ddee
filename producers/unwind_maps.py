"""The call-frame tables in the BPF maps the unwinder reads (producers/bpf/unwind.bpf.h): each mapped file's rows
once per build id in the shared `unwind_rows` array as (pc, rule index), each distinct rule once in `unwind_rules`,
each process's executable mappings in `unwind_procs`.

Tables are compiled (producers/unwind_tables.py, cached on disk per build id) on a thread of their own, so a large
new binary never holds up the agent's loop; until a process's tables are in, its stacks are walked by frame
pointers (and counted as such). A file's rows are freed when no loaded process maps it any more.

The maps are one set for the agent: the first program attached (the CPU sampler) owns and exports them; the others
(the GPU launch probes) are compiled with `cflags(shared=True)` and use the same maps. Each counts its own walks.
"""

from __future__ import annotations

import ctypes as ct
import logging
import mmap
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from producers.elf_symbols import ElfError, read_load_segments
from producers.mapped_files import file_of_mapping, load_bias
from producers.process_info import Mapping
from producers.unwind_cache import UnwindTableCache
from producers.unwind_rules import code_fields
from producers.unwind_tables import UnwindTable, UnwindTableError, compile_unwind_table_bytes

log = logging.getLogger("fleetprof.unwind")

DEFAULT_ROWS = 1 << 23  # rows of all loaded files together: 8 bytes of kernel memory each (64 MiB)
DEFAULT_PROCS = 8192  # processes with tables at once
MAX_RULES = 65536  # UNWIND_RULES in unwind.bpf.h
MAX_MAPPINGS = 512  # UNWIND_MAPPINGS in unwind.bpf.h
ELEMENT_BYTES = 8  # struct unwind_row in the kernel: pc, rule index
_COMPILED = np.dtype([("pc", "<u4"), ("code", "<u8")])  # a compiled 12-byte row: pc, then the rule's 8 bytes
_LOADED = np.dtype([("pc", "<u4"), ("rule", "<u4")])
PAGE = mmap.PAGESIZE
# How walks ended and what they met: the `unwind_stats` indices in unwind.bpf.h.
UNWIND_STATS = ("stacks_reached_root", "stacks_ended_by_frame_pointer", "stacks_cut_at_frame_limit",
                "stacks_unreadable_frame", "stacks_unsupported_rule", "stacks_bad_frame", "stacks_without_tables",
                "stacks_unmapped_pc", "frames_by_frame_pointer", "frames_by_table", "frames_signal",
                "samples_without_user_stack")
TRUNCATED_ENDS = ("stacks_cut_at_frame_limit", "stacks_unreadable_frame", "stacks_unsupported_rule",
                  "stacks_bad_frame")


@dataclass
class _File:
    start: int
    count: int
    pids: set[int] = field(default_factory=set)


@dataclass
class _Maps:
    rows_fd: int
    rules: Any  # the bcc tables of unwind_rules and unwind_procs
    procs: Any


def default_unwind_cache() -> Path:
    """Where compiled tables are kept: one cache per machine (user), whatever the agent's data directory, since a
    table depends on the file alone."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fleetprof" / "unwind"


class RowSpace:
    """First-fit allocation of the rows array: (start, count) slices, merged again when freed."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free: list[tuple[int, int]] = [(0, size)]

    def take(self, count: int) -> int | None:
        for i, (start, have) in enumerate(self._free):
            if have >= count:
                self._free[i:i + 1] = [(start + count, have - count)] if have > count else []
                return start
        return None

    def give(self, start: int, count: int) -> None:
        self._free.append((start, count))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for s, c in self._free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + c)
            else:
                merged.append((s, c))
        self._free = merged

    @property
    def used(self) -> int:
        return self.size - sum(c for _, c in self._free)


class UnwindLoader:
    """Loads the tables of the processes it is given into every attached program's maps."""

    def __init__(self, cache_dir: Path, rows: int = DEFAULT_ROWS, procs: int = DEFAULT_PROCS) -> None:
        self.tables = UnwindTableCache(cache_dir)
        self.rows = rows
        self.procs = procs
        self.space = RowSpace(rows)
        self._maps: _Maps | None = None
        self._stats: list[Any] = []  # each attached program's unwind_stats
        self._rules: dict[int, int] = {}  # rule code -> its index in unwind_rules
        self._files: dict[str, _File] = {}  # table key (build id) -> its rows
        self._pids: dict[int, set[str]] = {}  # loaded process -> the table keys its entry uses
        self._lock = threading.Lock()  # _files, _pids, space and the maps: the worker and forget_exited()
        self._queue: queue.Queue[tuple[int, list[Mapping]] | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._vdso: tuple[str, UnwindTable | None, int] | None = None
        self._segments: dict[str, list[tuple[int, int, int]]] = {}  # build id -> its PT_LOAD segments
        self.stats = {k: 0 for k in ("processes_loaded", "files_loaded", "files_freed", "tables_failed",
                                     "rows_exhausted", "rules_exhausted", "mappings_over_limit", "build_seconds_ms")}

    @property
    def shared(self) -> bool:
        """Whether a program owns the maps already: the next one shares them."""
        return self._maps is not None

    def cflags(self, shared: bool = False) -> list[str]:
        """The -D settings a program that unwinds is compiled with; `shared`: it uses the owner's maps."""
        return ["-DUNWIND_TABLES", f"-DUNWIND_ROWS={self.rows}", f"-DUNWIND_PROCS={self.procs}",
                f"-DUNWIND_RULES={MAX_RULES}", *(["-DUNWIND_EXTERN"] if shared else [])]

    def attach(self, bpf: Any) -> None:
        """Take a compiled program: the first one's maps are where the tables go (before the first load(): the
        rows are not kept to be written again); every one's walks are counted."""
        with self._lock:
            if self._maps is None:
                self._maps = _Maps(bpf[b"unwind_rows"].map_fd, bpf[b"unwind_rules"], bpf[b"unwind_procs"])
            self._stats.append(bpf[b"unwind_stats"])
        if self._worker is None:
            self._worker = threading.Thread(target=self._work, name="fleetprof-unwind", daemon=True)
            self._worker.start()

    def load(self, pid: int, mappings: list[Mapping]) -> None:
        """Queue a process (new, or with new mappings) to have its tables loaded."""
        self._queue.put((pid, list(mappings)))

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Whether everything queued so far was loaded within `timeout` (tests, and `--once` runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    def loaded(self, pid: int) -> bool:
        return pid in self._pids

    def forget_exited(self) -> int:
        """Remove the entries of processes that exited, and free the rows no process uses any more."""
        gone = [pid for pid in list(self._pids) if not os.path.exists(f"/proc/{pid}")]
        with self._lock:
            for pid in gone:
                self._unload(pid)
        return len(gone)

    def counters(self) -> dict[str, int]:
        """The kernel side's counts (summed over CPUs and programs) and the loader's own."""
        out = dict.fromkeys(UNWIND_STATS, 0)
        for stats in self._stats:
            for i, name in enumerate(UNWIND_STATS):
                try:
                    out[name] += sum(int(v) for v in stats[ct.c_int(i)])
                except (KeyError, OSError):
                    pass
        out["stacks_truncated"] = sum(out[k] for k in TRUNCATED_ENDS)
        out.update(self.stats, rows_used=self.space.used, rows_capacity=self.space.size, rules=len(self._rules),
                   files=len(self._files),
                   processes=len(self._pids), table_cache_builds=self.tables.builds,
                   table_cache_hits=self.tables.disk_hits)
        return out

    def close(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=30)
            self._worker = None
        self._maps = None
        self._stats.clear()

    # --- the worker ------------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._load(*item)
            except Exception:  # noqa: BLE001 - a process the agent cannot read must never stop the loader
                log.exception("loading the unwind tables of pid %d failed", item[0] if item else -1)
            finally:
                self._queue.task_done()

    def _load(self, pid: int, mappings: list[Mapping]) -> None:
        entries: list[tuple[int, int, int, int, int]] = []  # start, end, bias, rows start, rows count
        keys: set[str] = set()
        # Over the limit, files (which have tables) go before anonymous code (walked by frame pointers anyway).
        kept = sorted(mappings, key=lambda m: not m.path.startswith("/"))[:MAX_MAPPINGS]
        for m in sorted(kept, key=lambda m: m.start):
            found = self._table_for(pid, m)
            if found is None:
                entries.append((m.start, m.limit, 0, 0, 0))  # frame pointers there
                continue
            key, bias = found
            with self._lock:
                file = self._files.get(key)
            if file is None:
                entries.append((m.start, m.limit, 0, 0, 0))
                continue
            keys.add(key)
            entries.append((m.start, m.limit, bias, file.start, file.count))
        if len(mappings) > MAX_MAPPINGS:
            self.stats["mappings_over_limit"] += len(mappings) - MAX_MAPPINGS
        if not os.path.exists(f"/proc/{pid}"):
            with self._lock:  # it exited while its files were read: rows stored for it alone are free again
                for key in keys:
                    self._free_if_unused(key)
            return
        with self._lock:
            if any(key not in self._files for key in keys):  # freed meanwhile (its last process exited): again
                self._queue.put((pid, mappings))
                return
            old = self._pids.get(pid, set())
            for key in keys:
                self._files[key].pids.add(pid)
            self._pids[pid] = keys
            for key in old - keys:
                self._release(key, pid)
            self._write_proc(pid, entries)
        self.stats["processes_loaded"] += 1

    def _table_for(self, pid: int, m: Mapping) -> tuple[str, int] | None:
        """(table key, bias) of a mapping whose file has rows loaded (loading them now if needed), else None."""
        if m.path == "[vdso]":
            return self._vdso_table(m)
        if not m.path.startswith("/") or not m.build_id:
            return None
        key = m.build_id
        path: str | None = None
        segments = self._segments.get(key)
        if segments is None:
            path = file_of_mapping(pid, m)
            if path is None:
                return None
            try:
                segments = self._segments[key] = read_load_segments(path)
            except ElfError:
                return None
        bias = load_bias(segments, m.start, m.file_offset)
        if bias is None:
            return None
        with self._lock:
            if key in self._files:
                return key, bias
        path = path or file_of_mapping(pid, m)
        if path is None:  # the segments were read when it was there
            return None
        began = time.monotonic()
        try:
            table = self.tables.get(key, path)
        except (UnwindTableError, OSError) as exc:
            if not _running(pid):
                return None  # it exited while its file was read: nothing wrong with the file, a later process loads it
            self.stats["tables_failed"] += 1
            log.info("no unwind table for %s: %s", m.path, exc)
            return None
        self.stats["build_seconds_ms"] += int((time.monotonic() - began) * 1000)
        return (key, bias) if self._store(key, table) else None

    def _vdso_table(self, m: Mapping) -> tuple[str, int] | None:
        """The vDSO is the kernel's and the same in every process: its table is compiled once, from this
        process's own copy."""
        if self._vdso is None:
            self._vdso = _read_own_vdso()
        key, table, base = self._vdso
        if table is None:
            return None
        with self._lock:
            stored = key in self._files
        if not stored and not self._store(key, table):
            return None
        return key, m.start - base

    def _store(self, key: str, table: UnwindTable) -> bool:
        with self._lock:
            if key in self._files:
                return True
            if self._maps is None or not table.count:
                return False
            compiled = np.frombuffer(table.rows, dtype=_COMPILED)
            codes, rule_of_row = np.unique(compiled["code"], return_inverse=True)
            new = [int(c) for c in codes.tolist() if c not in self._rules]
            if len(self._rules) + len(new) > MAX_RULES:
                self.stats["rules_exhausted"] += 1
                log.warning("unwind rules full (%d): a file with %d new ones walks by frame pointers", MAX_RULES,
                            len(new))
                return False
            start = self.space.take(table.count)
            if start is None:
                self.stats["rows_exhausted"] += 1
                log.warning("unwind rows full (%d of %d used): a file of %d rows walks by frame pointers; raise "
                            "--unwind-rows", self.space.used, self.space.size, table.count)
                return False
            for code in new:
                index = self._rules[code] = len(self._rules)
                leaf = self._maps.rules.Leaf()
                leaf.cfa_kind, leaf.cfa_offset, leaf.rbp_kind, leaf.rbp_offset = code_fields(code)
                self._maps.rules[ct.c_int(index)] = leaf
            loaded = np.empty(table.count, dtype=_LOADED)
            loaded["pc"] = compiled["pc"]
            loaded["rule"] = np.array([self._rules[int(c)] for c in codes.tolist()], dtype=np.uint32)[rule_of_row]
            _write_rows(self._maps.rows_fd, start, loaded.tobytes())
            self._files[key] = _File(start, table.count)
            self.stats["files_loaded"] += 1
            return True

    def _write_proc(self, pid: int, entries: list[tuple[int, int, int, int, int]]) -> None:
        if self._maps is None:
            return
        buf = np.zeros(1, dtype=_PROC_DTYPE)
        buf["count"] = len(entries)
        if entries:
            buf["maps"][0, :len(entries)] = entries
        leaf = self._maps.procs.Leaf()
        ct.memmove(ct.addressof(leaf), buf.ctypes.data, min(ct.sizeof(leaf), buf.nbytes))
        try:
            self._maps.procs[ct.c_uint32(pid)] = leaf
        except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception when the map is full
            log.warning("unwind table of pid %d not loaded: %s", pid, exc)

    def _unload(self, pid: int) -> None:
        for key in self._pids.pop(pid, set()):
            self._release(key, pid)
        if self._maps is not None:
            try:
                del self._maps.procs[ct.c_uint32(pid)]
            except KeyError:
                pass

    def _release(self, key: str, pid: int) -> None:
        file = self._files.get(key)
        if file is None:
            return
        file.pids.discard(pid)
        self._free_if_unused(key)

    def _free_if_unused(self, key: str) -> None:
        file = self._files.get(key)
        if file is None or file.pids:
            return
        del self._files[key]
        self._segments.pop(key, None)
        self.space.give(file.start, file.count)
        self.stats["files_freed"] += 1


_PROC_DTYPE = np.dtype([("count", "<u4"), ("pad", "<u4"),
                        ("maps", [("start", "<u8"), ("end", "<u8"), ("bias", "<u8"), ("rows_start", "<u4"),
                                  ("rows_len", "<u4")], (MAX_MAPPINGS,))])


def _running(pid: int) -> bool:
    """Whether `pid` still runs: an exited process that is not reaped yet (a zombie) has /proc/PID but no root."""
    try:
        os.stat(f"/proc/{pid}/root")
        return True
    except OSError:
        return False


def _write_rows(fd: int, start: int, rows: bytes) -> None:
    """Rows (struct unwind_row, packed) into the mmap'able array at index `start`: only the pages they cover are
    mapped, and only while written (a mapping kept would count every page ever written in the agent's RSS)."""
    first = start * ELEMENT_BYTES
    page_start = first - first % PAGE
    length = first + len(rows) - page_start
    with mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=page_start) as mem:
        mem[first - page_start:first - page_start + len(rows)] = rows


def _read_own_vdso() -> tuple[str, UnwindTable | None, int]:
    """(key, table, the vDSO's own load address) from this process's vDSO image."""
    try:
        with open("/proc/self/maps") as f:
            line = next(ln for ln in f if ln.rstrip().endswith("[vdso]"))
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        image = ct.string_at(lo, hi - lo)
        table = compile_unwind_table_bytes(image)
    except (StopIteration, OSError, ValueError, UnwindTableError) as exc:
        log.info("no unwind table for the vDSO: %s", exc)
        return "vdso", None, 0
    # the vDSO is linked at virtual address 0 (its first segment's vaddr): pc - start is the virtual address
    return f"vdso:{os.uname().release}", table, 0
