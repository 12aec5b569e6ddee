"""The fleet questions in sql/queries/ (top stacks, kernels with their launching stacks, GPU idle time, utilization
percentiles, CPU while a GPU idles) on known rows, including rows ClickHouse has not merged yet; and two of them
through `fleetprof sql --file`."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from fleetprof.api import serve_api
from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from fleetprof.settings import REPO_ROOT

FRAME_COLUMNS = ["frame_id", "function", "binary", "kind", "last_seen"]
STACK_COLUMNS = ["stack_id", "frame_ids", "last_seen"]
CPU_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"]
KERNEL_COLUMNS = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                  "duration_ns", "launches"]
DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_util_pct",
                  "xid_errors", "simulated"]
PROCESS_COLUMNS = ["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct", "mem_util_pct",
                   "used_memory_bytes", "simulated"]


def recent_base() -> datetime:
    """Two hours ago on a 10 s boundary: recent, because older rows would fall to the tables' 30-day TTL."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    return now - timedelta(hours=2, seconds=now.second % 10)


def put_frames_and_stacks(store, base: datetime) -> None:
    """Frames and stacks shared by the datasets; frame 2 and stack 100 have an older second definition (not merged)."""
    older = base - timedelta(minutes=5)
    store.insert("frames", [
        [1, "main", "app", "NATIVE", base], [2, "step", "app", "NATIVE", base], [3, "load", "app", "NATIVE", base],
        [4, "fwd;bwd", "app", "NATIVE", base], [5, "gemm", "[gpu]", "GPU_KERNEL", base],
        [6, "relu", "[gpu]", "GPU_KERNEL", base], [7, "serve", "app", "NATIVE", base],
    ], FRAME_COLUMNS)
    store.insert("frames", [[2, "old_step", "app", "NATIVE", older]], FRAME_COLUMNS)
    store.insert("stacks", [
        [100, [1, 2], base], [101, [1, 3], base], [102, [1, 4, 9], base], [104, [1, 2], base], [105, [1, 7], base],
        [200, [1, 2, 5], base], [201, [1, 4, 5], base], [202, [1, 2, 6], base], [203, [1, 3, 6], base],
    ], STACK_COLUMNS)
    store.insert("stacks", [[100, [1, 3], older]], STACK_COLUMNS)


@pytest.fixture
def fleet(store):
    """CPU samples, kernel samples and NVML readings of two nodes in [since, until) = [B, B + 120 s).

    CPU (stack: samples): n1 pid 10 train: 100 main;step 5, inserted twice; 101 main;load 3
                          n2 pid 20 train: 104 main;step 2 (another id, same functions); 102 main;fwd:bwd;? 4
                          n2 pid 21 serve: 103 (no definition) 1;   n1 pid 10, before since: 101 x100
    GPU (kernel, stack: ns, launches): gemm 200 main;step 3000/3 inserted twice, gemm 201 main;fwd:bwd 1000/1,
                          relu 202 main;step 1500/5, relu 203 main;load 500/1, copy 999 (no definition) 1000/2
    NVML: see test_gpu_idle_time.
    """
    b = recent_base()
    at = lambda s: b + timedelta(seconds=s)  # noqa: E731
    put_frames_and_stacks(store, b)
    store.insert("cpu_samples", [[at(0), "n1", 10, "train", "", 100, 5]], CPU_COLUMNS)
    store.insert("cpu_samples", [
        [at(0), "n1", 10, "train", "", 100, 5], [at(10), "n1", 10, "train", "", 101, 3],
        [at(0), "n2", 20, "train", "", 104, 2], [at(10), "n2", 20, "train", "", 102, 4],
        [at(20), "n2", 21, "serve", "", 103, 1], [at(-10), "n1", 10, "train", "", 101, 100],
    ], CPU_COLUMNS)
    gemm = [at(0), "n1", 10, "", "", 0, 7, 200, "gemm", 3000, 3]
    store.insert("gpu_kernel_samples", [gemm], KERNEL_COLUMNS)
    store.insert("gpu_kernel_samples", [
        gemm, [at(0), "n1", 10, "", "", 0, 7, 201, "gemm", 1000, 1],
        [at(10), "n2", 20, "", "", 0, 7, 202, "relu", 1500, 5], [at(10), "n2", 20, "", "", 0, 7, 203, "relu", 500, 1],
        [at(20), "n2", 20, "", "", 0, 7, 999, "copy", 1000, 2],
    ], KERNEL_COLUMNS)
    devices = [
        # n1 GPU 0: every 10 s, the reading at 10 s stored twice; a MIG instance of it that must not count
        *[[at(10 * i), "n1", 0, "GPU-a", "H100", "", u, m, [], False]
          for i, (u, m) in enumerate([(80, 10), (80, 20), (0, 30), (0, 40), (40, 50), (40, 60)])],
        [at(10), "n1", 0, "GPU-a", "H100", "", 80, 20, [], False],
        [at(0), "n1", 0, "MIG-a1", "H100 MIG 1g", "GPU-a", 30, 30, [], False],
        # n1 GPU 1: a reading without utilization, then it stops reporting
        [at(0), "n1", 1, "GPU-b", "H100", "", 40, 5, [], False],
        [at(10), "n1", 1, "GPU-b", "H100", "", None, 7, [], False],
        [at(20), "n1", 1, "GPU-b", "H100", "", 40, 15, [], False],
        # n2 GPU 0: a gap longer than max_gap_s, and a reading past until that ends the last span in range
        [at(0), "n2", 0, "GPU-c", "A100", "", 90, None, [], False],
        [at(100), "n2", 0, "GPU-c", "A100", "", 90, None, [], False],
        [at(105), "n2", 0, "GPU-c", "A100", "", 0, None, [], False],
        [at(125), "n2", 0, "GPU-c", "A100", "", 0, None, [], False],
    ]
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    processes = [
        *[[at(10 * i), "n1", 0, 10, "train", "c1", u, None, 1 << 30, False]
          for i, u in enumerate([60, None, 60, 0, 0, 20])],
        [at(20), "n1", 0, 11, "eval", "", 10, None, 1 << 20, False],
        [at(30), "n1", 0, 11, "eval", "", 10, None, 1 << 20, False],
        [at(0), "n2", 0, 20, "serve", "c2", 50, None, 1 << 20, False],
    ]
    store.insert("gpu_process_metrics", processes, PROCESS_COLUMNS)
    return SimpleNamespace(store=store, since=b, until=at(120))


