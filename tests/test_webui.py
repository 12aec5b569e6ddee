"""The web UI: its JSON endpoints over a real uvicorn and chDB store with known rows, the page itself in real headless
Chromium (Debian's chromium driven by playwright: charts, drag-to-select, flame graph, search, zoom, filters, diff,
exports, with screenshots kept under test-artifacts/webui/), and `fleetprof ui` serving it through up's API."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import httpx
import orjson
import pytest
from click.testing import CliRunner

from fleetprof.api import serve_api
from fleetprof.cli import _register, cli
from fleetprof.flamegraph_formats import FORMATS
from fleetprof.pprof import Profile
from fleetprof.query_client import StoreTarget
from fleetprof.settings import REPO_ROOT
from fleetprof.webui import model
from fleetprof.webui.routes import EXPORTS
from tests.elf_helpers import unavailable
from tests.test_query_cli import silent_address

try:
    from compression import zstd  # Python 3.14 and later
except ImportError:
    from backports import zstd

ARTIFACTS = REPO_ROOT / "test-artifacts" / "webui"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage"]

# What the known rows add up to: 12 windows of 10 s; the first six run compute (and a GEMM on the GPU), the last
# six io on n1 and idle on n2 (and an all-reduce on the GPU). GPU utilization drops from 90% to 20% halfway.
FIRST_HALF_CPU = {"main;run;compute": 30}
SECOND_HALF_CPU = {"main;run;io": 18, "main;idle": 6}
FIRST_HALF_GPU = {"main;launch;gemm_kernel": 24_000_000}
SECOND_HALF_GPU = {"main;launch;nccl_allreduce": 6_000_000}


@pytest.fixture
def ui_store(store):
    """`store` with known profile rows and NVML readings over [t0, t0 + 120 s), an hour ago (n1 simulated)."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    t0 = now - timedelta(hours=1, seconds=now.second % 10)
    frames = [[1, "main", "app", "NATIVE", t0], [2, "run", "app", "NATIVE", t0], [3, "compute", "app", "NATIVE", t0],
              [4, "io", "libc.so.6", "NATIVE", t0], [5, "idle", "app", "NATIVE", t0],
              [6, "launch", "libtorch.so", "NATIVE", t0], [7, "gemm_kernel", "[gpu]", "GPU_KERNEL", t0],
              [8, "nccl_allreduce", "[gpu]", "GPU_KERNEL", t0]]
    stacks = [[100, [1, 2, 3], t0], [101, [1, 2, 4], t0], [102, [1, 5], t0], [200, [1, 6, 7], t0],
              [201, [1, 6, 8], t0]]
    cpu, gpu, devices, processes = [], [], [], []
    for i in range(12):
        ts = t0 + timedelta(seconds=10 * i)
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
    store.insert("gpu_device_metrics", devices, [
        "ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_util_pct", "mem_used_bytes",
        "mem_total_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_mw", "power_limit_mw", "temperature_c",
        "pcie_tx_kbps", "pcie_rx_kbps", "clock_event_reasons", "xid_errors", "simulated"])
    store.insert("gpu_process_metrics", processes, ["ts", "node", "gpu_index", "pid", "comm", "container_id",
                                                    "sm_util_pct", "mem_util_pct", "used_memory_bytes", "simulated"])
    t0_s = int(t0.timestamp())
    return SimpleNamespace(store=store, t0=t0_s, t1=t0_s + 120)


@pytest.fixture
def served(ui_store):
    """The API that `fleetprof up` serves (and the UI with it) over ui_store, on a free port."""
    server = serve_api(ui_store.store, "127.0.0.1", 0)
    try:
        yield SimpleNamespace(**vars(ui_store), url=server.url, address=server.address)
    finally:
        server.stop()


def stacks_of(payload: dict) -> dict[str, int]:
    """A flame graph answer's stacks as folded text -> value."""
    names = payload["frames"]
    return {";".join(names[f] for f in stack): count for stack, count in zip(payload["stacks"], payload["counts"],
                                                                            strict=True)}


def cli_export(ui, fmt: str, since: int, until: int, *extra: str) -> bytes:
    """`fleetprof query flamegraph` in this process (it owns the chDB directory, so it opens the store itself)."""
    _register()
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


# --- the endpoints --------------------------------------------------------------------------------------------------


