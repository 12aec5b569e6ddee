"""The correlator, pure: launches and kernels paired into GPU time by symbolized launching stack; unmatched records on
either side counted once with their reason; late records, reused pids, floods, 4 KB kernel names and weights; and a
changelog that restores exactly the state it was written from."""

from __future__ import annotations

import random
import zlib
from collections import Counter

import pytest
from prometheus_client import REGISTRY

from processors.correlate import KERNEL, LAUNCH, SECOND_NS, CorrelateConfig, Correlator, Outcome
from processors.correlate_changelog import ChangelogError, changelog, restore, state_key
from processors.correlate_samples import GPU_BINARY, LaunchStacks, build_gpu_samples, split_gpu_samples
from processors.correlate_stage import CorrelateStage, config_from_env
from processors.demangle import demangle
from processors.messages import Message, Produced
from processors.symbol_tables import SymbolTables
from schemas import single_object
from simulate.synthetic_binaries import mangle
from simulate.synthetic_fleet import SyntheticFleet
from tests.pipeline_helpers import APP_BASE, addr, build_id_for, symbol_chunks

BUILD_ID = build_id_for("correlate")
NODE, PID, START = "gpu-node", 4242, 777_000_000_000
T0 = 1_767_000_000 * SECOND_NS  # a window boundary
MS = 1_000_000
GEMM = "_ZN7cutlass6KernelI66cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8EEvNT_6ParamsE"
SGEMM = "ampere_sgemm_128x64_tn"
MAPPINGS = [{"start": APP_BASE, "limit": APP_BASE + 0x10000, "file_offset": 0, "path": "/opt/app",
             "build_id": BUILD_ID}]


def launch(corr: int, t: int, path: list[str], weight: int = 1, *, pid: int = PID, start: int = START,
           maps: bool = True, node: str = NODE) -> dict:
    """A GpuLaunch from a root-first path of the test app's functions."""
    leaf_first = list(reversed(path))
    return {"node": node, "pid": pid, "tid": pid, "process_start_ns": start, "time_ns": t, "correlation_id": corr,
            "callback_id": 211, "api_name": "cudaLaunchKernel", "weight": weight,
            "user_addrs": [addr(f, i == 0) for i, f in enumerate(leaf_first)],
            "mappings": MAPPINGS if maps else [], "simulated": False}


def kernel(corr: int, s: int, duration: int, name: str = GEMM, *, pid: int = PID, start: int = START,
           device: int = 0, stream: int = 7, node: str = NODE) -> dict:
    return {"node": node, "pid": pid, "process_start_ns": start, "correlation_id": corr, "start_ns": s,
            "end_ns": s + duration, "device_id": device, "stream_id": stream, "kernel_name": name, "simulated": False}


def tables() -> SymbolTables:
    t = SymbolTables()
    for c in symbol_chunks(BUILD_ID):
        t.add_chunk(c)
    return t


class Feed:
    """Numbered messages for one stage, as the runner would hand them over (one partition)."""

    def __init__(self, stage: CorrelateStage, partition: int = 0) -> None:
        self.stage, self.partition = stage, partition
        self.offsets = Counter()
        self.produced: list[Produced] = []

    def send(self, *records: dict) -> list[Produced]:
        msgs = []
        for rec in records:
            topic = "gpu.kernels" if "kernel_name" in rec else "gpu.launches"
            value = single_object.encode("GpuKernel" if "kernel_name" in rec else "GpuLaunch", rec)
            msgs.append(Message(topic, self.partition, self.offsets[topic], f"{rec['node']}/{rec['pid']}".encode(),
                                "", rec, value))
            self.offsets[topic] += 1
        self.stage.before_batch(msgs)
        out = self.stage.process(msgs)
        self.stage.after_commit()
        self.produced += out
        return out


