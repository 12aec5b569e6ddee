"""Copies, sets, a replayed CUDA graph, NCCL collectives and NVTX ranges as a user gets them, without a GPU: the
simulated depth workload (simulate/gpu_workload.py --scenario depth, firing the CUPTI shim's probes under launch and
graph-launch rate limits) → the real `fleetprof agent` (BPF) → Kafka → symbolizer, correlator, sink → chDB → the named
queries. Every stored number is the simulator's own execution log summed as the correlator must sum it: per name and
range path, launches (weights), GPU time (duration x weight) and bytes (x weight), exactly. Needs root, bcc and kernel
headers: skipped with the reason without them, a failure on CI."""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from processors import metrics
from processors.demangle import demangle
from simulate.gpu_workload import NCCL_ALL_GATHER, NCCL_ALL_REDUCE
from simulate.nvml import Segment, SimDevice, write_scenario
from tests.gpu_job import correlator, run_job, simulator_env
from tests.pipeline_helpers import sink, symbolizer, wait_for

WORKLOAD_S = 4
RATES = {"FLEETPROF_LAUNCH_RATE": "60", "FLEETPROF_GRAPH_LAUNCH_RATE": "5"}  # weights above 1 on both limits
COPY_KINDS = {"[memcpy HtoD]": "pinned>device", "[memcpy DtoH]": "device>pageable", "[memcpy DtoD]": "device>device",
              "[memset]": "device"}


def _is_copy(name: str) -> bool:
    return name.startswith(("[memcpy ", "[memset"))


def _graph_launches_joined() -> float:
    """fleetprof_correlate_graph_launches_total over every stage of this process."""
    return sum(s.value for m in metrics.CORRELATE_GRAPH_LAUNCHES.collect() for s in m.samples
               if s.name.endswith("_total"))