def test_flamegraph_endpoints_return_exact_stacks(served):
    ui = served
    whole = {"since": ui.t0, "until": ui.t1}
    second = {"since": ui.t0 + 60, "until": ui.t1}
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        body = http.get("/api/flamegraph", params=whole).json()
        assert stacks_of(body) == {**FIRST_HALF_CPU, **SECOND_HALF_CPU}
        assert body["total"] == 54 and body["unit"] == "samples" and body["simulated"] is True
        binary_of = {body["frames"][i]: body["binaries"][b] for i, b in enumerate(body["frame_binary"])}
        assert binary_of == {"main": "app", "run": "app", "compute": "app", "io": "libc.so.6", "idle": "app"}
        assert stacks_of(http.get("/api/flamegraph", params=second).json()) == SECOND_HALF_CPU
        gpu = http.get("/api/flamegraph", params={**whole, "kind": "gpu"}).json()
        assert stacks_of(gpu) == {**FIRST_HALF_GPU, **SECOND_HALF_GPU} and gpu["unit"] == "ns"
        n2 = http.get("/api/flamegraph", params={**whole, "node": "n2"}).json()
        assert stacks_of(n2) == {"main;idle": 6} and n2["simulated"] is False  # n2 has no NVML readings
        assert stacks_of(http.get("/api/flamegraph", params={**whole, "pid": 10}).json()) == {
            "main;run;compute": 30, "main;run;io": 18}
        diff = http.get("/api/flamegraph/diff", params={**second, "base_since": ui.t0, "base_until": ui.t0 + 60})
        body = diff.json()
        assert stacks_of(body) == {"main;run;io": 18, "main;idle": 6, "main;run;compute": 0}
        base = dict(zip(stacks_of(body), body["base_counts"], strict=True))
        assert base == {"main;run;io": 0, "main;idle": 0, "main;run;compute": 30}
        assert (body["total"], body["base_total"]) == (24, 30)