def gpu_time(produced: list[Produced]) -> Counter:
    """GPU ns per (root-first function names ..., kernel frame) over every GpuSamples record."""
    frames, stacks, out = {}, {}, Counter()
    samples = [p.record for p in produced if p.topic == "gpu.samples"]
    for rec in samples:
        frames.update({f["frame_id"]: f for f in rec["frames"]})
        stacks.update({s["stack_id"]: s["frame_ids"] for s in rec["stacks"]})
    for rec in samples:
        for s in rec["samples"]:
            out[tuple(frames[f]["function"] for f in stacks[s["stack_id"]])] += s["duration_ns"]
    return out


def unmatched(produced: list[Produced]) -> Counter:
    """(side, reason) -> events, and the GPU ns / launches they carried under (side, reason, 'ns'|'launches')."""
    out = Counter()
    for p in produced:
        if p.topic == "gpu.samples":
            for u in p.record["unmatched"]:
                out[u["side"], u["reason"]] += u["events"]
                out[u["side"], u["reason"], "ns"] += u["duration_ns"]
                out[u["side"], u["reason"], "launches"] += u["launches"]
    return +out


def stage(**config) -> CorrelateStage:
    return CorrelateStage(tables(), None, config=CorrelateConfig(**config))


# --- pairing ---------------------------------------------------------------------------------------------------------


def test_pairs_in_either_order_give_duration_times_weight_under_the_launching_stack():
    feed = Feed(stage())
    feed.send(launch(1, T0 + 1 * MS, ["main", "run", "compute"], weight=3))
    feed.send(kernel(1, T0 + 2 * MS, 5_000))
    feed.send(kernel(2, T0 + 3 * MS, 7_000, SGEMM, device=1, stream=9),
              launch(2, T0 + 2 * MS, ["main", "write_out"], weight=1, maps=False))
    assert gpu_time(feed.produced) == {("main", "run", "compute", demangle(GEMM)): 15_000,
                                       ("main", "write_out", SGEMM): 7_000}
    samples = [s for p in feed.produced if p.topic == "gpu.samples" for s in p.record["samples"]]
    assert sorted((s["kernel_name"], s["device"], s["stream"], s["launches"], s["pid"]) for s in samples) == [
        (GEMM, 0, 7, 3, PID), (SGEMM, 1, 9, 1, PID)]
    records = [p.record for p in feed.produced if p.topic == "gpu.samples"]
    assert {(r["node"], r["window_start_ns"], r["window_ns"]) for r in records} == {(NODE, T0, 10 * SECOND_NS)}
    leaves = [f for r in records for f in r["frames"] if f["kind"] == "GPU_KERNEL"]
    assert sorted((f["function"], f["binary"]) for f in leaves) == [(SGEMM, GPU_BINARY), (demangle(GEMM), GPU_BINARY)]
    assert unmatched(feed.produced) == {}
    for rec in records:
        assert single_object.decode(single_object.encode("GpuSamples", rec))[1] == rec


def test_weights_multiply_each_kernels_duration():
    feed = Feed(stage())
    path = ["main", "run", "hash_block"]
    weights, durations = [1, 7, 1000, 1 << 20], [1_000, 2_500, 333, 1 << 30]
    for i, (w, d) in enumerate(zip(weights, durations, strict=True)):
        feed.send(launch(10 + i, T0 + i * MS, path, weight=w), kernel(10 + i, T0 + i * MS + 500, d))
    assert gpu_time(feed.produced) == {("main", "run", "hash_block", demangle(GEMM)):
                                       sum(w * d for w, d in zip(weights, durations, strict=True))}
    launches = sum(s["launches"] for p in feed.produced if p.topic == "gpu.samples" for s in p.record["samples"])
    assert launches == sum(weights)