def test_copies_graphs_collectives_and_ranges_end_to_end(bpf_ok, kafka_bootstrap, store, tmp_path: Path) -> None:
    node = f"gpu-depth-{uuid.uuid4().hex[:8]}"
    env, lib = simulator_env(tmp_path, kafka_bootstrap)
    scenario = write_scenario(tmp_path / "nvml.txt", [SimDevice("g0", "GPU-de000000-0000-4000-8000-000000000000")],
                              [Segment(0.0, "g0", {"gpu_util": 60})])
    summary, report = run_job({**env, **RATES}, lib, scenario,
                              ["--window", "12s", "--node", node, "--comm", Path(sys.executable).name,
                               "--frequency", "19"],
                              [sys.executable, "-m", "simulate.gpu_workload", "--scenario", "depth", "--seconds",
                               str(WORKLOAD_S), "--launches-per-s", "400"], started="collecting CPU at 19 Hz")
    sim = report["simulator"]
    assert report["simulated"] and sim["queue_dropped"] == sim["log_dropped"] == 0
    assert sim["launches_decided"] == sim["launches"] > 0 and sim["graph_launches_decided"] == sim["graph_launches"]
    assert 0 < sim["launches_sampled"] < sim["launches"] and 0 < sim["graph_launches_sampled"] < sim["graph_launches"]
    assert summary["gpu_launches"] == sim["launches_sampled"] + sim["graph_launches_sampled"]
    assert summary["gpu_kernels"] == sim["kernels_fired"]
    # what the store must hold: (name, range path) -> [launches, GPU ns, bytes], from the device's own log
    want = {(name, path): (weight, ns, nbytes) for name, path, weight, ns, nbytes in report["stored"]}
    records = sum(row[-1] for row in report["fired"])
    assert records == sim["kernels_fired"]
    assert sum(w for w, _, _ in want.values()) == sim["weight_sum"] + sim["graph_weight_sum"] * 6  # 6 graph nodes

    graph_launches_before = _graph_launches_joined()
    run = uuid.uuid4().hex[:8]
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, correlator(kafka_bootstrap, f"cor-{run}") as cor, \
            sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        def stored_rows() -> int:
            _, rows = store.query_sql("SELECT count() FROM gpu_timeline WHERE node = {n:String}", {"n": node})
            return int(rows[0][0])
        wait_for(lambda: stored_rows() >= records, timeout=90, what="the GPU records in the store",
                 running=[sym, cor, snk])
        time.sleep(1.0)  # nothing more may arrive
    n = {"n": node}
    # every sampled graph launch joined (its records are matches), as the correlator's metric counts them
    assert _graph_launches_joined() - graph_launches_before == sim["graph_launches_sampled"]

    # GPU time, launches and bytes per name and range path: exactly the device's log x weights
    _, rows = store.query_sql("SELECT toString(kernel_name), toString(nvtx_range), sum(launches), sum(duration_ns) "
                              "FROM gpu_kernel_samples WHERE node = {n:String} GROUP BY 1, 2", n)
    assert {(k, r): (int(w), int(ns)) for k, r, w, ns in rows} == {key: (w, ns) for key, (w, ns, _) in want.items()}
    assert {r.split(" > ")[0] for _, r in want} == {"train_step"}  # every launch inside the step's range
    assert ("[memcpy DtoD]", "train_step > forward") in want  # the graph's copy, under the graph launch's range

    # copies and sets: their own table, time and bytes as two values, with their memory kinds
    _, rows = store.query_sql("SELECT toString(kernel_name), toString(memory_kinds), sum(bytes), sum(duration_ns), "
                              "sum(launches) FROM gpu_copy_samples WHERE node = {n:String} GROUP BY 1, 2", n)
    copies: dict[str, list[int]] = {}
    for (name, _), (w, ns, nbytes) in want.items():
        if _is_copy(name):
            row = copies.setdefault(name, [0, 0, 0])
            row[0], row[1], row[2] = row[0] + nbytes, row[1] + ns, row[2] + w
    assert {(k, kinds): [int(b), int(ns), int(w)] for k, kinds, b, ns, w in rows} == \
        {(name, COPY_KINDS[name]): sums for name, sums in copies.items()}
    assert set(copies) == set(COPY_KINDS) and copies["[memcpy HtoD]"][0] > 0

    # the timeline: one row per sampled record, graph kernels with their graph and node ids
    _, rows = store.query_sql("SELECT toString(activity), toString(name), bytes, graph_id, graph_node_id, "
                              "toString(nvtx_range), weight, end_ns - start_ns FROM gpu_timeline "
                              "WHERE node = {n:String}", n)
    assert Counter(tuple(r[:6]) for r in rows) == {tuple(row[:6]): row[6] for row in report["fired"]}
    graph = report["graph_id"]
    assert {(r[1], r[4]) for r in rows if r[3]} == {(r[1], r[4]) for r in report["fired"] if r[3]}
    assert {r[3] for r in rows if r[3]} == {graph} and {r[4] >> 32 for r in rows if r[3]} == {graph}
    assert sum(r[6] * r[7] for r in rows) == sum(ns for _, ns, _ in want.values())

    since = datetime.fromtimestamp(time.time() - 3600, UTC).strftime("%Y-%m-%d %H:%M:%S")
    until = datetime.fromtimestamp(time.time() + 3600, UTC).strftime("%Y-%m-%d %H:%M:%S")
    window = {"since": since, "until": until, "node": node}

    # NCCL collectives, named with the collective and the element type
    cols, rows = store.query_named("gpu_collectives", window)
    got = {(r[cols.index("collective")], r[cols.index("dtype")]): (int(r[cols.index("gpu_ns")]),
                                                                   int(r[cols.index("launches")])) for r in rows}

    def kernel_sums(kernel: str) -> tuple[int, int]:
        return (sum(ns for (k, _), (_, ns, _) in want.items() if k == kernel),
                sum(w for (k, _), (w, _, _) in want.items() if k == kernel))
    assert got == {("AllReduce", "bfloat16"): kernel_sums(NCCL_ALL_REDUCE),
                   ("AllGather", ""): kernel_sums(NCCL_ALL_GATHER)}
    assert {p for (k, p) in want if k == NCCL_ALL_REDUCE} == {"train_step > backward > nccl:AllReduce"}

    # NVTX: time per range path, kernels and copies apart
    cols, rows = store.query_named("gpu_time_by_nvtx_range", window)
    by_range = {r[cols.index("nvtx_range")]: (int(r[cols.index("gpu_ns")]), int(r[cols.index("copy_ns")]))
                for r in rows}
    expected: dict[str, list[int]] = {}
    for (name, path), (_, ns, _) in want.items():
        row = expected.setdefault(path, [0, 0])
        row[0] += ns
        row[1] += ns if _is_copy(name) else 0
    assert by_range == {path: tuple(v) for path, v in expected.items()}
    assert "train_step > backward > nccl:AllReduce" in by_range  # the nccl domain's range, named with its domain

    # the flame graph's filters: copies alone, and the time under `backward` wherever it sits in the path
    def stack_total(**params) -> int:
        _, rows = store.query_named("gpu_kernel_samples_by_stack", {**window, **params})
        return sum(int(r[-1]) for r in rows)
    assert stack_total(what="copies") == sum(v[1] for v in copies.values())
    assert stack_total(what="kernels") == sum(ns for (k, _), (_, ns, _) in want.items() if not _is_copy(k))
    assert stack_total(nvtx_range="backward") == sum(ns for (_, p), (_, ns, _) in want.items()
                                                     if "backward" in p.split(" > "))

    # each record under a launching stack whose leaf is its kernel (demangled) or its copy's label
    _, leaves = store.query_sql("""
        SELECT DISTINCT toString(g.kernel_name), f.function
        FROM gpu_kernel_samples AS g
        INNER JOIN (SELECT stack_id, any(frame_ids) AS frame_ids FROM stacks GROUP BY stack_id) AS st
            ON g.stack_id = st.stack_id
        INNER JOIN (SELECT frame_id, any(function) AS function FROM frames GROUP BY frame_id) AS f
            ON f.frame_id = st.frame_ids[-1]
        WHERE g.node = {n:String}""", n)
    assert sorted(map(tuple, leaves)) == sorted({(k, k if _is_copy(k) else demangle(k)) for k, _ in want})
    _, unmatched = store.query_sql("SELECT count() FROM gpu_unmatched WHERE node = {n:String}", n)
    assert unmatched[0][0] == 0