def test_timeseries_nodes_and_processes(served):
    ui = served
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        ts = http.get("/api/timeseries", params={"since": ui.t0, "until": ui.t1}).json()
        assert (ts["since_ms"], ts["until_ms"], ts["step_ms"], ts["activity_step_ms"]) == (
            ui.t0 * 1000, ui.t1 * 1000, 1000, 10_000)
        assert ts["simulated"] is True and ts["truncated"] is False
        [device] = ts["devices"]
        assert (device["node"], device["gpu_index"], device["uuid"], device["name"]) == ("n1", 0, "GPU-0001",
                                                                                           "Simulated H100")
        assert device["t"] == [(ui.t0 + s) * 1000 for s in range(120)]
        assert device["gpu_util_pct"] == [90] * 60 + [20] * 60
        assert device["power_mw"] == [300_000] * 60 + [120_000] * 60 and device["power_limit_mw"] == [400_000] * 120
        assert device["temperature_c"] == [71] * 60 + [52] * 60 and device["pcie_rx_kbps"] == [9 * 1024] * 120
        [proc] = ts["processes"]
        assert (proc["node"], proc["pid"], proc["comm"]) == ("n1", 10, "train")
        assert proc["sm_util_pct"] == [90] * 60 + [20] * 60
        assert ts["activity"]["cpu"] == {"t": [(ui.t0 + 10 * i) * 1000 for i in range(12)], "v": [5] * 6 + [4] * 6}
        assert ts["activity"]["gpu"]["v"] == [4_000_000] * 6 + [1_000_000] * 6
        # 2 hours in buckets of 15 s (epoch-aligned): each bucket averages the readings in it
        wide = http.get("/api/timeseries", params={"since": ui.t0 - 3600, "until": ui.t0 + 3600}).json()
        buckets: dict[int, list[int]] = {}
        for s in range(120):
            buckets.setdefault((ui.t0 + s) // 15 * 15_000, []).append(90 if s < 60 else 20)
        assert wide["step_ms"] == 15_000 and wide["devices"][0]["t"] == list(buckets)
        assert wide["devices"][0]["gpu_util_pct"] == [pytest.approx(sum(v) / len(v)) for v in buckets.values()]
        assert http.get("/api/nodes", params={"since": ui.t0, "until": ui.t1}).json() == {"nodes": [
            {"node": "n1", "cpu_samples": 48, "gpu_ns": 30_000_000, "gpus": 1, "simulated": True},
            {"node": "n2", "cpu_samples": 6, "gpu_ns": 0, "gpus": 0, "simulated": False}]}
        assert http.get("/api/processes", params={"since": ui.t0, "until": ui.t1}).json() == {"processes": [
            {"node": "n1", "pid": 10, "comm": "train", "cpu_samples": 48, "gpu_ns": 30_000_000},
            {"node": "n2", "pid": 20, "comm": "serve", "cpu_samples": 6, "gpu_ns": 0}]}
        assert http.get("/api/processes", params={"since": ui.t0, "until": ui.t1, "node": "n2"}).json()[
            "processes"] == [{"node": "n2", "pid": 20, "comm": "serve", "cpu_samples": 6, "gpu_ns": 0}]


def test_exports_are_the_clis_bytes(served):
    ui = served
    since, until = ui.t0 + 60, ui.t1
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        assert set(EXPORTS) == set(FORMATS)  # the UI offers every format the CLI writes
        for fmt in EXPORTS:
            response = http.get("/api/export", params={"since": since, "until": until, "format": fmt})
            assert response.status_code == 200
            assert response.content == cli_export(ui, fmt, since, until), fmt
        assert response.headers["content-disposition"].startswith('attachment; filename="fleetprof-cpu-')
        gpu = http.get("/api/export", params={"since": ui.t0, "until": ui.t1, "kind": "gpu", "format": "pprof",
                                              "node": "n1"})
        assert gpu.content == cli_export(ui, "pprof", ui.t0, ui.t1, "--kind", "gpu", "--node", "n1")
        assert pprof_stacks(gpu.content) == {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
        folded = http.get("/api/export", params={"since": since, "until": until, "format": "folded"}).text
        assert folded == "main;run;io 18\nmain;idle 6\n"


def test_bad_parameters_are_one_line_400s(served):
    ui = served
    whole = {"since": ui.t0, "until": ui.t1}
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        for path, params, needle in [
            ("/api/flamegraph", {**whole, "kind": "disk"}, "kind must be one of cpu, gpu"),
            ("/api/flamegraph", {**whole, "pid": "abc"}, "pid must be a process id"),
            ("/api/flamegraph", {**whole, "pid": "²"}, "pid must be a process id"),
            ("/api/flamegraph", {"since": ui.t1, "until": ui.t0}, "must be before"),
            ("/api/timeseries", {"since": "yesterday"}, "not a time"),
            ("/api/flamegraph/diff", whole, "base_since is required"),
            ("/api/export", {**whole, "format": "svg"}, "format must be one of"),
        ]:
            response = http.get(path, params=params)
            assert response.status_code == 400, (path, params)
            error = response.json()["error"]
            assert needle in error and "\n" not in error, error


def test_the_page_and_its_files_are_served(served):
    with httpx.Client(base_url=served.url, timeout=30) as http:
        page = http.get("/")
        assert page.status_code == 200 and '<canvas id="flame">' in page.text
        for path in ("/static/app.js", "/static/flamegraph.js", "/static/charts.js", "/static/style.css",
                     "/static/vendor/uPlot.iife.min.js", "/static/vendor/uPlot.min.css"):
            assert http.get(path).status_code == 200, path
        assert http.get("/static/../api.py").status_code == 404
        # the query API is still there, and the UI never closed the store it borrowed
        assert http.get("/api/query/totals_cpu", params={"since": served.t0, "until": served.t1}).json()["rows"] == [
            ["n1", 48], ["n2", 6]]


# --- flame graphs from frame ids (model.py) -------------------------------------------------------------------------

BIG_FRAME = 2**63 + 5  # frame and stack ids are 64-bit hashes: the high bit is set for half of them


@pytest.fixture
def edge_store(store):
    """Stacks that trip the naming and merging rules, sampled over two minutes an hour ago: two frame ids with the
    same (function, binary), one function in two binaries, undefined frames and stacks, a stack whose newest
    definition is empty, and older definitions (of a frame and of stacks) that must lose to newer ones."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    t0 = now - timedelta(hours=1, seconds=now.second)
    old = t0 - timedelta(hours=1)
    frames = [[1, "main", "app", "NATIVE", t0], [10, "main", "app", "INTERPRETED", t0],
              [2, "run", "app", "NATIVE", t0], [2, "old_run", "app", "NATIVE", old],
              [3, "io", "libc.so.6", "NATIVE", t0], [4, "io", "app", "NATIVE", t0],
              [6, "idle", "app", "NATIVE", t0], [BIG_FRAME, "gemm_kernel", "[gpu]", "GPU_KERNEL", t0]]
    # frames 11 and 0xabc have no definition; stack 0x05 none at all; stack 2**64 - 2 an empty newest one
    stacks = [[0x100, [1, 2, 3], t0], [0x101, [10, 2, 3], t0], [0x102, [1, 2, 4], t0],
              [2**64 - 2, [], t0], [2**64 - 2, [1, 2], old], [0x103, [1, 11, 0xABC], t0],
              [0x104, [1, BIG_FRAME], t0], [0x104, [1, 3], old], [0x105, [1], t0], [0x107, [3, 1], t0],
              [0x108, [1, 6], t0]]
    first = {0x100: 5, 0x101: 4, 0x102: 9, 0x05: 2, 2**64 - 2: 2, 0x103: 2, 0x104: 1, 0x105: 2}
    second = {0x105: 7, 0x107: 3, 0x108: 3}
    cpu = [[t0 + timedelta(seconds=s), "n1", 10, "train", "", stack, n]
           for s, window in ((0, first), (60, second)) for stack, n in window.items()]
    gpu = [[t0 + timedelta(seconds=30), "n1", 10, "", "", 0, 7, 0x104, "gemm_kernel", 2**40, 1],
           [t0 + timedelta(seconds=40), "n1", 10, "", "", 0, 7, 0x103, "gemm_kernel", 5, 1]]
    store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    store.insert("stacks", stacks, ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", cpu, ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    store.insert("gpu_kernel_samples", gpu, ["ts", "node", "pid", "comm", "container_id", "device", "stream",
                                             "stack_id", "kernel_name", "duration_ns", "launches"])
    return SimpleNamespace(store=store, first={"since": t0, "until": t0 + timedelta(seconds=60)},
                           second={"since": t0 + timedelta(seconds=60), "until": t0 + timedelta(seconds=120)})


def plain(payload: dict) -> dict:
    """An answer as the page parses it (model.py's stacks are numpy arrays)."""
    return orjson.loads(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))


def ids_graph(store, kind: str, *windows: dict) -> dict:
    """model.py's answer for one window (or a diff of two) from the store's Arrow columns, checked against the same
    built from the rows the API gives `fleetprof ui` (JSON: ids as plain numbers)."""
    target = StoreTarget(store)
    arrays = [model.StackIds.from_arrow(store.query_named_arrow(f"flamegraph_ids_{kind}", w)) for w in windows]
    names = [row for w in windows for row in store.query_named(f"flamegraph_names_{kind}", w)[1]]
    build = model.flamegraph_of_ids if len(windows) == 1 else model.flamegraph_diff_of_ids
    answer = plain(build(*arrays, names))
    rows = [model.StackIds.from_rows(target.named(f"flamegraph_ids_{kind}", w)[1]) for w in windows]
    json_names = [row for w in windows for row in target.named(f"flamegraph_names_{kind}", w)[1]]
    assert plain(build(*rows, json_names)) == answer
    return answer


def test_flame_graph_from_ids_names_and_merges_like_the_sql(edge_store):
    store = edge_store.store
    got = ids_graph(store, "cpu", edge_store.first)
    assert got == {
        "frames": ["main", "run", "io", "io", "[unknown stack 0x05]", "[unknown stack 0xfffffffffffffffe]",
                   "[unknown 0x0b]", "[unknown 0x0abc]", "gemm_kernel"],
        "binaries": ["app", "libc.so.6", "", "[gpu]"],
        "frame_binary": [0, 0, 0, 1, 2, 2, 2, 2, 3],
        # by value, then functions, then binaries (app before libc.so.6), a prefix first ([main] before main;…);
        # stacks 0x100 and 0x101 differ only in which frame id names main, so they are one stack of 5 + 4
        "stacks": [[0, 1, 2], [0, 1, 3], [4], [5], [0], [0, 6, 7], [0, 8]],
        "counts": [9, 9, 2, 2, 2, 2, 1], "total": 27}
    # the CLI's flame graph (names only, binaries merged) counts the same stacks in the same order
    _, cli_rows = store.query_named("flamegraph_cpu", edge_store.first)
    folded = [(";".join(got["frames"][f] for f in stack), count)
              for stack, count in zip(got["stacks"], got["counts"], strict=True)]
    assert [(";".join(functions), count) for functions, count in cli_rows] == [
        ("main;run;io", 18), *folded[2:]]
    gpu = ids_graph(store, "gpu", {"since": edge_store.first["since"], "until": edge_store.second["until"]})
    assert (gpu["frames"], gpu["stacks"], gpu["counts"]) == (
        ["main", "gemm_kernel", "[unknown 0x0b]", "[unknown 0x0abc]"], [[0, 1], [0, 2, 3]], [2**40, 5])
    empty = ids_graph(store, "cpu", {"since": edge_store.first["since"] - timedelta(days=1),
                                     "until": edge_store.first["since"]})
    assert empty == {"frames": [], "binaries": [], "frame_binary": [], "stacks": [], "counts": [], "total": 0}


def test_flame_graph_diff_from_ids(edge_store):
    got = ids_graph(edge_store.store, "cpu", edge_store.first, edge_store.second)
    # the first range's stacks in its order, then the baseline's others in theirs (io;main before main;idle)
    assert got["stacks"] == [[0, 1, 2], [0, 1, 3], [4], [5], [0], [0, 6, 7], [0, 8], [3, 0], [0, 9]]
    assert got["frames"][9] == "idle" and got["frame_binary"][9] == 0
    assert (got["counts"], got["total"]) == ([9, 9, 2, 2, 2, 2, 1, 0, 0], 27)
    assert (got["base_counts"], got["base_total"]) == ([0, 0, 0, 0, 7, 0, 0, 3, 3], 13)


def test_big_flame_graph_is_the_sql_grouping_in_every_encoding(store):
    """3,000 random stacks over frame ids that often share names: the answer equals model.flamegraph of the rows
    that grouping by (functions, binaries) and ordering as flamegraph_cpu does give, computed here in Python; the
    same in zstd, gzip and uncompressed."""
    rng = random.Random(11)
    t0 = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=1)
    functions = ["main", "run", "step", "é_step", "z", "a", "ab", "[unknown 0x01]"]
    binaries = ["app", "libc.so.6", "libé.so", "[gpu]"]
    frame_ids = [rng.getrandbits(64) for _ in range(60)]
    named = {f: (rng.choice(functions), rng.choice(binaries)) for f in frame_ids[:50]}  # the last 10 undefined
    stacks = {rng.getrandbits(64): [rng.choice(frame_ids) for _ in range(rng.randint(0, 12))] for _ in range(3000)}
    counts = {s: rng.choice([1, 2, 3, rng.randint(1, 10**6)]) for s in stacks}
    store.insert("frames", [[f, fn, b, "NATIVE", t0] for f, (fn, b) in named.items()],
                 ["frame_id", "function", "binary", "kind", "last_seen"])
    defined = {s for s in stacks if rng.random() < 0.95}
    store.insert("stacks", [[s, stacks[s], t0] for s in defined], ["stack_id", "frame_ids", "last_seen"])
    store.insert("cpu_samples", [[t0, "n1", 1, "c", "", s, n] for s, n in counts.items()],
                 ["ts", "node", "pid", "comm", "container_id", "stack_id", "count"])
    grouped: dict[tuple, int] = {}
    for s, n in counts.items():
        frames = [named.get(f, (f"[unknown 0x{model.ch_hex(f)}]", "")) for f in stacks[s]] if s in defined else []
        frames = frames or [(f"[unknown stack 0x{model.ch_hex(s)}]", "")]
        key = (tuple(f for f, _ in frames), tuple(b for _, b in frames))
        grouped[key] = grouped.get(key, 0) + n
    # ClickHouse compares arrays of strings element by element, bytewise, a prefix first: as Python compares these
    ordered = sorted(grouped.items(), key=lambda kv: (-kv[1], [f.encode() for f in kv[0][0]],
                                                      [b.encode() for b in kv[0][1]]))
    expected = model.flamegraph([(list(f), list(b), n) for (f, b), n in ordered])
    assert len(expected["stacks"]) > 2000 and len(expected["stacks"]) < len(stacks)  # some merged
    server = serve_api(store, "127.0.0.1", 0)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            params = {"since": int(t0.timestamp()), "until": int(t0.timestamp()) + 1}
            for asked, encoding, unpack in (("gzip, deflate, br, zstd", "zstd", zstd.decompress),
                                            ("gzip, deflate", "gzip", gzip.decompress), ("identity", None, bytes)):
                with http.stream("GET", "/api/flamegraph", params=params,
                                 headers={"Accept-Encoding": asked}) as response:
                    wire = b"".join(response.iter_raw())
                assert response.headers.get("content-encoding") == encoding
                body = json.loads(unpack(wire))
                assert {k: body[k] for k in expected} == expected, asked
    finally:
        server.stop()


# --- `fleetprof ui` -------------------------------------------------------------------------------------------------


def test_fleetprof_ui_serves_through_ups_api(served):
    ui = served
    env = {k: v for k, v in os.environ.items() if k != "FLEETPROF_CLICKHOUSE"}
    env["FLEETPROF_API"] = ui.address  # this process owns the chDB directory: the command must go through the API
    args = [sys.executable, "-m", "fleetprof", "--data-dir", os.path.dirname(ui.store.location), "--database",
            ui.store.database, "ui", "--listen", "127.0.0.1:0", "--no-open"]
    proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert line.startswith("web UI at http://127.0.0.1:"), line
        assert f"reading the fleetprof API at {ui.address}" in line
        url = line.split()[3]
        with httpx.Client(base_url=url, timeout=30) as http:
            assert http.get("/healthz").json()["service"] == "fleetprof-ui"
            assert '<canvas id="flame">' in http.get("/").text
            body = http.get("/api/flamegraph", params={"since": ui.t0 + 60, "until": ui.t1}).json()
            assert stacks_of(body) == SECOND_HALF_CPU
            folded = http.get("/api/export", params={"since": ui.t0, "until": ui.t1, "format": "folded"})
            assert folded.content == cli_export(ui, "folded", ui.t0, ui.t1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fleetprof_ui_bad_listen_address():
    done = subprocess.run([sys.executable, "-m", "fleetprof", "ui", "--listen", "nowhere"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == "Error: --listen: not a host:port address: 'nowhere'\n"


# --- the page in Chromium -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium, headless, driven by playwright (which never downloads a browser of its own here)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (bash infra/setup.sh installs it)")
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("chromium not found (bash infra/setup.sh installs Debian's chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """One page of the UI over `served`, with the waits and gestures the tests need."""

    def __init__(self, browser, ui, query: str = ""):
        self.ui = ui
        self.page = browser.new_page(viewport={"width": 1400, "height": 1200}, accept_downloads=True)
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))
        self.page.goto(f"{ui.url}/?since={ui.t0}&until={ui.t1}{query}")
        self.settle(0)

    def js(self, expression: str):
        return self.page.evaluate(expression)

    def settle(self, after: int) -> None:
        """Wait until the flame graph was drawn from a newer answer than draw `after` and nothing is loading."""
        self.page.wait_for_function(
            f"window.fleetprof && window.fleetprof.flameVersion > {after} && window.fleetprof.pending === 0",
            timeout=20_000)

    def changing(self, action) -> None:
        """Do `action` (which reloads the flame graph), then wait for the new one."""
        version = self.js("window.fleetprof.flameVersion")
        action()
        self.settle(version)

    def folded(self) -> dict[str, int]:
        return {line.rsplit(" ", 1)[0]: int(float(line.rsplit(" ", 1)[1]))
                for line in self.js("window.fleetprof.flame.folded()")}

    def drag(self, chart: str, since_s: float, until_s: float) -> None:
        """Press at since_s on the chart, move to until_s, release: what a person does to select a range."""
        self.page.locator(f"[data-chart={chart}]").scroll_into_view_if_needed()
        a = self.js(f"window.fleetprof.charts.pointOf('{chart}', {since_s * 1000})")
        b = self.js(f"window.fleetprof.charts.pointOf('{chart}', {until_s * 1000})")

        def gesture() -> None:
            # uPlot tracks the cursor once per animation frame: let it see where the press and release happen
            self.page.mouse.move(a["x"], a["y"], steps=5)
            self.next_frame()
            self.page.mouse.down()
            self.page.mouse.move(b["x"], b["y"], steps=10)
            self.next_frame()
            self.page.mouse.up()

        self.changing(gesture)

    def frame_point(self, *path: str) -> tuple[float, float]:
        """The page pixel in the middle of the drawn frame at `path` ("main", "run", ...), scrolled into view."""
        self.page.locator("#flame").scroll_into_view_if_needed()
        canvas = self.page.locator("#flame").bounding_box()
        rect = self.js(f"window.fleetprof.flame.rectOf(window.fleetprof.flame.find(...{json.dumps(path)}))")
        return canvas["x"] + rect["x"] + rect["w"] / 2, canvas["y"] + rect["y"] + rect["h"] / 2

    def next_frame(self) -> None:
        self.page.evaluate("new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")

    def shot(self, name: str) -> None:
        self.page.evaluate("window.scrollTo(0, 0)")  # else the sticky header lands mid-page in a full-page shot
        self.page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)

    def download(self, selector: str) -> bytes:
        with self.page.expect_download() as info:
            self.page.click(selector)
        return Path(info.value.path()).read_bytes()


def test_page_draws_charts_and_a_dragged_range_drives_the_flame_graph(browser, served):
    ui = served
    page = Page(browser, ui)
    charts = page.js("window.fleetprof.charts.plots.map(p => [p.fleetprofId, p.data.length - 1, p.data[0].length])")
    assert charts == [["activity", 2, 12], ["util", 1, 120], ["memory", 1, 120], ["clocks", 2, 120],
                      ["power", 2, 120], ["temperature", 1, 120], ["pcie", 2, 120], ["process-util", 1, 120],
                      ["process-memory", 1, 120]]
    assert page.js("window.fleetprof.charts.plots[1].data[1].slice(58, 62)") == [90, 90, 20, 20]
    assert page.page.locator("#simulated").is_visible()
    assert page.page.locator("#flame-title").inner_text().startswith("SIMULATED · CPU samples · 54 samples")
    assert page.folded() == {**FIRST_HALF_CPU, **SECOND_HALF_CPU}
    assert page.page.locator("#legend").inner_text().split("\n") == ["app 66.7%", "libc.so.6 33.3%"]
    page.shot("overview")

    # the second half, where GPU utilization dropped: from just before it to past the end of the chart
    page.drag("util", ui.t0 + 55, ui.t1 + 30)
    since, until = page.js("window.fleetprof.state.selection")
    assert ui.t0 + 54 <= since <= ui.t0 + 56 and until == ui.t1
    assert page.folded() == SECOND_HALF_CPU
    assert f"sel={since}%2C{until}" in page.page.url
    page.shot("second-half")

    exported = page.download("#export-folded")
    assert exported == cli_export(ui, "folded", since, until) == b"main;run;io 18\nmain;idle 6\n"
    pprof = page.download("#export-pprof")
    assert pprof == cli_export(ui, "pprof", since, until)
    assert pprof_stacks(pprof) == SECOND_HALF_CPU
    speedscope = page.download("#export-speedscope")
    assert speedscope == cli_export(ui, "speedscope", since, until)
    assert json.loads(speedscope)["profiles"][0]["weights"] == [18, 6]

    page.changing(lambda: page.page.check("input[name=kind][value=gpu]"))
    assert page.folded() == SECOND_HALF_GPU
    assert page.page.locator("#flame-title").inner_text().startswith("SIMULATED · GPU kernel time by launching "
                                                                     "CPU stack · 6.000 ms")
    page.changing(lambda: page.page.click("#clear-selection"))
    assert page.folded() == {**FIRST_HALF_GPU, **SECOND_HALF_GPU}
    assert page.errors == []


def test_search_and_zoom(browser, served):
    page = Page(browser, served)
    page.page.fill("#search", "^io$")
    page.page.wait_for_function("document.getElementById('match').textContent !== ''")
    assert page.page.locator("#match").inner_text() == "matched 33.3% (18 samples)"
    assert page.js("Array.from(window.fleetprof.flame.match)") == [
        int(name == "io") for name in page.js("window.fleetprof.flame.model.frames")]
    page.page.mouse.move(*page.frame_point("main", "run", "io"))
    assert page.page.locator("#tooltip").inner_text() == (
        "io  (libc.so.6)\ntotal 18 samples (33.3%)\nself  18 samples (33.3%)")
    page.shot("search")

    run = page.js("window.fleetprof.flame.find('main', 'run')")
    page.page.mouse.click(*page.frame_point("main", "run"))
    assert page.js("window.fleetprof.flame.focus") == run
    assert page.page.locator("#zoom-label").inner_text() == "zoomed: main › run"
    width = page.js("window.fleetprof.flame.canvas.clientWidth")
    after = page.js(f"window.fleetprof.flame.rectOf({run})")
    assert after["x"] == 0 and after["w"] == width  # the zoomed frame spans the graph
    compute = page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'run', 'compute'))")
    assert compute["w"] == pytest.approx(width * 30 / 48)
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'idle'))") is None
    page.shot("zoomed")
    page.page.click("#reset-zoom")
    assert page.js("window.fleetprof.flame.focus") == 0
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'idle'))") is not None
    assert page.errors == []


def test_node_and_process_filters(browser, served):
    page = Page(browser, served)
    assert page.page.locator("#node option").all_inner_texts() == ["all nodes", "n1", "n2"]
    assert page.page.locator("#process option").all_inner_texts() == ["all processes", "train 10 · n1",
                                                                      "serve 20 · n2"]
    page.changing(lambda: page.page.select_option("#process", "n2|20"))
    assert page.folded() == {"main;idle": 6}
    assert page.js("[window.fleetprof.state.node, window.fleetprof.state.pid]") == ["n2", 20]
    # n2 has no NVML readings: only the activity chart, and no SIMULATED banner
    assert page.js("window.fleetprof.charts.plots.map(p => p.fleetprofId)") == ["activity"]
    assert not page.page.locator("#simulated").is_visible()
    page.shot("process-filter")
    page.changing(lambda: page.page.select_option("#node", "n1"))
    assert page.folded() == {"main;run;compute": 30, "main;run;io": 18}
    assert page.js("window.fleetprof.state.pid") == 0
    assert page.errors == []


def test_diff_of_two_ranges(browser, served):
    ui = served
    page = Page(browser, ui)
    page.drag("activity", ui.t0 + 55, ui.t0 - 30)  # right to left, past the start: the first half
    assert page.js("window.fleetprof.state.selection")[0] == ui.t0
    assert page.folded() == FIRST_HALF_CPU
    page.page.click("#set-baseline")
    page.drag("activity", ui.t0 + 55, ui.t1 + 30)
    assert page.folded() == SECOND_HALF_CPU
    page.changing(lambda: page.page.check("#diff"))
    assert page.page.locator("#flame-title").inner_text().endswith(
        "diff vs baseline (30 samples): red grew, blue shrank, in share of its range")

    def described(*path: str) -> dict:
        return page.js(f"window.fleetprof.flame.describe(window.fleetprof.flame.find(...{json.dumps(path)}))")

    io = described("main", "run", "io")
    assert (io["total"], io["baseTotal"], io["delta"]) == (18, 0, pytest.approx(0.75))
    run = described("main", "run")
    assert (run["total"], run["baseTotal"], run["delta"]) == (18, 30, pytest.approx(-0.25))
    compute = described("main", "run", "compute")
    assert (compute["total"], compute["baseTotal"], compute["delta"]) == (0, 30, pytest.approx(-1.0))
    assert described("main")["delta"] == 0
    # width by the new range: compute, gone from it, is not drawn; colors: io red (grew), run blue (shrank)
    assert page.js("window.fleetprof.flame.rectOf(window.fleetprof.flame.find('main', 'run', 'compute'))") is None
    io_color = page.js("window.fleetprof.flame._color(window.fleetprof.flame.find('main', 'run', 'io'))")
    run_color = page.js("window.fleetprof.flame._color(window.fleetprof.flame.find('main', 'run'))")
    assert io_color.startswith("hsl(0,") and run_color.startswith("hsl(215,")
    page.shot("diff")
    assert page.errors == []



def test_call_tree_of_stacks(browser, served):
    """The page's call tree (static/flamegraph.js buildTree), on stacks built to trip it: one function name in two
    binaries, a stack that is a prefix of others, a repeated stack; then random stacks, checked against sums here."""
    page = Page(browser, served)
    tricky = {"frames": ["b", "a", "c", "a"], "binaries": ["x", "y"], "frame_binary": [0, 0, 0, 1],
              "stacks": [[1, 0], [1, 0, 2], [1], [3, 0], [1, 0]], "counts": [5, 3, 2, 7, 1]}
    got = page.js(f"""(async () => {{
        const m = await import("./static/flamegraph.js");
        const graph = window.fleetprof.flame;
        graph.setData({json.dumps(tricky)});
        const t = graph.model;
        const nodes = Array.from({{length: t.count}}, (_, i) => [graph.path(i).join(";"), graph.binary(i), t.total[i],
                                                                  t.self[i], t.x[i], t.end[i]]);
        return {{folded: graph.folded(), nodes, built: m.buildTree({json.dumps(tricky)}).count}};
    }})()""")
    assert got["folded"] == ["a 2", "a;b 6", "a;b;c 3", "a;b 7"]  # a in binary x sorts before a in binary y
    assert got["nodes"] == [["", "", 18, 0, 0, 6], ["a", "x", 11, 2, 0, 4], ["a;b", "x", 9, 6, 0, 4],
                            ["a;b;c", "x", 3, 3, 0, 4], ["a", "y", 7, 0, 11, 6], ["a;b", "x", 7, 7, 11, 6]]
    assert got["built"] == 6

    rng = random.Random(5)
    names = [f"fn{i}" for i in range(40)]
    stacks: dict[tuple[str, ...], int] = {}
    while len(stacks) < 3000:
        stacks.setdefault(tuple(rng.choice(names[:8] if d < 3 else names) for d in range(rng.randint(1, 30))),
                          rng.randint(1, 1000))
    rows = [(list(s), [f"lib{int(f[2:]) % 5}.so" for f in s], n) for s, n in stacks.items()]
    payload = model.flamegraph(rows)
    got = page.js(f"""(() => {{
        const graph = window.fleetprof.flame;
        graph.setData({json.dumps(payload)});
        const t = graph.model;
        let ordered = true;  // children in name order, each inside its parent's span
        for (let i = 1; i < t.count; i++) {{
            const p = t.parent[i];
            ordered = ordered && t.x[i] >= t.x[p] && t.x[i] + t.total[i] <= t.x[p] + t.total[p] + 1e-9;
        }}
        return {{folded: graph.folded(), total: t.total[0], ordered, count: t.count}};
    }})()""")
    assert got["total"] == sum(stacks.values()) and got["ordered"]
    assert {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in got["folded"]} == {
        ";".join(s): n for s, n in stacks.items()}
    assert got["folded"] == sorted(got["folded"], key=lambda line: line.rsplit(" ", 1)[0].split(";"))
    assert got["count"] == 1 + len({s[:d] for s in stacks for d in range(1, len(s) + 1)})
    assert page.errors == []
