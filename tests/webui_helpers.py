"""What the web UI tests share: the known rows of the `ui_store` fixture and what they add up to, the API over a
module's window of rows, and ways to read a flame graph answer, the CLI's export of the same range, and a pprof
profile."""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from click.testing import CliRunner

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.pprof import Profile
from tests.test_query_cli import silent_address

# What the known rows add up to: 12 windows of 10 s; the first six run compute (and a GEMM on the GPU), the last
# six io on n1 and idle on n2 (and an all-reduce on the GPU). GPU utilization drops from 90% to 20% halfway.
FIRST_HALF_CPU = {"main;run;compute": 30}
SECOND_HALF_CPU = {"main;run;io": 18, "main;idle": 6}
FIRST_HALF_GPU = {"main;launch;gemm_kernel": 24_000_000}
SECOND_HALF_GPU = {"main;launch;nccl_allreduce": 6_000_000}


def known_rows(store) -> SimpleNamespace:
    """`store` with known profile rows and NVML readings over [t0, t0 + 120 s), an hour ago: .store, .t0, .t1 (epoch
    seconds). The `ui_store` fixture (tests/conftest.py). What is simulated follows the kind, per node
    (profile_windows, migration 0012): n1 is `fleetprof up --simulate-gpu` (real eBPF CPU samples, simulated GPU
    kernel times and NVML readings), n2 is loadgen's (simulated CPU samples, no GPU)."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    t0 = now - timedelta(hours=1, seconds=now.second % 10)
    if t0.minute * 60 + t0.second > 3600 - 130:
        # all 120 s in one UTC hour: what reads the hourly rollups for "the hours the range touches" (the timeline
        # names a GPU process by its busiest CPU command there) sees every row from any range that starts at t0;
        # at :58-:59 n2's samples (from t0 + 60 s) fell in the next hour and its timeline process lost its name
        t0 -= timedelta(minutes=3)
    frames = [[1, "main", "app", "NATIVE", t0], [2, "run", "app", "NATIVE", t0], [3, "compute", "app", "NATIVE", t0],
              [4, "io", "libc.so.6", "NATIVE", t0], [5, "idle", "app", "NATIVE", t0],
              [6, "launch", "libtorch.so", "NATIVE", t0], [7, "gemm_kernel", "[gpu]", "GPU_KERNEL", t0],
              [8, "nccl_allreduce", "[gpu]", "GPU_KERNEL", t0]]
    stacks = [[100, [1, 2, 3], t0], [101, [1, 2, 4], t0], [102, [1, 5], t0], [200, [1, 6, 7], t0],
              [201, [1, 6, 8], t0]]
    cpu, gpu, devices, processes, windows = [], [], [], [], []
    for i in range(12):
        ts = t0 + timedelta(seconds=10 * i)
        windows += [[ts, "n1", "cpu", False, 19], [ts, "n1", "gpu", True, 0], [ts, "n2", "cpu", True, 19]]
        if i < 6:
            cpu.append([ts, "n1", 10, "train", "", 100, 5])
            gpu.append([ts, "n1", 10, "train", "", 0, 7, 200, "gemm_kernel", 4_000_000, 4])
        else:
            cpu.append([ts, "n1", 10, "train", "", 101, 3])
            cpu.append([ts, "n2", 20, "serve", "", 102, 1])
            gpu.append([ts, "n1", 10, "train", "", 0, 7, 201, "nccl_allreduce", 1_000_000, 1])
    for s in range(120):
        ts = t0 + timedelta(seconds=s)
        busy = s < 60
        devices.append([ts, "n1", 0, "GPU-0001", "Simulated H100", "", 90 if busy else 20, 45 if busy else 10,
                        40 << 30, 80 << 30, 1980 if busy else 1410, 2619, 300_000 if busy else 120_000, 400_000,
                        71 if busy else 52, 5 * 1024, 9 * 1024, None, [], True])
        processes.append([ts, "n1", 0, 10, "train", "", 90 if busy else 20, 30, 30 << 30, True])
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", cpu, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    store.insert("gpu_kernel_samples", gpu, ["ts", "node", "pid", "comm", "container_id", "device", "stream",
                                             "stack_id", "kernel_name", "duration_ns", "launches"])
    store.insert("profile_windows", windows, ["ts", "node", "kind", "simulated", "frequency_hz"])
    store.insert("gpu_device_metrics", devices, [
        "ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
        "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_mw", "power_limit_mw", "temperature_c",
        "pcie_tx_kbps", "pcie_rx_kbps", "clock_event_reasons", "xid_errors", "simulated"])
    store.insert("gpu_process_metrics", processes, ["ts", "node", "gpu_index", "pid", "comm", "container_id",
                                                    "sm_util_pct", "mem_util_pct", "used_memory_bytes", "simulated"])
    t0_s = int(t0.timestamp())
    return SimpleNamespace(store=store, t0=t0_s, t1=t0_s + 120)


# The frames that root each process's stacks (fleetprof.profile_kinds.process_frame), with the node in an answer
# for all nodes, without it for one node's
TRAIN, SERVE = "train (pid 10 on n1)", "serve (pid 20 on n2)"


@contextmanager
def serving_window(store, since: datetime) -> Iterator[SimpleNamespace]:
    """The API serving `store`, whose rows fill the 10 s window from `since`: .store, .since, .until (datetimes), .t0,
    .t1 (epoch seconds) and .url, until the block ends."""
    server = serve_api(store, "127.0.0.1", 0)
    try:
        yield SimpleNamespace(store=store, since=since, until=since + timedelta(seconds=10), url=server.url,
                              t0=int(since.timestamp()), t1=int(since.timestamp()) + 10)
    finally:
        server.stop()


def rooted(stacks: dict[str, int], process: str) -> dict[str, int]:
    """Folded stacks under one process's frame."""
    return {f"{process};{stack}": n for stack, n in stacks.items()}


