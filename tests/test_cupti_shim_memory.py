"""The CUPTI shim's memory copies and sets and its CUDA graph launches, against the simulated libcupti
(native/sim/cupti/): their launch APIs under the rate limits (graph launches under their own), their MEMCPY / MEMSET,
peer-to-peer MEMCPY2 and graph kernel records, what the record file says of them, and which records come when only
sampled launches are timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from producers.cupti_shim import build_shim
from simulate.cupti import build_simulated_cupti
from tests.usdt_probes import built

# The drivers' start (this file's and test_cupti_shim_probes'): the simulated libcupti, its launch calls' arguments
SIMULATED_CUPTI = r"""
import ctypes, json, os, sys, time
cupti = ctypes.CDLL(os.environ["FLEETPROF_CUPTI_LIBRARY"], mode=ctypes.RTLD_GLOBAL)
u32, u64, s = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_char_p
cupti.simcupti_launch.argtypes = [u32, u32, s, s, u32, u64, u32, ctypes.c_int, ctypes.c_int]
cupti.simcupti_memory.argtypes = [u32, u32, s, ctypes.c_int, u32, u32, u32, u64, u64, u32, ctypes.c_int]
cupti.simcupti_graph_launch.argtypes = [u32, u32, s, s, u32, u32, u32, u64, u64, u32]
cupti.simcupti_peer_copy.argtypes = [u32, u32, s, u32, u32, u32, u64, u64, u32, ctypes.c_int]
"""

DRIVER = SIMULATED_CUPTI + r"""
for f in (cupti.simcupti_launch, cupti.simcupti_memory, cupti.simcupti_graph_launch, cupti.simcupti_peer_copy):
    f.restype = u32
shim = ctypes.CDLL(sys.argv[1])
shim.InitializeInjection()
ids, spans = [], []  # spans: CLOCK_REALTIME before and after each call
for _ in range(int(sys.argv[3])):
    for op, *args in json.loads(sys.argv[2]):
        args = [a.encode() if isinstance(a, str) else a for a in args]
        before = time.time_ns()
        ids.append(getattr(cupti, "simcupti_" + op)(*args))
        spans.append([before, time.time_ns()])
