"""The GPU simulator's copies, sets, CUDA graphs and NVTX ranges (simulated), alone and through the agent's GPU
collector with the real BPF program: exact records against the simulator's own execution log and counters. One
simulator build (a file of this module's own, so attaching here turns on no probes in other tests' processes) and one
collector for the module."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.gpu_probes import GpuProbeCollector
from producers.kernel_records import memory_fields
from simulate.gpu import GpuSim, GraphNode, build_gpusim, memory_kind
from simulate.gpu_demo import workload_command as demo_command
from simulate.gpu_workload import STEP_RANGES
from tests.probe_emitters import Procs, _drain, attached_to, own_gpusim
from tests.usdt_probes import built

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "[range before attach]"
APIS = {"gpusimLaunchKernel (simulated)": "kernel", "gpusimMemcpyAsync (simulated)": "memcpy",
        "gpusimMemsetAsync (simulated)": "memset", "gpusimGraphLaunch (simulated)": "graph"}
LONG = ("a" * 250, "b" * 250, "c" * 250)


def _cut(path: str) -> str:
    """The header's rule: at most 511 bytes and the NUL; a longer path keeps 508 and ends in '...'."""
    return path if len(path) <= 511 else path[:508] + "..."


# --- no agent: what the simulator itself does ---


def test_without_an_agent_ranges_are_before_attach_and_records_exact() -> None:
    sim = GpuSim(built(build_gpusim))
    sim.synchronize()
    sim.log_start(256)
    sim.range_push("train_step")
    copy = sim.memcpy(1000, "HtoD", "pinned", "device", 2000, stream=4)
    fill = sim.memset(64, "managed", 1000)
    graph = sim.graph_create([GraphNode("k_a", 1000), GraphNode("", 500, 77, memory_kind("PtoP", "device", "device")),
                              GraphNode("k_b", 1500)])
    replay = sim.graph_launch(graph, stream=2)
    assert sim.range_pop() == 0 and sim.range_pop() == -1
    sim.synchronize()
    got = [(k.correlation_id, k.activity, k.name, k.bytes, k.memory_kind, k.graph_id, k.graph_node_id, k.api, k.range,
            k.stream_id, k.duration_ns, k.state) for k in sim.drain()]
    assert got == [
        (copy, "MEMCPY", "[memcpy HtoD]", 1000, 1 | 2 << 16 | 3 << 24, 0, 0, "memcpy", BEFORE, 4, 2000, "unseen"),
        (fill, "MEMSET", "[memset]", 64, 0x100 | 5 << 24, 0, 0, "memset", BEFORE, 0, 1000, "unseen"),
        (replay, "KERNEL", "k_a", 0, 0, graph, graph << 32 | 1, "graph", BEFORE, 2, 1000, "unseen"),
        (replay, "MEMCPY", "[memcpy PtoP]", 77, 10 | 3 << 16 | 3 << 24, graph, graph << 32 | 2, "graph", BEFORE, 2, 500,
         "unseen"),
        (replay, "KERNEL", "k_b", 0, 0, graph, graph << 32 | 3, "graph", BEFORE, 2, 1500, "unseen")]
    # the simulator's labels are the agent's
    for _, _, name, _, kind, *_ in got[:2]:
        assert memory_fields(kind)["kernel_name"] == name
    stats = sim.stats()
    assert stats["range_pops_unmatched"] >= 1 and stats["graph_launches_decided"] == 0


