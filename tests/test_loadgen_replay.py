"""loadgen's replay mode: pre-encoded windows sent with their times and correlation ids rewritten decode with the real
schemas to exactly what a window at the new time carries, and a replayed run lands in the topics exactly as its report
says (the live mode's checks, run on a replayed run)."""

from __future__ import annotations

import io
import json
import uuid
from collections import Counter

import fastavro
import numpy as np
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer

from schemas import topics
from schemas.single_object import decode
from simulate.replay import CORR_BASE, prepare, run_loadgen, shift_varints, varint
from simulate.synthetic_fleet import SyntheticFleet
from tests.test_loadgen import (  # noqa: F401 - the live mode's checks, collected here against the replayed `sent`
    _cli,
    _ends,
    _read,
    test_cpu_batches_match_the_report_exactly,
    test_gpu_records_match_the_report,
    test_identities_are_defined_once_per_node_and_every_reference_is_defined,
    test_symbols_are_complete_and_stacks_symbolize_to_the_reported_counts,
)

W = 10**10
T0 = 1_790_000_000 * 10**9  # a window start in 2026


@pytest.fixture(scope="module")
def sent(kafka_bootstrap: str):
    """One replayed run: 3 nodes, 1 s windows, 3 s, unpaced, 2 pre-encoded windows (the first sent twice)."""
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"test-replay-{uuid.uuid4()}",
                         "enable.auto.commit": False, "max.partition.fetch.bytes": 16 << 20})
    try:
        before = _ends(consumer)
        report = run_loadgen({"bootstrap.servers": kafka_bootstrap}, nodes=3, rate=152, duration=3, window=1,
                             seed=5, pace=False, node_prefix=f"r{uuid.uuid4().hex[:8]}-node", replay=2)
        return report, _read(consumer, before, _ends(consumer))
    finally:
        consumer.close()


def _long(value: int) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema("long"), value)
    return buf.getvalue()


def test_varints_are_avro_longs_and_shift_in_place() -> None:
    for v in (0, 1, -1, 63, 64, CORR_BASE, 2**34 - 1, T0, 2**62 - 1, -(2**63)):
        assert varint(v) == _long(v)
    values = [T0, T0 + 123_456_789, 2**55, 2**62 - 10**12]
    buf = np.frombuffer(bytearray(b"".join(b"\x01" + varint(v) for v in values)), dtype=np.uint8).copy()
    offsets = np.arange(len(values), dtype=np.int64) * 10 + 1
    shift_varints(buf, offsets, 9, np.array([7, -7, 10**9, 10**12 - 1]))
    assert bytes(buf) == b"".join(b"\x01" + varint(v + d) for v, d in zip(values, [7, -7, 10**9, 10**12 - 1],
                                                                          strict=True))
    with pytest.raises(ValueError, match="no longer fits"):
        shift_varints(buf, offsets[:1], 9, 2**62)
    corr = np.frombuffer(bytearray(varint(CORR_BASE)), dtype=np.uint8).copy()
    shift_varints(corr, np.array([0]), 5, 5000)
    assert bytes(corr) == varint(CORR_BASE + 5000)


def _decoded(t) -> list[tuple[str, dict]]:
    return [(topic, decode(bytes(t.blob[a:b]))[1]) for topic, (a, b) in zip(t.topics, t.bounds, strict=True)]


def test_a_moved_window_decodes_to_the_same_records_at_the_new_time() -> None:
    fleet = SyntheticFleet(seed=3)
    sim = [fleet.node(i) for i in range(2)]
    templates = prepare(fleet, sim, 2, T0, W, 1520, True, 2.0, 1 << 20)
    span = {(n.name, pid): c - CORR_BASE for n in sim for pid, c in n.correlation.items()}
    assert all(s > 0 for (_, pid), s in span.items() if any(p.pid == pid and p.kind == "trainer"
                                                            for n in sim for p in n.processes))
    t = templates[1]
    before = _decoded(t)
    assert [topic for topic, _ in before[:t.cpu_messages]] == [topics.CPU_STACKS.name] * 2  # CPU batches first
    assert Counter(topic for topic, _ in before) == Counter(
        {topics.CPU_STACKS.name: 2, topics.GPU_METRICS.name: 20, topics.GPU_LAUNCHES.name: t.run.messages[
            topics.GPU_LAUNCHES.name], topics.GPU_KERNELS.name: t.run.messages[topics.GPU_KERNELS.name]})
    shift = 7 * W  # window 8 of a run whose windows 0 and 1 these are: replay cycle 4
    t.move(T0 + W + shift, 4)
    after = _decoded(t)
    times = {"window_start_ns", "time_ns", "start_ns", "end_ns"}
    for (topic, old), (topic2, new) in zip(before, after, strict=True):
        assert topic == topic2
        want = {k: v + shift if k in times else v for k, v in old.items()}
        if "correlation_id" in old:
            want["correlation_id"] = old["correlation_id"] + 4 * span[old["node"], old["pid"]]
        assert new == want
        assert new["simulated"] is True
    launches = [r for topic, r in after if topic == topics.GPU_LAUNCHES.name]
    assert launches and all(T0 + 8 * W <= r["time_ns"] < T0 + 9 * W for r in launches)
    t.move(T0 + W, 0)  # and back: the bytes it had
    assert _decoded(t) == before


def test_replayed_correlation_ids_keep_increasing_and_weights_are_their_gaps(sent) -> None:
    report, got = sent
    assert report.replay_windows == 2 and report.windows == 3
    by_pid: dict[tuple[str, int], list[dict]] = {}
    for _, value in got[topics.GPU_LAUNCHES.name]:
        rec = decode(value)[1]
        if rec["node"] in report.nodes:
            by_pid.setdefault((rec["node"], rec["pid"]), []).append(rec)
    assert len(by_pid) == 3 * 8
    for recs in by_pid.values():  # one partition per key: in the order sent
        ids = [r["correlation_id"] for r in recs]
        assert ids[0] - recs[0]["weight"] == CORR_BASE
        assert all(b - a == r["weight"] for a, b, r in zip(ids, ids[1:], recs[1:], strict=False))
        first = report.first_window_start_ns
        assert all(first <= r["time_ns"] < report.end_ns for r in recs)
        assert [r["time_ns"] for r in recs] == sorted(r["time_ns"] for r in recs)


def test_cli_replay_waits_for_the_go(kafka_bootstrap: str, tmp_path) -> None:
    prefix = f"g{uuid.uuid4().hex[:8]}"
    ready, go = tmp_path / "ready", tmp_path / "go"
    go.touch()
    result = CliRunner().invoke(_cli(), ["--kafka", kafka_bootstrap, "loadgen", "--nodes", "2", "--duration", "3s",
                                         "--window", "1s", "--no-pace", "--replay", "2", "--node-prefix", prefix,
                                         "--ready-file", str(ready), "--go-file", str(go), "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert ready.exists() and report["replay_windows"] == 2
    assert report["total_samples"] == 2 * 3 * 152 and report["batches"] == 6 and report["metrics"] == 6
    assert report["cpu_send_s"] > 0 and report["cpu_prepare_s"] > 0