def test_mappings_sent_once_symbolize_every_later_launch_of_the_process():
    feed = Feed(stage())
    feed.send(launch(1, T0, ["main", "compute"]), kernel(1, T0 + MS, 100))
    feed.send(launch(2, T0 + 2 * MS, ["main", "run"], maps=False), kernel(2, T0 + 3 * MS, 200))
    # another process never sent its mappings: its frames stay visible as unknown addresses
    feed.send(launch(3, T0 + 4 * MS, ["main"], pid=PID + 1, maps=False), kernel(3, T0 + 5 * MS, 300, pid=PID + 1))
    got = gpu_time(feed.produced)
    unknown = (f"[unknown] 0x{addr('main', True):x}", demangle(GEMM))
    assert got == {("main", "compute", demangle(GEMM)): 100, ("main", "run", demangle(GEMM)): 200, unknown: 300}


# --- what does not pair --------------------------------------------------------------------------------------------


def test_unmatched_launches_and_kernels_are_counted_once_when_the_horizon_passes():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    before = {side: REGISTRY.get_sample_value("fleetprof_correlate_unmatched_total",
                                              {"stage": "correlate", "side": side, "reason": "EXPIRED"}) or 0
              for side in ("LAUNCH", "KERNEL")}
    feed.send(launch(1, T0, ["main", "run"], weight=4), kernel(2, T0 + SECOND_NS, 900))
    feed.send(launch(3, T0 + 5 * SECOND_NS, ["main"]), kernel(3, T0 + 5 * SECOND_NS + MS, 50))
    assert unmatched(feed.produced) == {}  # nothing has waited past the horizon yet
    feed.send(launch(4, T0 + 20 * SECOND_NS, ["main"]), kernel(4, T0 + 20 * SECOND_NS + MS, 60))
    feed.send(launch(5, T0 + 40 * SECOND_NS, ["main"]), kernel(5, T0 + 40 * SECOND_NS + MS, 70))
    assert unmatched(feed.produced) == {("LAUNCH", "EXPIRED"): 1, ("LAUNCH", "EXPIRED", "launches"): 4,
                                        ("KERNEL", "EXPIRED"): 1, ("KERNEL", "EXPIRED", "ns"): 900}
    # counted in the window of their own time
    windows = {(u["side"], r["window_start_ns"]) for p in feed.produced if p.topic == "gpu.samples"
               for r in [p.record] for u in r["unmatched"]}
    assert windows == {("LAUNCH", T0), ("KERNEL", T0)}
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 180}
    for side in ("LAUNCH", "KERNEL"):
        assert REGISTRY.get_sample_value("fleetprof_correlate_unmatched_total", {
            "stage": "correlate", "side": side, "reason": "EXPIRED"}) == before[side] + 1
    assert feed.stage.correlator.parts[0].pending() == (0, 0)


def test_one_input_read_ahead_does_not_expire_the_other():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    feed.send(*[launch(i, T0 + i * SECOND_NS, ["main"]) for i in range(1, 60)])  # a minute of launches first
    feed.send(*[kernel(i, T0 + i * SECOND_NS + MS, 10) for i in range(1, 60)])
    assert unmatched(feed.produced) == {}
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 590}


def test_late_records_are_counted_unless_their_partner_still_waits():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    feed.send(launch(1, T0 + 60 * SECOND_NS, ["main"]), kernel(1, T0 + 60 * SECOND_NS + MS, 10))  # cutoff: T0+55s
    feed.send(kernel(2, T0 + 10 * SECOND_NS, 20), launch(3, T0 + 30 * SECOND_NS, ["main"], weight=2))
    assert unmatched(feed.produced) == {("KERNEL", "LATE"): 1, ("KERNEL", "LATE", "ns"): 20,
                                        ("LAUNCH", "LATE"): 1, ("LAUNCH", "LATE", "launches"): 2}
    # a launch that arrived after a newer one waits behind it, so its late kernel still finds it
    feed.send(launch(4, T0 + 70 * SECOND_NS, ["main", "run"]), launch(5, T0 + 58 * SECOND_NS, ["main", "compute"]))
    feed.send(launch(6, T0 + 66 * SECOND_NS, ["main"]), kernel(6, T0 + 66 * SECOND_NS, 30))  # cutoff: T0+61s
    feed.send(kernel(5, T0 + 58 * SECOND_NS + MS, 40))
    assert gpu_time(feed.produced)[("main", "compute", demangle(GEMM))] == 40
    assert sum(n for k, n in unmatched(feed.produced).items() if len(k) == 2) == 2


