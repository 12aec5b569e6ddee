"""`fleetprof up --simulate-gpu`: a GPU node on a laptop, labelled simulated everywhere it shows.

Two child processes join the local pipeline: the simulated GPU workload (real Python and native call paths firing the
same USDT probes as the CUPTI shim; its `mixed` scenario, so copies, a replayed CUDA graph, NCCL-named kernels and
NVTX ranges show too, under a CPython with `-X perf` when one is built, so its Python frames show) and
the real `fleetprof agent`, whose real nvidia-ml-py loads the simulated libnvidia-ml.so.1 with a scripted timeline:
two GPUs busy for four minutes, then idle for one, over and over for a day.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from producers.native_build import ROOT
from simulate.nvml import Segment, SimDevice, SimProcess, sim_env, write_scenario

DAY_S = 24 * 3600
CYCLE_S = 300  # busy 240 s, idle 60 s
PERF_PYTHON = ROOT / ".venv" / "bin" / "python-perf"
SCENARIO = ("--scenario", "mixed")


def demo_scenario(path: Path, workload_pid: int) -> Path:
    """Write the demo's NVML timeline; the workload shows as the compute process of GPU 0."""
    devices = [SimDevice("gpu0", "GPU-5e1a0000-0000-4000-8000-000000000000"),
               SimDevice("gpu1", "GPU-5e1a0000-0000-4000-8000-000000000001")]
    timeline = []
    for start in range(0, DAY_S, CYCLE_S):
        for i, dev in enumerate(devices):
            busy = {"gpu_util": 92 - 7 * i, "mem_util": 61, "mem_used": 52 * 1024**3, "sm_clock": 1980,
                    "mem_clock": 2619, "power": 610_000 - 40_000 * i, "temp": 67, "pcie_tx": 1_200_000,
                    "pcie_rx": 3_400_000, "clock_events": 0}
            idle = {**busy, "gpu_util": 4, "mem_util": 1, "sm_clock": 345, "power": 120_000, "temp": 44,
                    "pcie_tx": 2_000, "pcie_rx": 9_000}
            procs = [SimProcess(workload_pid, sm_util=busy["gpu_util"], mem_util=60, used_memory=50 * 1024**3)]
            timeline.append(Segment(float(start), dev.key, busy, processes=procs if i == 0 else []))
            timeline.append(Segment(float(start + 240), dev.key, idle,
                                    processes=[SimProcess(workload_pid, 2, 0, 50 * 1024**3)] if i == 0 else []))
    return write_scenario(path, devices, timeline)


def workload_command() -> list[str]:
    """The simulated workload, for a day; under CPython with -X perf when infra/setup.sh could build it."""
    if PERF_PYTHON.exists():
        return [str(PERF_PYTHON), "-X", "perf", "-m", "simulate.gpu_workload", "--seconds", str(DAY_S), *SCENARIO]
    return [sys.executable, "-m", "simulate.gpu_workload", "--seconds", str(DAY_S), *SCENARIO]


def agent_env(scenario: Path) -> dict[str, str]:
    """The agent's environment: the simulated NVML library and its timeline."""
    return sim_env(scenario, os.environ)
