"""Copies, sets, CUDA graph kernels and NVTX launch ranges through the agent's GPU collector (the real BPF program)
against a C emitter of the probes (tests/depth_emitters.py). One collector and one emitter for the module (a compile
costs seconds); each test uses correlation ids of its own and checks counter differences."""

from __future__ import annotations

import io
from collections.abc import Iterator

import fastavro
import pytest

from producers.gpu_probes import GpuProbeCollector
from producers.gpu_records import UNREADABLE_RANGE
from producers.kernel_records import is_graph_launch, memory_fields
from schemas.gpu_launch_writer import LaunchEncoder
from schemas.single_object import default_registry, encode
from tests.depth_emitters import (
    T0,
    build_depth_emitter,
    expected_copies,
    expected_graph,
    expected_thread_ranges,
)
from tests.probe_emitters import Emitter, Procs, _collector, _drain

# --- no BPF needed ---


def test_copy_and_memory_kinds_are_labelled_as_the_contract_says() -> None:
    def fields(copy: int, is_set: int, src: int, dst: int) -> tuple:
        f = memory_fields(copy | (0x100 if is_set else 0) | src << 16 | dst << 24)
        return f["activity"], f["kernel_name"], f["copy_kind"], f["memory_kinds"]

    assert fields(1, 0, 2, 3) == ("MEMCPY", "[memcpy HtoD]", "HtoD", "pinned>device")
    assert fields(2, 0, 3, 1) == ("MEMCPY", "[memcpy DtoH]", "DtoH", "device>pageable")
    assert [fields(k, 0, 0, 0)[2] for k in range(12)] == ["unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD",
                                                          "DtoA", "DtoD", "HtoH", "PtoP", "unknown"]
    assert [fields(8, 0, k, 0)[3] for k in range(9)] == [
        f"{k}>unknown" for k in ("unknown", "pageable", "pinned", "device", "array", "managed", "device", "managed",
                                 "unknown")]
    assert fields(0, 1, 0, 5) == ("MEMSET", "[memset]", "", "managed")
    assert fields(7, 1, 2, 3) == ("MEMSET", "[memset]", "", "device")  # a set: its copy kind bits mean nothing


def test_graph_launch_apis() -> None:
    for api in ("cudaGraphLaunch", "cudaGraphLaunch_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
                "gpusimGraphLaunch (simulated)"):
        assert is_graph_launch(api), api
    for api in ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphInstantiate", "cudaGraphLaunchX", ""):
        assert not is_graph_launch(api), api


def test_fast_launch_writer_writes_range_and_graph_as_the_schema() -> None:
    enc = LaunchEncoder()
    rec = {"node": "n", "pid": 1, "tid": 2, "process_start_ns": 3, "time_ns": 4, "correlation_id": 5,
           "callback_id": 6, "api_name": "cudaGraphLaunch", "weight": 7, "nvtx_range": "train_step > forward",
           "graph": True, "user_addrs": [10, 11], "mappings": [], "code_objects": [], "simulated": True}
    assert enc.encode(rec) == encode("GpuLaunch", rec)
    other = dict(rec, nvtx_range="train_step > backward", graph=False)  # same tail, cached: the head differs
    assert enc.encode(other) == encode("GpuLaunch", other)
    sv = default_registry().latest("GpuLaunch")
    body = enc.encode(other)[len(enc.header):]
    got = fastavro.schemaless_reader(io.BytesIO(body), fastavro.parse_schema(sv.parsed, named_schemas={}))
    assert (got["nvtx_range"], got["graph"]) == ("train_step > backward", False)


# --- through BPF ---


@pytest.fixture(scope="module")
def depth(tmp_path_factory: pytest.TempPathFactory, bpf_ok: None) -> Iterator[tuple[GpuProbeCollector, Emitter]]:
    d = tmp_path_factory.mktemp("gpu_depth")
    binary = build_depth_emitter(d)
    view = d / "proc"
    view.mkdir()
    procs = Procs(view)
    c = _collector(procs)
    try:
        e = procs.start(binary)
        assert c.rescan() == [str(binary)]
        assert c.attached() == {str(binary): ["graph_kernel_executed", "kernel_launch", "launch_range",
                                              "memory_executed"]}
        yield c, e
    finally:
        c.close()
        for e in procs.started:
            e.close()


def _delta(c: GpuProbeCollector, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in c.counters().items() if v != before.get(k, 0)}