def test_a_node_whose_clock_is_ahead_does_not_make_the_others_on_its_partition_late():
    """Many nodes share a partition: one stamping its records 42 days ahead joins as usual and is counted, but it
    does not move the partition's event time, so the next node's records are neither late nor without mappings."""
    now = T0 + 3600 * SECOND_NS
    feed = Feed(stage())  # the default horizon, 60 s
    feed.stage.before_batch = lambda messages: feed.stage.correlator.set_clock(now)  # this test's clock
    ahead = now + 42 * 86400 * SECOND_NS
    before = REGISTRY.get_sample_value("fleetprof_correlate_ahead_of_clock_total", {"stage": "correlate"}) or 0
    feed.send(launch(1, ahead, ["main", "run"], node="skewed"), kernel(1, ahead + MS, 500, node="skewed"))
    feed.send(launch(2, now, ["main", "compute"]), kernel(2, now + MS, 100))
    feed.send(launch(3, now + 2 * SECOND_NS, ["main", "run"], maps=False), kernel(3, now + 2 * SECOND_NS + MS, 200))
    assert unmatched(feed.produced) == {}
    assert gpu_time(feed.produced) == {("main", "run", demangle(GEMM)): 700, ("main", "compute", demangle(GEMM)): 100}
    assert REGISTRY.get_sample_value("fleetprof_correlate_ahead_of_clock_total", {"stage": "correlate"}) == before + 2
    assert feed.stage.correlator.parts[0].wm == [now + 10 * SECOND_NS] * 2  # the clock's ceiling, not 42 days on


def test_process_start_tells_a_reused_pid_apart():
    feed = Feed(stage())
    feed.send(launch(1, T0, ["main", "run"], start=START), launch(1, T0 + MS, ["main", "compute"], start=START + 1))
    feed.send(kernel(1, T0 + 2 * MS, 300, start=START + 1), kernel(1, T0 + 3 * MS, 200, start=START))
    assert gpu_time(feed.produced) == {("main", "run", demangle(GEMM)): 200, ("main", "compute", demangle(GEMM)): 300}
    assert unmatched(feed.produced) == {}


def test_without_process_start_a_reused_pid_is_told_apart_by_time():
    feed = Feed(stage())
    # a process that died with launch 5 unanswered; a new one with the same pid reuses correlation id 5
    feed.send(launch(5, T0, ["main", "run"], start=0, weight=9))
    feed.send(kernel(5, T0 + 90 * SECOND_NS, 400, start=0))  # cannot be the old launch's: 90 s after it
    feed.send(launch(5, T0 + 90 * SECOND_NS - MS, ["main", "write_out"], start=0, maps=False))
    # and the same again with a launch that is newer than the kernel waiting with its key: the kernel is the stale one
    feed.send(kernel(6, T0 + 91 * SECOND_NS, 50, start=0))
    feed.send(launch(6, T0 + 200 * SECOND_NS, ["main", "compute"], start=0, maps=False))
    feed.send(kernel(6, T0 + 200 * SECOND_NS + MS, 60, start=0))
    assert gpu_time(feed.produced) == {("main", "write_out", demangle(GEMM)): 400,
                                       ("main", "compute", demangle(GEMM)): 60}
    assert unmatched(feed.produced) == {("LAUNCH", "SUPERSEDED"): 1, ("LAUNCH", "SUPERSEDED", "launches"): 9,
                                        ("KERNEL", "SUPERSEDED"): 1, ("KERNEL", "SUPERSEDED", "ns"): 50}


