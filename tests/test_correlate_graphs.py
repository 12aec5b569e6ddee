"""CUDA graph launches in the correlator: one sampled graph launch matched by every kernel, copy and set its graph
replays, whether they come before or after it, interleaved with other graphs; exact totals with weights; every record
leaving once (matched, or counted with its reason); bounded state over a long replay; and the changelog (v4) bringing
a graph launch back with its match count after a crash between two of its records."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from processors.correlate import KERNEL, LAUNCH, SECOND_NS, CorrelateConfig, Correlator, Outcome
from processors.correlate_changelog import changelog, restore, state_key
from processors.correlate_samples import LaunchStacks, build_gpu_samples
from processors.demangle import demangle
from schemas import single_object
from tests.test_correlate import (
    GEMM,
    MS,
    NODE,
    PID,
    SGEMM,
    T0,
    Feed,
    gpu_time,
    kernel,
    launch,
    stage,
    tables,
    unmatched,
)

GID = 77


def glaunch(corr: int, t: int, path: list[str], weight: int = 1, **kw) -> dict:
    return launch(corr, t, path, weight, **kw) | {"graph": True, "api_name": "cudaGraphLaunch"}


def gkernel(corr: int, s: int, duration: int, node_id: int, name: str = GEMM, gid: int = GID, **kw) -> dict:
    return kernel(corr, s, duration, name, **kw) | {"graph_id": gid, "graph_node_id": node_id}


def samples(produced) -> list[dict]:
    return [s for p in produced if p.topic == "gpu.samples" for s in p.record["samples"]]


def test_a_graph_launch_takes_every_record_of_its_graph_before_and_after_it():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    before = [gkernel(1, T0 + i * MS, 100 + i, i) for i in range(3)]  # CUPTI delivered these first
    after = [gkernel(1, T0 + (3 + i) * MS, 200 + i, 3 + i, SGEMM if i % 2 else GEMM) for i in range(5)]
    feed.send(*before)
    assert feed.stage.correlator.parts[0].pending() == (0, 3)  # three records of one correlation id wait at once
    feed.send(glaunch(1, T0, ["main", "run"], weight=3), *after[:2])
    feed.send(*after[2:])
    st = feed.stage.correlator.parts[0]
    assert st.pending() == (1, 0) and st.launches[(NODE, PID, 777_000_000_000, 1)][8] == 8 and not st.graph_index
    durations = {GEMM: 100 + 101 + 102 + 200 + 202 + 204, SGEMM: 201 + 203}
    assert gpu_time(feed.produced) == {("main", "run", demangle(GEMM)): 3 * durations[GEMM],
                                       ("main", "run", SGEMM): 3 * durations[SGEMM]}
    # launches: each record stands for `weight` launches of its own (kernel, device, stream) row
    launches = Counter()
    for s in samples(feed.produced):
        launches[s["kernel_name"]] += s["launches"]
    assert launches == {GEMM: 18, SGEMM: 6}
    # the horizon passes: the launch leaves, matched, without an unmatched count
    feed.send(launch(2, T0 + 20 * SECOND_NS, ["main"]), kernel(2, T0 + 20 * SECOND_NS, 5))
    assert st.pending() == (0, 0)
    assert unmatched(feed.produced) == {}


def test_interleaved_graphs_of_two_processes_and_plain_launches_keep_exact_totals():
    rng = random.Random(5)
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    events, want = [], Counter()
    for g, (pid, path, weight) in enumerate([(PID, ["main", "compute"], 1), (PID, ["main", "hash_block"], 7),
                                             (PID + 1, ["main", "compute"], 2)]):
        corr = 10 + g
        events.append((g * 10, glaunch(corr, T0 + g * MS, path, weight, pid=pid)))
        for n in range(40):
            d = rng.randrange(1, 1000)
            want[tuple(path) + (demangle(GEMM),)] += d * weight
            # records spread around the launch: about half come first
            events.append((g * 10 + rng.randrange(-30, 30), gkernel(corr, T0 + g * MS + 10 + n, d, n, pid=pid,
                                                                    gid=GID + g)))
    for i in range(20):  # plain launches and kernels in between, one to one
        events.append((i * 3, launch(100 + i, T0 + i, ["main", "hash_block"], maps=False)))
        events.append((i * 3 + rng.randrange(-5, 5), kernel(100 + i, T0 + i + 5, 10)))
        want[("main", "hash_block", demangle(GEMM))] += 10
    events.sort(key=lambda e: e[0])
    recs = [r for _, r in events]
    for i in range(0, len(recs), 7):
        feed.send(*recs[i:i + 7])
    assert gpu_time(feed.produced) == want
    assert unmatched(feed.produced) == {}
    assert feed.stage.correlator.parts[0].pending() == (3, 0)  # the three graph launches wait for the horizon


def test_a_graph_launch_that_never_matched_expires_and_a_record_after_it_left_is_late():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    feed.send(glaunch(1, T0, ["main"], weight=4), glaunch(2, T0 + MS, ["main"]), gkernel(2, T0 + 2 * MS, 50, 0))
    feed.send(launch(3, T0 + 10 * SECOND_NS, ["main"]), kernel(3, T0 + 10 * SECOND_NS, 5))  # cutoff T0 + 5 s
    assert unmatched(feed.produced) == {("LAUNCH", "EXPIRED"): 1, ("LAUNCH", "EXPIRED", "launches"): 4}
    # graph 2 left matched; a record of it now, older than the cutoff, is late; a newer one waits, then expires
    feed.send(gkernel(2, T0 + 3 * MS, 60, 1), gkernel(2, T0 + 6 * SECOND_NS, 70, 2))
    feed.send(launch(4, T0 + 30 * SECOND_NS, ["main"]), kernel(4, T0 + 30 * SECOND_NS, 5))
    assert unmatched(feed.produced) == {("LAUNCH", "EXPIRED"): 1, ("LAUNCH", "EXPIRED", "launches"): 4,
                                        ("KERNEL", "LATE"): 1, ("KERNEL", "LATE", "ns"): 60,
                                        ("KERNEL", "EXPIRED"): 1, ("KERNEL", "EXPIRED", "ns"): 70}
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 60}
    assert feed.stage.correlator.parts[0].pending() == (0, 0) and not feed.stage.correlator.parts[0].graph_index


def test_a_duplicate_graph_record_counts_once_and_eviction_keeps_the_index():
    feed = Feed(stage(max_pending=10))
    feed.send(gkernel(1, T0, 100, 0), gkernel(1, T0, 100, 0))  # the same node of the graph at the same time
    feed.send(*[gkernel(2, T0 + MS + i, 10, i) for i in range(12)])  # 13 waiting: the 3 oldest evicted
    st = feed.stage.correlator.parts[0]
    assert st.pending() == (0, 10) and {k: len(v) for k, v in st.graph_index.items()} == {
        (NODE, PID, 777_000_000_000, 2): 10}
    feed.send(glaunch(2, T0, ["main"]), glaunch(1, T0, ["main"]))
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 100}
    assert unmatched(feed.produced) == {("KERNEL", "SUPERSEDED"): 1, ("KERNEL", "SUPERSEDED", "ns"): 100,
                                        ("KERNEL", "EVICTED"): 3, ("KERNEL", "EVICTED", "ns"): 120}
    assert st.pending() == (2, 0) and not st.graph_index


def test_an_evicted_graph_launch_left_matched_if_it_had_matched():
    corr, out = Correlator(CorrelateConfig(max_pending=2)), Outcome()
    corr.process(0, LAUNCH, 0, glaunch(1, T0, ["main"], weight=5), out)
    corr.process(0, KERNEL, 0, gkernel(1, T0 + 1, 10, 0), out)
    corr.process(0, LAUNCH, 1, glaunch(2, T0 + 1, ["main"], weight=6), out)  # never matched
    for i in range(3, 5):
        corr.process(0, LAUNCH, i - 1, glaunch(i, T0 + i, ["main"]), out)
    assert corr.parts[0].pending() == (2, 0) and len(out.matches) == 1 and out.graph_launches == 1
    assert out.unmatched == [(NODE, PID, T0 + 1, LAUNCH, "EVICTED", 0, 6)]
    corr.process(0, KERNEL, 1, gkernel(1, T0 + 2, 10, 1), out)  # launch 1 is gone: its record waits
    assert corr.parts[0].pending() == (2, 1)


def test_a_duplicate_graph_launch_counts_once_and_the_waiting_one_keeps_matching():
    feed = Feed(stage(horizon_ns=5 * SECOND_NS))
    feed.send(glaunch(1, T0, ["main"], weight=2), gkernel(1, T0 + 1, 10, 0))
    feed.send(glaunch(1, T0, ["main"], weight=2), gkernel(1, T0 + 2, 20, 1))  # sent again
    feed.send(launch(2, T0 + 20 * SECOND_NS, ["main"]), kernel(2, T0 + 20 * SECOND_NS, 5))
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 2 * 30 + 5}
    assert unmatched(feed.produced) == {("LAUNCH", "SUPERSEDED"): 1, ("LAUNCH", "SUPERSEDED", "launches"): 2}


def test_without_process_start_graph_records_of_an_earlier_process_are_superseded():
    feed = Feed(stage())
    feed.send(gkernel(5, T0, 40, 0, start=0), gkernel(5, T0 + 1, 30, 1, start=0))  # an earlier process's
    feed.send(glaunch(5, T0 + 100 * SECOND_NS, ["main"], start=0),
              gkernel(5, T0 + 100 * SECOND_NS + MS, 20, 0, start=0))
    assert gpu_time(feed.produced) == {("main", demangle(GEMM)): 20}
    assert unmatched(feed.produced) == {("KERNEL", "SUPERSEDED"): 2, ("KERNEL", "SUPERSEDED", "ns"): 70}


def _graph_view(st) -> tuple:
    launches = [(k, e[:4] + e[5:]) for k, e in st.launches.items()]
    return (launches, list(st.kernels.items()), {k: list(v) for k, v in st.graph_index.items()},
            [(k, e[:3] + e[4:]) for k, e in st.procs.items()], list(st.stacks.values()), st.wm, st.check_at,
            st.next_seq, st.offsets)


def _graph_events(seed: int, graphs: int = 30) -> tuple[list[tuple[int, dict]], Counter]:
    """Graph launches (weights 1..5) each replaying 5..40 records, a third of them before their launch, some plain
    pairs between, lightly shuffled; and the GPU ns x weight each stack should get."""
    rng = random.Random(seed)
    timed, want = [], Counter()
    for g in range(graphs):
        t = T0 + g * SECOND_NS // 2
        w = rng.randrange(1, 6)
        path = ["main", ("run", "compute", "write_out")[g % 3]]
        timed.append((t, LAUNCH, glaunch(g, t, path, w, maps=g == 0)))
        for n in range(rng.randrange(5, 40)):
            s, d = t + rng.randrange(-MS, 20 * MS), rng.randrange(1, 5000)
            # a third come before their launch
            timed.append((t - 1 - n if rng.random() < 0.33 else t + 30 * MS + n, KERNEL, gkernel(g, s, d, n)))
            want[tuple(path) + (demangle(GEMM),)] += d * w
        for p in range(3):
            c = 100_000 + g * 10 + p
            timed.append((t + p, LAUNCH, launch(c, t + p, ["main", "hash_block"], maps=False)))
            timed.append((t + p + 2, KERNEL, kernel(c, t + p + MS, 7)))
            want[("main", "hash_block", demangle(GEMM))] += 7
    timed.sort(key=lambda e: e[0])
    events = [(side, rec) for _, side, rec in timed]
    for i in range(0, len(events) - 10, 3):
        j = i + rng.randrange(10)
        events[i], events[j] = events[j], events[i]
    return events, want


def _gpu_ns(matches: list[tuple]) -> Counter:
    recs = build_gpu_samples(matches, [], 10 * SECOND_NS, LaunchStacks(), tables().get)
    return gpu_time([type("P", (), {"topic": "gpu.samples", "record": r})() for r in recs])


@pytest.mark.parametrize("seed", [4, 5])
def test_a_crash_between_two_records_of_a_graph_launch_loses_and_repeats_nothing(seed):
    """Batches commit their matches with their changelog records; some batches crash before their commit (their
    output is lost, the state goes back to the committed changelog and the batch is read again from the committed
    offsets). Totals are exact and every record leaves once, with graph launches matched on both sides of each
    crash."""
    config = CorrelateConfig(horizon_ns=5 * SECOND_NS, snapshot_min_bytes=3000, log_slots=8, chunk_bytes=2000)
    events, want = _graph_events(seed=seed)
    rng = random.Random(seed + 5)
    written = Counter()
    log: dict[str, dict] = {}
    committed = Outcome()
    live = Correlator(config)
    offsets = [0, 0]  # committed next offsets per side (one partition)
    pos = crashes = 0
    split_graphs = 0
    while pos < len(events):
        n = rng.randrange(1, 25)
        batch = events[pos:pos + n]
        out = Outcome()
        offs = list(offsets)
        for side, rec in batch:
            live.process(0, side, offs[side], rec, out)
            offs[side] += 1
        if rng.random() < 0.3:  # crash before the commit: this batch's output and changes are gone
            crashes += 1
            st = live.parts.get(0)
            split_graphs += sum(1 for e in (st.launches.values() if st else ()) if e[7] and e[8])
            live.parts.clear()  # as CorrelateStage.after_abort: stack numbers live on, the state is read back
            restore(live, 0, [r for r in log.values() if r["partition"] == 0])
            continue  # read again from the committed offsets
        for rec in changelog(live, "g", 0):
            written[rec["kind"], rec["chunks"] > 1] += 1
            log[state_key(rec, config.log_slots)] = single_object.decode(single_object.encode("CorrelatorState",
                                                                                             rec))[1]
        committed.matches += out.matches
        committed.unmatched += out.unmatched
        committed.graph_launches += out.graph_launches
        offsets = offs
        pos += n
        fresh = Correlator(config)
        assert _graph_view(restore(fresh, 0, list(log.values()))) == _graph_view(live.parts[0])
    assert crashes > 5 and split_graphs > 3  # crashes did come while graph launches had matched some records
    # snapshots (some in several chunks) and logs both carried graph launches and records
    assert written["SNAPSHOT", True] and written["SNAPSHOT", False] and written["LOG", False] > 20
    for i in range(3):  # the horizon passes
        live.process(0, LAUNCH, offsets[LAUNCH] + i, launch(9_000_000 + i, T0 + 100 * SECOND_NS, ["main"]),
                     committed)
        live.process(0, KERNEL, offsets[KERNEL] + i, kernel(9_000_000 + i, T0 + 100 * SECOND_NS, 1), committed)
    assert committed.unmatched == []
    assert _gpu_ns(committed.matches) == want + Counter({("main", demangle(GEMM)): 3})
    kernels = sum(1 for side, _ in events if side == KERNEL)
    launches = sum(1 for side, _ in events if side == LAUNCH)
    assert len(committed.matches) - 3 == kernels  # every record matched exactly once
    plain = launches - 30
    assert committed.graph_launches == 30 and len([m for m in committed.matches if m[18] == 0]) - 3 == plain


def test_a_long_replay_keeps_the_state_bounded_and_the_totals_exact():
    """1M graph kernel records of 500 graph launches, through Correlator.process with a changelog per batch of
    10,000: the pending state stays at a few launches, each changelog record small, and the totals exact."""
    cfg = CorrelateConfig(horizon_ns=2 * SECOND_NS)
    corr = Correlator(cfg)
    launches, per = 500, 2000
    want_ns = want_launches = matches = 0
    biggest_state = biggest_log = 0
    offsets = [0, 0]
    out = Outcome()
    started = time.monotonic()
    base = launch(0, T0, ["main", "run"], maps=False) | {"graph": True}
    for g in range(launches):
        t = T0 + g * 100 * MS
        w = 1 + g % 4
        corr.process(0, LAUNCH, offsets[LAUNCH], {**base, "correlation_id": g, "time_ns": t, "weight": w}, out)
        offsets[LAUNCH] += 1
        rec = gkernel(g, t, 0, 0) | {"graph_id": 1 + g % 7}
        for n in range(per):
            s = t + 10 + n * 20
            rec["start_ns"], rec["end_ns"], rec["graph_node_id"] = s, s + 1 + n % 13, n % 50  # nothing keeps it
            corr.process(0, KERNEL, offsets[KERNEL], rec, out)
            offsets[KERNEL] += 1
            want_ns += (1 + n % 13) * w
            if offsets[KERNEL] % 10_000 == 0:
                matches += len(out.matches)
                got = sum(m[7] * m[5] for m in out.matches)
                want_launches += sum(m[5] for m in out.matches)
                want_ns -= got
                out.matches.clear()
                st = corr.parts[0]
                biggest_state = max(biggest_state, sum(st.pending()), len(st.stacks), len(st.added),
                                    len(st.updated), len(st.removed))
                biggest_log = max(biggest_log, sum(len(single_object.encode("CorrelatorState", r))
                                                   for r in changelog(corr, "g", 0)))
    matches += len(out.matches)
    want_ns -= sum(m[7] * m[5] for m in out.matches)
    want_launches += sum(m[5] for m in out.matches)
    assert matches == launches * per and want_ns == 0
    assert want_launches == sum((1 + g % 4) * per for g in range(launches))
    assert out.unmatched == [] and biggest_state <= 25 and biggest_log < 4000
    assert out.graph_launches == launches  # each joined once, those still waiting at the end too
    assert time.monotonic() - started < 30
