"""A simulated GPU training job: real Python (and native C) call paths that launch named kernels of known durations
on the GPU simulator, so the agent's GPU collector can be checked against exactly what was launched.

    python -m simulate.gpu_workload --seconds 5 [--launches-per-s 250] [--scenario train|depth|mixed]

Each step launches from four call paths: the training loop's forward (attention) and backward (matmul), the
simulator's native C chain (forward gemm and backward gemm), and a data-loader thread (resize, on stream 1). At the
end it prints one JSON object on stdout: per launching path and kernel, the launches and their total requested
duration; the same per kernel; what the simulated device executed (from its execution log: kernels, requested and
wall time); launches the full device queue refused; and the simulator's counters.
A path is the workload's own frames from its thread's root (train_loop or data_loader) to the launching function,
root first, ';'-separated; native paths continue with the C frames below the Python call.

The `depth` scenario (DepthWorkload) is a training step in NVTX ranges (`train_step` around `forward`, `backward`,
`optimizer.step`; the collective in the `nccl` domain) with host<->device copies (HtoD from pinned memory, DtoH to
pageable), a memset, a CUDA graph (kernels and a copy) replayed every step, and NCCL-named kernels. Its report adds
what the agent should see, from the simulator's own execution log: every sampled launch (correlation id, API, weight,
range path) and the records fired for them, grouped, and what a store should hold for them: per name (kernel, or copy
or set label) and range path, the launches they stand for and the GPU time and bytes x weight. Everything is
simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from simulate.gpu import GpuSim, GraphNode, memory_kind

FLASH_ATTN = "_Z14flash_attn_fwdILi128EEvPKfS1_Pf"
SGEMM = "ampere_sgemm_128x64_nn"
RESIZE = "_Z12resize_imagePKhPhii"
DURATIONS_NS = {FLASH_ATTN: 300_000, SGEMM: 500_000, RESIZE: 100_000}
LOADER_STREAM = 1
LAUNCHES_PER_STEP = 5  # attention, matmul, native gemm + gemm_bwd, resize
LOG_CAPACITY = 1 << 16
ROOTS = ("train_loop", "data_loader")  # where a thread's launching code starts
DRAIN_EVERY_STEPS = 100


@dataclass
class Tally:
    """What was launched, per (path, kernel): launches and total requested duration."""

    rows: dict[tuple[str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, kernel: str, launches: int, duration_ns: int) -> None:
        with self.lock:
            row = self.rows[(path, kernel)]
            row[0] += launches
            row[1] += launches * duration_ns


def _caller_path(depth: int) -> str:
    """The function names from the thread's root (ROOTS) down to the frame `depth` levels above the caller."""
    frame = sys._getframe(depth + 1)
    names: list[str] = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        if frame.f_code.co_name in ROOTS and frame.f_code.co_filename == __file__:
            return ";".join(reversed(names))
        frame = frame.f_back
    raise RuntimeError(f"launch outside {' or '.join(ROOTS)}: {';'.join(reversed(names))}")


class Workload:
    """The launching code: a class so the simulator handle and the tally travel with the call paths."""

    def __init__(self, sim: GpuSim, tally: Tally) -> None:
        self.sim = sim
        self.tally = tally

    def _launch(self, kernel: str, stream: int = 0) -> None:
        duration = DURATIONS_NS[kernel]
        if self.sim.launch(kernel, duration, stream) == 0:
            return  # the device queue was full: not launched (the simulator counts it)
        self.tally.add(_caller_path(1), kernel, 1, duration)

    def attention(self) -> None:
        self._launch(FLASH_ATTN)

    def forward(self) -> None:
        self.attention()

    def matmul(self) -> None:
        self._launch(SGEMM)

    def backward(self) -> None:
        self.matmul()

    def native_step(self) -> None:
        before = self.sim.stats()["queue_dropped"]
        self.sim.native_train_step(1)
        if self.sim.stats()["queue_dropped"] != before:
            raise RuntimeError("the simulated device queue overflowed during a native step")
        python_path = _caller_path(0)
        for k in self.sim.native_kernels():
            self.tally.add(f"{python_path};{k.path}", k.name, 1, k.duration_ns)

    def train_step(self) -> None:
        self.forward()
        self.backward()
        self.native_step()
        self.sim.synchronize()  # like loss.item(): the step waits for its kernels

    def train_loop(self, steps: int, period_s: float, start: float, executed: dict[str, dict[str, int]]) -> None:
        for i in range(steps):
            _pace(start + i * period_s)
            self.train_step()
            if i % DRAIN_EVERY_STEPS == DRAIN_EVERY_STEPS - 1:
                _executed(self.sim, executed)  # keeps the device's execution log short

    def augment(self) -> None:
        self._launch(RESIZE, LOADER_STREAM)

    def data_loader(self, steps: int, period_s: float, start: float) -> None:
        for i in range(steps):
            _pace(start + i * period_s)
            self.augment()