def test_a_duplicate_record_counts_once():
    feed = Feed(stage())
    feed.send(launch(1, T0, ["main"]), launch(1, T0, ["main"]), kernel(1, T0 + MS, 100), kernel(1, T0 + MS, 100))
    feed.send(launch(2, T0 + 90 * SECOND_NS, ["main"]), kernel(2, T0 + 90 * SECOND_NS, 5))
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 105}
    assert unmatched(feed.produced) == {("LAUNCH", "SUPERSEDED"): 1, ("LAUNCH", "SUPERSEDED", "launches"): 1,
                                        ("KERNEL", "EXPIRED"): 1, ("KERNEL", "EXPIRED", "ns"): 100}


def test_a_flood_keeps_the_state_bounded_and_counts_every_eviction():
    feed = Feed(stage(max_pending=100, max_processes=50))
    feed.send(*[kernel(i, T0 + i, 10) for i in range(1000)])
    feed.send(*[launch(5000 + i, T0 + i, ["main"], pid=10_000 + i) for i in range(1000)])
    st = feed.stage.correlator.parts[0]
    assert st.pending() == (100, 100) and len(st.procs) == 50
    assert unmatched(feed.produced) == {("KERNEL", "EVICTED"): 900, ("KERNEL", "EVICTED", "ns"): 9000,
                                        ("LAUNCH", "EVICTED"): 900, ("LAUNCH", "EVICTED", "launches"): 900}
    # the newest wait: kernel 999 and launch 5999 still pair with their partners
    feed.send(launch(999, T0 + 999, ["main"]), kernel(5999, T0 + 999, 10, pid=10_999))
    assert sum(gpu_time(feed.produced).values()) == 20


def test_4kb_kernel_names_pair_and_split_their_output_under_the_message_limit():
    names = [mangle(f"k{i:03d}::" + "a" * 4081, "float*") for i in range(300)]
    assert {len(n) for n in names} == {4096}
    feed = Feed(stage())
    out = feed.send(*[r for i, n in enumerate(names) for r in (launch(i, T0 + i, ["main", "run"]),
                                                               kernel(i, T0 + i + 1, 1000 + i, n))])
    assert gpu_time(feed.produced) == {("main", "run", demangle(n)): 1000 + i for i, n in enumerate(names)}
    assert demangle(names[0]).startswith("k000::aaaa") and demangle(names[0]).endswith("(float*)")
    parts = [p.record for p in out if p.topic == "gpu.samples"]
    assert len(parts) > 1 and all(len(single_object.encode("GpuSamples", r)) < 600 * 1024 for r in parts)
    assert sorted(s["kernel_name"] for r in parts for s in r["samples"]) == sorted(names)


def test_split_parts_carry_the_definitions_they_use():
    rec = {"node": NODE, "window_start_ns": T0, "window_ns": 10, "unmatched": [{"x": 1}],
           "frames": [{"frame_id": i, "function": f"f{i}" * 100, "binary": "b", "kind": "NATIVE"} for i in range(4)],
           "stacks": [{"stack_id": 10 + i, "frame_ids": [0, i]} for i in range(4)],
           "samples": [{"pid": 1, "comm": "", "container_id": "", "device": 0, "stream": 0, "stack_id": 10 + i,
                        "kernel_name": "k" * 300, "duration_ns": i, "launches": 1} for i in range(4)]}
    parts = split_gpu_samples(rec, 2500)
    assert len(parts) > 1 and [s for p in parts for s in p["samples"]] == rec["samples"]
    assert [p["unmatched"] for p in parts] == [[{"x": 1}]] + [[]] * (len(parts) - 1)
    for p in parts:
        used = {s["stack_id"] for s in p["samples"]}
        assert {s["stack_id"] for s in p["stacks"]} == used
        assert {f["frame_id"] for f in p["frames"]} == {f for s in p["stacks"] for f in s["frame_ids"]}


