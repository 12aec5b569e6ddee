"""GPU time end to end on the real broker and chDB: launches and kernels → the correlator (consumer group,
transactions, changelog) → gpu.samples → the sink → `fleetprof query top|flamegraph --kind gpu`, with exact totals;
loadgen's simulated fleet attributed exactly as its report says; and a correlator killed mid-stream that, restarted,
stores every nanosecond once."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client import REGISTRY

from fleetprof.pprof import Profile
from processors.correlate_stage import build_correlate
from processors.demangle import demangle
from processors.runner import TopicRunner
from schemas import topics
from simulate.loadgen import run_loadgen
from tests.pipeline_helpers import Running, build_id_for, encode, produce, sink, symbol_chunks, wait_for
from tests.test_correlate import GEMM, MAPPINGS, SGEMM, kernel, launch
from tests.test_query_cli import run_here, silent_address

SECOND = 1_000_000_000
GROUP_TOPICS = {"correlate": [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name],
                "sink": [topics.GPU_SAMPLES.name, topics.CPU_SAMPLES.name, topics.GPU_METRICS.name]}


class Crash(BaseException):
    """Stands for the process dying at that exact point."""


class DyingTopicRunner(TopicRunner):
    """Dies at its `die_at`-th batch: inside the transaction (output produced, not committed), or just after the
    commit (the state in memory is lost, the committed changelog is all that is left of it)."""

    def __init__(self, *args, die_at: int, inside: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.die_at, self.inside = die_at, inside

    def _commit(self, out):
        if self.batches + 1 < self.die_at:
            return super()._commit(out)
        if self.inside:
            self.producer.begin_transaction()
            for p in out:
                key = p.key.encode() if isinstance(p.key, str) else p.key
                self.producer.produce(p.topic, key=key, value=encode(p.schema, p.record))
            self.producer.flush(10)
            raise Crash()
        super()._commit(out)
        raise Crash()


def start_at_end(bootstrap: str, group: str, names: list[str]) -> None:
    """Commit the group's offsets at the topics' current ends: it reads only what this test sends."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        ends = [TopicPartition(t, p, _retried(lambda t=t, p=p: c.get_watermark_offsets(TopicPartition(t, p),
                                                                                       timeout=10)[1]))
                for t in names for p in range(topics.BY_NAME[t].partitions)]
        _retried(lambda: c.commit(offsets=ends, asynchronous=False))
    finally:
        c.close()


def _retried(call, timeout: float = 30):
    """`call()`, retried while a just-started broker still elects a new topic's leader or the group's coordinator."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Run:
    """One test's names: node, groups, build id, a transactional slot of its own."""

    def __init__(self, bootstrap: str, store) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.bootstrap, self.store = bootstrap, store
        self.kafka = {"bootstrap.servers": bootstrap}
        self.node = f"gpu-e2e-{self.id}"
        self.group = f"corr-{self.id}"
        self.sink_group = f"sink-{self.id}"
        self.slot = int(self.id, 16) % 1_000_000
        self.build_id = build_id_for(self.id)
        start_at_end(bootstrap, self.group, GROUP_TOPICS["correlate"])
        start_at_end(bootstrap, self.sink_group, GROUP_TOPICS["sink"])

    def correlator(self, runner: type[TopicRunner] = TopicRunner, **kwargs) -> Running:
        stage = build_correlate(self.kafka, group=self.group)
        return Running(runner(stage, self.kafka, group=self.group, slot=self.slot, poll_timeout=0.2, **kwargs),
                       threading.Event())

    def sink(self) -> Running:
        return sink(self.store, self.bootstrap, self.sink_group)

    def send(self, *records: dict) -> None:
        produce(self.bootstrap, [(topics.GPU_KERNELS.name if "kernel_name" in r else topics.GPU_LAUNCHES.name,
                                  f"{r['node']}/{r['pid']}", encode("GpuKernel" if "kernel_name" in r else "GpuLaunch",
                                                                    r)) for r in records])

    def send_symbols(self) -> None:
        produce(self.bootstrap, [(topics.SYMBOLS.name, f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c))
                                 for c in symbol_chunks(self.build_id)])

    def launch(self, corr: int, t: int, path: list[str], weight: int = 1, **kw) -> dict:
        rec = launch(corr, t, path, weight, node=self.node, **kw)
        if rec["mappings"]:
            rec["mappings"] = [{**MAPPINGS[0], "build_id": self.build_id}]
        return rec

    def kernel(self, corr: int, s: int, duration: int, name: str = GEMM, **kw) -> dict:
        return kernel(corr, s, duration, name, node=self.node, **kw)

    def stored(self) -> Counter:
        """GPU ns per kernel name for this run's node."""
        _, rows = self.store.query_sql("SELECT kernel_name, sum(duration_ns) FROM gpu_kernel_samples "
                                       "WHERE node = {node:String} GROUP BY kernel_name", {"node": self.node})
        return Counter({name: int(ns) for name, ns in rows})

    def cli(self, *args: str):
        data_dir = os.path.dirname(self.store.location)  # the session's store is <data-dir>/chdb
        result = run_here(["--data-dir", data_dir, "--database", self.store.database, *args], silent_address())
        assert result.exit_code == 0, result.output
        return result


