"""The CPU collector: one window of sampler output becomes one CpuStackBatch record (schemas/cpu_stack_batch.v1)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import asdict

from producers.cpu_sampler import CpuSampler, Sample
from producers.process_info import ProcessInfo, process_info

_U64 = 1 << 64


def as_long(addr: int) -> int:
    """An unsigned 64-bit address as the Avro long with the same bits (kernel addresses go negative)."""
    return addr - _U64 if addr >= 1 << 63 else addr


class ProcessCache:
    """Process metadata captured when a pid is first seen, so a process that exits later still symbolizes."""

    def __init__(self, lookup: Callable[[int], ProcessInfo | None] = process_info) -> None:
        self._lookup = lookup
        self._infos: dict[int, ProcessInfo] = {}

    def get(self, pid: int) -> ProcessInfo:
        """The cached info, else read now; a pid already gone gets a placeholder without mappings."""
        info = self._infos.get(pid)
        if info is None:
            info = self._lookup(pid) or ProcessInfo(pid, comm="", exe="", cgroup="", container_id="")
            self._infos[pid] = info
        return info


def build_cpu_batch(samples: list[Sample], processes: ProcessCache, node: str, window_start_ns: int,
                    window_ns: int, frequency_hz: int, kernel_build_id: str = "") -> dict:
    """A CpuStackBatch record: per process its metadata, mappings and (tid, stacks, count) tuples."""
    by_pid: dict[int, list[dict]] = {}
    for pid, tid, user, kernel, count in samples:
        by_pid.setdefault(pid, []).append({
            "tid": tid, "user_addrs": [as_long(a) for a in user],
            "kernel_addrs": [as_long(a) for a in kernel], "count": count})
    procs = []
    for pid in sorted(by_pid):
        info = processes.get(pid)
        procs.append({
            "pid": pid, "comm": info.comm, "exe": info.exe, "cgroup": info.cgroup,
            "container_id": info.container_id,
            "mappings": [{**asdict(m), "start": as_long(m.start), "limit": as_long(m.limit)} for m in info.mappings],
            "stacks": by_pid[pid]})
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": window_ns, "frequency_hz": frequency_hz,
            "kernel_build_id": kernel_build_id, "simulated": False, "processes": procs}


def collect_window(sampler: CpuSampler, window_s: float, processes: ProcessCache,
                   node: str | None = None) -> dict:
    """Sleep one window on a started sampler, drain it and build the batch record."""
    start_ns = time.time_ns()
    time.sleep(window_s)
    samples = sampler.drain()
    window_ns = time.time_ns() - start_ns
    return build_cpu_batch(samples, processes, node or socket.gethostname(), start_ns, window_ns,
                           sampler.frequency_hz)
