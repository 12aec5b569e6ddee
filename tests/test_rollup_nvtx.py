"""The GPU flame graphs with copies and NVTX ranges (migration 0014) read whole hours from the hourly rollup and the
ragged edges from the 10 s windows, and give exactly the sums of the windows alone: for every range, each `what`, NVTX
range filter and the NVTX level, by names (flamegraph_gpu, flamegraph_processes_gpu) and by frame ids named by
flamegraph_names_gpu (the UI's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.gpu_filters import is_copy, nvtx_frames, nvtx_range_matches
from fleetprof.webui.model import UNKNOWN_STACK, ch_hex
from tests.test_gpu_copies_nvtx import FRAMES, STACKS, store_record

S = timedelta(seconds=1)
# (seconds after the first whole hour, stack, kernel or label, NVTX range path, GPU ns): both sides of each boundary
ROWS = [(-10, 100, "gemm", "step > forward", 1000), (-10, 101, "[memcpy HtoD]", "step > forward", 30),
        (10, 100, "gemm", "step > backward", 200), (1800, 102, "[memset]", "step > backward", 7),
        (3590, 103, "[memcpy DtoH]", "", 50), (3610, 100, "gemm", "optimizer.step", 4000),
        (7190, 100, "gemm", "step > forward", 60_000), (7210, 101, "[memcpy HtoD]", "step > forward2", 500_000),
        (7210, 100, "gemm", "", 9), (7220, 999, "gemm", "step > forward", 3_000_000)]  # 999: no definition
# (what, nvtx_range, nvtx_level): each choice of each, and filters together
CASES = [("all", "", 0), ("all", "", 1), ("kernels", "step", 1), ("copies", "", 1), ("copies", "forward2", 0),
         ("all", "step > backward", 1), ("kernels", "forward", 0), ("all", "forward", 1), ("kernels", "", 0)]


@pytest.fixture
def known(store):
    """ROWS stored through the sink, one GpuSamples v3 record per window, around whole UTC hours h, h + 1 h, h + 2 h
    (h some hours ago, inside the TTL)."""
    now = datetime.now(tz=UTC)
    h = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=5)
    for i, (at, stack, kernel, path, ns) in enumerate(ROWS):
        rec = {"node": "n1", "window_start_ns": int((h + at * S).timestamp()) * 10**9, "window_ns": 10**10,
               "frames": [{"frame_id": f, "function": n, "binary": b, "kind": k, "build_id": ""}
                          for f, (n, b, k) in FRAMES.items()],
               "stacks": [{"stack_id": s, "frame_ids": ids} for s, ids in STACKS.items()],
               "samples": [{"pid": 10, "comm": "train", "container_id": "", "device": 0, "stream": 7,
                            "stack_id": stack, "kernel_name": kernel, "duration_ns": ns, "launches": 1,
                            "nvtx_range": path, "bytes": 0, "memory_kinds": ""}],
               "unmatched": [], "timeline": []}
        store_record(store, rec, i)
    return store, h


def expected(h: datetime, since: datetime, until: datetime, what: str, wanted: str, level: int) -> dict[tuple, int]:
    sums: dict[tuple, int] = {}
    for at, stack, kernel, path, ns in ROWS:
        if not since <= h + at * S < until or not nvtx_range_matches(path, wanted):
            continue
        if what != "all" and is_copy(kernel) != (what == "copies"):
            continue
        frames = [FRAMES[f][0] for f in STACKS[stack]] if stack in STACKS else [UNKNOWN_STACK.format(ch_hex(stack))]
        names = (*(nvtx_frames(path) if level else []), *frames)
        sums[names] = sums.get(names, 0) + ns
    return sums


def by_ids(store, params: dict) -> dict[tuple, int]:
    """flamegraph_ids_gpu's stacks named by flamegraph_names_gpu, as the UI names them (a stack without frames:
    "[unknown stack 0x…]", as fleetprof/webui/model.py names it)."""
    names = {int(r[0]): r[1] for r in store.query_named("flamegraph_names_gpu", params)[1]}
    sums: dict[tuple, int] = {}
    for stack, frame_ids, value, *_ in store.query_named("flamegraph_ids_gpu", params)[1]:
        key = tuple(names[int(f)] for f in frame_ids) or (UNKNOWN_STACK.format(ch_hex(int(stack))),)
        sums[key] = sums.get(key, 0) + int(value)
    return sums


def test_gpu_flame_graphs_with_copies_and_ranges_are_the_window_sums(known):
    store, h = known
    ranges = {"whole hours": (h, h + timedelta(hours=2)), "ragged": (h - 10 * S, h + timedelta(hours=2) + 11 * S),
              "inside hours": (h + 5 * S, h + timedelta(hours=1, minutes=59, seconds=55)),
              "one boundary": (h + timedelta(minutes=30), h + timedelta(minutes=90))}
    checked = 0
    for label, (since, until) in ranges.items():
        for what, wanted, level in CASES:
            params = {"since": since, "until": until, "what": what, "nvtx_range": wanted, "nvtx_level": level}
            want = expected(h, since, until, what, wanted, level)
            case = (label, what, wanted, level)
            got = {tuple(f): int(n) for f, n in store.query_named("flamegraph_gpu", params)[1]}
            assert got == want, case
            processes: dict[tuple, int] = {}
            for *_, functions, _binaries, value in store.query_named("flamegraph_processes_gpu", params)[1]:
                processes[tuple(functions)] = processes.get(tuple(functions), 0) + int(value)
            assert processes == want, case
            assert by_ids(store, params) == want, case
            checked += bool(want)
    assert checked >= 25  # most combinations hold time: the comparison proves something


def test_the_rollup_alone_answers_whole_hours_with_ranges(known):
    # a row put into the rollup alone shows exactly when its hour is whole inside the range, under its range
    store, h = known
    hour = h + timedelta(hours=1)
    store.insert("gpu_kernel_samples_1h", [[hour, "n1", 10, "train", "", 0, 7, 100, "gemm", "marker", 77, 1]],
                 ["hour", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name",
                  "nvtx_range", "duration_ns", "launches"])
    params = {"nvtx_range": "marker", "nvtx_level": 1}
    whole = {"since": hour, "until": hour + timedelta(hours=1)}
    assert store.query_named("flamegraph_gpu", {**whole, **params})[1] == [
        (["[nvtx] marker", "main", "step", "launch", "gemm"], 77)]
    assert store.query_named("flamegraph_gpu", {**whole, **params, "since": hour + S})[1] == []
