"""The CPU collector: the eBPF sampler's counts, per window, as one CpuStackBatch record
(schemas/cpu_stack_batch.v3), with the metadata of every sampled process read while it runs and its workload
identity id."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from producers.agent import Records, Window
from producers.cpu_sampler import CpuSampler, Sample
from producers.identity_refs import Identities, process_identity
from producers.perf_map import is_anonymous
from producers.process_info import KEEP_ALL, ProcessCache, ProcessFilter, ProcessInfo, batch_mappings
from producers.python_frames import PythonStacks
from schemas.wire import LOST_STACK_FRAME, PYTHON_FRAME_TAG, TRUNCATED_FRAME, u64_to_long

if TYPE_CHECKING:
    from producers.python_procs import PythonProcs
    from producers.unwind_maps import UnwindLoader

log = logging.getLogger("fleetprof.agent")

# Reading a process (its maps, its files' build ids) takes milliseconds, seconds for hundreds on a busy machine; the
# kernel maps are emptied only between reads, and the fuller they get the more stacks collide: read for at most this
# long at a time, the rest this much later.
READ_BUDGET_S = 0.05
READ_AGAIN_S = 0.1
PRELOAD_BUDGET_S = 10.0  # at start, how long the tables of running processes may take before the first window


def _running_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


class CpuCollector:
    """The Collector for CPU stacks: the sampler's kernel maps emptied every look, new processes read as soon as
    their first sample announces them (the sampler wakes the agent), one batch per window."""

    name = "cpu"

    def __init__(self, sampler: CpuSampler, processes: ProcessCache, node: str, keep: ProcessFilter = KEEP_ALL,
                 kernel_build_id: str = "", unwind: UnwindLoader | None = None,
                 python: PythonProcs | None = None, identities: Identities | None = None) -> None:
        self.sampler = sampler
        self.identities = identities  # each process's workload identity id, per window (None: every id 0)
        self.unwind = unwind  # loads the call-frame tables of each process read
        self.python = python  # finds the CPython processes among those read, whose Python frames are walked
        self.python_stacks = PythonStacks(python) if python is not None else None
        self.processes = processes
        self.node = node
        self.keep = keep
        self.kernel_build_id = kernel_build_id
        self.lost_samples = self.dropped_samples = 0  # in all windows so far
        self._read_again = 0.0
        self._to_read: dict[int, None] = {}  # pids to read, in the order announced

    def begin(self, wake: Callable[[], None]) -> None:
        if self.unwind is not None or self.python is not None:
            self.preload()
        self.sampler.drain()  # what was counted while the BPF programs compiled is not this window's
        self.sampler.new_pids()
        self.sampler.on_new_pid = wake

    def preload(self, budget_s: float = PRELOAD_BUDGET_S) -> int:
        """Load the tables of the processes already running (those the filters keep) before the first window, so
        its stacks are walked by table from the start; at most `budget_s` (the rest load as they are sampled).
        Returns the processes queued."""
        pids = [self.sampler.pid_filter] if self.sampler.pid_filter is not None else _running_pids()
        queued = 0
        for pid in pids:
            info = self.processes.refresh(pid)
            if info is not None and info.mappings and self.keep.accepts(info):
                self._load(info)
                queued += 1
        if self.unwind is not None and not self.unwind.wait_idle(budget_s):
            log.info("call-frame tables of running processes still loading after %.0f s", budget_s)
        return queued

    def look(self) -> None:
        self.sampler.collect()
        for pid in self.sampler.pids():  # in case an announcement was missed (the known-pids map was full)
            if not self.processes.has(pid):
                self._to_read.setdefault(pid)

    def due_in(self) -> float | None:
        """Now when a process was announced; soon while a backlog of them waits to be read; else at the window's end."""
        if self.sampler.announced:
            return 0.0
        return self._read_again - time.monotonic() if self._to_read else None

    def drain(self) -> list[Records]:
        """Read the processes sampled for the first time (or first since exec) now, while they still run."""
        self._read_again = time.monotonic() + READ_AGAIN_S
        for pid in self.sampler.new_pids():
            self._to_read.pop(pid, None)
            self._to_read[pid] = None
        deadline = time.monotonic() + READ_BUDGET_S
        while self._to_read and time.monotonic() < deadline:
            # newest first: a process that was just announced may be gone soon; a backlog (every process at the
            # agent's start) has been running for a while and likely keeps running
            pid = next(reversed(self._to_read))
            del self._to_read[pid]
            info = self.processes.refresh(pid)
            if info is not None and self.keep.accepts(info):
                self._load(info)
        return []

    def _load(self, info: ProcessInfo) -> None:
        """A process read (new, or with new mappings): its tables loaded, and its interpreter found if it has one."""
        if self.identities is not None:
            # asked now, not first at the window's end: what the resolver's thread must fetch for it (the kubelet's
            # pod list for a new container, a Slurm job's environment) is then there for this window's batch
            self.identities.identify(info)
        if self.unwind is not None:
            self.unwind.load(info.pid, info.mappings)
        if self.python is not None:
            self.python.load(info.pid, info.mappings)

    def end_window(self, window: Window) -> list[Records]:
        samples = self.sampler.drain()
        self._to_read.clear()  # the batch reads whatever is still unread
        code_objects: dict[int, list[dict]] = {}
        if self.python_stacks is not None:
            samples, code_objects = self.python_stacks.rewrite(samples)  # before an exited process is forgotten
            self.python.forget_exited()
            self.python_stacks.end_window()
        if self.unwind is not None:
            self.unwind.forget_exited()
        self.lost_samples += self.sampler.lost_samples
        self.dropped_samples += self.sampler.dropped_samples
        batch = build_cpu_batch(samples, self.processes, self.node, window.start_ns, window.end_ns - window.start_ns,
                                self.sampler.frequency_hz, self.kernel_build_id, self.keep, window.index,
                                code_objects, self.identities)
        return [Records("cpu", [batch])]

    def counters(self) -> dict[str, int]:
        found = {"lost_stacks": self.lost_samples, "map_full_samples": self.dropped_samples,
                 "processes_read": self.processes.reads}
        if self.unwind is not None:
            found.update({f"unwind_{k}": v for k, v in self.unwind.counters().items()})
        if self.python is not None:
            found.update(self.python.counters(), **self.python_stacks.counts)
        return found

    def close(self) -> None:
        self.sampler.close()
        if self.unwind is not None:
            self.unwind.close()


