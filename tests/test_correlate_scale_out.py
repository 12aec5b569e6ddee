"""More correlator instances than the old 6-partition cap: eight TopicRunners of the correlate stage (threads, a
transactional slot each) share gpu.launches and gpu.kernels of 12 partitions (the test session's override of the
fleet defaults, tests/conftest.py), every one of them gets partitions, and through one of them leaving mid-stream
(its partitions, and the join state of their pending launches, move to the others through the changelog) every
launch's GPU time reaches gpu.samples (read_committed) exactly once."""

from __future__ import annotations

import random
import threading
import time
import uuid
import zlib
from collections import Counter

from confluent_kafka import Consumer, ConsumerGroupState, TopicPartition
from confluent_kafka.admin import AdminClient

from processors.correlate_stage import build_correlate
from processors.runner import TopicRunner
from schemas import single_object, topics
from tests.pipeline_helpers import Running, encode, produce, wait_for
from tests.test_correlate import SGEMM
from tests.test_gpu_pipeline import start_at_end

SECOND = 1_000_000_000
INSTANCES = 8
INPUTS = [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name]


def processes_over_partitions(prefix: str, per_partition: int, partitions: int) -> list[tuple[str, int]]:
    """(node, pid) pairs whose key node/pid lands `per_partition` on each partition (librdkafka's partitioner for a
    key: CRC32 modulo the count)."""
    out, per = [], Counter()
    i = 0
    while len(out) < per_partition * partitions:
        node, pid = f"{prefix}-{i // 4}", 1000 + i
        p = zlib.crc32(f"{node}/{pid}".encode()) % partitions
        if per[p] < per_partition:
            per[p] += 1
            out.append((node, pid))
        i += 1
    return out


def launch(node: str, pid: int, corr: int, t: int) -> dict:
    return {"node": node, "pid": pid, "tid": pid, "process_start_ns": 5, "time_ns": t, "correlation_id": corr,
            "callback_id": 211, "api_name": "cudaLaunchKernel", "weight": 1 + corr % 7, "user_addrs": [0x401000 + pid],
            "mappings": [], "simulated": False}


def kernel(node: str, pid: int, corr: int, t: int, duration: int) -> dict:
    return {"node": node, "pid": pid, "process_start_ns": 5, "correlation_id": corr, "start_ns": t + 1000,
            "end_ns": t + 1000 + duration, "device_id": 0, "stream_id": 7, "kernel_name": SGEMM, "simulated": False}


def send(bootstrap: str, records: list[dict]) -> None:
    produce(bootstrap, [(topics.GPU_KERNELS.name if "kernel_name" in r else topics.GPU_LAUNCHES.name,
                         f"{r['node']}/{r['pid']}", encode("GpuKernel" if "kernel_name" in r else "GpuLaunch", r))
                        for r in records])


def assignments(bootstrap: str, group: str) -> list[set[tuple[str, int]]]:
    """The (topic, partition) sets of the group's members that hold any, as the broker describes the group (a
    consumer's own assignment() would wait for the thread polling it)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    if str(desc.state) != str(ConsumerGroupState.STABLE):
        return []
    return [{(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} for m in desc.members
            if m.assignment.topic_partitions]


def committed_since(bootstrap: str, topic: str, since_ms: int, timeout: float = 60) -> list[bytes]:
    """The values of `topic`'s committed messages written since `since_ms`, read until the position passes every
    partition's end (a transactional topic ends with a commit marker, which no message stands for)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"to-end-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        parts = [TopicPartition(topic, p, since_ms) for p in c.list_topics(topic, timeout=15).topics[topic].partitions]
        parts = [tp for tp in c.offsets_for_times(parts, timeout=15) if tp.offset >= 0]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=15)[1] for tp in parts}
        c.assign(parts)
        found: list[bytes] = []
        deadline = time.monotonic() + timeout
        while any(max(tp.offset, 0) < ends[tp.partition] for tp in c.position(parts)):
            assert time.monotonic() < deadline, f"{topic} not read to its end"
            found += [m.value() for m in c.consume(500, 0.5) if m.error() is None]
        return found
    finally:
        c.close()


