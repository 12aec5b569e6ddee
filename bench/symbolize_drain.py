"""The symbolize stage draining a backlog through the real broker, its CPU per CPU sample with the Kafka side
(consume, transactions, produce) included: `fleetprof loadgen --no-pace --no-gpu` writes `--nodes` nodes x
`--duration` into a LocalBroker, then `fleetprof process symbolize` runs from each given source tree in turn
(alternated, `--runs` times each), its consumer group deleted before each run so every run reads the same
messages. CPU (utime + stime from /proc) is taken between 10% and 90% of the backlog committed, which leaves out
start-up (imports, reading the symbol tables) and the tail.

    .venv/bin/python bench/symbolize_drain.py [--nodes 20] [--duration 200s] [--runs 3] TREE [TREE ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet import cpu_seconds  # noqa: E402
from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from schemas import topics  # noqa: E402

GROUP = "fleetprof-symbolize"
RATE = 152


def committed(group: Consumer, parts: list[TopicPartition]) -> int:
    return sum(max(tp.offset, 0) for tp in group.committed(parts, timeout=10))


def run_once(tree: Path, env: dict, group: Consumer, parts: list[TopicPartition], total: int, log: Path) -> float:
    """CPU seconds per message between 10% and 90% of `total` committed."""
    group.commit(offsets=[TopicPartition(tp.topic, tp.partition, 0) for tp in parts], asynchronous=False)
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(tree / ".venv" / "bin" / "python"), "-m", "fleetprof", "process", "symbolize"],
                                cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
    marks: dict[str, tuple[int, float]] = {}
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            done = committed(group, parts)
            cpu = cpu_seconds(proc.pid)
            if cpu is None:
                raise RuntimeError(f"the symbolizer from {tree} exited; see {log}")
            if "lo" not in marks and done >= 0.1 * total:
                marks["lo"] = (done, cpu)
            if done >= 0.9 * total:
                marks["hi"] = (done, cpu)
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    (m0, c0), (m1, c1) = marks["lo"], marks["hi"]
    return (c1 - c0) / (m1 - m0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path, help="source trees, each with its .venv")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--duration", default="200s")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-symdrain-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    try:
        create_topics(broker.bootstrap)
        env = dict(os.environ, FLEETPROF_KAFKA=broker.bootstrap, FLEETPROF_DATA_DIR=str(tmp))
        subprocess.run([sys.executable, "-m", "fleetprof", "loadgen", "--nodes", str(args.nodes), "--duration",
                        args.duration, "--no-pace", "--no-gpu", "--rate", str(RATE)], cwd=ROOT, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        meta = admin.list_topics(timeout=10).topics[topics.CPU_STACKS.name]
        parts = [TopicPartition(topics.CPU_STACKS.name, p) for p in sorted(meta.partitions)]
        highs = admin.list_offsets({tp: OffsetSpec.latest() for tp in parts}, request_timeout=10)
        total = sum(f.result().offset for f in highs.values())
        per_msg = RATE * 10  # samples per node-window message
        group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": GROUP, "enable.auto.commit": False})
        print(f"{total} cpu.stacks messages ({args.nodes} nodes x {args.duration})")
        for r in range(args.runs):
            for tree in args.trees:
                s = run_once(tree.resolve(), env, group, parts, total, tmp / f"symbolize-{r}-{tree.name}.log")
                print(f"run {r + 1} {tree}: {1e6 * s / per_msg:.2f} µs CPU per CPU sample = "
                      f"{1e3 * s / per_msg * RATE:.3f} ms per node-second", flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
