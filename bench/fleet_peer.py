"""The peer of bench/fleet.py: a plain confluent-kafka consumer of the raw topics the pipeline consumes, in real
time, in its own consumer group, committing as it goes (so the bench reads its lag like the processors').

    python bench/fleet_peer.py OUT_JSON

Kafka from FLEETPROF_KAFKA. It fetches and counts; for each cpu.stacks message it also reads the node and window
start from the Avro header (a few bytes, no decode) and keeps the message's produce time, so the bench can split
the latency into loadgen's send delay and the pipeline's. On SIGTERM it writes OUT_JSON and exits.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter

from confluent_kafka import Consumer

TOPICS = ["cpu.stacks", "gpu.launches", "gpu.kernels", "gpu.metrics", "identities"]
GROUP = "bench-raw-peer"
HEADER = 10  # C3 01 + 8-byte schema fingerprint


def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zigzag varint) at pos: (value, next position)."""
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def node_window(value: bytes) -> tuple[str, int]:
    """CpuStackBatch's first two fields: node (string) and window_start_ns (long)."""
    n, pos = varint(value, HEADER)
    node = value[pos:pos + n].decode()
    start, _ = varint(value, pos + n)
    return node, start


def main() -> None:
    out = sys.argv[1]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    c = Consumer({"bootstrap.servers": os.environ["FLEETPROF_KAFKA"], "group.id": GROUP,
                  "auto.offset.reset": "earliest", "enable.auto.commit": True, "auto.commit.interval.ms": 1000,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    c.subscribe(TOPICS)
    messages: Counter[str] = Counter()
    size: Counter[str] = Counter()
    sent: dict[str, list[int]] = {}  # "node window_start_s" -> [first, last] produce time ms of its batches
    first = last = None
    while not stop.is_set():
        for m in c.consume(1000, 0.5):
            if m.error() is not None:
                continue
            topic, value = m.topic(), m.value()
            messages[topic] += 1
            size[topic] += len(value)
            if topic == "cpu.stacks":
                node, start = node_window(value)
                ts = m.timestamp()[1]
                cell = sent.setdefault(f"{node} {start // 1_000_000_000}", [ts, ts])
                cell[0], cell[1] = min(cell[0], ts), max(cell[1], ts)
            now = time.time()
            first = first or now
            last = now
    c.close()
    with open(out, "w") as f:
        json.dump({"messages": dict(messages), "bytes": dict(size), "first_s": first, "last_s": last,
                   "cpu_s": time.process_time(), "sent_ms": sent}, f)


if __name__ == "__main__":
    main()
