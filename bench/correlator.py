"""Correlator events/s on one core, next to decoding and raw confluent-kafka consume of the same messages, in the
same run. An event is one gpu.launches or gpu.kernels message.

    .venv/bin/python bench/correlator.py [--nodes 50] [--windows 6] [--launch-rate 20] [--batch 1000]
                                         [--kafka-batch 50000]

Starts its own broker in a temporary directory (removed at the end); loadgen sends a simulated fleet's launches and
kernels (and its symbol tables). Measured, each on one core over the same messages:
- peer, fetch: a plain consumer fetching both topics (best of 3);
- peer, decode: the codec decoding every message;
- correlate: the stage's pure work per batch (state, join, symbolization, aggregation, changelog records), on decoded
  messages (each partition in offset order, the partitions merged by event time), checked exact against loadgen's
  report;
- correlate + decode + encode: what one stage instance spends on a message besides Kafka I/O;
- stage through Kafka: the real TopicRunner (consumer group, transactions with the changelog) from start to the last
  input committed: wall time, and this process's CPU time over it (the runner's thread and librdkafka's; the broker is
  another process), per event: what one instance spends per message draining a backlog.
Prints a table and writes bench/out/correlator.json.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from fleetprof.stage_registry import BY_NAME  # noqa: E402
from processors.correlate_stage import build_correlate  # noqa: E402
from processors.messages import Message  # noqa: E402
from processors.runner import TopicRunner, encode_produced, expected_schemas  # noqa: E402
from schemas import single_object, topics  # noqa: E402
from simulate.loadgen import run_loadgen  # noqa: E402

INPUTS = [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name]


def raw_consume(bootstrap: str, messages: int, inputs: list[str] = INPUTS) -> tuple[float, list[tuple], float]:
    """Seconds for a plain consumer to fetch `messages` messages of the input topics (partitions assigned
    directly, no group join), the messages as (topic, partition, offset, key, value), and the CPU seconds it took
    (this process: the Python loop and librdkafka's threads)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    parts = [TopicPartition(t, p, OFFSET_BEGINNING) for t in inputs
             for p in c.list_topics(t, timeout=10).topics[t].partitions]
    t0, c0 = time.perf_counter(), time.process_time()
    c.assign(parts)
    out: list[tuple] = []
    while len(out) < messages:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                out.append((m.topic(), m.partition(), m.offset(), m.key(), m.value()))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    c.close()
    return elapsed, out, cpu


def event_time(record: dict) -> int:
    return record["time_ns"] if "time_ns" in record else record["start_ns"]


def sent_order(raw: list[tuple]) -> list[Message]:
    """Decoded messages in the order a real-time fleet delivers them: each (topic, partition) in offset order, the
    streams merged by event time."""
    streams: dict[tuple[str, int], list[Message]] = {}
    for topic, partition, offset, key, value in raw:
        name, rec = single_object.decode(value)
        streams.setdefault((topic, partition), []).append(Message(topic, partition, offset, key, name, rec, value))
    for s in streams.values():
        s.sort(key=lambda m: m.offset)
    return list(heapq.merge(*streams.values(), key=lambda m: event_time(m.record)))


def correlate(stage, messages: list[Message], batch: int, encode: bool) -> tuple[float, float, dict]:
    """(wall s, CPU s, totals) of the stage's work over `messages` in batches, one core."""
    totals = {"gpu_ns": 0, "launches": 0, "unmatched": 0, "samples_records": 0, "state_records": 0,
              "state_bytes": 0}
    gc.collect()
    gc.freeze()  # the inputs live for the whole run here, not for one batch as in the stage: keep GC off them
    expect = expected_schemas(stage.inputs)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(messages), batch):
        part = messages[i:i + batch]
        if encode:  # as the runner decodes a batch (the stage's own batch decoder where it has one)
            part = decode_batch(stage, [Raw(m) for m in part], expect)
        stage.before_batch(part)
        out = stage.process(part)
        stage.after_commit()
        for p in out:
            if encode:
                value = encode_produced(p)[1]
                if p.topic == topics.CORRELATE_STATE.name:
                    totals["state_bytes"] += len(value)
            if p.topic == topics.GPU_SAMPLES.name:
                totals["samples_records"] += 1
                totals["gpu_ns"] += sum(s["duration_ns"] for s in p.record["samples"])
                totals["launches"] += sum(s["launches"] for s in p.record["samples"])
                totals["unmatched"] += sum(u["events"] for u in p.record["unmatched"])
            elif p.topic == topics.CORRELATE_STATE.name:
                totals["state_records"] += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    gc.unfreeze()
    return wall, cpu, totals


class Raw:
    """A decoded Message's bytes as a consumed message, for the stage's decoder."""

    def __init__(self, m: Message) -> None:
        self.m = m

    def topic(self) -> str:
        return self.m.topic

    def partition(self) -> int:
        return self.m.partition

    def offset(self) -> int:
        return self.m.offset

    def key(self) -> bytes | None:
        return self.m.key

    def value(self) -> bytes:
        return self.m.value


def decode_batch(stage, raws: list[Raw], expect: dict[str, str]) -> list[Message]:
    decode = getattr(stage, "decode_batch", None)
    if decode is not None:
        return decode(raws, expect, 16 << 20)
    return [Message(r.topic(), r.partition(), r.offset(), r.key(), *single_object.decode(r.value()), r.value())
            for r in raws]


