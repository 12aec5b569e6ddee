"""End to end on the real broker and chDB: known batches in, exact totals out; bad messages dead-lettered."""

from __future__ import annotations

import time
import uuid
from collections import Counter

from schemas import single_object
from tests.pipeline_helpers import (
    build_id_for,
    cpu_batch,
    encode,
    produce,
    read_topic,
    sink,
    stack,
    symbol_chunks,
    symbolizer,
    wait_for,
)


def expected_functions(batches: list[dict]) -> tuple[Counter, Counter]:
    """Reference self/total per function from root-first paths (a recursive function counts once)."""
    self_, total = Counter(), Counter()
    for path, count in batches:
        self_[path[-1]] += count
        for f in set(path):
            total[f] += count
    return self_, total


def stored_node_totals(store, nodes: list[str]) -> dict[str, int]:
    _, rows = store.query_sql(
        "SELECT node, sum(count) FROM cpu_samples WHERE node IN {nodes:Array(String)} GROUP BY node",
        {"nodes": nodes})
    return {n: int(c) for n, c in rows}


def test_known_batches_are_stored_exactly_and_bad_messages_dead_lettered(kafka_bootstrap, store):
    run = uuid.uuid4().hex[:8]
    node_a, node_b = f"e2e-{run}-a", f"e2e-{run}-b"
    bid = build_id_for(run)
    t0 = (time.time_ns() // 1_000_000_000) * 1_000_000_000
    paths = [
        (node_a, t0, [(["main", "run", "compute"], 5, 1), (["main", "run", "hash_block"], 3, 2),
                      (["main", "run", "compute"], 2, 3)]),
        (node_a, t0 + 1_000_000_000, [(["main", "write_out"], 4, 1)]),
        (node_b, t0, [(["main", "run", "compute", "hash_block"], 6, 1), (["main", "compute", "compute"], 2, 1)]),
    ]
    items = [("symbols", f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c)) for c in symbol_chunks(bid)]
    good = [encode("CpuStackBatch", cpu_batch(node, bid, ts, [stack(p, n, tid) for p, n, tid in st]))
            for node, ts, st in paths]
    unknown_fp = single_object.MARKER + b"\x01\x02\x03\x04\x05\x06\x07\x08" + b"\x00" * 8
    bad = [unknown_fp, good[0][: len(good[0]) // 2], b"not avro at all"]
    # bad messages sit between good ones on node_a's partition (same key → same partition), so they are read before
    # node_a's last window is stored: another partition may hold a backlog of earlier tests' batches
    items += [("cpu.stacks", node_a, good[0])]
    items += [("cpu.stacks", node_a, v) for v in bad]
    items += [("cpu.stacks", node_a, good[1]), ("cpu.stacks", node_b, good[2])]
    produce(kafka_bootstrap, items)

    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        want = {node_a: 14, node_b: 8}
        wait_for(lambda: stored_node_totals(store, [node_a, node_b]) == want, what="stored totals",
                 running=[sym, snk])
        time.sleep(1.0)  # anything extra (a duplicate) would show up by now
        assert stored_node_totals(store, [node_a, node_b]) == want
        dead = read_topic(kafka_bootstrap, "deadletter",
                          lambda m: m.key() is not None and m.key().decode() == node_a,
                          want=3, timeout=150)  # while the symbolizer runs (the last letter can come late)

    exp_self, exp_total = expected_functions([(p, n) for _, _, st in paths for p, n, _ in st])
    _, rows = store.query_named("top_functions_cpu", {
        "since": t0 // 1_000_000_000 - 60, "until": t0 // 1_000_000_000 + 60, "node": node_a, "pid": 0,
        "comm": "", "limit": 100})
    _, rows_b = store.query_named("top_functions_cpu", {
        "since": t0 // 1_000_000_000 - 60, "until": t0 // 1_000_000_000 + 60, "node": node_b, "pid": 0,
        "comm": "", "limit": 100})
    got_self, got_total = Counter(), Counter()
    for function, _binary, self_, total in [r[:4] for r in rows + rows_b]:
        got_self[function] += int(self_)
        got_total[function] += int(total)
    assert +got_self == +exp_self
    assert got_total == exp_total

    # where the windows came from: the batches' simulated flag and sampling frequency, one row per node and window
    _, windows = store.query_sql("SELECT DISTINCT node, ts, kind, simulated, frequency_hz FROM profile_windows "
                                 "WHERE node IN {n:Array(String)} ORDER BY node, ts", {"n": [node_a, node_b]})
    second = t0 // 1_000_000_000
    assert [(r[0], int(r[1].timestamp()), r[2], bool(r[3]), r[4]) for r in windows] == [
        (node_a, second, "cpu", True, 99), (node_a, second + 1, "cpu", True, 99), (node_b, second, "cpu", True, 99)]
    _, labelled = store.query_named("simulated_sources", {"since": second - 60, "until": second + 60, "node": node_b})
    assert [tuple(r) for r in labelled] == [("cpu", node_b)]

    reasons = sorted(single_object.decode(m.value())[1]["reason"] for m in dead)
    assert len(reasons) == 3
    assert any(r.startswith("unknown schema fingerprint") for r in reasons)
    assert any(r.startswith("truncated or corrupt Avro body") for r in reasons)
    assert any("missing C3 01 marker" in r for r in reasons)
    letters = [single_object.decode(m.value())[1] for m in dead]
    assert {bytes(d["value"]) for d in letters} == set(bad)
    assert all(d["source_topic"] == "cpu.stacks" and d["stage"] == "symbolize" for d in letters)