def _window(t0: int) -> list[str]:
    return ["--since", str(t0 // SECOND - 60), "--until", str(t0 // SECOND + 300)]


def test_known_launches_and_kernels_come_out_of_query_top_and_flamegraph_exactly(kafka_bootstrap, store, tmp_path):
    run = Run(kafka_bootstrap, store)
    run.send_symbols()
    t0 = (time.time_ns() // (10 * SECOND) - 30) * 10 * SECOND  # five minutes ago, a window boundary
    a, b = dict(pid=300), dict(pid=301, start=999)
    run.send(run.launch(1, t0 + 1_000, ["main", "run", "compute"], 2, **a),
             run.launch(2, t0 + 2_000, ["main", "run", "compute"], 1, maps=False, **a),
             run.launch(3, t0 + 3_000, ["main", "write_out"], 5, maps=False, **a),
             run.kernel(2, t0 + 9_000, 3_000, SGEMM, **a),  # before its launch in the other topic: either order pairs
             run.launch(1, t0 + 4_000, ["main", "run", "hash_block"], 1, **b),
             run.kernel(1, t0 + 5_000, 10_000, **a), run.kernel(3, t0 + 6_000, 1_000, SGEMM, **a),
             run.kernel(1, t0 + 7_000, 7_000, device=1, **b),
             run.kernel(99, t0 + 8_000, 4_444, **a),  # its launch never comes
             # 100 s later: the watermark passes the horizon, and kernel 99 is counted without a partner
             run.launch(4, t0 + 100 * SECOND, ["main", "run", "compute"], 1, maps=False, **a),
             run.kernel(4, t0 + 100 * SECOND + 10, 1_000, **a))
    gemm = demangle(GEMM)
    want = {GEMM: 21_000 + 7_000, SGEMM: 3_000 + 5_000}
    with run.correlator() as corr, run.sink() as snk:
        wait_for(lambda: run.stored() == want, what="GPU time per kernel", running=[corr, snk])
        wait_for(lambda: store.query_sql("SELECT count() FROM gpu_unmatched WHERE node = {node:String}",
                                         {"node": run.node})[1][0][0] > 0, what="the unmatched kernel", running=[corr])
        time.sleep(1.0)  # anything extra (a duplicate) would show up by now
        assert run.stored() == want
    _, lost = store.query_sql("SELECT side, reason, sum(events), sum(duration_ns), sum(launches) FROM gpu_unmatched "
                              "WHERE node = {node:String} GROUP BY side, reason", {"node": run.node})
    assert [tuple(r) for r in lost] == [("KERNEL", "EXPIRED", 1, 4_444, 0)]

    where = ["--node", run.node, *_window(t0)]
    top = json.loads(run.cli("query", "top", "--kind", "gpu", *where, "--format", "json").stdout)
    total = 36_000
    assert top == [
        {"function": gemm, "binary": "[gpu]", "self": 28_000, "total": 28_000, "share": 28_000 / total,
         "kernel": gemm},
        {"function": SGEMM, "binary": "[gpu]", "self": 8_000, "total": 8_000, "share": 8_000 / total, "kernel": SGEMM},
        {"function": "main", "binary": "app", "self": 0, "total": 36_000, "share": 0.0, "kernel": ""},
        {"function": "run", "binary": "app", "self": 0, "total": 31_000, "share": 0.0, "kernel": ""},
        {"function": "compute", "binary": "app", "self": 0, "total": 24_000, "share": 0.0, "kernel": ""},
        {"function": "hash_block", "binary": "app", "self": 0, "total": 7_000, "share": 0.0, "kernel": ""},
        {"function": "write_out", "binary": "app", "self": 0, "total": 5_000, "share": 0.0, "kernel": ""}]
    table = run.cli("query", "top", "--kind", "gpu", *where)
    assert "28 µs" in table.stdout and "77.8%" in table.stdout and "36 µs of GPU time" in table.stderr

    folded = run.cli("query", "flamegraph", "--kind", "gpu", *where, "--merge-processes").stdout
    assert folded == (f"main;run;compute;{gemm} 21000\nmain;run;hash_block;{gemm} 7000\n"
                      f"main;write_out;{SGEMM} 5000\nmain;run;compute;{SGEMM} 3000\n")
    only_b = run.cli("query", "flamegraph", "--kind", "gpu", *where, "--pid", "301", "--merge-processes").stdout
    assert only_b == f"main;run;hash_block;{gemm} 7000\n"

    run.cli("query", "flamegraph", "--kind", "gpu", *where, "--format", "pprof", "-o", str(tmp_path / "gpu.pb.gz"))
    prof = Profile()
    prof.ParseFromString(gzip.decompress((tmp_path / "gpu.pb.gz").read_bytes()))
    assert [(prof.string_table[t.type], prof.string_table[t.unit]) for t in prof.sample_type] == [
        ("gpu_time", "nanoseconds")]
    assert sum(s.value[0] for s in prof.sample) == total
    leaves = Counter()
    for s in prof.sample:
        leaves[prof.string_table[prof.function[s.location_id[0] - 1].name]] += s.value[0]
    assert leaves == {gemm: 28_000, SGEMM: 8_000}
    speedscope = json.loads(run.cli("query", "flamegraph", "--kind", "gpu", *where, "--format", "speedscope").stdout)
    assert speedscope["profiles"][0]["unit"] == "nanoseconds" and sum(speedscope["profiles"][0]["weights"]) == total
    stacks = json.loads(run.cli("query", "flamegraph", "--kind", "gpu", *where, "--format", "json",
                                "--merge-processes").stdout)
    assert stacks[0] == {"stack": ["main", "run", "compute", gemm], "count": 21_000}
    page = run.cli("query", "flamegraph", "--kind", "gpu", *where, "--format", "html").stdout
    assert page.startswith("<!doctype html>") and "fleetprof gpu" in page and "main" in page


def test_loadgen_gpu_time_is_attributed_exactly_as_its_report_says(kafka_bootstrap, store):
    run = Run(kafka_bootstrap, store)
    prefix = f"lg-{run.id}"
    with run.correlator() as corr, run.sink() as snk:
        report = run_loadgen(run.kafka, nodes=2, rate=50, duration=3, window=1, seed=7, pace=False,
                             launch_rate=20.0, node_prefix=prefix)
        assert report.launches == report.kernels > 100 and report.gpu_ns > 0

        def stored() -> dict:
            _, rows = store.query_sql("SELECT kernel_name, sum(duration_ns), sum(launches) FROM gpu_kernel_samples "
                                      "WHERE startsWith(node, {p:String}) GROUP BY kernel_name", {"p": prefix})
            return {name: (int(ns), int(n)) for name, ns, n in rows}

        want = {name: (ns, report.launches_by_kernel[name]) for name, ns in report.gpu_ns_by_kernel.items()}
        wait_for(lambda: stored() == want, what="GPU time and launches per kernel", running=[corr, snk])
        time.sleep(1.0)
        assert stored() == want
    _, lost = store.query_sql("SELECT count() FROM gpu_unmatched WHERE startsWith(node, {p:String})", {"p": prefix})
    assert lost[0][0] == 0

    since, until = report.first_window_start_ns // SECOND - 60, report.end_ns // SECOND + 60
    rows = []
    for node in report.nodes:
        rows += json.loads(run.cli("query", "top", "--kind", "gpu", "--node", node, "--since", str(since), "--until",
                                   str(until), "--limit", "100000", "--format", "json").stdout)
    self_, total = Counter(), Counter()
    for r in rows:
        self_[r["function"], r["binary"]] += r["self"]
        total[r["function"], r["binary"]] += r["total"]
    kernels = {(demangle(name), "[gpu]"): ns for name, ns in report.gpu_ns_by_kernel.items()}
    assert +self_ == kernels
    functions = {(demangle(f), b): ns for (b, f), ns in report.gpu_ns_by_function.items()}
    assert total == {**functions, **kernels}
    # every launching stack ends in the function the report names as its leaf
    leaves = Counter()
    for node in report.nodes:
        stacks = json.loads(run.cli("query", "flamegraph", "--kind", "gpu", "--node", node, "--since", str(since),
                                    "--until", str(until), "--format", "json").stdout)
        for s in stacks:
            leaves[s["stack"][-2]] += s["count"]
    assert leaves == {demangle(f): ns for (_, f), ns in report.gpu_ns_by_launch_leaf.items()}


@pytest.mark.parametrize("inside", [False, True], ids=["after-a-commit", "inside-its-transaction"])
def test_a_correlator_killed_mid_stream_stores_every_nanosecond_once(kafka_bootstrap, store, inside):
    run = Run(kafka_bootstrap, store)
    run.send_symbols()
    t0 = (time.time_ns() // (10 * SECOND) - 30) * 10 * SECOND
    paths = [["main", "run", "compute"], ["main", "write_out"], ["main", "run", "hash_block"]]

    def pair(i: int) -> tuple[dict, dict]:
        pid = 500 + i % 3
        return (run.launch(i, t0 + i * 1_000_000, paths[i % 3], 1 + i % 4, pid=pid, maps=i < 3),
                run.kernel(i, t0 + i * 1_000_000 + 500, 1_000 + i, GEMM if i % 2 else SGEMM, pid=pid))

    pairs = [pair(i) for i in range(40)]
    want = Counter()
    for lrec, krec in pairs:
        want[krec["kernel_name"]] += (krec["end_ns"] - krec["start_ns"]) * lrec["weight"]
    # the launches first: when the correlator dies, many of them wait for kernels that are not sent yet
    run.send(*[lrec for lrec, _ in pairs[:30]])
    restores = REGISTRY.get_sample_value("fleetprof_correlate_state_restores_total",
                                         {"stage": "correlate", "reason": "assigned"}) or 0
    dying = run.correlator(DyingTopicRunner, die_at=4, inside=inside, batch_size=5)
    with dying:
        wait_for(lambda: dying.error is not None, what="the correlator to die")
    assert isinstance(dying.error, Crash)
    assert dying.runner.batches == (3 if inside else 4)
    waiting = sum(sum(st.pending()) for st in dying.runner.stage.correlator.parts.values())
    assert waiting >= 15  # launches that were waiting in the memory that died

    run.send(*[krec for _, krec in pairs[:30]], *[r for p in pairs[30:] for r in p])
    with run.correlator() as corr, run.sink() as snk:
        wait_for(lambda: run.stored() == want, what="exact GPU time after the restart", running=[corr, snk])
        time.sleep(1.5)  # a duplicate would show up by now
        assert run.stored() == want
        restored = corr.runner.stage.correlator.parts
        assert sum(sum(st.pending()) for st in restored.values()) == 0
    assert (REGISTRY.get_sample_value("fleetprof_correlate_state_restores_total",
                                      {"stage": "correlate", "reason": "assigned"}) or 0) > restores
    _, lost = store.query_sql("SELECT count() FROM gpu_unmatched WHERE node = {node:String}", {"node": run.node})
    assert lost[0][0] == 0
    _, launches = store.query_sql("SELECT sum(launches) FROM gpu_kernel_samples WHERE node = {node:String}",
                                  {"node": run.node})
    assert int(launches[0][0]) == sum(lrec["weight"] for lrec, _ in pairs)