def test_depth_and_mixed_scenarios_report_exactly_what_they_launched() -> None:
    for scenario, per_step in (("depth", 0), ("mixed", 5)):
        out = subprocess.run([sys.executable, "-m", "simulate.gpu_workload", "--seconds", "1", "--launches-per-s",
                              "320", "--scenario", scenario], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        stats = report["simulator"]
        depth_steps = report["steps"] if scenario == "depth" else report["depth_steps"]
        train_steps = report["steps"] if per_step else 0
        assert report["simulated"] and report["scenario"] == scenario and stats["queue_dropped"] == 0
        # a depth step: 2 copies, a set, 5 kernels (2 NCCL-named) and a graph of 5 kernels and a copy
        assert stats["launches"] == per_step * train_steps + 8 * depth_steps
        assert (stats["graph_launches"], stats["graph_nodes_executed"]) == (depth_steps, 6 * depth_steps)
        assert stats["kernels_executed"] == per_step * train_steps + 14 * depth_steps
        assert stats["copies_executed"] == 4 * depth_steps
    assert demo_command()[-2:] == ["--scenario", "mixed"]


# --- through the agent ---

CHILD = r"""
import json, sys
from pathlib import Path
from simulate.gpu import GpuSim, GraphNode, memory_kind
sim = GpuSim(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
out = {}
def launch(label, name):
    out[label] = sim.launch(name, 1000)
sim.log_start(1024)
launch("outside", "k_outside")
sim.range_push("train_step")
sim.range_push("forward")
launch("forward", "k_forward")
graph = sim.graph_create([GraphNode("g_gemm", 2000), GraphNode("", 700, 4096, memory_kind("DtoD", "device", "device")),
                          GraphNode("g_norm", 1000)])
out["graph"] = sim.graph_launch(graph, 3)
out["graph_id"] = graph
sim.range_pop()
sim.range_push("backward")
sim.range_push("AllReduce", domain="nccl")
launch("allreduce", "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE")
sim.range_pop()
sim.range_push("plain", domain="")
launch("empty_domain", "k_plain")
sim.range_pop()
sim.range_pop()
sim.range_push("optimizer.step")
out["h2d"] = sim.memcpy(1 << 20, "HtoD", "pinned", "device", 3000, 1)
out["set"] = sim.memset(512, "device", 500, 1)
out["d2h"] = sim.memcpy(4, "DtoH", "device", "pageable", 200, 1)
sim.range_pop()
sim.range_pop()
for part in ("a" * 250, "b" * 250, "c" * 250):
    sim.range_push(part)
launch("cut", "k_cut")
for _ in range(3):
    sim.range_pop()
for _ in range(34):
    sim.range_push("r")
launch("deep", "k_deep")
for _ in range(34):
    sim.range_pop()
out["unmatched_pop"] = sim.range_pop()
launch("after", "k_after")
sim.synchronize()
out["log"] = [[k.correlation_id, k.activity, k.name, k.bytes, k.graph_id, k.graph_node_id, k.range, k.state, k.weight,
               k.start_ns, k.end_ns] for k in sim.drain()]
out["stats"] = sim.stats()
print(json.dumps(out), flush=True)
sys.stdin.readline()
"""


@pytest.fixture(scope="module")
def attached(tmp_path_factory: pytest.TempPathFactory, bpf_ok: None) -> Iterator[tuple[GpuProbeCollector, Path]]:
    d = tmp_path_factory.mktemp("gpusim_depth")
    lib = own_gpusim(d / "native")
    view = d / "proc"
    view.mkdir()
    with attached_to(Procs(view), lib) as c:  # before any test's process maps it: every launch is decided
        yield c, lib


def _child(lib: Path, script: str, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, str(lib), *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env})


def test_ranges_copies_and_graphs_reach_the_agent_exactly(attached: tuple[GpuProbeCollector, Path]) -> None:
    c, lib = attached
    child = _child(lib, CHILD, FLEETPROF_LAUNCH_RATE="0", FLEETPROF_GRAPH_LAUNCH_RATE="0")
    try:
        assert child.stdout.readline().strip() == "ready"
        before = c.counters()
        child.stdin.write("go\n")
        child.stdin.flush()
        out = json.loads(child.stdout.readline())
        launches, kernels = _drain(c, {child.pid}, 11, 13)
    finally:
        child.kill()
        child.wait()
    paths = {
        "outside": "", "forward": "train_step > forward", "graph": "train_step > forward",
        "allreduce": "train_step > backward > nccl:AllReduce", "empty_domain": "train_step > backward > plain",
        "h2d": "train_step > optimizer.step", "set": "train_step > optimizer.step",
        "d2h": "train_step > optimizer.step", "cut": _cut(" > ".join(LONG)),
        "deep": " > ".join(["r"] * 32) + " > ...", "after": ""}
    assert len(paths["cut"]) == 511 and paths["cut"].endswith("...")
    by_corr = {r["correlation_id"]: r for r in launches}
    assert len(by_corr) == len(launches) == len(paths)
    assert {corr: (r["nvtx_range"], r["graph"], r["weight"]) for corr, r in by_corr.items()} == {
        out[label]: (path, label == "graph", 1) for label, path in paths.items()}
    assert by_corr[out["graph"]]["api_name"] == "gpusimGraphLaunch (simulated)"
    assert {by_corr[out[k]]["api_name"] for k in ("h2d", "d2h")} == {"gpusimMemcpyAsync (simulated)"}
    # the simulator's log says the same paths
    assert {e[0]: (e[6] or "") for e in out["log"]} == {out[label]: path for label, path in paths.items()}
    graph = out["graph_id"]
    records = sorted((k["correlation_id"], k["activity"], k["kernel_name"], k["bytes"], k["copy_kind"],
                      k["memory_kinds"], k["graph_id"], k["graph_node_id"], k["stream_id"]) for k in kernels)
    corr = out["graph"]
    expected_graph = [(corr, "KERNEL", "g_gemm", 0, "", "", graph, graph << 32 | 1, 3),
                      (corr, "MEMCPY", "[memcpy DtoD]", 4096, "DtoD", "device>device", graph, graph << 32 | 2, 3),
                      (corr, "KERNEL", "g_norm", 0, "", "", graph, graph << 32 | 3, 3)]
    expected_copies = [(out["h2d"], "MEMCPY", "[memcpy HtoD]", 1 << 20, "HtoD", "pinned>device", 0, 0, 1),
                       (out["set"], "MEMSET", "[memset]", 512, "", "device", 0, 0, 1),
                       (out["d2h"], "MEMCPY", "[memcpy DtoH]", 4, "DtoH", "device>pageable", 0, 0, 1)]
    kernel_names = {"outside": "k_outside", "forward": "k_forward", "empty_domain": "k_plain", "cut": "k_cut",
                    "deep": "k_deep", "after": "k_after",
                    "allreduce": "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"}
    expected_kernels = [(out[label], "KERNEL", name, 0, "", "", 0, 0, 0) for label, name in kernel_names.items()]
    assert records == sorted(expected_graph + expected_copies + expected_kernels)
    # the times are the simulator's, to the nanosecond
    log_times = sorted((e[0], e[2], e[9], e[10]) for e in out["log"])
    assert sorted((k["correlation_id"], k["kernel_name"], k["start_ns"], k["end_ns"]) for k in kernels) == log_times
    assert {(e[7], e[8]) for e in out["log"]} == {("sampled", 1)}
    stats = out["stats"]
    assert out["unmatched_pop"] == -1 and stats["range_pops_unmatched"] == 1
    assert (stats["ranges_fired"], stats["range_paths_cut"], stats["ranges_too_deep"]) == (9, 2, 2)
    delta = {k: v - before.get(k, 0) for k, v in c.counters().items() if v != before.get(k, 0)}
    assert delta == {"ranges_attached": 9, "copies": 3, "sets": 1, "graph_kernels": 2, "graph_launches": 1}


