"""Copies, sets, NVTX ranges and the timeline through the correlate stage (GpuSamples v3): a copy's label is its
sample's kernel and leaf frame, bytes x weight summed beside the time, memory kinds and the launch's range part of the
row; every matched record one by one in the window's timeline, split with the samples under the message limit; and
the changelog (v4) carrying a pending copy and a pending range, read back from v3 records too."""

from __future__ import annotations

from collections import Counter

from processors.correlate import KERNEL, LAUNCH, SECOND_NS, Correlator, Outcome
from processors.correlate_changelog import changelog, restore, state_key
from processors.correlate_samples import GPU_BINARY, estimated_bytes, split_gpu_samples
from processors.demangle import demangle
from schemas import single_object
from tests.test_correlate import GEMM, MS, NODE, PID, T0, Feed, gpu_time, kernel, launch, stage, unmatched

TRAIN = "train > forward"


def copy(corr: int, s: int, duration: int, nbytes: int, kind: str = "HtoD", kinds: str = "pinned>device",
         **kw) -> dict:
    return kernel(corr, s, duration, f"[memcpy {kind}]", **kw) | {
        "activity": "MEMCPY", "bytes": nbytes, "copy_kind": kind, "memory_kinds": kinds}


def memset(corr: int, s: int, duration: int, nbytes: int, **kw) -> dict:
    return kernel(corr, s, duration, "[memset]", **kw) | {"activity": "MEMSET", "bytes": nbytes,
                                                          "memory_kinds": "device"}


def ranged(rec: dict, nvtx: str) -> dict:
    return rec | {"nvtx_range": nvtx}


def gpu_records(produced) -> list[dict]:
    return [p.record for p in produced if p.topic == "gpu.samples"]


def test_copies_and_sets_are_rows_with_bytes_times_weight_and_their_label_as_leaf():
    feed = Feed(stage())
    feed.send(ranged(launch(1, T0, ["main", "run"], weight=4), TRAIN), copy(1, T0 + MS, 300, 1 << 20))
    feed.send(memset(2, T0 + 3 * MS, 50, 4096), ranged(launch(2, T0 + 2 * MS, ["main", "run"], weight=2), TRAIN))
    feed.send(ranged(launch(3, T0 + 4 * MS, ["main", "run"]), TRAIN),
              copy(3, T0 + 5 * MS, 70, 1000, "DtoH", "device>pageable"))
    rows = sorted((s["kernel_name"], s["nvtx_range"], s["memory_kinds"], s["bytes"], s["duration_ns"], s["launches"])
                  for r in gpu_records(feed.produced) for s in r["samples"])
    assert rows == [("[memcpy DtoH]", TRAIN, "device>pageable", 1000, 70, 1),
                    ("[memcpy HtoD]", TRAIN, "pinned>device", 4 << 20, 1200, 4),
                    ("[memset]", TRAIN, "device", 8192, 100, 2)]
    assert gpu_time(feed.produced) == {("main", "run", "[memcpy HtoD]"): 1200, ("main", "run", "[memset]"): 100,
                                       ("main", "run", "[memcpy DtoH]"): 70}
    leaves = {f["function"]: (f["binary"], f["kind"]) for r in gpu_records(feed.produced) for f in r["frames"]
              if f["binary"] == GPU_BINARY}
    assert leaves == {"[memcpy HtoD]": (GPU_BINARY, "GPU_KERNEL"), "[memset]": (GPU_BINARY, "GPU_KERNEL"),
                      "[memcpy DtoH]": (GPU_BINARY, "GPU_KERNEL")}
    for rec in gpu_records(feed.produced):
        assert single_object.decode(single_object.encode("GpuSamples", rec))[1] == rec


def test_the_nvtx_range_is_part_of_the_row():
    feed = Feed(stage())
    for i, nvtx in enumerate(["train > forward", "train > backward", "train > forward", ""]):
        feed.send(ranged(launch(i, T0 + i * MS, ["main", "compute"], weight=i + 1), nvtx), kernel(i, T0 + i * MS, 10))
    got = Counter()
    for r in gpu_records(feed.produced):
        for s in r["samples"]:
            got[s["nvtx_range"]] += s["duration_ns"]
    assert got == {"train > forward": 10 + 30, "train > backward": 20, "": 40}
    assert gpu_time(feed.produced) == {("main", "compute", demangle(GEMM)): 100}