def test_bad_records_are_dead_lettered_with_their_reason():
    feed = Feed(stage())
    bad = [kernel(1, T0, 10) | {"end_ns": T0 - 5}, launch(2, T0, ["main"], weight=0),
           kernel(3, T0, 10, device=70_000), kernel(4, T0, 10, "k" * 70_000), kernel(5, T0, 2 ** 43),
           launch(6, T0, ["main"]) | {"mappings": MAPPINGS * 5000}]
    out = feed.send(launch(9, T0, ["main"]), *bad, kernel(9, T0 + 1, 10))
    dead = [p.record for p in out if p.topic == "deadletter"]
    assert [d["reason"] for d in dead] == ["kernel ends 5 ns before it starts",
                                           "launch with weight 0 (from 1, standing for itself, to 1048576)",
                                           "kernel on device 70000", "kernel name of 70000 characters (limit 65536)",
                                           "kernel runs 8796 s (limit 4398 s)",
                                           "launch with 5000 mappings (limit 4096)"]
    assert [d["source_offset"] for d in dead] == [0, 1, 1, 2, 3, 2]
    assert all(d["stage"] == "correlate" and d["value"] for d in dead)
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 10}


def test_definitions_go_out_once_per_commit():
    feed = Feed(stage())
    first = feed.send(launch(1, T0, ["main", "run"]), kernel(1, T0 + 1, 10))
    again = feed.send(launch(2, T0 + 2, ["main", "run"]), kernel(2, T0 + 3, 10))
    (a,), (b,) = ([p.record for p in out if p.topic == "gpu.samples"] for out in (first, again))
    assert (len(a["stacks"]), len(a["frames"])) == (1, 3) and (len(b["stacks"]), len(b["frames"])) == (0, 0)


def test_a_record_split_in_parts_defines_each_stack_and_frame_once(monkeypatch):
    import processors.correlate_stage as correlate_stage

    monkeypatch.setattr(correlate_stage, "STAGE_OUTPUT_MAX_BYTES", 700)  # a few samples per part
    feed = Feed(stage())
    paths = [["main", "run"], ["main", "run", "compute"], ["main", "compute"], ["main"]]
    events = []
    for i in range(24):
        events += [launch(100 + i, T0 + 10 * i, paths[i % 4]), kernel(100 + i, T0 + 10 * i + 1, 5 + i, f"k{i % 6}")]
    parts = [p.record for p in feed.send(*events) if p.topic == "gpu.samples"]
    assert len(parts) > 2 and sum(len(p["timeline"]) for p in parts) == 24
    assert sum(len(p["samples"]) for p in parts) == 12  # 4 paths x 6 kernels, every 12th launch alike
    defined = [s["stack_id"] for p in parts for s in p["stacks"]]
    frames = [f["frame_id"] for p in parts for f in p["frames"]]
    used = {s["stack_id"] for p in parts for s in p["samples"] + p["timeline"]}
    assert len(defined) == len(set(defined)) and set(defined) == used  # each once, every one used
    named = {f for p in parts for s in p["stacks"] for f in s["frame_ids"]}
    assert len(frames) == len(set(frames)) and set(frames) == named
    for i, p in enumerate(parts):  # a stack is defined no later than the first part that uses it
        before = {s["stack_id"] for q in parts[:i + 1] for s in q["stacks"]}
        assert {s["stack_id"] for s in p["samples"] + p["timeline"]} <= before
    again = [p.record for p in feed.send(launch(200, T0 + 500, ["main", "run"]), kernel(200, T0 + 501, 5, "k0"))
             if p.topic == "gpu.samples"]
    assert [(len(p["stacks"]), len(p["frames"])) for p in again] == [(0, 0)]  # all sent and committed


