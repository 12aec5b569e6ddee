"""The GPU timeline's endpoint (/api/timeline) over a real uvicorn and chDB store: known records of gpu_timeline
(migration 0014) written straight into the store, on top of the web UI tests' known rows (tests/webui_helpers.py),
and the exact answer: lanes, bars, names as the flame graph names them, stacks, the range limit and the bar cap."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import httpx

from fleetprof.webui import timeline

NS = 1_000_000_000
MIB = 1 << 20
ALL_REDUCE = "[nccl AllReduce bfloat16] ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
MANGLED_ALL_REDUCE = "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
TIMELINE_COLUMNS = ["ts", "node", "pid", "comm", "device", "stream", "start_ns", "duration_ns", "activity", "name",
                    "stack_id", "weight", "bytes", "nvtx_range", "graph_id", "graph_node_id", "correlation_id"]


def add_timeline(ui) -> None:
    """Sampled records of n1's train (pid 10) in the first 10 s window, as the sink writes them: GPU 0 stream 7 two
    GEMMs (the second replayed by CUDA graph 3, node 17), GPU 0 stream 8 an NCCL all-reduce (stored mangled, its
    stack's leaf demangled), GPU 1 stream 0 a host-to-device copy and a set whose stack the store never got; one
    record of n2 and one of n1 at t0 + 30 s, outside the ranges the tests ask for but the whole one."""
    t0 = datetime.fromtimestamp(ui.t0, tz=UTC)
    frames = [[9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "[gpu]",
               "GPU_KERNEL", t0], [11, "[memcpy HtoD]", "[gpu]", "GPU_KERNEL", t0]]
    ui.store.insert("frames", frames, ["frame_id", "function", "binary", "kind", "last_seen"])
    ui.store.insert("stacks", [[202, [1, 6, 9], t0], [204, [1, 6, 11], t0]], ["stack_id", "frame_ids", "last_seen"])
    s = ui.t0 * NS
    rows = [
        # node, pid, device, stream, start, end, activity, name, stack, weight, bytes, range, graph, graph node
        ["n1", 10, 0, 7, s + 1 * NS, s + 1 * NS + 4_000_000, "KERNEL", "gemm_kernel", 200, 4, 0,
         "train_step > forward", 0, 0],
        ["n1", 10, 0, 7, s + 2 * NS, s + 2 * NS + 3_000_000, "KERNEL", "gemm_kernel", 200, 4, 0,
         "train_step > backward", 3, 17],
        ["n1", 10, 0, 8, s + 3 * NS, s + 3 * NS + 2_000_000, "KERNEL", MANGLED_ALL_REDUCE, 202, 1, 0,
         "train_step > backward", 0, 0],
        ["n1", 10, 1, 0, s + 1_500_000_000, s + 1_500_000_000 + 250_000, "MEMCPY", "[memcpy HtoD]", 204, 2, 4 * MIB,
         "train_step", 0, 0],
        ["n1", 10, 1, 0, s + 4 * NS, s + 4 * NS + 50_000, "MEMSET", "[memset]", 205, 2, MIB, "", 0, 0],
        ["n2", 20, 0, 7, s + 1 * NS, s + 1 * NS + 1_000_000, "KERNEL", "gemm_kernel", 200, 1, 0, "", 0, 0],
        ["n1", 10, 0, 7, s + 30 * NS, s + 30 * NS + 1_000_000, "KERNEL", "gemm_kernel", 200, 1, 0, "", 0, 0],
    ]
    ui.store.insert("gpu_timeline", [[t0, node, pid, "", device, stream, start, end - start, activity, name, stack,
                                      weight, nbytes, nvtx, graph, graph_node, k + 1]
                                     for k, (node, pid, device, stream, start, end, activity, name, stack, weight,
                                             nbytes, nvtx, graph, graph_node) in enumerate(rows)], TIMELINE_COLUMNS)


def test_timeline_endpoint_returns_exact_bars_lanes_and_stacks(served):
    ui = served
    add_timeline(ui)
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        body = http.get("/api/timeline", params={"node": "n1", "from": ui.t0, "to": ui.t0 + 10}).json()
    assert body["since_ns"] == str(ui.t0 * NS) and body["until_ns"] == str((ui.t0 + 10) * NS)
    assert body["span_ns"] == 10 * NS and body["count"] == 5 and body["capped"] is False
    assert body["limit"] == timeline.BAR_LIMIT and body["expired"] == ""
    assert body["lanes"] == [{"node": "n1", "device": 0, "stream": 7}, {"node": "n1", "device": 0, "stream": 8},
                             {"node": "n1", "device": 1, "stream": 0}]
    # names and stacks once each, numbered in order of first appearance (bars by start)
    assert body["names"] == ["gemm_kernel", "[memcpy HtoD]", ALL_REDUCE, "[memset]"]
    assert body["ranges"] == ["train_step > forward", "train_step", "train_step > backward", ""]
    assert body["processes"] == ["train (pid 10)"]  # named as the flame graph's process frame, comm from CPU samples
    assert body["stack_ids"] == ["200", "204", "202", "205"]
    assert [[body["frames"][f] for f in stack] for stack in body["stacks"]] == [
        ["main", "launch", "gemm_kernel"], ["main", "launch", "[memcpy HtoD]"], ["main", "launch", ALL_REDUCE],
        ["[unknown stack 0xcd]"]]
    assert body["kinds"] == ["kernel", "copy", "set", "collective"]
    assert body["bars"] == {
        "lane": [0, 2, 0, 1, 2],
        "start": [1 * NS, 1_500_000_000, 2 * NS, 3 * NS, 4 * NS],
        "end": [1 * NS + 4_000_000, 1_500_250_000, 2 * NS + 3_000_000, 3 * NS + 2_000_000, 4 * NS + 50_000],
        "kind": [0, 1, 0, 3, 2], "name": [0, 1, 0, 2, 3], "stack": [0, 1, 0, 2, 3], "process": [0, 0, 0, 0, 0],
        "range": [0, 1, 2, 2, 3], "weight": [4, 2, 4, 1, 2], "bytes": [0, 4 * MIB, 0, 0, MIB],
        "graph": [0, 0, 3, 0, 0], "graph_node": [0, 0, 17, 0, 0]}
    assert body["simulated"] == ["n1"]  # n1's GPU records come from the simulated GPU library (profile_windows)


def test_timeline_endpoint_filters_and_all_nodes(served):
    ui = served
    add_timeline(ui)
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        both = http.get("/api/timeline", params={"from": ui.t0, "to": ui.t0 + 2}).json()
        # a bar that overlaps the range's start is in it, at a negative start
        late = http.get("/api/timeline", params={"node": "n1", "from": ui.t0 + 1.002, "to": ui.t0 + 1.6}).json()
        none = http.get("/api/timeline", params={"node": "n1", "pid": 99, "from": ui.t0, "to": ui.t0 + 10}).json()
        window = {"node": "n1", "from": ui.t0, "to": ui.t0 + 10}
        only = http.get("/api/timeline", params={**window, "collectives": "only"}).json()
        hidden = http.get("/api/timeline", params={**window, "collectives": "hide"}).json()
        bad = http.get("/api/timeline", params={**window, "collectives": "some"})
        copies = http.get("/api/timeline", params={**window, "what": "copies"}).json()
        kernels = http.get("/api/timeline", params={**window, "what": "kernels"}).json()
        backward = http.get("/api/timeline", params={**window, "nvtx_range": "backward"}).json()
        under_step = http.get("/api/timeline", params={**window, "nvtx_range": "train_step > forward"}).json()
    assert both["lanes"] == [{"node": "n1", "device": 0, "stream": 7}, {"node": "n1", "device": 1, "stream": 0},
                             {"node": "n2", "device": 0, "stream": 7}]
    assert both["processes"] == ["train (pid 10 on n1)", "serve (pid 20 on n2)"]
    assert both["bars"]["lane"] == [0, 2, 1] and both["bars"]["process"] == [0, 1, 0]
    assert late["bars"]["start"] == [-2_000_000, 498_000_000] and late["bars"]["lane"] == [0, 1]
    assert none["count"] == 0 and none["lanes"] == [] and none["stacks"] == [] and none["bars"]["start"] == []
    # NCCL's collectives alone or hidden, as the GPU flame graph shows them (copies and sets are not collectives)
    assert only["names"] == [ALL_REDUCE] and only["bars"]["kind"] == [3] and only["filters"]["collectives"] == "only"
    assert hidden["names"] == ["gemm_kernel", "[memcpy HtoD]", "[memset]"] and hidden["bars"]["kind"] == [0, 1, 0, 2]
    assert bad.status_code == 400 and bad.json() == {"error": "collectives must be one of all, hide, only, not 'some'"}
    # kernels or copies and sets, and the NVTX range rule of the GPU flame graph (an element, or a path's prefix)
    assert copies["names"] == ["[memcpy HtoD]", "[memset]"] and copies["filters"]["what"] == "copies"
    assert kernels["names"] == ["gemm_kernel", ALL_REDUCE] and kernels["bars"]["kind"] == [0, 0, 3]
    assert backward["bars"]["start"] == [2 * NS, 3 * NS] and backward["ranges"] == ["train_step > backward"]
    assert under_step["bars"]["start"] == [1 * NS] and "nvtx_level" not in under_step["filters"]


def test_timeline_endpoint_refuses_long_ranges_and_caps_bars(served, monkeypatch):
    ui = served
    add_timeline(ui)
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        long = http.get("/api/timeline", params={"node": "n1", "from": ui.t0, "to": ui.t0 + 301})
        assert long.status_code == 400
        assert long.json() == {"error": "the timeline shows at most 5 minutes: select a shorter range (this one is "
                                        "301 s)"}
        assert http.get("/api/timeline", params={"node": "n1", "to": ui.t0}).json() == {"error": "from is required"}
        monkeypatch.setattr(timeline, "BAR_LIMIT", 3)
        capped = http.get("/api/timeline", params={"node": "n1", "from": ui.t0, "to": ui.t0 + 300}).json()
    # the first bars by start, and word that there are more
    assert capped["capped"] is True and capped["count"] == 3 and capped["limit"] == 3
    assert capped["bars"]["start"] == [1 * NS, 1_500_000_000, 2 * NS]


def test_a_range_older_than_the_timeline_keeps_says_so(served):
    ui = served
    add_timeline(ui)
    old = int(time.time()) - timeline.DETAIL_KEEP_S - 600
    with httpx.Client(base_url=ui.url, timeout=30) as http:
        body = http.get("/api/timeline", params={"node": "n1", "from": old, "to": old + 60}).json()
        recent = http.get("/api/timeline", params={"node": "n1", "from": ui.t0, "to": ui.t0 + 10}).json()
    assert body["count"] == 0
    assert body["expired"] == ("The timeline keeps sampled records for 6 hours and this range starts before that: its "
                               "bars are deleted or being deleted. Its GPU time stays in the flame graph (30 days).")
    assert recent["count"] == 5 and recent["expired"] == ""