DEPTH_CHILD = r"""
import json, sys
from pathlib import Path
from simulate.gpu import GpuSim
from simulate import gpu_workload as workload
sim = GpuSim(Path(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
print(json.dumps(workload.run_depth(float(sys.argv[2]), float(sys.argv[3]), sim)), flush=True)
sys.stdin.readline()
"""


def test_depth_workload_under_rate_limits_every_sampled_record_once(attached: tuple[GpuProbeCollector, Path]) -> None:
    c, lib = attached
    child = _child(lib, DEPTH_CHILD, "3", "800", FLEETPROF_LAUNCH_RATE="60", FLEETPROF_GRAPH_LAUNCH_RATE="5")
    launches, kernels = [], []
    try:
        assert child.stdout.readline().strip() == "ready"
        before = c.counters()
        child.stdin.write("go\n")
        child.stdin.flush()
        ready = selectors.DefaultSelector()  # not select.select: a long test session's descriptors pass 1024
        ready.register(child.stdout, selectors.EVENT_READ)
        while not ready.select(0):  # drain while it runs: the rings are bounded
            more_l, more_k = c.poll(100)
            launches += [r for r in more_l if r["pid"] == child.pid]
            kernels += [r for r in more_k if r["pid"] == child.pid]
        report = json.loads(child.stdout.readline())
        more_l, more_k = _drain(c, {child.pid}, 0, 0)
        launches += more_l
        kernels += more_k
    finally:
        child.kill()
        child.wait()
    stats = report["simulator"]
    steps = report["steps"]
    assert report["simulated"] and stats["queue_dropped"] == stats["log_dropped"] == 0
    assert stats["launches"] == stats["launches_decided"] == 8 * steps
    assert stats["graph_launches"] == stats["graph_launches_decided"] == steps
    assert 0 < stats["graph_launches_sampled"] < steps  # its own, lower rate limit
    assert len(launches) == stats["launches_sampled"] + stats["graph_launches_sampled"]
    assert sum(r["weight"] for r in launches if r["graph"]) == stats["graph_weight_sum"]
    assert sum(r["weight"] for r in launches if not r["graph"]) == stats["weight_sum"]
    # every sampled launch once, with the simulator's weight and range path
    assert sorted([r["correlation_id"], APIS[r["api_name"]], r["weight"], r["nvtx_range"]] for r in launches) == \
        sorted(report["sampled"])
    assert {r["nvtx_range"].split(" > ")[1] if " > " in r["nvtx_range"] else r["nvtx_range"] for r in launches} <= {
        "train_step", *STEP_RANGES}
    # and every record fired for them, grouped as the simulator's log groups them
    range_of = {r["correlation_id"]: r["nvtx_range"] for r in launches}
    got = Counter((k["activity"], k["kernel_name"], k["bytes"], k["graph_id"], k["graph_node_id"],
                   range_of[k["correlation_id"]]) for k in kernels)
    assert got == {tuple(row[:-1]): row[-1] for row in report["fired"]}
    assert len(kernels) == stats["kernels_fired"]
    assert sum(1 for k in kernels if k["activity"] != "KERNEL") == stats["copies_fired"]
    assert sum(1 for k in kernels if k["graph_id"]) == stats["graph_nodes_fired"]
    delta = {k: v - before.get(k, 0) for k, v in c.counters().items()}
    assert delta["ranges_attached"] == stats["ranges_fired"] == sum(1 for r in launches if r["nvtx_range"])
    assert delta["graph_kernels"] == sum(1 for k in kernels if k["graph_id"] and k["activity"] == "KERNEL")
    assert delta["lost_launches"] == delta["lost_kernels"] == delta["lost_ranges"] == delta["ranges_unmatched"] == 0
    assert all(r["simulated"] for r in launches + kernels)

