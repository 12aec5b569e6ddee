"""loadgen against the real broker: what it reports is exactly what lands in the topics, and the stacks symbolize
(by the contract's reference function) to exactly the reported per-function sample counts."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import click
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaException, TopicPartition

from fleetprof.cli import cli
from fleetprof.commands import COMMANDS
from producers.publisher import PublishError, check_broker
from schemas import topics
from schemas.gpu_launch_writer import LaunchEncoder
from schemas.single_object import decode, encode
from schemas.wire import identity_key
from simulate.loadgen import LoadgenReport, run_loadgen
from simulate.synthetic_fleet import SyntheticFleet
from tests.test_synthetic_fleet import reference_symbolize, reference_symbolize_kernel, tables_from_chunks

TOPICS = [topics.SYMBOLS, topics.IDENTITIES, topics.CPU_STACKS, topics.GPU_LAUNCHES, topics.GPU_KERNELS,
          topics.GPU_METRICS]


def _ends(consumer: Consumer) -> dict[tuple[str, int], int]:
    """End offset of every partition; retried while a fresh broker still settles its partition leaders."""
    out = {}
    for t in TOPICS:
        for p in range(t.partitions):
            deadline = time.monotonic() + 30
            while True:
                try:
                    out[t.name, p] = consumer.get_watermark_offsets(TopicPartition(t.name, p), timeout=10)[1]
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    return out


def _read(consumer: Consumer, start: dict, end: dict) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every (key, value) between two snapshots of the end offsets."""
    wanted = {tp: e for tp, e in end.items() if e > start[tp]}
    consumer.assign([TopicPartition(t, p, start[t, p]) for (t, p) in wanted])
    out: dict[str, list] = {t.name: [] for t in TOPICS}
    deadline = time.monotonic() + 60
    while wanted and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            assert msg.error() is None, msg.error()
            tp = (msg.topic(), msg.partition())
            if tp in wanted and msg.offset() < wanted[tp]:
                out[msg.topic()].append((msg.key(), msg.value()))
                if msg.offset() + 1 >= wanted[tp]:
                    del wanted[tp]
    assert not wanted, f"partitions not read to their end: {wanted}"
    return out


@pytest.fixture(scope="module")
def sent(kafka_bootstrap: str) -> tuple[LoadgenReport, dict[str, list[tuple[bytes, bytes]]]]:
    """One run: 3 nodes, 1 s windows, 3 s, unpaced; and everything it wrote, read back from the topics."""
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"test-loadgen-{uuid.uuid4()}",
                         "enable.auto.commit": False, "max.partition.fetch.bytes": 16 << 20})
    try:
        before = _ends(consumer)
        report = run_loadgen({"bootstrap.servers": kafka_bootstrap}, nodes=3, rate=152, duration=3, window=1,
                             seed=5, pace=False, node_prefix=f"t{uuid.uuid4().hex[:8]}-node")
        return report, _read(consumer, before, _ends(consumer))
    finally:
        consumer.close()


def test_cpu_batches_match_the_report_exactly(sent) -> None:
    report, got = sent
    assert report.windows == 3 and report.window_ns == 10**9
    per_node: Counter[str] = Counter()
    windows: dict[str, set] = {}
    batches = 0
    for key, value in got[topics.CPU_STACKS.name]:
        _, batch = decode(value, expect="CpuStackBatch")
        if batch["node"] not in report.nodes:
            continue  # another test's data on the shared topic
        batches += 1
        assert key.decode() == batch["node"] and batch["simulated"] and batch["kernel_build_id"] == "kernel-6.1.0-sim"
        assert batch["window_start_ns"] % batch["window_ns"] == 0
        windows.setdefault(batch["node"], set()).add(batch["window_start_ns"])
        per_node[batch["node"]] += sum(s["count"] for p in batch["processes"] for s in p["stacks"])
    assert batches == report.batches == 9
    assert dict(per_node) == report.samples_per_node == {n: 152 * 3 for n in report.nodes}
    first = report.first_window_start_ns
    assert all(w == {first, first + 10**9, first + 2 * 10**9} for w in windows.values())
    assert report.end_ns == first + 3 * 10**9 <= time.time_ns()


