"""The CPU collector: one window of sampler output becomes one CpuStackBatch record (schemas/cpu_stack_batch.v1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from producers.cpu_sampler import Sample
from producers.perf_map import DEFAULT_PERF_MAPS, JIT_BINARY, PerfMap, PerfMapCache, is_anonymous
from producers.process_info import Mapping, ProcessInfo, process_info

_U64 = 1 << 64


def as_long(addr: int) -> int:
    """An unsigned 64-bit address as the Avro long with the same bits (kernel addresses go negative)."""
    return addr - _U64 if addr >= 1 << 63 else addr


class ProcessCache:
    """Process metadata captured when a pid is first seen, so a process that exits later still symbolizes.

    A pid not sampled for `idle_windows` windows is forgotten (it has likely exited, and its number may be reused),
    which also bounds the cache by the processes active recently. Mappings of a live process are read again when
    its samples land outside all of them (code it mapped later: a JIT), at most once per window.
    """

    def __init__(self, lookup: Callable[[int], ProcessInfo | None] = process_info, idle_windows: int = 6,
                 perf_maps: PerfMapCache | None = None, max_unmapped: int = 4096) -> None:
        self._lookup = lookup
        self._infos: dict[int, ProcessInfo] = {}
        self._last_window: dict[int, int] = {}
        self._reread_window: dict[int, int] = {}
        # Addresses still outside every mapping after a re-read (a broken frame-pointer chain gives junk): they do
        # not cause another re-read. At most max_unmapped per process.
        self._unmapped: dict[int, set[int]] = {}
        self.max_unmapped = max_unmapped
        self.perf_maps = perf_maps if perf_maps is not None else DEFAULT_PERF_MAPS
        self.idle_windows = idle_windows
        self.window = 0
        self.rereads = 0

    def get(self, pid: int) -> ProcessInfo:
        """The cached info, else read now; a pid already gone gets a placeholder without mappings."""
        info = self._infos.get(pid)
        if info is None:
            info = self._lookup(pid) or ProcessInfo(pid, comm="", exe="", cgroup="", container_id="")
            self._infos[pid] = info
            if any(is_anonymous(m.path) for m in info.mappings):
                self.perf_maps.get(pid)  # now, in case the process exits before its window ends
        self._last_window[pid] = self.window
        return info

    def covering(self, pid: int, addrs: list[int]) -> ProcessInfo:
        """The info of `pid`, its mappings read again first when some of `addrs` lie outside all of them and were
        not outside after an earlier re-read; a process that is gone keeps what was read before."""
        info = self.get(pid)
        outside = _outside(info.mappings, addrs) - self._unmapped.get(pid, set())
        if not outside or self._reread_window.get(pid) == self.window:
            return info
        self._reread_window[pid] = self.window
        self.rereads += 1
        fresh = self._lookup(pid)
        if fresh is not None:
            self._infos[pid] = info = fresh
        known = self._unmapped.setdefault(pid, set())
        if len(known) > self.max_unmapped:
            known.clear()
        known |= _outside(info.mappings, list(outside))
        return info

    def end_window(self) -> None:
        """Close a window: forget pids idle for too long."""
        self.window += 1
        for pid in [p for p, w in self._last_window.items() if self.window - w > self.idle_windows]:
            del self._last_window[pid]
            self._infos.pop(pid, None)
            self._reread_window.pop(pid, None)
            self._unmapped.pop(pid, None)
            self.perf_maps.forget(pid)

    def __len__(self) -> int:
        return len(self._infos)


def _outside(mappings: list[Mapping], addrs: list[int]) -> set[int]:
    """The addresses in none of the mappings."""
    if not addrs:
        return set()
    if not mappings:
        return set(addrs)
    spans = sorted((m.start, m.limit) for m in mappings)
    starts = np.array([s for s, _ in spans], dtype=np.uint64)
    limits = np.array([lim for _, lim in spans], dtype=np.uint64)
    values = np.array(addrs, dtype=np.uint64)
    i = np.searchsorted(starts, values, side="right").astype(np.int64) - 1
    inside = (i >= 0) & (values < limits[np.maximum(i, 0)])
    return set(values[~inside].tolist())


def batch_mappings(info: ProcessInfo, perf_map: PerfMap | None) -> list[dict]:
    """The Mapping records of a process. An anonymous mapping that holds perf-map symbols points at the perf map's
    table with file_offset = start, so the symbolizer's file offset is the absolute address the map names."""
    out = []
    for m in info.mappings:
        rec = {**asdict(m), "start": as_long(m.start), "limit": as_long(m.limit)}
        if perf_map is not None and is_anonymous(m.path) and perf_map.covers(m.start, m.limit):
            rec.update(path=JIT_BINARY, build_id=perf_map.build_id, file_offset=as_long(m.start))
        out.append(rec)
    return out


@dataclass(frozen=True)
class ProcessFilter:
    """Which processes a window keeps: by command name and by cgroup path prefix (None: all)."""

    comm: str | None = None
    cgroup: str | None = None

    def accepts(self, info: ProcessInfo) -> bool:
        if self.comm is not None and info.comm != self.comm:
            return False
        return self.cgroup is None or info.cgroup.startswith(self.cgroup)


def build_cpu_batch(samples: list[Sample], processes: ProcessCache, node: str, window_start_ns: int,
                    window_ns: int, frequency_hz: int, kernel_build_id: str = "",
                    keep: ProcessFilter = ProcessFilter()) -> dict:
    """A CpuStackBatch record: per process its metadata, mappings and (tid, stacks, count) tuples; processes the
    filter rejects are left out. A process with anonymous executable mappings has its perf map read (again, when the
    file changed), and the mappings holding its symbols refer to it (see batch_mappings)."""
    by_pid: dict[int, list[dict]] = {}
    user_addrs: dict[int, set[int]] = {}
    for pid, tid, user, kernel, count in samples:
        user_addrs.setdefault(pid, set()).update(user)
        by_pid.setdefault(pid, []).append({
            "tid": tid, "user_addrs": [as_long(a) for a in user],
            "kernel_addrs": [as_long(a) for a in kernel], "count": count})
    procs = []
    for pid in sorted(by_pid):
        info = processes.get(pid)
        if not keep.accepts(info):
            continue
        info = processes.covering(pid, list(user_addrs[pid]))
        anonymous = any(is_anonymous(m.path) for m in info.mappings)
        procs.append({
            "pid": pid, "comm": info.comm, "exe": info.exe, "cgroup": info.cgroup,
            "container_id": info.container_id,
            "mappings": batch_mappings(info, processes.perf_maps.get(pid) if anonymous else None),
            "stacks": by_pid[pid]})
    processes.end_window()
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": window_ns, "frequency_hz": frequency_hz,
            "kernel_build_id": kernel_build_id, "simulated": False, "processes": procs}