def _pace(at: float) -> None:
    delay = at - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _executed(sim: GpuSim, into: dict[str, dict[str, int]]) -> None:
    for k in sim.drain():
        row = into.setdefault(k.name, {"kernels": 0, "duration_ns": 0, "wall_ns": 0})
        row["kernels"] += 1
        row["duration_ns"] += k.duration_ns
        row["wall_ns"] += k.end_ns - k.start_ns


# ---- the depth scenario: copies, a graph, NCCL-named kernels, NVTX ranges ----

NCCL_ALL_REDUCE = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
NCCL_ALL_GATHER = "_Z31ncclDevKernel_AllGather_RING_LL24ncclDevKernelArgsStorageILm4096EE"
ADAM = "_Z11adam_kernelPfS_S_fi"
GRAPH_KERNELS = ("ampere_bf16_gemm_64x64_tn", "_Z15layer_norm_fwdPKfPf", "_Z8gelu_fwdPKfPf",
                 "ampere_bf16_gemm_64x64_tn", "_Z13residual_addPKfPf")
GRAPH_KERNEL_NS = 20_000
GRAPH_COPY_BYTES = 1 << 16  # a DtoD copy inside the captured graph
BATCH_BYTES = 4 << 20  # HtoD from pinned memory each step
LOSS_BYTES = 4  # DtoH to pageable memory each step
GRAD_BYTES = 8 << 20  # set to zero each step
DEPTH_LAUNCHES_PER_STEP = 8  # 2 copies, a set, attention, matmul, 2 collectives, adam; and one graph launch
STEP_RANGES = ("forward", "backward", "optimizer.step")
SAMPLED_KEPT = 200_000  # sampled launches the report lists one by one; a longer run counts the rest


class DepthWorkload:
    """A training step with copies, a replayed graph, collectives and NVTX ranges (all simulated)."""

    def __init__(self, sim: GpuSim) -> None:
        self.sim = sim
        nodes = [GraphNode(k, GRAPH_KERNEL_NS) for k in GRAPH_KERNELS]
        nodes.append(GraphNode("", 5_000, GRAPH_COPY_BYTES, memory_kind("DtoD", "device", "device")))
        self.graph = sim.graph_create(nodes)
        self.graph_nodes = nodes

    def forward(self) -> None:
        self.sim.range_push("forward")
        self.sim.launch(FLASH_ATTN, DURATIONS_NS[FLASH_ATTN])
        self.sim.graph_launch(self.graph)  # the captured decoder layers
        self.sim.range_pop()

    def backward(self) -> None:
        self.sim.range_push("backward")
        self.sim.launch(SGEMM, DURATIONS_NS[SGEMM])
        self.sim.range_push("AllReduce", domain="nccl")
        self.sim.launch(NCCL_ALL_REDUCE, 200_000)
        self.sim.launch(NCCL_ALL_GATHER, 100_000)
        self.sim.range_pop()
        self.sim.range_pop()

    def optimizer_step(self) -> None:
        self.sim.range_push("optimizer.step")
        self.sim.memset(GRAD_BYTES, "device", 10_000)
        self.sim.launch(ADAM, 50_000)
        self.sim.range_pop()

    def train_step(self) -> None:
        self.sim.range_push("train_step")
        self.sim.memcpy(BATCH_BYTES, "HtoD", "pinned", "device", 50_000)
        self.forward()
        self.backward()
        self.optimizer_step()
        self.sim.memcpy(LOSS_BYTES, "DtoH", "device", "pageable", 5_000)
        self.sim.range_pop()
        self.sim.synchronize()


def _depth_log(sim: GpuSim, sampled: dict[int, list], fired: dict[tuple, int], totals: dict[str, int],
               stored: dict[tuple, list[int]]) -> None:
    for k in sim.drain():
        totals[k.activity] = totals.get(k.activity, 0) + 1
        totals["bytes"] = totals.get("bytes", 0) + k.bytes
        if k.state != "sampled":
            continue
        if len(sampled) < SAMPLED_KEPT or k.correlation_id in sampled:
            sampled[k.correlation_id] = [k.api, k.weight, k.range or ""]
        else:
            totals["sampled_records_not_listed"] = totals.get("sampled_records_not_listed", 0) + 1
        key = (k.activity, k.name, k.bytes, k.graph_id, k.graph_node_id, k.range or "")
        fired[key] = fired.get(key, 0) + 1
        # the correlator's sums: a record stands for its launch's weight (a graph's nodes, the graph launch's)
        row = stored.setdefault((k.name, k.range or ""), [0, 0, 0])
        row[0] += k.weight
        row[1] += k.weight * (k.end_ns - k.start_ns)
        row[2] += k.weight * k.bytes