def run(fleet, name: str, **params) -> list[tuple]:
    _, rows = fleet.store.query_named(name, {"since": fleet.since, "until": fleet.until, **params})
    return rows


# --- top_stacks_cpu -------------------------------------------------------------------------------------------------


def test_top_stacks_cpu(fleet):
    _, rows = fleet.store.query_named("top_stacks_cpu", {"since": fleet.since, "until": fleet.until})
    assert rows == [
        # 10 (one key inserted twice) + 2 from another stack id with the same functions; stack 100's newer
        # definition and frame 2's newer name win
        ("main;step", 12, 12 / 20, 2, 2),
        ("main;fwd:bwd;[unknown 0x09]", 4, 4 / 20, 1, 1),
        ("main;load", 3, 3 / 20, 1, 1),
        ("[unknown stack 0x67]", 1, 1 / 20, 1, 1),
    ]


def test_top_stacks_cpu_filters_and_limit(fleet):
    assert run(fleet, "top_stacks_cpu", node="n1", limit=1) == [("main;step", 10, 10 / 13, 1, 1)]
    assert run(fleet, "top_stacks_cpu", comm="serve") == [("[unknown stack 0x67]", 1, 1.0, 1, 1)]
    assert run(fleet, "top_stacks_cpu", node="n9") == []


# --- top_kernels_gpu_stacks -----------------------------------------------------------------------------------------


def test_top_kernels_with_their_launching_stacks(fleet):
    _, rows = fleet.store.query_named("top_kernels_gpu_stacks", {"since": fleet.since, "until": fleet.until})
    assert rows == [
        # gemm: 3000 ns inserted twice from main;step (the GPU_KERNEL leaf left out), 1000 from main;fwd:bwd
        ("gemm", 7000, 7, 0.7, 1, "main;step", 6000, 6),
        ("gemm", 7000, 7, 0.7, 2, "main;fwd:bwd", 1000, 1),
        ("relu", 2000, 6, 0.2, 1, "main;step", 1500, 5),
        ("relu", 2000, 6, 0.2, 2, "main;load", 500, 1),
        ("copy", 1000, 2, 0.1, 1, "[unknown stack 0x03e7]", 1000, 2),
    ]


def test_top_kernels_limits(fleet):
    assert run(fleet, "top_kernels_gpu_stacks", limit=2, stacks=1) == [
        ("gemm", 7000, 7, 0.7, 1, "main;step", 6000, 6),
        ("relu", 2000, 6, 0.2, 1, "main;step", 1500, 5),
    ]
    assert run(fleet, "top_kernels_gpu_stacks", pid=20, limit=1) == [
        ("relu", 2000, 6, 2000 / 3000, 1, "main;step", 1500, 5),
        ("relu", 2000, 6, 2000 / 3000, 2, "main;load", 500, 1),
    ]


