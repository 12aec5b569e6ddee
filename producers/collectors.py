"""Which of the agent's collectors can run on this node, opened: the registry the agent is built from.

Each collector says "not here" in one line (no BPF, no driver) and the rest keep running; the order is the order of
draining at a window's end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from producers.agent import Collector
from producers.cpu import CpuCollector
from producers.cpu_sampler import DEFAULT_MAX_ENTRIES, BpfUnavailable, CpuSampler
from producers.identity_refs import Identities
from producers.process_info import KEEP_ALL, ProcessCache, ProcessFilter
from producers.python_frames import PythonStacks
from producers.python_procs import PythonProcs
from producers.unwind_maps import DEFAULT_ROWS, UnwindLoader
from producers.unwind_program import TABLES

log = logging.getLogger("fleetprof.agent")


@dataclass(frozen=True)
class CollectorOptions:
    node: str
    frequency_hz: int = 19
    pid: int | None = None
    keep: ProcessFilter = KEEP_ALL
    gpu: bool = True  # CUDA kernel timing (USDT probes) and NVML
    nvml_period_s: float = 1.0
    stack_entries: int | None = None  # None: sized from the CPU count and frequency
    count_entries: int = DEFAULT_MAX_ENTRIES
    kernel_build_id: str = ""
    unwind_dir: Path | None = None  # where call-frame tables are cached; None: user stacks by frame pointers only
    unwind_rows: int = DEFAULT_ROWS
    python_frames: bool = True  # Python frames read from CPython interpreters (producers/python_procs.py)


@dataclass
class OpenedCollectors:
    collectors: list[Collector] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per collector that is off, and why

    def names(self) -> list[str]:
        return [c.name for c in self.collectors]

    def close(self) -> None:
        for c in self.collectors:
            c.close()


def open_collectors(options: CollectorOptions, processes: ProcessCache,
                    identities: Identities | None = None) -> OpenedCollectors:
    """Start what can run here: CPU stacks, then CUDA kernels, then NVML; one warning line for each that cannot.
    `identities`: the workload identity of each process and GPU their records carry (None: every id 0)."""
    found = OpenedCollectors()
    unwind = UnwindLoader(options.unwind_dir, options.unwind_rows) if options.unwind_dir is not None else None
    python = PythonProcs() if options.python_frames else None
    try:
        sampler = CpuSampler(options.frequency_hz, options.pid, options.count_entries, options.stack_entries, unwind,
                             python)
        sampler.start()
        found.collectors.append(CpuCollector(sampler, processes, options.node, options.keep, options.kernel_build_id,
                                             unwind if sampler.unwinding == TABLES else None, python, identities))
    except BpfUnavailable as exc:
        _off(found, f"CPU sampling off: BPF unavailable: {exc}")
    if options.gpu:
        # the GPU probes share the CPU sampler's tables (without them, frame pointers) and its CPython processes
        shared = unwind if unwind is not None and unwind.shared else None
        cpu = found.collectors[0] if found.collectors else None
        _open_gpu(found, options, processes, bpf=bool(found.collectors), unwind=shared,
                  python=cpu.python_stacks if isinstance(cpu, CpuCollector) else None, identities=identities)
    return found


def _off(found: OpenedCollectors, note: str, said: bool = False) -> None:
    found.notes.append(note)
    if not said:
        log.warning("%s", note)


def _open_gpu(found: OpenedCollectors, options: CollectorOptions, processes: ProcessCache, bpf: bool,
              unwind: UnwindLoader | None, python: PythonStacks | None, identities: Identities | None) -> None:
    if bpf:
        from producers.gpu_probes import GpuProbeCollector

        probes = GpuProbeCollector(options.node, processes, keep=options.keep, pid=options.pid, unwind=unwind,
                                   python=python, identities=identities)
        try:
            probes.start()
            found.collectors.append(probes)
        except BpfUnavailable as exc:
            _off(found, f"CUDA kernel timing off: {exc}")
    else:
        _off(found, "CUDA kernel timing off: it needs BPF too")
    try:
        from producers.nvml_collector import NvmlCollector
    except ImportError as exc:  # nvidia-ml-py missing from this install
        _off(found, f"GPU metrics off: {exc}")
        return
    nvml = NvmlCollector(options.node, period_s=options.nvml_period_s, identities=identities)
    if nvml.open():
        found.collectors.append(nvml)
    else:
        _off(found, f"GPU metrics off: {nvml.reason}", said=True)  # the collector said why itself
