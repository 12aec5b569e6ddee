"""Each topic-to-topic stage over records that decode but are bogus (absurd addresses and times, path-like build ids,
negative pids and counts, 1 MB strings, overlapping mappings), through the runner's isolation: it gives outputs the
runner can send, or dead letters with a reason, within a time limit, opening no file a message names."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.alerts import MAX_NAME, MAX_PIDS, AlertConfig, DropDetector
from processors.correlate import MAX_NODE
from processors.runner import MAX_OUTPUT_BYTES, encode_produced
from processors.symbol_tables import BadChunk, SymbolTables
from processors.symbolize import LONG_MAX
from schemas import single_object
from tests.fuzz import targets
from tests.fuzz.records import record_of

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
FEW_BIG = settings(FUZZ, max_examples=8)
FACTORIES = targets.stage_factories()


@pytest.fixture(scope="module")
def harness():
    made: dict[str, targets.StageHarness] = {}

    def get(name: str) -> targets.StageHarness:
        if name not in made:
            made[name] = targets.StageHarness(FACTORIES[name])
        return made[name]

    yield get
    for h in made.values():
        h.close()


def _messages(pairs: list[tuple[str, dict]], columnar: bool = False) -> list:
    out = []
    for i, (topic, rec) in enumerate(pairs):
        (m,) = targets.as_messages(topic, [rec], columnar)
        m.offset = i
        out.append(m)
    return out


def _launches_and_kernels(big: bool) -> st.SearchStrategy:
    return st.lists(st.one_of(st.tuples(st.just("gpu.launches"), record_of("GpuLaunch", big=big)),
                              st.tuples(st.just("gpu.kernels"), record_of("GpuKernel", big=big))),
                    min_size=1, max_size=6)


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MB-strings"])
def test_symbolize_survives_bogus_batches(harness, big):
    @FEW_BIG if big else FUZZ
    @given(st.lists(record_of("CpuStackBatch", big=big), min_size=1, max_size=3))
    def check(batches):
        out = harness("symbolize").run(_messages([("cpu.stacks", b) for b in batches], columnar=True))
        assert len(out) >= len(batches)  # every batch gives samples or a dead letter

    check()


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MB-strings"])
def test_correlate_survives_bogus_launches_and_kernels(harness, big):
    @FEW_BIG if big else FUZZ
    @given(_launches_and_kernels(big))
    def check(pairs):
        harness("correlate").run(_messages(pairs))

    check()


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MB-strings"])
def test_alerts_survive_bogus_polls(harness, big):
    @FEW_BIG if big else FUZZ
    @given(st.lists(record_of("GpuMetrics", big=big), min_size=1, max_size=5))
    def check(polls):
        harness("alerts").run(_messages([("gpu.metrics", p) for p in polls]))

    check()


# ---- regressions: each of these broke a stage or the runner before its fix --------------------------------------

LAUNCH = {"node": "n", "pid": 3, "tid": 3, "process_start_ns": 0, "time_ns": 10**18, "correlation_id": 1,
          "callback_id": 5, "api_name": "cudaLaunchKernel", "weight": 1, "user_addrs": [0x1000], "mappings": [],
          "simulated": False}
KERNEL = {"node": "n", "pid": 3, "process_start_ns": 0, "correlation_id": 1, "start_ns": 10**18, "end_ns": 10**18 + 5,
          "device_id": 0, "stream_id": 1, "kernel_name": "k", "simulated": False}


def _batch(counts: list[int], pid: int = 1, window_start_ns: int = 10**18) -> dict:
    return {"node": "n", "window_start_ns": window_start_ns, "window_ns": 10**10, "frequency_hz": 19,
            "kernel_build_id": "", "simulated": False,
            "processes": [{"pid": pid, "comm": "c", "exe": "", "cgroup": "", "container_id": "", "mappings": [],
                           "stacks": [{"tid": 1, "user_addrs": [0x1000], "kernel_addrs": [], "count": c}
                                      for c in counts]}]}


def test_summed_counts_stay_avro_longs(harness):
    """Two stacks that symbolize alike, each counted 2^62: their sum overflowed the output's long (the runner died
    encoding it); it is held at the largest long."""
    (out,) = harness("symbolize").run(_messages([("cpu.stacks", _batch([2**62, 2**62]))], columnar=True))
    assert out.topic == "cpu.samples" and [s["count"] for s in out.record["samples"]] == [LONG_MAX]


def test_summed_gpu_time_stays_an_avro_long(harness):
    """Kernels of the longest allowed duration at the largest weight: one product fits, their sum did not."""
    from processors.correlate import MAX_DURATION_NS, MAX_WEIGHT

    pairs = []
    for c in range(3):
        pairs += [("gpu.launches", {**LAUNCH, "correlation_id": c, "weight": MAX_WEIGHT}),
                  ("gpu.kernels", {**KERNEL, "correlation_id": c, "end_ns": KERNEL["start_ns"] + MAX_DURATION_NS})]
    out = harness("correlate").run(_messages(pairs))
    (samples,) = [p for p in out if p.topic == "gpu.samples"]
    assert [(s["duration_ns"], s["launches"]) for s in samples.record["samples"]] == [(LONG_MAX, 3 * MAX_WEIGHT)]


def test_a_late_launch_at_the_start_of_time_has_a_window(harness):
    """A launch at -2^63 + 1 that arrives late: the start of its window lay below the smallest long."""
    out = harness("correlate").run(_messages([("gpu.kernels", {**KERNEL, "correlation_id": 9}),
                                              ("gpu.launches", LAUNCH),  # both inputs' watermarks now at 10^18
                                              ("gpu.launches", {**LAUNCH, "time_ns": -(2**63) + 1,
                                                                "correlation_id": 2})]))
    (samples,) = [p for p in out if p.topic == "gpu.samples"]
    assert samples.record["window_start_ns"] == -(2**63)
    assert [(u["side"], u["reason"]) for u in samples.record["unmatched"]] == [("LAUNCH", "LATE")]


@pytest.mark.parametrize("topic, record, what", [("gpu.launches", {**LAUNCH, "node": "n" * (MAX_NODE + 1)}, "launch"),
                                                 ("gpu.kernels", {**KERNEL, "node": "n" * (MAX_NODE + 1)}, "kernel")])
def test_a_giant_node_name_is_a_dead_letter_not_state(harness, topic, record, what):
    """A node name is part of every pending entry, changelog record and output: a 1 MB one made a state record
    that Kafka refuses."""
    (out,) = [p for p in harness("correlate").run(_messages([(topic, record)])) if p.topic == "deadletter"]
    assert out.record["reason"] == f"{what} with a node name of {MAX_NODE + 1} characters (limit {MAX_NODE})"


def _poll(util: int, t: int, node: str = "n", pids: range = range(0)) -> dict:
    return {"node": node, "time_ns": t, "simulated": False,
            "processes": [{"device_index": 0, "pid": p, "comm": "c", "container_id": "", "sm_util_pct": None,
                           "mem_util_pct": None, "used_memory_bytes": None} for p in pids],
            "devices": [{"index": 0, "uuid": "GPU-1", "name": "H100", "parent_uuid": "", "gpu_util_pct": util,
                         "mem_util_pct": None, "mem_used_bytes": None, "mem_total_bytes": None, "sm_clock_mhz": None,
                         "mem_clock_mhz": None, "power_mw": None, "power_limit_mw": None, "temperature_c": None,
                         "pcie_tx_kbps": None, "pcie_rx_kbps": None, "clock_event_reasons": None, "xid_errors": []}]}


def test_alerts_refuse_giant_names_and_bound_the_pids_they_keep(harness):
    out = harness("alerts").run(_messages([("gpu.metrics", _poll(90, 1, node="n" * 2000))]))
    assert [p.record["reason"] for p in out if p.topic == "deadletter"] == \
        [f"node name of 2000 characters (limit {MAX_NAME})"]
    assert all(len(encode_produced(p)[1]) <= MAX_OUTPUT_BYTES for p in out)
    # a firing GPU collects the pids of every poll; 40 polls of 5,000 new pids each stayed in its state record
    detector = DropDetector(AlertConfig(hold_ns=0))
    detector.poll(_poll(90, 0))
    for i in range(40):
        detector.poll(_poll(5, i + 1, pids=range(1 + i * 5000, 1 + (i + 1) * 5000)))
    (gpu,) = detector.gpus.values()
    assert gpu.phase == "FIRING" and gpu.pids == list(range(1, MAX_PIDS + 1))


@pytest.mark.parametrize("chunk, reason", [
    ({"chunk_index": 0, "chunk_count": 0}, "symbol chunk 0 of 0"),
    ({"chunk_index": 3, "chunk_count": 2}, "symbol chunk 3 of 2"),
    ({"chunk_index": -1, "chunk_count": 2}, "symbol chunk -1 of 2"),
    ({"names": []}, "has 1 addresses, 1 sizes and 0 names"),
])
def test_an_inconsistent_symbol_chunk_is_refused(chunk, reason):
    """chunk_count 0 (or an index past the count) made table_from_chunks index an empty list: the symbols feed
    raised in before_batch, outside the runner's isolation, and every symbolizer and correlator died on the same
    compacted record for ever."""
    good = {"build_id": "ab" * 20, "binary": "b", "kind": "ELF", "chunk_index": 0, "chunk_count": 1,
            "load_segments": [], "addrs": [16], "sizes": [0], "names": ["f"]}
    tables = SymbolTables()
    with pytest.raises(BadChunk, match=reason):
        tables.add_chunk(single_object.decode(single_object.encode("SymbolChunk", {**good, **chunk}))[1])
    assert len(tables.add_chunk(good)) == 1 and "ab" * 20 in tables


def test_an_output_too_large_for_kafka_becomes_a_dead_letter_not_a_crash(harness):
    """The runner's last line of defence, for outputs without an input to blame (a state record, an aggregate)."""
    from processors.messages import Produced

    runner = harness("symbolize").runner
    huge = Produced("gpu.samples", "n", "GpuSamples", {"node": "n" * 2_000_000, "window_start_ns": 0, "window_ns": 1,
                                                       "frames": [], "stacks": [], "samples": [], "unmatched": []})
    dead = runner._oversize(huge, 2_000_100)
    assert dead.topic == "deadletter" and dead.record["source_topic"] == "gpu.samples"
    assert dead.record["reason"] == (f"output of 2000100 bytes exceeds the {MAX_OUTPUT_BYTES}-byte message limit; "
                                     "dropped (an output, not an input)")
    assert len(encode_produced(dead)[1]) < 1000