def test_cost_kernels_and_launch_stacks(fleet):
    assert run(fleet, "cost_kernels") == [("gemm", 7000, 7), ("relu", 2000, 6), ("copy", 1000, 2)]
    # main;step launched gemm and relu; the 1000 ns tie ranks by stack text ('[' sorts before 'm')
    assert run(fleet, "cost_launch_stacks") == [
        ("main;step", 7500, 11, 2),
        ("[unknown stack 0x03e7]", 1000, 2, 1),
        ("main;fwd:bwd", 1000, 1, 1),
        ("main;load", 500, 1, 1),
    ]
    assert run(fleet, "cost_launch_stacks", node="n2", limit=1) == [("main;step", 1500, 5, 1)]


# --- gpu_idle_time --------------------------------------------------------------------------------------------------


GPU_IDLE_COLUMNS = ["level", "node", "gpu_index", "uuid", "pid", "comm", "container_id", "readings", "covered_s",
                    "busy_s", "idle_s", "unknown_s"]


def test_gpu_idle_time(fleet):
    columns, rows = fleet.store.query_named("gpu_idle_time", {"since": fleet.since, "until": fleet.until})
    assert columns == GPU_IDLE_COLUMNS
    assert rows == [
        # six 10 s spans (the duplicate at 10 s is one reading; the last stands for the median, 10 s):
        # busy 10 x (80 + 80 + 0 + 0 + 40 + 40) / 100; the MIG instance is not a GPU of its own
        ("gpu", "n1", 0, "GPU-a", 0, "", "", 6, 60.0, 24.0, 36.0, 0.0),
        # present 60 s, 10 s of them without a sample; busy 10 x (60 + 60 + 0 + 0 + 20) / 100
        ("process", "n1", 0, "", 10, "train", "c1", 6, 50.0, 14.0, 36.0, 10.0),
        ("process", "n1", 0, "", 11, "eval", "", 2, 20.0, 2.0, 18.0, 0.0),
        # 0 s: 10 s; 10 s: no utilization (unknown); 20 s: last reading, median gap 10 s
        ("gpu", "n1", 1, "GPU-b", 0, "", "", 3, 20.0, 8.0, 12.0, 10.0),
        # 0 s: the next reading is 100 s later (> 60 s), so the median of its gaps [100, 5, 20] (20);
        # 100 s: 5 s; 105 s: up to the reading at 125 s, cut at until (120 s): 15 s
        ("gpu", "n2", 0, "GPU-c", 0, "", "", 3, 40.0, 22.5, 17.5, 0.0),
        # a lone reading covers nothing
        ("process", "n2", 0, "", 20, "serve", "c2", 1, 0.0, 0.0, 0.0, 0.0),
    ]


def test_gpu_idle_time_max_gap_and_filters(fleet):
    # with max_gap_s = 120 the 100 s gap counts in full: 100 x 0.9 + 5 x 0.9 busy
    assert run(fleet, "gpu_idle_time", node="n2", max_gap_s=120) == [
        ("gpu", "n2", 0, "GPU-c", 0, "", "", 3, 120.0, 94.5, 25.5, 0.0),
        ("process", "n2", 0, "", 20, "serve", "c2", 1, 0.0, 0.0, 0.0, 0.0),
    ]
    assert [r[:5] for r in run(fleet, "gpu_idle_time", gpu=1)] == [("gpu", "n1", 1, "GPU-b", 0)]
    # until cuts the last span: the reading at 50 s of GPU-a stands for 5 s up to until = 55 s
    rows = fleet.store.query_named("gpu_idle_time", {"since": fleet.since, "until": fleet.since + timedelta(seconds=55),
                                                     "node": "n1", "gpu": 0})[1]
    assert rows[0] == ("gpu", "n1", 0, "GPU-a", 0, "", "", 6, 55.0, 22.0, 33.0, 0.0)


# --- gpu_utilization_percentiles ------------------------------------------------------------------------------------