def through_kafka(kafka: dict, messages: int, batch: int) -> tuple[float, float]:
    """(wall s, CPU s of this process) for the real stage (consumer group, transactions, changelog) to consume and
    commit every message."""
    group = f"bench-correlate-{uuid.uuid4().hex[:8]}"
    runner = TopicRunner(build_correlate(kafka, group=group), kafka, group=group, batch_size=batch, poll_timeout=0.5,
                         gather_s=BY_NAME["correlate"].gather_s)
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    runner.start()
    done = 0
    try:
        while done < messages:
            done += runner.run_once()
    finally:
        runner.close()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--windows", type=int, default=6, help="10 s windows per node")
    ap.add_argument("--launch-rate", type=float, default=20.0, help="sampled launches/s per GPU (8 per node)")
    ap.add_argument("--batch", type=int, default=1000, help="messages per stage call, one core")
    ap.add_argument("--kafka-batch", type=int, default=BY_NAME["correlate"].batch_size,
                    help="messages per transaction through Kafka (the correlator stage's batch)")
    ap.add_argument("--no-kafka-stage", action="store_true", help="skip the run through Kafka")
    ap.add_argument("--out", default="correlator.json", help="file name under bench/out")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-bench-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    try:
        create_topics(broker.bootstrap)
        kafka = {"bootstrap.servers": broker.bootstrap}
        report = run_loadgen(kafka, nodes=args.nodes, rate=1.0, duration=10.0 * args.windows, window=10.0, seed=1,
                             pace=False, gpu=True, launch_rate=args.launch_rate)
        events = report.launches + report.kernels

        runs = [raw_consume(broker.bootstrap, events) for _ in range(3)]
        raw_s, raw, raw_cpu = min(r[0] for r in runs), runs[0][1], min(r[2] for r in runs)
        del runs
        raw_bytes = sum(len(r[4]) for r in raw)
        gc.collect()
        gc.freeze()
        t = time.process_time()
        for r in raw:
            single_object.decode(r[4])
        decode_s = time.process_time() - t
        gc.unfreeze()

        messages = sent_order(raw)
        del raw
        stage = build_correlate(kafka, group="bench-pure")
        stage.before_batch(messages)  # reads the symbol tables and the (empty) join state once, outside the timing
        wall_s, cpu_s, totals = correlate(stage, messages, args.batch, encode=False)
        exact = (totals["gpu_ns"] == report.gpu_ns and totals["unmatched"] == 0
                 and totals["launches"] == sum(report.launches_by_kernel.values()))
        stage.close()
        stage = build_correlate(kafka, group="bench-pure-2")
        stage.before_batch(messages)
        full_wall_s, full_cpu_s, full = correlate(stage, messages, args.batch, encode=True)
        stage.close()
        del messages
        kafka_s, kafka_cpu = (None, None) if args.no_kafka_stage else through_kafka(kafka, events, args.kafka_batch)

        result = {
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
            "nodes": args.nodes, "windows": args.windows, "launch_rate_per_gpu": args.launch_rate,
            "batch": args.batch, "kafka_batch": args.kafka_batch, "events": events, "launches": report.launches,
            "kernels": report.kernels,
            "message_mb": round(raw_bytes / 1e6, 1),
            "raw_fetch_s": round(raw_s, 3), "raw_fetch_events_per_s": round(events / raw_s),
            "raw_fetch_cpu_us_per_event": round(raw_cpu / events * 1e6, 2),
            "decode_cpu_s": round(decode_s, 2), "decode_events_per_core_s": round(events / decode_s),
            "correlate_wall_s": round(wall_s, 2), "correlate_cpu_s": round(cpu_s, 2),
            "correlate_events_per_core_s": round(events / cpu_s),
            "correlate_exact": exact, "gpu_ns": totals["gpu_ns"], "report_gpu_ns": report.gpu_ns,
            "gpu_samples_records": totals["samples_records"], "state_records": totals["state_records"],
            "with_decode_encode_cpu_s": round(full_cpu_s, 2),
            "with_decode_encode_events_per_core_s": round(events / full_cpu_s),
            "state_mb_written": round(full["state_bytes"] / 1e6, 2),
            "ratio_correlate_to_decode": round((events / cpu_s) / (events / decode_s), 3),
            "stage_through_kafka_s": None if kafka_s is None else round(kafka_s, 2),
            "stage_through_kafka_events_per_s": None if kafka_s is None else round(events / kafka_s),
            "stage_through_kafka_cpu_s": None if kafka_cpu is None else round(kafka_cpu, 2),
            "stage_through_kafka_cpu_us_per_event": None if kafka_cpu is None else round(kafka_cpu / events * 1e6, 2),
            "with_decode_encode_cpu_us_per_event": round(full_cpu_s / events * 1e6, 2),
        }
        out = ROOT / "bench" / "out"
        out.mkdir(exist_ok=True)
        (out / args.out).write_text(json.dumps(result, indent=2))
        for k, v in result.items():
            print(f"{k:40} {v}")
        if not exact:
            raise SystemExit(f"correlated GPU time {totals['gpu_ns']} != loadgen's {report.gpu_ns} "
                             f"(unmatched {totals['unmatched']})")
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