def run_depth(seconds: float, launches_per_s: float, sim: GpuSim | None = None) -> dict[str, Any]:
    """Run the depth scenario and return its report."""
    sim = sim or GpuSim()
    steps = max(1, round(seconds * launches_per_s / DEPTH_LAUNCHES_PER_STEP))
    period = seconds / steps
    work = DepthWorkload(sim)
    sim.log_start(LOG_CAPACITY)
    sampled: dict[int, list] = {}
    fired: dict[tuple, int] = {}
    totals: dict[str, int] = {}
    stored: dict[tuple, list[int]] = {}
    start = time.monotonic()
    for i in range(steps):
        _pace(start + i * period)
        work.train_step()
        if i % DRAIN_EVERY_STEPS == DRAIN_EVERY_STEPS - 1:
            _depth_log(sim, sampled, fired, totals, stored)
    sim.synchronize()
    _depth_log(sim, sampled, fired, totals, stored)
    return {
        "simulated": True,
        "scenario": "depth",
        "seconds": seconds,
        "steps": steps,
        "elapsed_s": round(time.monotonic() - start, 3),
        "launch_rate_limit": sim.launch_rate(),
        "graph_launch_rate_limit": sim.graph_launch_rate(),
        "graph_id": work.graph,
        "executed": totals,
        "sampled": [[corr, *rest] for corr, rest in sorted(sampled.items())],
        "fired": [[*key, n] for key, n in sorted(fired.items())],
        "stored": [[*key, *sums] for key, sums in sorted(stored.items())],
        "simulator": sim.stats(),
    }


def run_mixed(seconds: float, launches_per_s: float, sim: GpuSim | None = None) -> dict[str, Any]:
    """The train scenario at half the rate, and beside it on a thread of its own the depth scenario's step at the
    other half (the demo's workload). The execution log is the train scenario's: its `executed` counts both."""
    sim = sim or GpuSim()
    depth = DepthWorkload(sim)
    steps = max(1, round(seconds * launches_per_s / 2 / DEPTH_LAUNCHES_PER_STEP))
    period = seconds / steps

    def depth_loop() -> None:
        start = time.monotonic()
        for i in range(steps):
            _pace(start + i * period)
            depth.train_step()

    thread = threading.Thread(target=depth_loop, name="depth_step")
    thread.start()
    report = run(seconds, launches_per_s / 2, sim)
    thread.join()
    sim.synchronize()
    report.update(scenario="mixed", depth_steps=steps, simulator=sim.stats())
    return report


def run(seconds: float, launches_per_s: float, sim: GpuSim | None = None) -> dict[str, Any]:
    """Run the workload and return its report."""
    sim = sim or GpuSim()
    steps = max(1, round(seconds * launches_per_s / LAUNCHES_PER_STEP))
    period = seconds / steps
    tally = Tally()
    work = Workload(sim, tally)
    executed: dict[str, dict[str, int]] = {}
    sim.log_start(LOG_CAPACITY)
    start = time.monotonic()
    loader = threading.Thread(target=work.data_loader, args=(steps, period, start), name="data_loader")
    loader.start()
    work.train_loop(steps, period, start, executed)
    loader.join()
    sim.synchronize()
    _executed(sim, executed)
    by_kernel: dict[str, dict[str, int]] = {}
    for (_, kernel), (launches, duration) in sorted(tally.rows.items()):
        row = by_kernel.setdefault(kernel, {"launches": 0, "duration_ns": 0})
        row["launches"] += launches
        row["duration_ns"] += duration
    stats = sim.stats()
    return {
        "simulated": True,
        "seconds": seconds,
        "launches_per_s": launches_per_s,
        "steps": steps,
        "elapsed_s": round(time.monotonic() - start, 3),
        "launch_rate_limit": sim.launch_rate(),
        "launched": [{"path": path, "kernel": kernel, "launches": launches, "duration_ns": duration}
                     for (path, kernel), (launches, duration) in sorted(tally.rows.items())],
        "by_kernel": by_kernel,
        "executed": executed,
        "dropped": stats["queue_dropped"],
        "simulator": stats,
    }


SCENARIOS = {"train": run, "depth": run_depth, "mixed": run_mixed}


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulate.gpu_workload",
                                     description="A simulated GPU training job on the GPU simulator (simulated).")
    parser.add_argument("--seconds", type=float, required=True, help="how long to run")
    parser.add_argument("--launches-per-s", type=float, default=250.0,
                        help=f"launches per second, all paths together ({LAUNCHES_PER_STEP} per step; depth: "
                             f"{DEPTH_LAUNCHES_PER_STEP} and a graph launch)")
    parser.add_argument("--scenario", choices=tuple(SCENARIOS), default="train",
                        help="train: kernels from Python, native and loader paths; depth: copies, a CUDA graph, "
                             "NCCL-named kernels and NVTX ranges; mixed: both, half the rate each")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.launches_per_s <= 0:
        parser.error("--seconds and --launches-per-s must be positive")
    report = SCENARIOS[args.scenario](args.seconds, args.launches_per_s)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