def build_cpu_batch(samples: list[Sample], processes: ProcessCache, node: str, window_start_ns: int,
                    window_ns: int, frequency_hz: int, kernel_build_id: str = "",
                    keep: ProcessFilter = KEEP_ALL, window_index: int | None = None,
                    code_objects: dict[int, list[dict]] | None = None,
                    identities: Identities | None = None) -> dict:
    """A CpuStackBatch record: per process its metadata, mappings, the code objects its Python frames name and
    (tid, stacks, count) tuples; processes the filter rejects are left out. A process with anonymous executable
    mappings has its perf map read (again, when the file changed), and the mappings holding its symbols refer to it
    (see batch_mappings). `identities` gives each process's identity id (0 without it)."""
    by_pid: dict[int, list[dict]] = {}
    user_addrs: dict[int, set[int]] = {}
    for pid, tid, user, kernel, count in samples:
        user_addrs.setdefault(pid, set()).update(a for a in user
                                                 if a not in (TRUNCATED_FRAME, LOST_STACK_FRAME)
                                                 and a >> 56 != PYTHON_FRAME_TAG)
        by_pid.setdefault(pid, []).append({
            "tid": tid, "user_addrs": [u64_to_long(a) for a in user],
            "kernel_addrs": [u64_to_long(a) for a in kernel], "count": count})
    procs = []
    for pid in sorted(by_pid):
        info = processes.get(pid)
        if not keep.accepts(info):
            continue
        info = processes.covering(pid, list(user_addrs[pid]))
        anonymous = any(is_anonymous(m.path) for m in info.mappings)
        procs.append({
            "pid": pid, "comm": info.comm, "exe": info.exe, "cgroup": info.cgroup,
            "container_id": info.container_id, "identity_id": process_identity(identities, info),
            "mappings": batch_mappings(info, processes.perf_maps.get(pid) if anonymous else None),
            "code_objects": (code_objects or {}).get(pid, []), "stacks": by_pid[pid]})
    processes.end_window(window_index)
    return {"node": node, "window_start_ns": window_start_ns, "window_ns": window_ns, "frequency_hz": frequency_hz,
            "kernel_build_id": kernel_build_id, "simulated": False, "processes": procs}