def test_settings_from_the_environment_are_checked():
    cfg = config_from_env({"FLEETPROF_CORRELATE_HORIZON_S": "90", "FLEETPROF_CORRELATE_MAX_PENDING": "500",
                           "FLEETPROF_CORRELATE_MAX_AHEAD_S": "2.5"})
    assert cfg.max_ahead_ns == 2_500_000_000
    assert (cfg.horizon_ns, cfg.max_pending, cfg.window_ns) == (90 * SECOND_NS, 500, 10 * SECOND_NS)
    with pytest.raises(ValueError, match="FLEETPROF_CORRELATE_WINDOW_S='soon' is not a number"):
        config_from_env({"FLEETPROF_CORRELATE_WINDOW_S": "soon"})
    with pytest.raises(ValueError, match="FLEETPROF_CORRELATE_MAX_PENDING='0' must be positive"):
        config_from_env({"FLEETPROF_CORRELATE_MAX_PENDING": "0"})


# --- the changelog -------------------------------------------------------------------------------------------------


def _view(st) -> tuple:
    # all but the numbers a correlator gives mapping lists and stacks in memory
    launches = [(k, e[:4] + e[5:]) for k, e in st.launches.items()]
    procs = [(k, e[:3] + e[4:]) for k, e in st.procs.items()]
    stacks = list(st.stacks.values())
    index = {k: list(v) for k, v in st.graph_index.items()}
    return launches, list(st.kernels.items()), index, procs, stacks, st.wm, st.check_at, st.next_seq, st.offsets


def _fleet_events(seed: int) -> list[tuple[int, dict]]:
    """Loadgen's launches and kernels of a few nodes, some lost, some reordered, with a reused pid."""
    fleet = SyntheticFleet(seed=seed)
    rng = random.Random(seed)
    events = []
    for w in range(5):
        for n in range(3):
            launches, kernels = fleet.gpu_window(fleet.node(n), T0 + w * 10 * SECOND_NS, 10 * SECOND_NS, 4.0)
            events += [(LAUNCH, r) for r in launches] + [(KERNEL, r) for r in kernels]
    events = [e for e in events if rng.random() > 0.05]
    for i in range(0, len(events) - 40, 5):
        j = i + rng.randrange(40)
        events[i], events[j] = events[j], events[i]
    return events


@pytest.mark.parametrize("config", [
    CorrelateConfig(horizon_ns=15 * SECOND_NS),
    # tiny limits: snapshots, chunks, evictions and the log ring wrapping all happen
    CorrelateConfig(horizon_ns=15 * SECOND_NS, max_pending=40, max_processes=5, snapshot_min_bytes=4000,
                    log_slots=8, chunk_bytes=2500),
])
def test_the_changelog_restores_exactly_the_state_it_was_written_from(config):
    events = _fleet_events(seed=11)
    live, log = Correlator(config), {}
    offsets, outcomes, written = Counter(), Outcome(), Counter()
    rng = random.Random(3)
    i = 0
    while i < len(events):
        n = rng.randrange(1, 60)
        touched = set()
        for side, rec in events[i:i + n]:
            p = zlib.crc32(f"{rec['node']}/{rec['pid']}".encode()) % 3
            live.process(p, side, offsets[side, p], rec, outcomes)
            offsets[side, p] += 1
            touched.add(p)
        for p in touched:
            for rec in changelog(live, "g", p):
                data = single_object.encode("CorrelatorState", rec)
                assert len(data) < 1_000_000
                log[state_key(rec, config.log_slots)] = single_object.decode(data)[1]
                written[rec["kind"]] += 1
        fresh = Correlator(config)
        for p in touched:
            assert _view(restore(fresh, p, [r for r in log.values() if r["partition"] == p])) == _view(live.parts[p])
        i += n
    # every record left exactly once, or still waits
    pending = sum(sum(st.pending()) for st in live.parts.values())
    assert 2 * len(outcomes.matches) + len(outcomes.unmatched) + pending == len(events)
    assert len(outcomes.matches) > 1000
    if config.log_slots < 100:  # snapshots were taken, and log slots reused
        assert written["SNAPSHOT"] > 10 and written["LOG"] > 10 * config.log_slots
    max_chunks = max((r["chunks"] for r in log.values() if r["kind"] == "SNAPSHOT"), default=0)
    assert len(log) <= 3 * (config.log_slots + max_chunks)  # a fixed key space per partition