def add_machine(ui) -> None:
    """More of n1 in the first window, so that its flame graph is a machine's: the idle task and two kernel threads
    (kernel stacks), and a Python process (python3, pid 40) with JIT code, an undefined frame and a stack the agent
    lost. n1's CPU samples: train 48, swapper/0 40, python3 24, kworker/0:1-events 3, ksoftirqd/0 2 (117)."""
    t0 = datetime.fromtimestamp(ui.t0, tz=UTC)
    frames = [[20, "do_idle", "[kernel.kallsyms]", "KERNEL"], [21, "worker_thread", "[kernel.kallsyms]", "KERNEL"],
              [22, "run_ksoftirqd", "[kernel.kallsyms]", "KERNEL"], [23, "<module> (serve.py:1)", "serve.py",
                                                                     "INTERPRETED"],
              [24, "handle (serve.py:9)", "serve.py", "INTERPRETED"], [25, "jit_stub", "[jit]", "NATIVE"],
              [26, "[stack lost: map full, raise agent --stack-entries]", "[lost]", "UNKNOWN"],
              [27, "_PyEval_EvalFrameDefault", "python3.11", "NATIVE"]]
    stacks = [[300, [20]], [301, [21]], [302, [22]], [303, [27, 23, 24]], [304, [27, 23, 25]], [305, [26]],
              [306, [27, 28]]]  # frame 28 has no definition: "[unknown 0x1c]"
    samples = [(0, "swapper/0", 300, 40), (31, "kworker/0:1-events", 301, 3), (14, "ksoftirqd/0", 302, 2),
               (40, "python3", 303, 12), (40, "python3", 304, 6), (40, "python3", 305, 4), (40, "python3", 306, 2)]
    ui.store.insert("frames", [[*f, t0] for f in frames], ["frame_id", "function", "binary", "kind", "last_seen"])
    ui.store.insert("stacks", [[*s, t0] for s in stacks], ["stack_id", "frame_ids", "last_seen"])
    ui.store.insert("cpu_samples", [[t0, "n1", pid, comm, "", stack, n] for pid, comm, stack, n in samples],
                    ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])


def stacks_of(payload: dict) -> dict[str, int]:
    """A flame graph answer's stacks as folded text -> value."""
    names = payload["frames"]
    return {";".join(names[f] for f in stack): count for stack, count in zip(payload["stacks"], payload["counts"],
                                                                            strict=True)}


def cli_export(ui, fmt: str, since: int, until: int, *extra: str) -> bytes:
    """`fleetprof query flamegraph` in this process (it owns the chDB directory, so it opens the store itself)."""
    args = ["--data-dir", os.path.dirname(ui.store.location), "--database", ui.store.database, "query",
            "flamegraph", "--since", str(since), "--until", str(until), "--format", fmt, *extra]
    result = CliRunner().invoke(cli, args, env={"FLEETPROF_API": silent_address(), "FLEETPROF_CLICKHOUSE": ""})
    assert result.exit_code == 0, result.output
    return result.stdout_bytes


def pprof_stacks(data: bytes) -> dict[str, int]:
    prof = Profile()
    prof.ParseFromString(gzip.decompress(data))
    names = {f.id: prof.string_table[f.name] for f in prof.function}
    return {";".join(names[i] for i in reversed(s.location_id)): s.value[0] for s in prof.sample}