def test_gpu_utilization_percentiles(fleet):
    columns, rows = fleet.store.query_named("gpu_utilization_percentiles", {"since": fleet.since,
                                                                            "until": fleet.until})
    assert columns == ["node", "gpu_index", "uuid", "name", "readings", "min", "mean", "p50", "p90", "p99", "max",
                       "mem_util_mean"]
    assert rows == [
        # [0, 0, 40, 40, 80, 80] (the duplicate counts once): p50 = 0-based position 3, p90 and p99 position 5
        ("n1", 0, "GPU-a", "H100", 6, 0, 40.0, 40, 80, 80, 80, 35.0),
        # the NULL reading is left out, with its memory utilization
        ("n1", 1, "GPU-b", "H100", 2, 40, 40.0, 40, 40, 40, 40, 10.0),
        ("n2", 0, "GPU-c", "A100", 3, 0, 60.0, 90, 90, 90, 90, None),
    ]
    assert run(fleet, "gpu_utilization_percentiles", node="n2", gpu=1) == []


# --- cpu_while_gpu_idle ---------------------------------------------------------------------------------------------


@pytest.fixture
def idle_fleet(store):
    """Node n1, CPU windows W0..W3 at B, B+10, B+20, B+30; NVML every 2 s from B+1.

    GPU 0 mean utilization per window: W0 5 (idle), W1 50, W2 (0+19+0+19+0)/5 = 7.6 (idle), W3 no reading.
    GPU 1: W0 0 (idle), then 95.  Listed: pid 10 on GPU 0 always and on GPU 1 in W0; pid 12 on GPU 1 always;
    pid 13 on GPU 0 in W1 only.  CPU: pid 10 W0 main;load 4 (inserted twice), W1 main;step 6, W2 main;load 2 and
    main;step 5, W3 main;load 9; pid 12 W0 main;serve 5, W1 main;serve 5; pid 13 W1 main;step 7; node n2 pid 20 W0
    main;load 50 without any GPU readings.
    """
    b = recent_base()
    at = lambda s: b + timedelta(seconds=s)  # noqa: E731
    put_frames_and_stacks(store, b)
    store.insert("cpu_samples", [[at(0), "n1", 10, "train", "", 101, 4]], CPU_COLUMNS)
    store.insert("cpu_samples", [
        [at(0), "n1", 10, "train", "", 101, 4], [at(10), "n1", 10, "train", "", 100, 6],
        [at(20), "n1", 10, "train", "", 101, 2], [at(20), "n1", 10, "train", "", 100, 5],
        [at(30), "n1", 10, "train", "", 101, 9],
        [at(0), "n1", 12, "other", "", 105, 5], [at(10), "n1", 12, "other", "", 105, 5],
        [at(10), "n1", 13, "helper", "", 100, 7], [at(0), "n2", 20, "train", "", 101, 50],
    ], CPU_COLUMNS)
    gpu0 = {0: [5] * 5, 10: [50] * 5, 20: [0, 19, 0, 19, 0]}
    devices = [[at(w + 1 + 2 * i), "n1", 0, "GPU-a", "H100", "", u, 0, [], False]
               for w, utils in gpu0.items() for i, u in enumerate(utils)]
    devices += [[at(1 + 2 * i), "n1", 1, "GPU-b", "H100", "", 0 if i < 5 else 95, 0, [], False] for i in range(20)]
    devices.append([at(11), "n1", 0, "GPU-a", "H100", "", 50, 0, [], False])  # stored twice
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    listed = [[at(1 + 2 * i), "n1", 0, 10, "train", "", None, None, None, False] for i in range(20)]
    listed += [[at(1 + 2 * i), "n1", 1, 10, "train", "", None, None, None, False] for i in range(5)]
    listed += [[at(1 + 2 * i), "n1", 1, 12, "other", "", 95, None, None, False] for i in range(20)]
    listed += [[at(11), "n1", 0, 13, "helper", "", 0, None, None, False]]
    store.insert("gpu_process_metrics", listed, PROCESS_COLUMNS)
    return SimpleNamespace(store=store, since=b, until=at(40))


def test_cpu_while_gpu_idle(idle_fleet):
    columns, rows = idle_fleet.store.query_named("cpu_while_gpu_idle", {"since": idle_fleet.since,
                                                                        "until": idle_fleet.until})
    assert columns == ["stack", "samples", "share", "processes", "windows"]
    # idle windows: GPU 0 W0 and W2, GPU 1 W0. pid 10 in W0 (idle on both GPUs: counted once) and W2; pid 12 in W0
    assert rows == [
        ("main;load", 10, 0.5, 1, 2),
        ("main;serve", 5, 0.25, 1, 1),
        ("main;step", 5, 0.25, 1, 1),
    ]