def test_the_timeline_has_every_matched_record_one_by_one():
    feed = Feed(stage())
    feed.send(copy(1, T0 + 2 * MS, 30, 512), kernel(2, T0 + MS, 20, device=1, stream=3))
    feed.send(ranged(launch(1, T0, ["main", "run"], weight=3), TRAIN), launch(2, T0, ["main", "compute"]),
              ranged(launch(3, T0 + 5, ["main", "run"], weight=2), "step") | {"graph": True},
              kernel(3, T0 + 4 * MS, 5) | {"graph_id": 9, "graph_node_id": 1},
              kernel(3, T0 + 3 * MS, 6) | {"graph_id": 9, "graph_node_id": 0})
    (rec,) = gpu_records(feed.produced)
    stacks = {s["stack_id"]: s["frame_ids"] for s in rec["stacks"]}
    frames = {f["frame_id"]: f["function"] for f in rec["frames"]}
    sample_of = {(s["kernel_name"], s["nvtx_range"]): s["stack_id"] for s in rec["samples"]}
    got = [{k: v for k, v in t.items() if k not in ("stack_id", "identity_id")}
           | {"stack": [frames[f] for f in stacks[t["stack_id"]]]} for t in rec["timeline"]]
    assert {t["identity_id"] for t in rec["timeline"]} == {0}  # launches without one
    assert got == [
        {"pid": PID, "device": 1, "stream": 3, "start_ns": T0 + MS, "end_ns": T0 + MS + 20, "activity": "KERNEL",
         "name": GEMM, "weight": 1, "bytes": 0, "nvtx_range": "", "graph_id": 0, "graph_node_id": 0,
         "correlation_id": 2, "stack": ["main", "compute", demangle(GEMM)]},
        {"pid": PID, "device": 0, "stream": 7, "start_ns": T0 + 2 * MS, "end_ns": T0 + 2 * MS + 30,
         "activity": "MEMCPY", "name": "[memcpy HtoD]", "weight": 3, "bytes": 512, "nvtx_range": TRAIN,
         "graph_id": 0, "graph_node_id": 0, "correlation_id": 1, "stack": ["main", "run", "[memcpy HtoD]"]},
        {"pid": PID, "device": 0, "stream": 7, "start_ns": T0 + 3 * MS, "end_ns": T0 + 3 * MS + 6,
         "activity": "KERNEL", "name": GEMM, "weight": 2, "bytes": 0, "nvtx_range": "step", "graph_id": 9,
         "graph_node_id": 0, "correlation_id": 3, "stack": ["main", "run", demangle(GEMM)]},
        {"pid": PID, "device": 0, "stream": 7, "start_ns": T0 + 4 * MS, "end_ns": T0 + 4 * MS + 5,
         "activity": "KERNEL", "name": GEMM, "weight": 2, "bytes": 0, "nvtx_range": "step", "graph_id": 9,
         "graph_node_id": 1, "correlation_id": 3, "stack": ["main", "run", demangle(GEMM)]}]
    # the timeline's stack id is its sample's
    assert [t["stack_id"] for t in rec["timeline"]] == [sample_of[(GEMM, "")], sample_of[("[memcpy HtoD]", TRAIN)],
                                                        sample_of[(GEMM, "step")], sample_of[(GEMM, "step")]]
    assert single_object.decode(single_object.encode("GpuSamples", rec))[1] == rec


def test_a_large_timeline_is_split_under_the_message_limit_with_exact_totals():
    feed = Feed(stage())
    names = [f"kernel_{i:03d}_" + "x" * 2000 for i in range(40)]
    recs = []
    for i in range(400):
        recs.append(ranged(launch(i, T0 + i, ["main", ("run", "compute")[i % 2]], weight=1 + i % 3), "r" * 400))
        recs.append(copy(i, T0 + i + 1, 10 + i, 100 + i) if i % 5 == 0 else kernel(i, T0 + i + 1, 10 + i,
                                                                                   names[i % 40]))
    out = feed.send(*recs)
    parts = gpu_records(out)
    assert len(parts) > 2
    for p in parts:
        assert estimated_bytes(p) <= 600 * 1024 and len(single_object.encode("GpuSamples", p)) < 600 * 1024
    # each stack goes out once per commit, with the first part that uses it
    used = {s["stack_id"] for p in parts for s in p["samples"]} | {t["stack_id"] for p in parts for t in p["timeline"]}
    # 32 kernel names (i % 40, not a multiple of 5), each under one path, and the copy under both
    assert used == {s["stack_id"] for p in parts for s in p["stacks"]} and len(used) == 32 + 2
    timeline = [t for p in parts for t in p["timeline"]]
    assert len(timeline) == 400 and sorted(t["correlation_id"] for t in timeline) == list(range(400))
    assert sum(s["duration_ns"] for p in parts for s in p["samples"]) == sum((10 + i) * (1 + i % 3)
                                                                            for i in range(400))
    assert sum(s["bytes"] for p in parts for s in p["samples"]) == sum((100 + i) * (1 + i % 3)
                                                                      for i in range(0, 400, 5))
    assert sum(t["bytes"] * t["weight"] for t in timeline) == sum((100 + i) * (1 + i % 3) for i in range(0, 400, 5))


