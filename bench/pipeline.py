"""Sustained samples/s from loadgen through Kafka, the symbolizer and the sink into chDB, next to raw
confluent-kafka consume throughput of the same messages in the same run. The ratio is the figure.

    .venv/bin/python bench/pipeline.py [--nodes 100] [--windows 6] [--rate 152] [--symbolizers 1]

Starts its own broker and chDB store in a temporary directory; prints a table and writes bench/out/pipeline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from fleetprof.store import open_store  # noqa: E402
from processors.store_writer import StoreRunner  # noqa: E402
from simulate.loadgen import run_loadgen  # noqa: E402


def raw_consume(bootstrap: str, topic: str, messages: int) -> tuple[float, list[bytes]]:
    """Seconds for a plain confluent-kafka consumer to fetch `messages` messages of `topic` from the start.

    Partitions are assigned directly (no group join), so the time is fetching alone.
    """
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"raw-{uuid.uuid4()}", "enable.auto.commit": False,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    t0 = time.perf_counter()
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    values: list[bytes] = []
    while len(values) < messages:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                values.append(m.value())
    elapsed = time.perf_counter() - t0
    c.close()
    return elapsed, values


def symbolize_only(bootstrap: str, values: list[bytes]) -> float:
    """Seconds for the pure symbolize function alone (columnar decode included, as the stage runs it) over the same
    messages, one core."""
    from processors.symbolize import symbolize_batch
    from processors.symbolize_stage import build_symbolize
    from schemas.cpu_batch_reader import decode_columnar

    stage = build_symbolize({"bootstrap.servers": bootstrap})
    t0 = time.perf_counter()
    for v in values:
        symbolize_batch(decode_columnar(v)[1], stage.tables.get, stage.memo)
    elapsed = time.perf_counter() - t0
    stage.close()
    return elapsed


def stored_total(store) -> int:
    _, rows = store.query_named("totals_cpu", {"since": datetime(2000, 1, 1, tzinfo=UTC),
                                               "until": datetime(2100, 1, 1, tzinfo=UTC), "node": ""})
    return sum(int(r[-1]) for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=30, help="10 s windows per node")
    ap.add_argument("--rate", type=float, default=152.0, help="CPU samples/s per node (19 Hz x 8 busy CPUs)")
    ap.add_argument("--symbolizers", type=int, default=1)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-bench-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    procs: list[subprocess.Popen] = []
    store = None
    try:
        create_topics(broker.bootstrap)
        kafka = {"bootstrap.servers": broker.bootstrap}
        t = time.perf_counter()
        report = run_loadgen(kafka, nodes=args.nodes, rate=args.rate, duration=10.0 * args.windows, window=10.0,
                             seed=1, pace=False, gpu=True)
        produce_s = time.perf_counter() - t
        samples = report.total_samples
        batches = report.batches

        # the peer's best of three: fetch time on this shared VM varies between runs more than the pipeline's
        raw_runs = [raw_consume(broker.bootstrap, "cpu.stacks", batches) for _ in range(3)]
        raw_s = min(r[0] for r in raw_runs)
        values = raw_runs[0][1]
        del raw_runs
        raw_bytes = sum(len(v) for v in values)
        sym_s = symbolize_only(broker.bootstrap, values)
        del values

        store = open_store(f"chdb://{tmp / 'chdb'}", "bench")
        store.migrate()
        env = dict(os.environ, FLEETPROF_KAFKA=broker.bootstrap, FLEETPROF_DATA_DIR=str(tmp))
        t_start = time.perf_counter()
        for i in range(args.symbolizers):
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetprof", "process", "symbolize"],
                                          env=dict(env, FLEETPROF_INSTANCE=str(i)), cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=open(tmp / f"sym{i}.log", "wb")))
        stop = threading.Event()
        sink = StoreRunner(store, kafka, stop=stop)
        thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
        thread.start()
        t_first = None
        done = 0
        while done < samples:
            time.sleep(0.25)
            done = stored_total(store)
            if done and t_first is None:
                t_first = time.perf_counter()
            if time.perf_counter() - t_start > 1800:
                raise SystemExit(f"pipeline did not finish: {done}/{samples} samples stored")
        t_end = time.perf_counter()
        stop.set()
        thread.join(60)

        pipe_s = t_end - t_start
        steady_s = t_end - t_first
        result = {
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
            "nodes": args.nodes, "windows": args.windows, "rate_per_node": args.rate,
            "symbolizers": args.symbolizers, "batches": batches, "samples": samples,
            "message_mb": round(raw_bytes / 1e6, 1), "loadgen_s": round(produce_s, 2),
            "raw_consume_s": round(raw_s, 3), "raw_samples_per_s": round(samples / raw_s),
            "symbolize_only_s": round(sym_s, 2), "symbolize_only_samples_per_s": round(samples / sym_s),
            "pipeline_s": round(pipe_s, 2), "pipeline_samples_per_s": round(samples / pipe_s),
            "pipeline_steady_samples_per_s": round(samples / steady_s),
            "ratio_pipeline_to_raw": round((samples / pipe_s) / (samples / raw_s), 4),
        }
        out = ROOT / "bench" / "out"
        out.mkdir(exist_ok=True)
        (out / "pipeline.json").write_text(json.dumps(result, indent=2))
        for k, v in result.items():
            print(f"{k:32} {v}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        if store is not None:
            store.close()
        broker.stop()


if __name__ == "__main__":
    main()
