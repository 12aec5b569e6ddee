"""One reporting window of the node agent: every collector it runs, on one thread and one schedule.

- the CPU sampler's kernel maps are emptied every `look_every_s` (fewer stack-hash collisions), and newly sampled
  processes are read at once (so one that exits mid-window still symbolizes);
- the GPU probes' ring buffers are drained every `tick_s` while an object is attached (they are bounded), and
  objects with fleetprof probes looked for every `look_every_s` (new processes; all of them every 10th time), so a
  new CUDA process is attached within the window;
- NVML is polled on its own period.

One thread on purpose: the process cache and the collectors are not shared between threads, and nothing here
blocks for long (an NVML call that hangs is cut off by the collector's own deadline).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from threading import Event
from typing import Any

from producers.cpu import ProcessCache
from producers.cpu_sampler import CpuSampler, Sample

GpuSink = Callable[[list[dict], list[dict]], None]  # (GpuLaunch records, GpuKernel records)
MetricsSink = Callable[[dict], None]  # a GpuMetrics record


@dataclass
class AgentCollectors:
    """What this node's agent runs; any of them may be None (not wanted, or unavailable here)."""

    sampler: CpuSampler | None = None
    gpu: Any = None  # producers.gpu_probes.GpuProbeCollector
    nvml: Any = None  # producers.nvml_collector.NvmlCollector, opened
    notes: list[str] = field(default_factory=list)  # one line per collector that is off, and why

    def close(self) -> None:
        for part in (self.sampler, self.gpu, self.nvml):
            if part is not None:
                part.close()


class AgentLoop:
    """Runs windows over `collectors`, handing GPU records and metrics to the sinks as they come."""

    def __init__(self, collectors: AgentCollectors, processes: ProcessCache, on_gpu: GpuSink,
                 on_metrics: MetricsSink, tick_s: float = 0.1, look_every_s: float = 1.0) -> None:
        self.c = collectors
        self.processes = processes
        self.on_gpu = on_gpu
        self.on_metrics = on_metrics
        self.tick_s = tick_s
        self.look_every_s = look_every_s
        self.launches = self.kernels = self.metrics = 0

    def start(self) -> None:
        """Begin the first window now (the BPF compiles took a while: what they counted meanwhile is dropped)."""
        if self.c.sampler is not None:
            self.c.sampler.drain()
        if self.c.gpu is not None:
            self.c.gpu.rescan()

    def _look(self) -> None:
        if self.c.sampler is not None:
            self.c.sampler.collect()
            for pid in self.c.sampler.pids():
                self.processes.get(pid)
        if self.c.gpu is not None:
            self.c.gpu.rescan()

    def _drain_gpu(self) -> None:
        if self.c.gpu is None:
            return
        launches, kernels = self.c.gpu.poll(0)
        if launches or kernels:
            self.launches += len(launches)
            self.kernels += len(kernels)
            self.on_gpu(launches, kernels)

    def _poll_nvml(self) -> None:
        if self.c.nvml is None:
            return
        record = self.c.nvml.poll(time.time_ns())
        if record is not None:
            self.metrics += 1
            self.on_metrics(record)

    def window(self, window_s: float, stop: Event | None = None) -> list[Sample]:
        """Run one window (ended early by `stop`); the CPU samples counted in it."""
        stop = stop or Event()
        now = time.monotonic()
        deadline, next_look = now + window_s, now + self.look_every_s
        while (left := deadline - time.monotonic()) > 0:
            # the rings need draining only while something is attached; otherwise wake once per look
            busy = self.c.gpu is not None and bool(self.c.gpu.attached())
            if stop.wait(min(self.tick_s if busy else max(0.0, next_look - time.monotonic()), left)):
                break
            self._drain_gpu()
            self._poll_nvml()
            if time.monotonic() >= next_look:
                next_look += self.look_every_s
                self._look()
        self._drain_gpu()
        if self.c.gpu is not None:
            self.c.gpu.end_window()
        return self.c.sampler.drain() if self.c.sampler is not None else []