def test_split_parts_carry_what_their_timeline_references():
    rec = {"node": NODE, "window_start_ns": T0, "window_ns": 10, "unmatched": [], "simulated": False,
           "frames": [{"frame_id": i, "function": f"f{i}" * 100, "binary": "b", "kind": "NATIVE", "build_id": ""}
                      for i in range(6)],
           "stacks": [{"stack_id": 10 + i, "frame_ids": [0, i]} for i in range(6)],
           "samples": [{"pid": 1, "comm": "", "container_id": "", "device": 0, "stream": 0, "stack_id": 10,
                        "kernel_name": "k", "duration_ns": 5, "launches": 1, "nvtx_range": "", "bytes": 0,
                        "memory_kinds": ""}],
           "timeline": [{"pid": 1, "device": 0, "stream": 0, "start_ns": i, "end_ns": i + 1, "activity": "KERNEL",
                         "name": "k" * 200, "stack_id": 10 + i % 6, "weight": 1, "bytes": 0, "nvtx_range": "",
                         "graph_id": 0, "graph_node_id": 0, "correlation_id": i} for i in range(30)]}
    parts = split_gpu_samples(rec, 3000)
    assert len(parts) > 3
    assert [t for p in parts for t in p["timeline"]] == rec["timeline"]
    assert [s for p in parts for s in p["samples"]] == rec["samples"]
    for p in parts:
        assert estimated_bytes(p) <= 3000
        used = {s["stack_id"] for s in p["samples"]} | {t["stack_id"] for t in p["timeline"]}
        assert {s["stack_id"] for s in p["stacks"]} == used
        assert {f["frame_id"] for f in p["frames"]} == {f for s in p["stacks"] for f in s["frame_ids"]}


def test_bad_copies_and_ranges_are_dead_lettered():
    feed = Feed(stage())
    out = feed.send(copy(1, T0, 10, -1), copy(2, T0, 10, 1 << 43), ranged(launch(3, T0, ["main"]), "r" * 5000),
                    memset(4, T0, 10, 8) | {"memory_kinds": "d" * 300})
    assert [p.record["reason"] for p in out if p.topic == "deadletter"] == [
        "memcpy of -1 bytes (from 0 to 4398046511104)", "memcpy of 8796093022208 bytes (from 0 to 4398046511104)",
        "launch with an NVTX range of 5000 characters (limit 4096)", "memset with kinds over 256 characters"]


def test_a_pending_copy_and_range_survive_the_changelog_and_v3_records_still_restore():
    live = Correlator()
    live.process(0, KERNEL, 0, copy(1, T0 + 5, 10, 4096, "PtoP", "device>device") | {"graph_id": 3,
                                                                                      "graph_node_id": 8}, Outcome())
    live.process(0, LAUNCH, 0, ranged(launch(2, T0, ["main"]), TRAIN) | {"graph": True}, Outcome())
    live.process(0, KERNEL, 1, kernel(2, T0 + 6, 10), Outcome())  # the graph launch's first match
    records = [single_object.decode(single_object.encode("CorrelatorState", r))[1] for r in changelog(live, "g", 0)]
    fresh = Correlator()
    restore(fresh, 0, records)
    assert list(fresh.parts[0].kernels.items()) == list(live.parts[0].kernels.items())
    assert [e[6:] for e in fresh.parts[0].launches.values()] == [[TRAIN, True, 1, 0, 82 + len(NODE) + len(TRAIN)]]
    out = Outcome()
    fresh.process(0, LAUNCH, 1, launch(1, T0, ["main"]) | {"graph": True}, out)
    fresh.process(0, KERNEL, 2, kernel(2, T0 + 7, 4), out)
    assert [(m[10], m[14], m[15], m[16], m[17], m[18], m[19]) for m in out.matches] == [
        ("[memcpy PtoP]", "", "MEMCPY", 4096, "device>device", 3, 8), (GEMM, TRAIN, "KERNEL", 0, "", 0, 0)]
    assert fresh.parts[0].launches[(NODE, PID, 777_000_000_000, 2)][8] == 2
    # a v3 record (written before this version) reads into v4 with its defaults
    old = Correlator()
    old.process(0, LAUNCH, 0, launch(5, T0, ["main"]), Outcome())
    old.process(0, KERNEL, 0, kernel(6, T0, 10), Outcome())
    v3 = single_object.default_registry().version("CorrelatorState", 3)
    (rec,) = changelog(old, "g", 0)
    back = single_object.decode(single_object.encode_as(v3, rec))[1]
    assert back["launches"][0]["graph"] is False and back["kernels"][0]["activity"] == "KERNEL"
    again = Correlator()
    restore(again, 0, [back])
    assert list(again.parts[0].kernels.items()) == list(old.parts[0].kernels.items())
    assert [e[6:] for e in again.parts[0].launches.values()] == [["", False, 0, 0, 82 + len(NODE)]]
    assert {state_key(back, 4096)} == {"g/0/log/0"}


def test_copies_and_kernels_still_count_unmatched_alike():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    feed.send(copy(1, T0, 300, 1 << 10), launch(2, T0, ["main"], weight=2))
    feed.send(launch(3, T0 + 20 * SECOND_NS, ["main"]), kernel(3, T0 + 20 * SECOND_NS, 5))
    assert unmatched(feed.produced) == {("KERNEL", "EXPIRED"): 1, ("KERNEL", "EXPIRED", "ns"): 300,
                                        ("LAUNCH", "EXPIRED"): 1, ("LAUNCH", "EXPIRED", "launches"): 2}
