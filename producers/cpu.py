"""The CPU collector: one window of sampler output becomes one CpuStackBatch record (schemas/cpu_stack_batch.v1)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from threading import Event

from producers.cpu_sampler import CpuSampler, Sample
from producers.process_info import ProcessInfo, process_info

_U64 = 1 << 64


def as_long(addr: int) -> int:
    """An unsigned 64-bit address as the Avro long with the same bits (kernel addresses go negative)."""
    return addr - _U64 if addr >= 1 << 63 else addr


class ProcessCache:
    """Process metadata captured when a pid is first seen, so a process that exits later still symbolizes.

    A pid not sampled for `idle_windows` windows is forgotten (it has likely exited, and its number may be reused),
    which also bounds the cache by the processes active recently.
    """

    def __init__(self, lookup: Callable[[int], ProcessInfo | None] = process_info, idle_windows: int = 6) -> None:
        self._lookup = lookup
        self._infos: dict[int, ProcessInfo] = {}
        self._last_window: dict[int, int] = {}
        self.idle_windows = idle_windows
        self.window = 0

    def get(self, pid: int) -> ProcessInfo:
        """The cached info, else read now; a pid already gone gets a placeholder without mappings."""
        info = self._infos.get(pid)
        if info is None:
            info = self._lookup(pid) or ProcessInfo(pid, comm="", exe="", cgroup="", container_id="")
            self._infos[pid] = info
        self._last_window[pid] = self.window
        return info

    def end_window(self) -> None:
        """Close a window: forget pids idle for too long."""
        self.window += 1
        for pid in [p for p, w in self._last_window.items() if self.window - w > self.idle_windows]:
            del self._last_window[pid]
            self._infos.pop(pid, None)

    def __len__(self) -> int:
        return len(self._infos)


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
    filter rejects are left out."""
    by_pid: dict[int, list[dict]] = {}
    for pid, tid, user, kernel, count in samples:
        by_pid.setdefault(pid, []).append({
            "tid": tid, "user_addrs": [as_long(a) for a in user],
            "kernel_addrs": [as_long(a) for a in kernel], "count": count})
    procs = []
    for pid in sorted(by_pid):
        info = processes.get(pid)
        if not keep.accepts(info):
            continue
        procs.append({
            "pid": pid, "comm": info.comm, "exe": info.exe, "cgroup": info.cgroup,
            "container_id": info.container_id,
            "mappings": [{**asdict(m), "start": as_long(m.start), "limit": as_long(m.limit)} for m in info.mappings],
            "stacks": by_pid[pid]})
    processes.end_window()
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": window_ns, "frequency_hz": frequency_hz,
            "kernel_build_id": kernel_build_id, "simulated": False, "processes": procs}


def wait_window(sampler: CpuSampler, window_s: float, processes: ProcessCache, stop: Event | None = None,
                look_every_s: float = 1.0) -> None:
    """Wait out one window, reading each newly sampled process's metadata and mappings as soon as it shows up,
    so a process that exits before the window ends still symbolizes."""
    deadline = time.monotonic() + window_s
    stop = stop or Event()
    while (left := deadline - time.monotonic()) > 0:
        if stop.wait(min(look_every_s, left)):
            return
        for pid in sampler.pids():
            processes.get(pid)


def collect_window(sampler: CpuSampler, window_s: float, processes: ProcessCache,
                   node: str | None = None, keep: ProcessFilter = ProcessFilter()) -> dict:
    """Wait one window on a started sampler, drain it and build the batch record."""
    start_ns = time.time_ns()
    wait_window(sampler, window_s, processes)
    samples = sampler.drain()
    window_ns = time.time_ns() - start_ns
    return build_cpu_batch(samples, processes, node or socket.gethostname(), start_ns, window_ns,
                           sampler.frequency_hz, keep=keep)