def test_symbols_are_complete_and_stacks_symbolize_to_the_reported_counts(sent) -> None:
    report, got = sent
    chunks = [decode(v, expect="SymbolChunk")[1] for _, v in got[topics.SYMBOLS.name]]
    assert all(k.decode() == f"{c['build_id']}/{c['chunk_index']}" for (k, _), c in
               zip(got[topics.SYMBOLS.name], chunks, strict=True))
    ours = [c for c in chunks if c["build_id"] in report.build_ids]
    assert len(ours) >= report.symbol_chunks  # other runs in the session may have sent the same tables
    tables = tables_from_chunks(ours)
    assert set(tables) == set(report.build_ids)
    assert all(t["chunks"] == set(range(t["chunk_count"])) for t in tables.values())

    leaf: Counter[tuple[str, str]] = Counter()
    inclusive: Counter[tuple[str, str]] = Counter()
    for _, value in got[topics.CPU_STACKS.name]:
        batch = decode(value)[1]
        if batch["node"] not in report.nodes:
            continue
        kernel = tables[batch["kernel_build_id"]]
        for proc in batch["processes"]:
            for s in proc["stacks"]:
                frames = [reference_symbolize(a, proc["mappings"], tables) for a in s["user_addrs"]]
                frames += [reference_symbolize_kernel(a, kernel) for a in s["kernel_addrs"]]
                assert None not in frames
                leaf[frames[len(s["user_addrs"])] if s["kernel_addrs"] else frames[0]] += s["count"]
                for fn in set(frames):
                    inclusive[fn] += s["count"]
    assert dict(leaf) == report.samples_by_leaf
    assert dict(inclusive) == report.samples_by_function


def test_gpu_records_match_the_report(sent) -> None:
    report, got = sent
    nodes = set(report.nodes)
    launches = [(k, decode(v, expect="GpuLaunch")[1]) for k, v in got[topics.GPU_LAUNCHES.name]]
    launches = [(k, r) for k, r in launches if r["node"] in nodes]
    kernels = [(k, decode(v, expect="GpuKernel")[1]) for k, v in got[topics.GPU_KERNELS.name]]
    kernels = [(k, r) for k, r in kernels if r["node"] in nodes]
    metrics = [decode(v, expect="GpuMetrics")[1] for _, v in got[topics.GPU_METRICS.name]]
    metrics = [r for r in metrics if r["node"] in nodes]
    assert len(launches) == report.launches > 0 and len(kernels) == report.kernels == report.launches
    assert sum(r["weight"] for _, r in launches) == report.launch_weight
    assert all(k.decode() == f"{r['node']}/{r['pid']}" and r["simulated"] for k, r in launches + kernels)
    assert sum(r["end_ns"] - r["start_ns"] for _, r in kernels) == report.kernel_ns
    assert Counter(r["node"] for _, r in kernels) == report.kernels_per_node
    assert {r["correlation_id"] for _, r in launches} == {r["correlation_id"] for _, r in kernels}
    assert len(metrics) == report.metrics == 9 and all(m["simulated"] and len(m["devices"]) == 8 for m in metrics)
    assert report.messages_by_topic[topics.GPU_METRICS.name] == 9


