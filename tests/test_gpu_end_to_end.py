"""The GPU path as a user runs it, without a GPU: the simulated workload (real Python and native call paths firing the
CUPTI shim's probes) and the simulated libnvidia-ml.so.1 → the real `fleetprof agent` (BPF, nvidia-ml-py) → Kafka →
symbolizer, correlator, sink → chDB → the named queries. GPU time per kernel equals what the simulator ran, under
the launching stacks it launched from; the NVML values are stored exactly (needs root, bcc and kernel headers:
skipped with the reason without them, a failure on CI)."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from processors.demangle import demangle
from simulate.gpu_demo import PERF_PYTHON
from simulate.nvml import Segment, SimDevice, SimProcess, write_scenario
from tests.elf_helpers import unavailable
from tests.gpu_job import correlator, run_job, simulator_env
from tests.pipeline_helpers import sink, symbolizer, wait_for

WORKLOAD_S = 4
BUSY = {"gpu_util": 87, "mem_util": 55, "mem_used": 40 * 1024**3, "sm_clock": 1755, "mem_clock": 2619,
        "power": 512_000, "temp": 71, "pcie_tx": 800_000, "pcie_rx": 2_100_000, "clock_events": 4}
PYTHON_PATHS = {  # kernel -> the Python functions the workload launches it from, outermost first
    "_Z14flash_attn_fwdILi128EEvPKfS1_Pf": ["train_step", "forward", "attention"],
    "ampere_sgemm_128x64_nn": ["train_step", "backward", "matmul"],
    "_Z12resize_imagePKhPhii": ["data_loader", "augment"],
}
NATIVE_PATHS = {"_Z11native_gemmPKfS0_Pfi": ["gpusim_native_train_step", "native_forward", "native_gemm"],
                "_Z15native_gemm_bwdPKfS0_Pfi": ["gpusim_native_train_step", "native_backward", "native_gemm_bwd"]}


def test_simulated_gpu_node_end_to_end(bpf_ok, kafka_bootstrap, store, tmp_path: Path) -> None:
    if not PERF_PYTHON.exists():
        unavailable(f"no CPython with -X perf at {PERF_PYTHON} (bash infra/setup.sh builds it): Python launch paths "
                    "cannot show")
    node = f"gpu-e2e-{uuid.uuid4().hex[:8]}"
    env, lib = simulator_env(tmp_path, kafka_bootstrap)
    scenario = write_scenario(tmp_path / "nvml.txt", [SimDevice("g0", "GPU-e2e00000-0000-4000-8000-000000000000")],
                              [Segment(0.0, "g0", BUSY, processes=[SimProcess(4242, 80, 50, 30 * 1024**3)])])
    summary, report = run_job(env, lib, scenario,
                              ["--window", "14s", "--node", node, "--comm", PERF_PYTHON.name, "--frequency", "99"],
                              [str(PERF_PYTHON), "-X", "perf", "-m", "simulate.gpu_workload", "--seconds",
                               str(WORKLOAD_S)], started="collecting CPU at 99 Hz, CUDA kernels, NVML")
    sim = report["simulator"]
    assert sim["launches_decided"] == sim["launches"] > 0  # the probes were on for every launch
    assert summary["gpu_launches"] == sim["launches_sampled"] and summary["gpu_kernels"] == sim["kernels_fired"]

    run = uuid.uuid4().hex[:8]
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, correlator(kafka_bootstrap, f"cor-{run}") as cor, \
            sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        def stored_launches() -> int:
            _, rows = store.query_sql("SELECT sum(launches) FROM gpu_kernel_samples WHERE node = {n:String}",
                                      {"n": node})
            return int(rows[0][0] or 0)
        wait_for(lambda: stored_launches() >= sim["weight_sum"], timeout=90, what="the GPU time in the store",
                 running=[sym, cor, snk])

        def cpu_samples_of_workload() -> int:  # --comm below reads them: the CPU batches may land after the GPU rows
            _, rows = store.query_sql("SELECT count() FROM cpu_samples WHERE node = {n:String} AND comm = {c:String}",
                                      {"n": node, "c": PERF_PYTHON.name})
            return int(rows[0][0])
        wait_for(lambda: cpu_samples_of_workload() > 0, timeout=60, what="the workload's CPU samples in the store",
                 running=[sym, cor, snk])
        time.sleep(1.0)  # nothing more may arrive
    assert stored_launches() == sim["weight_sum"]

    # GPU time per kernel: what the simulated device ran (its own clock, the probes' values), within 2% (exact here
    # but for the rounding of per-window sums), and the requested durations within 2% as well.
    _, rows = store.query_sql("SELECT kernel_name, sum(duration_ns), sum(launches) FROM gpu_kernel_samples "
                              "WHERE node = {n:String} GROUP BY kernel_name", {"n": node})
    stored = {name: (int(ns), int(n)) for name, ns, n in rows}
    ran = report["executed"]
    assert set(stored) == set(ran), (stored, ran)
    for name, (ns, n) in stored.items():
        assert n == ran[name]["kernels"], name
        assert abs(ns - ran[name]["wall_ns"]) <= 0.02 * ran[name]["wall_ns"], (name, ns, ran[name])
        assert abs(ns - ran[name]["duration_ns"]) <= 0.02 * ran[name]["duration_ns"], (name, ns, ran[name])

    # Each kernel under the stack it was launched from: Python functions (perf map) and native C frames.
    _, stacks = store.query_sql("""
        SELECT g.kernel_name, st.frame_ids, sum(g.duration_ns)
        FROM gpu_kernel_samples AS g
        INNER JOIN (SELECT stack_id, any(frame_ids) AS frame_ids FROM stacks GROUP BY stack_id) AS st
            ON g.stack_id = st.stack_id
        WHERE g.node = {n:String}
        GROUP BY g.kernel_name, st.frame_ids""", {"n": node})
    _, frames = store.query_sql("SELECT frame_id, any(function) FROM frames WHERE frame_id IN {ids:Array(UInt64)} "
                                "GROUP BY frame_id", {"ids": sorted({f for _, ids, _ in stacks for f in ids})})
    names = dict(frames)
    # the leaf is the kernel, demangled
    assert {k: names.get(ids[-1]) for k, ids, _ in stacks} == {k: demangle(k) for k, _, _ in stacks}
    assert demangle("_Z14flash_attn_fwdILi128EEvPKfS1_Pf") == "void flash_attn_fwd<128>(float const*, float const*, " \
        "float*)"
    for kernel, path in {**PYTHON_PATHS, **NATIVE_PATHS}.items():
        total = sum(ns for k, _, ns in stacks if k == kernel)
        under = 0
        for k, ids, ns in stacks:
            chain = [names.get(f, "?") for f in ids]
            short = [c.split(":")[2].rsplit(".", 1)[-1] if c.startswith("py::") else c for c in chain]
            if k == kernel and _contains_in_order(short, path):
                under += ns
        example = next(([names.get(f, "?") for f in ids] for k, ids, _ in stacks if k == kernel), [])
        assert total and under >= 0.9 * total, \
            f"{kernel}: {under} of {total} ns under {' → '.join(path)}; a stack: {' → '.join(example)}"

    # --comm selects GPU time too: the workload's CPU samples name its process
    since = datetime.fromtimestamp(time.time() - 3600, UTC).strftime("%Y-%m-%d %H:%M:%S")
    until = datetime.fromtimestamp(time.time() + 3600, UTC).strftime("%Y-%m-%d %H:%M:%S")
    by_comm = {}
    for comm in (PERF_PYTHON.name, "no-such-command"):
        cols, rows = store.query_named("top_kernels_gpu", {"since": since, "until": until, "node": node,
                                                           "comm": comm, "limit": 100})
        by_comm[comm] = {r[cols.index("function")]: int(r[cols.index("self")]) for r in rows if r[cols.index("self")]}
    assert by_comm[PERF_PYTHON.name] == {demangle(k): ns for k, (ns, _) in stored.items()}
    assert by_comm["no-such-command"] == {}

    # NVML: the simulated values, stored exactly.
    _, rows = store.query_sql("SELECT gpu_util_pct, mem_util_pct, mem_used_bytes, sm_clock_mhz, mem_clock_mhz, "
                              "power_mw, temperature_c, pcie_tx_kbps, pcie_rx_kbps, clock_event_reasons, name "
                              "FROM gpu_device_metrics WHERE node = {n:String}", {"n": node})
    assert rows and summary["gpu_metric_polls"] == len(rows)
    expected = (BUSY["gpu_util"], BUSY["mem_util"], BUSY["mem_used"], BUSY["sm_clock"], BUSY["mem_clock"],
                BUSY["power"], BUSY["temp"], BUSY["pcie_tx"], BUSY["pcie_rx"], BUSY["clock_events"])
    assert {tuple(r[:10]) for r in rows} == {expected}
    assert all("simulated" in r[10] for r in rows)

    # labels follow the data: the GPU kernel times and NVML readings are simulated, the eBPF CPU samples are not
    _, labelled = store.query_named("simulated_sources", {"since": since, "until": until, "node": node})
    assert sorted(tuple(r) for r in labelled) == [("gpu", node), ("nvml", node)]
    _, windows = store.query_sql("SELECT DISTINCT kind, simulated, frequency_hz FROM profile_windows "
                                 "WHERE node = {n:String} ORDER BY kind", {"n": node})
    assert [tuple(r) for r in windows] == [("cpu", False, 99), ("gpu", True, 0)]


def _contains_in_order(chain: list[str], path: list[str]) -> bool:
    """`path` appears in `chain` in order, root first (interpreter frames sit between Python ones)."""
    at = 0
    for name in chain:
        if at < len(path) and name == path[at]:
            at += 1
    return at == len(path)