totals = (ctypes.c_uint64 * 5)()
cupti.cuptiActivityFlushAll(0)
cupti.simcupti_totals(totals)
print(json.dumps({"ids": ids, "spans": spans, "totals": list(totals)}))
"""

RUNTIME, DRIVER_API = 0, 1
HTOD, DTOH, DTOD, PTOP = 1, 2, 8, 10  # CUpti_ActivityMemcpyKind
PAGEABLE, PINNED, DEVICE = 1, 2, 3  # CUpti_ActivityMemoryKind


def memory_kind(copy_kind: int, is_set: int, src: int, dst: int) -> int:
    """FLEETPROF_MEMORY_KIND of native/include/fleetprof_probes.h."""
    return copy_kind | (0x100 if is_set else 0) | src << 16 | dst << 24


PLAN = [
    # memory: driver, cbid, api, is_set, copy_kind, src, dst, bytes, duration, stream, fail
    ["memory", RUNTIME, 31, "cudaMemcpy", 0, HTOD, PAGEABLE, DEVICE, 4096, 1000, 0, 0],
    ["memory", RUNTIME, 225, "cudaMemcpyAsync_ptsz", 0, DTOH, DEVICE, PINNED, 1 << 20, 2000, 3, 0],
    ["memory", DRIVER_API, 277, "cuMemcpyHtoDAsync_v2", 0, HTOD, PINNED, DEVICE, 512, 500, 3, 0],
    ["memory", RUNTIME, 51, "cudaMemsetAsync", 1, 0, 0, DEVICE, 256, 300, 0, 0],
    ["memory", DRIVER_API, 249, "cuMemsetD8_v2", 1, 0, 0, DEVICE, 64, 100, 0, 1],  # fails: no record
    # graph: driver, cbid, api, kernel, graph id, kernels, copies, copy bytes, duration, stream
    ["graph_launch", RUNTIME, 311, "cudaGraphLaunch", "k_node", 7, 3, 2, 4096, 100, 5],
    ["graph_launch", DRIVER_API, 514, "cuGraphLaunch", "k_drv", 9, 2, 0, 0, 200, 6],
    ["launch", RUNTIME, 211, "cudaLaunchKernel", "k_plain", 1, 1000, 0, 0, 0],
]


@pytest.fixture(scope="module")
def libraries() -> tuple[Path, Path]:
    return built(build_shim), built(build_simulated_cupti)


def drive(libraries: tuple[Path, Path], plan: list, env: dict[str, str], repeat: int = 1) -> dict[str, Any]:
    shim, cupti = libraries
    out = subprocess.run([sys.executable, "-c", DRIVER, str(shim), json.dumps(plan), str(repeat)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FLEETPROF_CUPTI_LIBRARY": str(cupti), **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def records(path: Path) -> dict[str, list[dict[str, Any]]]:
    by_type: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        by_type.setdefault(record["type"], []).append(record)
    return by_type


def test_copies_sets_and_graph_nodes_are_recorded(libraries: tuple[Path, Path], tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    run = drive(libraries, PLAN, {"FLEETPROF_CUPTI_RECORD": str(path), "FLEETPROF_LAUNCH_RATE": "0",
                                  "FLEETPROF_GRAPH_LAUNCH_RATE": "0"})
    h2d, d2h, drv_h2d, memset, _failed, graph, drv_graph, plain = run["ids"]
    r = records(path)
    assert [(x["correlation_id"], x["api"], x["kind"], x["weight"]) for x in r["launch"]] == [
        (h2d, "cudaMemcpy", "copy", 1), (d2h, "cudaMemcpyAsync_ptsz", "copy", 1),
        (drv_h2d, "cuMemcpyHtoDAsync_v2", "copy", 1), (memset, "cudaMemsetAsync", "set", 1),
        (graph, "cudaGraphLaunch", "graph", 1), (drv_graph, "cuGraphLaunch", "graph", 1),
        (plain, "cudaLaunchKernel", "kernel", 1)]
    assert [(m["correlation_id"], m["bytes"], m["memory_kind"], m["end_ns"] - m["start_ns"], m["stream_id"],
             m["graph_id"], m["graph_node_id"], m["fired"]) for m in r["memory"]] == [
        (h2d, 4096, memory_kind(HTOD, 0, PAGEABLE, DEVICE), 1000, 0, 0, 0, True),
        (d2h, 1 << 20, memory_kind(DTOH, 0, DEVICE, PINNED), 2000, 3, 0, 0, True),
        (drv_h2d, 512, memory_kind(HTOD, 0, PINNED, DEVICE), 500, 3, 0, 0, True),
        (memset, 256, memory_kind(0, 1, 0, DEVICE), 300, 0, 0, 0, True),
        *[(graph, 4096, memory_kind(DTOD, 0, DEVICE, DEVICE), 100, 5, 7, node, True) for node in (4, 5)]]
    assert [(k["correlation_id"], k["name"], k["graph_id"], k["graph_node_id"]) for k in r["kernel"]] == [
        *[(graph, "k_node", 7, node) for node in (1, 2, 3)],
        *[(drv_graph, "k_drv", 9, node) for node in (1, 2)],
        (plain, "k_plain", 0, 0)]
    # a graph's records follow one another from its launch, none overlapping
    nodes = sorted((x["start_ns"], x["end_ns"]) for x in r["kernel"] + r["memory"] if x["correlation_id"] == graph)
    assert all(a[1] <= b[0] for a, b in zip(nodes, nodes[1:], strict=False))
    summary = r["summary"][0]
    assert {k: summary[k] for k in ("copies", "sets", "memory_skipped", "memory_unseen", "kernels", "graph_kernels",
                                    "graph_launches", "graph_launches_sampled", "launches", "launches_failed",
                                    "records_implausible", "records_dropped")} == {
        "copies": 5, "sets": 1, "memory_skipped": 0, "memory_unseen": 0, "kernels": 6, "graph_kernels": 5,
        "graph_launches": 2, "graph_launches_sampled": 2, "launches": 7, "launches_failed": 1,
        "records_implausible": 0, "records_dropped": 0}
    generated, dropped, delivered, generated_ns, _ = run["totals"]
    assert (generated, dropped, delivered) == (12, 0, 12)
    assert summary["gpu_ns"] == generated_ns == 1000 + 2000 + 500 + 300 + 5 * 100 + 2 * 200 + 1000


def test_graph_launches_have_their_own_rate_limit_and_hold_their_whole_replay(libraries: tuple[Path, Path],
                                                                             tmp_path: Path) -> None:
    # sampled mode: a copy, a set and a graph launch of 4 kernels and 2 copies, 800 times on one thread; the launch
    # rate limit samples the copies and sets, the graph rate limit the graph launches
    path = tmp_path / "records.jsonl"
    plan = [PLAN[1], PLAN[3], ["graph_launch", RUNTIME, 311, "cudaGraphLaunch", "k_node", 3, 4, 2, 64, 100, 0]]
    drive(libraries, plan, {"FLEETPROF_CUPTI_RECORD": str(path), "FLEETPROF_CUPTI_ACTIVITY": "sampled",
                            "FLEETPROF_LAUNCH_RATE": "50", "FLEETPROF_GRAPH_LAUNCH_RATE": "20"}, repeat=800)
    r = records(path)
    assert r["on"][0]["activity"] == "sampled"
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for launch in r["launch"]:
        by_kind.setdefault(launch["kind"], []).append(launch)
    assert {k: len(v) for k, v in by_kind.items()} == {"copy": 800, "set": 800, "graph": 800}
    graph_weights = [x["weight"] for x in r["launch"] if x["kind"] == "graph"]
    other_weights = [x["weight"] for x in r["launch"] if x["kind"] != "graph"]
    # each limit's weights add up to its own launches exactly, less the skips after its last sampled launch
    for weights in (graph_weights, other_weights):
        trailing = len(weights) - max(i for i, w in enumerate(weights) if w) - 1
        assert sum(weights) + trailing == len(weights)
        assert 0 < sum(map(bool, weights)) < len(weights) / 4
    sampled = {x["correlation_id"]: x["kind"] for x in r["launch"] if x["weight"]}
    got: dict[int, list[str]] = {}
    for k in r["kernel"]:
        got.setdefault(k["correlation_id"], []).append("kernel")
    for m in r["memory"]:
        got.setdefault(m["correlation_id"], []).append("set" if m["memory_kind"] & 0x100 else "copy")
    # every record of every sampled launch (a graph's 4 kernels and 2 copies), none of a skipped one
    expected = {"copy": ["copy"], "set": ["set"], "graph": ["kernel"] * 4 + ["copy"] * 2}
    assert got == {cid: expected[kind] for cid, kind in sampled.items()}
    summary = r["summary"][0]
    assert (summary["memory_skipped"], summary["kernels_skipped"], summary["graph_kernels"]) == (
        0, 0, 4 * summary["graph_launches_sampled"])


PEER_PLAN = [
    # peer_copy: driver, cbid, api, device (where it runs), src device, dst device, bytes, duration, stream, fail
    ["peer_copy", RUNTIME, 160, "cudaMemcpyPeer", 1, 1, 0, 1 << 24, 3000, 0, 0],
    ["peer_copy", DRIVER_API, 426, "cuMemcpyPeerAsync_ptsz", 2, 3, 2, 65536, 700, 4, 0],
    ["peer_copy", RUNTIME, 161, "cudaMemcpyPeerAsync", 0, 0, 1, 128, 50, 0, 1],  # fails: no record
]


def test_peer_to_peer_copies_fire_memory_executed_as_ptop(libraries: tuple[Path, Path], tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    run = drive(libraries, PEER_PLAN, {"FLEETPROF_CUPTI_RECORD": str(path), "FLEETPROF_LAUNCH_RATE": "0"})
    peer, peer_async, _failed = run["ids"]
    r = records(path)
    assert [(x["correlation_id"], x["api"], x["kind"], x["weight"]) for x in r["launch"]] == [
        (peer, "cudaMemcpyPeer", "copy", 1), (peer_async, "cuMemcpyPeerAsync_ptsz", "copy", 1)]
    ptop = memory_kind(PTOP, 0, DEVICE, DEVICE)
    assert [(m["correlation_id"], m["bytes"], m["memory_kind"], m["device_id"], m["stream_id"],
             m["end_ns"] - m["start_ns"], m["graph_id"], m["graph_node_id"], m["fired"]) for m in r["memory"]] == [
        (peer, 1 << 24, ptop, 1, 0, 3000, 0, 0, True), (peer_async, 65536, ptop, 2, 4, 700, 0, 0, True)]
    # CUPTI's times as they are (the simulated clock is CLOCK_REALTIME): each copy starts within its call
    for m, (before, after) in zip(r["memory"], run["spans"], strict=False):
        assert before <= m["start_ns"] <= after
    summary = r["summary"][0]
    assert {k: summary[k] for k in ("copies", "memory_skipped", "memory_unseen", "launches", "launches_failed",
                                    "records_implausible", "records_dropped")} == {
        "copies": 2, "memory_skipped": 0, "memory_unseen": 0, "launches": 2, "launches_failed": 1,
        "records_implausible": 0, "records_dropped": 0}
    generated, dropped, delivered, generated_ns, _ = run["totals"]
    assert (generated, dropped, delivered) == (2, 0, 2)
    assert summary["gpu_ns"] == generated_ns == 3000 + 700


@pytest.mark.parametrize("activity", ["sampled", "always"])
def test_a_skipped_launchs_peer_copy_fires_nothing(libraries: tuple[Path, Path], tmp_path: Path,
                                                   activity: str) -> None:
    # 800 peer copies under the launch rate limit: sampled mode times only the sampled launches' copies (MEMCPY2 held
    # on around them); always mode times every copy and fires only those of sampled launches
    path = tmp_path / "records.jsonl"
    drive(libraries, PEER_PLAN[1:2], {"FLEETPROF_CUPTI_RECORD": str(path), "FLEETPROF_CUPTI_ACTIVITY": activity,
                                      "FLEETPROF_LAUNCH_RATE": "50"}, repeat=800)
    r = records(path)
    assert r["on"][0]["activity"] == activity
    sampled = {x["correlation_id"] for x in r["launch"] if x["weight"]}
    skipped = {x["correlation_id"] for x in r["launch"] if not x["weight"]}
    assert len(sampled) + len(skipped) == 800 and 0 < len(sampled) < 800 / 4
    fired = [m for m in r["memory"] if m["fired"]]
    assert sorted(m["correlation_id"] for m in fired) == sorted(sampled)
    assert all((m["bytes"], m["memory_kind"], m["device_id"], m["stream_id"], m["end_ns"] - m["start_ns"]) ==
               (65536, memory_kind(PTOP, 0, DEVICE, DEVICE), 2, 4, 700) for m in r["memory"])
    not_fired = sorted(m["correlation_id"] for m in r["memory"] if not m["fired"])
    assert not_fired == (sorted(skipped) if activity == "always" else [])
    summary = r["summary"][0]
    assert (summary["copies"], summary["memory_skipped"]) == (len(r["memory"]), len(not_fired))