def drained(bootstrap: str, group: str) -> bool:
    """The group's committed offsets are at the ends of both inputs."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        parts = [TopicPartition(t, p) for t in INPUTS for p in range(topics.BY_NAME[t].partitions)]
        committed = {(tp.topic, tp.partition): tp.offset for tp in c.committed(parts, timeout=10)}
        return all(committed[(tp.topic, tp.partition)] >= c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
    finally:
        c.close()


def test_eight_correlators_on_twelve_partitions_through_a_rebalance_count_every_launch_once(kafka_bootstrap):
    partitions = topics.GPU_LAUNCHES.partitions
    assert partitions >= 12 and topics.GPU_KERNELS.partitions == partitions
    assert INSTANCES > 6  # more than the old partition count allowed
    run = uuid.uuid4().hex[:8]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    group = f"corr-scale-{run}"
    start_at_end(kafka_bootstrap, group, INPUTS)
    started_ms = int(time.time() * 1000)
    procs = processes_over_partitions(f"scale-{run}", 2, partitions)
    slot0 = 2_000_000 + int(run, 16) % 1_000_000
    members = [Running(TopicRunner(build_correlate(kafka, group=group), kafka, group=group, slot=slot0 + i,
                                   poll_timeout=0.2, batch_size=100), threading.Event()) for i in range(INSTANCES)]
    rng = random.Random(run)
    t0 = time.time_ns() // SECOND * SECOND  # now: a fixed time would be another clock on the shared partitions
    launches, kernels = [], []
    for node, pid in procs:
        for k in range(10):
            corr = pid * 100 + k
            t = t0 + k * SECOND // 10
            launches.append(launch(node, pid, corr, t))
            kernels.append(kernel(node, pid, corr, t, rng.randrange(1000, 5_000_000)))
    # phase 1: every launch, the kernels of the first half; the other half's launches wait in the join state
    first = [k for k in kernels if k["correlation_id"] % 100 < 5]
    later = [k for k in kernels if k["correlation_id"] % 100 >= 5]
    try:
        for m in members:
            m.__enter__()
        wait_for(lambda: len(assignments(kafka_bootstrap, group)) == INSTANCES, timeout=60,
                 what="every instance assigned partitions", running=members)
        assigned = assignments(kafka_bootstrap, group)
        assert all(assigned), assigned
        assert set().union(*assigned) == {(t, p) for t in INPUTS for p in range(partitions)}
        for one in assigned:  # partition p of both inputs with one member: the join needs both sides
            assert {p for t, p in one if t == INPUTS[0]} == {p for t, p in one if t == INPUTS[1]}, one
        send(kafka_bootstrap, launches + first)
        wait_for(lambda: drained(kafka_bootstrap, group), timeout=60, what="phase 1 committed", running=members)
        assert all(m.runner.batches > 0 for m in members), [m.runner.batches for m in members]  # every one worked
        # one instance leaves mid-stream: its partitions, with their pending launches, go to the other seven
        members[0].__exit__(None, None, None)
        assert members[0].error is None and not members[0].thread.is_alive()
        send(kafka_bootstrap, later)
        wait_for(lambda: drained(kafka_bootstrap, group), timeout=60, what="phase 2 committed", running=members[1:])
    finally:
        for m in members[1:]:
            m.__exit__(None, None, None)
    assert all(m.error is None for m in members), [m.error for m in members]

    nodes = {node for node, _ in procs}
    seen: Counter = Counter()
    gpu_ns = launched = unmatched = 0
    for value in committed_since(kafka_bootstrap, topics.GPU_SAMPLES.name, started_ms):
        rec = single_object.decode(value, expect=topics.GPU_SAMPLES.schema)[1]
        if rec["node"] not in nodes:
            continue
        seen.update((rec["node"], t["pid"], t["correlation_id"], t["end_ns"] - t["start_ns"], t["weight"])
                    for t in rec["timeline"])
        gpu_ns += sum(s["duration_ns"] for s in rec["samples"])
        launched += sum(s["launches"] for s in rec["samples"])
        unmatched += sum(u["events"] for u in rec["unmatched"])
    by_launch = {l_["correlation_id"]: l_ for l_ in launches}
    want = Counter((k["node"], k["pid"], k["correlation_id"], k["end_ns"] - k["start_ns"],
                    by_launch[k["correlation_id"]]["weight"]) for k in kernels)
    assert seen == want  # each launch matched once: none lost, none twice
    assert gpu_ns == sum((k["end_ns"] - k["start_ns"]) * by_launch[k["correlation_id"]]["weight"] for k in kernels)
    assert launched == sum(l_["weight"] for l_ in launches)
    assert unmatched == 0