def test_copies_and_sets_carry_bytes_and_kinds(depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, e = depth
    before = c.counters()
    e.cmd("copy 8 100")
    launches, kernels = _drain(c, {e.pid}, 0, 8)
    assert launches == []
    assert sorted((k["correlation_id"], k["start_ns"], k["end_ns"], k["device_id"], k["stream_id"], k["bytes"],
                   k["activity"], k["kernel_name"], k["copy_kind"], k["memory_kinds"]) for k in kernels) == \
        expected_copies(8, 100)
    assert {(k["graph_id"], k["graph_node_id"], k["simulated"]) for k in kernels} == {(0, 0, False)}
    for k in kernels:
        assert encode("GpuKernel", k)  # a whole record of the latest schema
    # a copy is checked for plausible times like a kernel: dead-lettered with the reason
    e.cmd(f"ctimes {T0 + 10} {T0 + 5}")
    e.cmd(f"ctimes {T0 + 20} {T0 + 30}")
    _, kernels = _drain(c, {e.pid}, 0, 1)
    assert [(k["correlation_id"], k["kernel_name"], k["bytes"], k["start_ns"]) for k in kernels] == \
        [(43, "[memcpy HtoD]", 8, T0 + 20)]
    letters = c.take_dead_letters()
    assert [x["reason"] for x in letters] == [f"end_ns {T0 + 5} is before start_ns {T0 + 10}"]
    assert _delta(c, before) == {"copies": 7, "sets": 2, "kernel_times_implausible": 1}


def test_graph_kernels_carry_graph_and_node_ids_and_the_launch_correlation(
        depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, e = depth
    before = c.counters()
    e.cmd("graph 7 500 5 cudaGraphLaunch")
    e.cmd("graph 9 501 3 cuGraphLaunch_ptsz")
    e.cmd("launch 502")
    launches, kernels = _drain(c, {e.pid}, 3, 10)
    assert sorted((r["correlation_id"], r["api_name"], r["graph"], r["nvtx_range"]) for r in launches) == [
        (500, "cudaGraphLaunch", True, ""), (501, "cuGraphLaunch_ptsz", True, ""), (502, "cudaLaunchKernel", False, "")]
    assert sorted((k["correlation_id"], k["graph_id"], k["graph_node_id"], k["activity"], k["kernel_name"],
                   k["start_ns"], k["end_ns"], k["bytes"]) for k in kernels) == \
        sorted(expected_graph(7, 500, 5) + expected_graph(9, 501, 3))
    assert {(k["device_id"], k["stream_id"]) for k in kernels} == {(0, 3)}
    assert _delta(c, before) == {"graph_kernels": 8, "graph_launches": 2, "copies": 2}


def test_launch_ranges_join_their_own_launch(depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, e = depth
    before = c.counters()
    cut = "train_step > " + "x" * (511 - len("train_step > ") - 3) + "..."  # the emitter's cut: 511 bytes and NUL
    assert len(cut) == 511
    sent = {600: "train_step > forward", 601: "", 602: "train_step > backward",
            603: "train_step > backward > nccl:AllReduce", 604: "train_step > optimizer.step", 605: cut, 606: ""}
    for corr, path in sent.items():
        e.cmd(f"rlaunch {corr} {path}" if path else f"launch {corr}")
    e.cmd("threads 30 700")  # two threads, each switching ranges between launches
    threads = expected_thread_ranges(30, 700)
    launches, _ = _drain(c, {e.pid}, len(sent) + len(threads), 0)
    got = {r["correlation_id"]: r["nvtx_range"] for r in launches}
    assert len(got) == len(launches) == len(sent) + len(threads)
    assert got == {**sent, **threads}
    by_tid: dict[int, set[str]] = {}
    for r in launches:
        if r["correlation_id"] >= 700:
            by_tid.setdefault(r["tid"], set()).add(r["nvtx_range"].split(" > ")[0])
    assert sorted(by_tid.values(), key=sorted) == [{"", "thread0"}, {"", "thread1"}]  # each thread's own ranges
    assert e.pid not in by_tid
    attached = sum(1 for p in (*sent.values(), *threads.values()) if p)
    assert _delta(c, before) == {"ranges_attached": attached}


def test_unreadable_range_paths_are_read_from_the_process_or_marked(depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, e = depth
    before = c.counters()
    e.cmd("runtouched 801")
    e.cmd("rgone 800")  # after: the address it unmapped is not mapped again before the drain reads it
    launches, _ = _drain(c, {e.pid}, 2, 0)
    assert sorted((r["correlation_id"], r["nvtx_range"]) for r in launches) == [
        (800, UNREADABLE_RANGE), (801, "train_step > in an untouched page")]
    assert _delta(c, before) == {"ranges_attached": 2, "ranges_unreadable": 1, "ranges_read_from_process": 1}


def test_ranges_join_across_polls_cut_by_their_budget(depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, e = depth
    sent = {900 + i: (f"step > part{i}" if i % 4 else "") for i in range(11)}
    for corr, path in sent.items():
        e.cmd(f"rlaunch {corr} {path}" if path else f"launch {corr}")
    before = c.counters()
    c.max_pending = 3  # every ring is read 3 records a poll: the ranges ring only once the launches ring is empty
    try:
        got: dict[int, str] = {}
        polls = 0
        while len(got) < len(sent) and polls < 20:
            polls += 1
            got.update((r["correlation_id"], r["nvtx_range"]) for r in c.poll(0)[0] if r["pid"] == e.pid)
    finally:
        c.max_pending = 200_000
    got.update((r["correlation_id"], r["nvtx_range"]) for r in c.poll(0)[0] if r["pid"] == e.pid)
    assert got == sent
    delta = _delta(c, before)
    assert delta.pop("polls_cut") >= 4  # 11 launches and 8 ranges, 3 a poll
    assert delta == {"ranges_attached": 8}


def test_nothing_lost_or_unmatched(depth: tuple[GpuProbeCollector, Emitter]) -> None:
    c, _ = depth
    c.poll(0)
    c.poll(0)  # an unjoined range would be dropped and counted by now
    counts = c.counters()
    assert counts["lost_launches"] == counts["lost_kernels"] == counts["lost_ranges"] == 0
    assert counts["ranges_unmatched"] == counts["records_malformed"] == counts["stacks_missing"] == 0

