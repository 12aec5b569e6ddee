"""The sink's input as the real pipeline makes it, captured to a file for bench/sink_cost.py.

    .venv/bin/python bench/sink_capture.py [--nodes 20] [--windows 6] [--out bench/out/sink_input.bin]

Starts a LocalBroker in a temporary directory, sends `fleetprof loadgen`'s simulated fleet unpaced (152 CPU samples/s
per node in 10 s windows, 8 GPUs x 2 sampled launches/s, NVML once a second), runs `fleetprof process symbolize` and
`fleetprof process correlate` until their output stops growing, then writes every message of the sink's input topics
(cpu.samples, gpu.samples, gpu.metrics, identities) to one file: per message the topic, key and value.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
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
from processors.sink import SINK_INPUTS  # noqa: E402
from simulate.loadgen import run_loadgen  # noqa: E402


def read_topics(bootstrap: str, names: list[str]) -> list[tuple[str, int, bytes | None, bytes]]:
    """Every message of `names` from the start: (topic, partition, key, value), in offset order per partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"capture-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    meta = c.list_topics(timeout=10).topics
    c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t in names for p in meta[t].partitions])
    out: list[tuple[str, int, bytes | None, bytes]] = []
    idle = 0
    while idle < 3:  # nothing more for 3 polls of a second: all read (the topics are no longer written)
        got = [m for m in c.consume(1000, 1.0) if m.error() is None]
        idle = 0 if got else idle + 1
        out.extend((m.topic(), m.partition(), m.key(), m.value()) for m in got)
    c.close()
    return out


def counts(bootstrap: str, names: list[str]) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4()}"})
    meta = c.list_topics(timeout=10).topics
    total = sum(c.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1] for t in names for p in meta[t].partitions)
    c.close()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "sink_input.bin")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-sinkcap-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    procs: list[subprocess.Popen] = []
    try:
        create_topics(broker.bootstrap)
        kafka = {"bootstrap.servers": broker.bootstrap}
        report = run_loadgen(kafka, nodes=args.nodes, rate=152.0, duration=10.0 * args.windows, window=10.0, seed=1,
                             pace=False, gpu=True)
        env = dict(os.environ, FLEETPROF_KAFKA=broker.bootstrap, FLEETPROF_DATA_DIR=str(tmp))
        for stage in ("symbolize", "correlate"):
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetprof", "process", stage], env=env, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=open(tmp / f"{stage}.log", "wb")))
        outputs = ["cpu.samples", "gpu.samples"]
        last, still = -1, 0
        while still < 8:  # the outputs stop growing for 8 s: both stages are done
            time.sleep(1)
            now = counts(broker.bootstrap, outputs)
            still = still + 1 if now == last and now > 0 else 0
            last = now
        messages = read_topics(broker.bootstrap, [t for t in SINK_INPUTS if t != "alerts"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "wb") as f:
            pickle.dump({"nodes": args.nodes, "windows": args.windows, "samples": report.total_samples,
                         "messages": messages}, f)
        by_topic: dict[str, int] = {}
        for t, *_ in messages:
            by_topic[t] = by_topic.get(t, 0) + 1
        print(f"{len(messages)} messages {by_topic}, {report.total_samples} CPU samples sent -> {args.out}")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        broker.stop()


if __name__ == "__main__":
    main()