def test_cpu_while_gpu_idle_threshold_gpu_and_window(idle_fleet):
    # GPU 1 alone: W0, with pid 10 and pid 12
    assert run(idle_fleet, "cpu_while_gpu_idle", gpu=1) == [("main;load", 8, 8 / 13, 1, 1),
                                                            ("main;serve", 5, 5 / 13, 1, 1)]
    # threshold 5: GPU 0's W0 (mean 5) and W2 (7.6) are no longer idle, GPU 1's W0 (0) still is
    assert run(idle_fleet, "cpu_while_gpu_idle", threshold=5) == run(idle_fleet, "cpu_while_gpu_idle", gpu=1)
    # 4 s windows: W2 holds the readings at 21 and 23 s only, mean 9.5, still idle
    assert run(idle_fleet, "cpu_while_gpu_idle", gpu=0, window_s=4, limit=1) == [("main;load", 10, 10 / 15, 1, 2)]
    assert run(idle_fleet, "cpu_while_gpu_idle", node="n2") == []


# --- through `fleetprof sql --file` ---------------------------------------------------------------------------------


def silent_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def sql_file(fleet, name: str, *args: str, api: str | None = None) -> Result:
    """`fleetprof sql --file sql/queries/<name>.sql ARGS` in this process: through the API at `api`, or (None) by
    opening the store directly."""
    for command in COMMANDS:
        cli.add_command(command)
    base = ["--data-dir", os.path.dirname(fleet.store.location), "--database", fleet.store.database]
    path = os.path.relpath(REPO_ROOT / "sql" / "queries" / f"{name}.sql")
    return CliRunner().invoke(cli, [*base, "sql", "--file", path, *args],
                              env={"FLEETPROF_API": api or silent_address(), "FLEETPROF_CLICKHOUSE": ""})


@pytest.mark.parametrize("through", ["store", "api"])
def test_top_stacks_cpu_through_the_cli(fleet, through):
    server = serve_api(fleet.store, "127.0.0.1", 0) if through == "api" else None
    try:
        result = sql_file(fleet, "top_stacks_cpu", "--param", f"since={fleet.since.isoformat()}",
                          "--param", f"until={int(fleet.until.timestamp())}", "--param", "limit=2", "--format", "json",
                          api=server.address if server else None)
    finally:
        if server:
            server.stop()
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"stack": "main;step", "samples": 12, "share": 0.6, "nodes": 2, "processes": 2},
        {"stack": "main;fwd:bwd;[unknown 0x09]", "samples": 4, "share": 0.2, "nodes": 1, "processes": 1},
    ]


def test_gpu_idle_time_through_the_cli(fleet):
    # only since is given: until defaults to now, which adds nothing (no readings after 125 s; the spans stay)
    result = sql_file(fleet, "gpu_idle_time", "--param", f"since={fleet.since.isoformat()}", "--param", "node=n1",
                      "--param", "gpu=1", "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout == ("level,node,gpu_index,uuid,pid,comm,container_id,readings,covered_s,busy_s,idle_s,"
                             "unknown_s\ngpu,n1,1,GPU-b,0,,,3,20.0,8.0,12.0,10.0\n")


def test_kernels_and_percentiles_through_the_cli(fleet):
    result = sql_file(fleet, "top_kernels_gpu_stacks", "-p", f"since={fleet.since.isoformat()}", "-p", "stacks=1",
                      "--format", "csv")
    assert result.exit_code == 0, result.output
    assert list(csv.reader(io.StringIO(result.stdout))) == [
        ["kernel", "kernel_ns", "launches", "share", "stack_rank", "stack", "stack_ns", "stack_launches"],
        ["gemm", "7000", "7", "0.7", "1", "main;step", "6000", "6"],
        ["relu", "2000", "6", "0.2", "1", "main;step", "1500", "5"],
        ["copy", "1000", "2", "0.1", "1", "[unknown stack 0x03e7]", "1000", "2"],
    ]
    result = sql_file(fleet, "gpu_utilization_percentiles", "-p", "since=1d", "-p", "node=n1", "-p", "gpu=0",
                      "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"node": "n1", "gpu_index": 0, "uuid": "GPU-a", "name": "H100",
                                          "readings": 6, "min": 0, "mean": 40.0, "p50": 40, "p90": 80, "p99": 80,
                                          "max": 80, "mem_util_mean": 35.0}]


def test_unknown_parameter_names_the_known_ones(fleet):
    result = sql_file(fleet, "gpu_idle_time", "--param", "since=1h", "--param", "gpus=0")
    assert result.exit_code == 1
    assert result.stderr == ("Error: gpu_idle_time.sql has no parameter gpus (known: max_gap_s, since, until, node, "
                             "gpu)\n")