def test_identities_are_defined_once_per_node_and_every_reference_is_defined(sent) -> None:
    report, got = sent
    fleet = SyntheticFleet(seed=5, node_prefix=report.nodes[0].rsplit("-", 1)[0])
    sim = {node.name: node for node in (fleet.node(i) for i in range(3))}
    assert [n.workloads.scheduler for n in sim.values()] == ["kubernetes", "kubernetes", "slurm"]
    definitions = [(k.decode(), decode(v, expect="WorkloadIdentity")[1]) for k, v in got[topics.IDENTITIES.name]]
    ours = [(k, d) for k, d in definitions if d["node"] in sim]
    assert len(ours) == report.identities == 6  # per node: its training pod or Slurm step, and its log shipper
    sent_at = ours[0][1]["time_ns"]  # when the run resolved them
    assert abs(sent_at - time.time_ns()) < 600 * 10**9
    want = [(identity_key(i.identity_id), i.record(name, sent_at, simulated=True))
            for name, node in sim.items() for i in node.identities]
    assert sorted(ours, key=repr) == sorted(want, key=repr)
    defined = {name: {d["identity_id"] for _, d in ours if d["node"] == name} for name in sim}

    # every id a record carries is one its node defined; the trainers' are on every record kind
    referenced: dict[str, set[int]] = {name: set() for name in sim}
    sampled: dict[str, set[int]] = {name: set() for name in sim}  # pids with CPU samples
    samples: Counter[str] = Counter()
    for _, value in got[topics.CPU_STACKS.name]:
        batch = decode(value)[1]
        if batch["node"] in sim:
            procs = {p.pid: p.identity_id for p in sim[batch["node"]].processes}
            for p in batch["processes"]:
                assert p["identity_id"] == procs[p["pid"]] != 0
                referenced[batch["node"]].add(p["identity_id"])
                sampled[batch["node"]].add(p["pid"])
                samples[identity_key(p["identity_id"])] += sum(s["count"] for s in p["stacks"])
    assert dict(samples) == report.samples_by_identity and samples.total() == report.total_samples
    for _, value in got[topics.GPU_LAUNCHES.name]:
        launch = decode(value)[1]
        if launch["node"] in sim:
            assert launch["identity_id"] == next(p.identity_id for p in sim[launch["node"]].processes
                                                 if p.pid == launch["pid"])
            referenced[launch["node"]].add(launch["identity_id"])
    for _, value in got[topics.GPU_METRICS.name]:
        poll = decode(value)[1]
        if poll["node"] in sim:
            node = sim[poll["node"]]
            assert [d["identity_id"] for d in poll["devices"]] == node.gpu_owner_ids
            assert [p["identity_id"] for p in poll["processes"]] == [p.identity_id for p in node.processes
                                                                     if p.kind == "trainer"]
            referenced[poll["node"]] |= {d["identity_id"] for d in poll["devices"]} - {0}
    assert referenced == {name: {p.identity_id for p in node.processes if p.kind == "trainer" or
                                 p.pid in sampled[name]} for name, node in sim.items()}
    assert all(referenced[name] <= defined[name] for name in sim)
    assert sim[report.nodes[2]].gpu_owner_ids == [0] * 8  # the Slurm node: no pod holds its GPUs
    assert sim[report.nodes[0]].gpu_owner_ids == [p.identity_id for p in sim[report.nodes[0]].processes[:8]]


def test_launch_encoder_matches_the_codec() -> None:
    fleet = SyntheticFleet(seed=1)
    node = fleet.node(0)
    enc = LaunchEncoder()
    for w in range(2):
        launches, _ = fleet.gpu_window(node, w * 10**10, 10**10, 2.0)
        for rec in launches:
            assert enc.encode(rec) == encode("GpuLaunch", rec)


def test_cli_json_report(kafka_bootstrap: str) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}"  # not the default names: other tests share the topics
    result = CliRunner().invoke(_cli(), ["--kafka", kafka_bootstrap, "loadgen", "--nodes", "2", "--duration", "2s",
                                         "--window", "1s", "--no-pace", "--no-gpu", "--node-prefix", prefix,
                                         "--format", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["total_samples"] == 2 * 2 * 152 and report["batches"] == 4 and report["launches"] == 0
    assert report["identities"] == 4 and sum(report["samples_by_identity"].values()) == 2 * 2 * 152
    assert report["samples_by_leaf"][0][2] >= report["samples_by_leaf"][-1][2]
    assert report["nodes"] == [f"{prefix}-0001", f"{prefix}-0002"]


def test_cli_errors_are_one_line() -> None:
    runner = CliRunner()
    for args in (["--nodes", "0"], ["--rate", "0"], ["--duration", "soon"], ["--window", "0"]):
        result = runner.invoke(_cli(), ["loadgen", *args])
        assert result.exit_code == 2 and "Error: Invalid value" in result.output, args
    t = time.monotonic()
    result = runner.invoke(_cli(), ["--kafka", "127.0.0.1:1", "loadgen", "--nodes", "1"])
    assert result.exit_code == 1 and time.monotonic() - t < 15
    assert result.output.strip().count("\n") == 0 and "not reachable" in result.output


def test_missing_topic_is_named(kafka_bootstrap: str) -> None:
    with pytest.raises(PublishError, match="no-such-topic"):
        check_broker({"bootstrap.servers": kafka_bootstrap}, ["cpu.stacks", "no-such-topic"])
    with pytest.raises(ValueError, match="rate"):
        run_loadgen({"bootstrap.servers": kafka_bootstrap}, nodes=1, rate=0, duration=1)


def _cli() -> click.Group:
    for command in COMMANDS:
        cli.add_command(command)
    return cli