def test_a_restored_state_skips_what_it_has_seen_and_pairs_what_waits():
    live = Correlator()
    out = Outcome()
    live.process(0, LAUNCH, 0, launch(1, T0, ["main"]), out)
    live.process(0, LAUNCH, 1, launch(2, T0, ["main"], maps=False), out)
    records = {state_key(r, 4096): r for r in changelog(live, "g", 0)}
    fresh = Correlator()
    restore(fresh, 0, list(records.values()))
    again = Outcome()
    fresh.process(0, LAUNCH, 1, launch(2, T0, ["main"], maps=False), again)  # re-read after a crash: already there
    fresh.process(0, KERNEL, 0, kernel(2, T0 + 1, 10), again)
    assert again.replayed == 1 and len(again.matches) == 1
    assert again.matches[0][3] == MAPPINGS  # the process's mappings came back with the state


def test_a_simulated_kernel_labels_its_window_even_across_a_restore():
    """The kernel record's `simulated` flag waits with it, survives the changelog (v3) and marks the window's
    GpuSamples record, so the store labels simulated GPU time as such; a real kernel's window is not marked."""
    live = Correlator()
    live.process(0, KERNEL, 0, {**kernel(1, T0 + 5, 10), "simulated": True}, Outcome())
    live.process(0, KERNEL, 1, kernel(2, T0 + 20 * SECOND_NS, 10), Outcome())
    records = {state_key(r, 4096): r for r in changelog(live, "g", 0)}
    for r in records.values():
        assert single_object.decode(single_object.encode("CorrelatorState", r))[1] == r
    fresh = Correlator()
    restore(fresh, 0, list(records.values()))
    out = Outcome()
    fresh.process(0, LAUNCH, 0, launch(1, T0, ["main"]), out)
    fresh.process(0, LAUNCH, 1, launch(2, T0 + 20 * SECOND_NS - 1, ["main"], maps=False), out)
    assert [m[13] for m in out.matches] == [True, False]
    recs = build_gpu_samples(out.matches, [], 10 * SECOND_NS, LaunchStacks(), tables().get)
    assert sorted((r["window_start_ns"], r["simulated"]) for r in recs) == [(T0, True), (T0 + 20 * SECOND_NS, False)]


def test_a_changelog_with_a_gap_is_refused():
    live = Correlator()
    records = []
    for i in range(3):
        live.process(0, LAUNCH, i, launch(i, T0 + i, ["main"]), Outcome())
        records += changelog(live, "g", 0)
    assert [r["kind"] for r in records] == ["LOG"] * 3
    with pytest.raises(ChangelogError, match="do not follow"):
        restore(Correlator(), 0, [records[0], records[2]])


def test_a_stack_is_stored_once_for_all_the_launches_waiting_with_it():
    live, out = Correlator(), Outcome()
    for i in range(100):
        live.process(0, LAUNCH, i, launch(i, T0 + i, ["main", "run"]), out)
    (rec,) = changelog(live, "g", 0)
    assert len(rec["stacks"]) == 1 and len(rec["launches"]) == 100
    assert {x["stack_seq"] for x in rec["launches"]} == {rec["stacks"][0]["seq"]}
    for i in range(100):
        live.process(0, KERNEL, i, kernel(i, T0 + i + 1, 5), out)
    (rec,) = changelog(live, "g", 0)
    assert len(rec["removed"]) == 101 and live.parts[0].stacks == {}  # the launches, then their stack
    assert len(out.matches) == 100
