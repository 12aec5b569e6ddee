"""Scale-out on the real broker and store: several `fleetprof process STAGE` processes in one consumer group share
the partitions, and through a member joining, one leaving on SIGTERM and one SIGKILLed mid-stream (its partitions
move only once its session times out), every input is counted exactly once, and every alert sent exactly once.

The processes run in their stage's default consumer group (`fleetprof process` has no option to name another);
each test commits that group's offsets at the topics' ends first, and counts only its own nodes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path

import httpx
from confluent_kafka.admin import AdminClient

from processors.alerts import alert_id
from processors.sink import SINK_INPUTS
from schemas import single_object, topics
from tests.conftest import free_ports
from tests.pipeline_helpers import (
    build_id_for,
    cpu_batch,
    encode,
    produce,
    read_topic,
    sink,
    stack,
    symbol_chunks,
    wait_for,
)
from tests.test_alerts_pipeline import _base, _metrics
from tests.test_correlate import GEMM, SGEMM
from tests.test_gpu_pipeline import Run, start_at_end

SECOND = 1_000_000_000
REPO = Path(__file__).resolve().parent.parent


class Instance:
    """One `fleetprof process STAGE` child with its own transactional slot, metrics port and log file."""

    def __init__(self, bootstrap: str, stage: str, slot: int, logs: Path, batch_size: int) -> None:
        (self.port,) = free_ports(1)
        self.stage = stage
        self.log = logs / f"{stage}-{slot}.log"
        # a killed member's partitions move once its session times out: 6 s instead of librdkafka's 45 s
        # a data directory each: an alerter opens the chDB store there for its evidence, one process per directory
        env = dict(os.environ, FLEETPROF_KAFKA=bootstrap, FLEETPROF_DATA_DIR=str(logs / f"{stage}-{slot}"),
                   FLEETPROF_INSTANCE=str(slot), FLEETPROF_KAFKA_SESSION_TIMEOUT_MS="6000")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleetprof", "process", stage, "--metrics-port", str(self.port),
                 "--batch-size", str(batch_size)],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)

    def consumed(self, topic: str) -> float:
        """Messages of `topic` this instance has consumed, from its /metrics."""
        body = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        pattern = (rf'^fleetprof_processor_messages_in_total\{{stage="{self.stage}",topic="{re.escape(topic)}"\}} '
                   r"(\S+)$")
        found = re.search(pattern, body, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def serving(self) -> bool:
        self.check_alive()
        try:
            httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2)
            return True
        except httpx.TransportError:
            return False

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log.name} exited with {self.proc.returncode}:\n{self.log.read_text()}")

    def stop(self, sig: int) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(60)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


class Fleet:
    """Instances of one stage; all killed at the end whatever happens."""

    def __init__(self, bootstrap: str, stage: str, logs: Path, batch_size: int) -> None:
        self.bootstrap, self.stage, self.logs, self.batch_size = bootstrap, stage, logs, batch_size
        self.slot = int(uuid.uuid4().hex[:5], 16) + 1_000_000  # transactional ids of this test's own
        self.all: list[Instance] = []

    def start(self) -> Instance:
        inst = Instance(self.bootstrap, self.stage, self.slot + len(self.all), self.logs, self.batch_size)
        self.all.append(inst)
        return inst

    def wait_serving(self, *insts: Instance) -> None:
        wait_for(lambda: all(i.serving() for i in insts), timeout=60, what=f"{self.stage} processes to start")

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc) -> None:
        for inst in self.all:
            inst.close()


def assignment(bootstrap: str, group: str) -> list[set[tuple[str, int]]]:
    """The partitions of each member of `group`, once the group is stable; [] while it rebalances."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    if desc.state.name != "STABLE":
        return []
    return [{(tp.topic, tp.partition) for tp in m.assignment.topic_partitions} for m in desc.members]


def wait_assigned(bootstrap: str, group: str, members: int, partitions: set[tuple[str, int]], fleet: Fleet) -> list:
    """Wait until `members` members share all of `partitions`, each holding some."""
    seen: list = []

    def settled() -> bool:
        for inst in fleet.all:
            if inst.proc.returncode is None:
                inst.check_alive()
        seen[:] = assignment(bootstrap, group)
        return (len(seen) == members and all(seen) and set().union(*seen) == partitions
                and sum(len(s) for s in seen) == len(partitions))

    wait_for(settled, timeout=75, what=f"{members} members sharing {group}'s partitions")
    return seen


def nodes_over_partitions(prefix: str, per_partition: int, partitions: int) -> list[str]:
    """Node names whose keys land `per_partition` on each partition (librdkafka's default partitioner: CRC32)."""
    out, per = [], Counter()
    i = 0
    while len(out) < per_partition * partitions:
        node = f"{prefix}-{i}"
        p = zlib.crc32(node.encode()) % partitions
        if per[p] < per_partition:
            per[p] += 1
            out.append(node)
        i += 1
    return out


def test_symbolizers_scale_out_through_join_leave_and_kill_with_exact_totals(kafka_bootstrap, store, tmp_path):
    run = uuid.uuid4().hex[:8]
    group, sink_group = "fleetprof-symbolize", f"sink-{run}"
    stacks_topic = topics.CPU_STACKS.name
    start_at_end(kafka_bootstrap, group, [stacks_topic])
    start_at_end(kafka_bootstrap, sink_group, list(SINK_INPUTS))
    bid = build_id_for(run)
    produce(kafka_bootstrap, [("symbols", f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c))
                              for c in symbol_chunks(bid)])
    nodes = nodes_over_partitions(f"so-{run}", 2, topics.CPU_STACKS.partitions)
    t0 = (time.time_ns() // SECOND - 600) * SECOND
    want: Counter = Counter()
    sent = 0

    def wave(windows: int) -> None:
        nonlocal sent
        items = []
        for w in range(sent, sent + windows):
            for i, node in enumerate(nodes):
                a, b = 1 + (w + i) % 5, 1 + w % 3
                items.append((stacks_topic, node, encode("CpuStackBatch", cpu_batch(
                    node, bid, t0 + w * SECOND, [stack(["main", "run", "compute"], a),
                                                 stack(["main", "write_out"], b, tid=2)]))))
                want[node] += a + b
        sent += windows
        produce(kafka_bootstrap, items)

    def stored() -> Counter:
        _, rows = store.query_sql("SELECT node, sum(count) FROM cpu_samples WHERE startsWith(node, {p:String}) "
                                  "GROUP BY node", {"p": f"so-{run}-"})
        return Counter({n: int(c) for n, c in rows})

    every = {(stacks_topic, p) for p in range(topics.CPU_STACKS.partitions)}
    with Fleet(kafka_bootstrap, "symbolize", tmp_path, batch_size=4) as fleet, \
            sink(store, kafka_bootstrap, sink_group) as snk:
        a, b = fleet.start(), fleet.start()
        fleet.wait_serving(a, b)
        two = wait_assigned(kafka_bootstrap, group, 2, every, fleet)
        wave(10)
        c = fleet.start()  # joins mid-stream: a rebalance while a and b work
        wave(10)
        fleet.wait_serving(c)
        three = wait_assigned(kafka_bootstrap, group, 3, every, fleet)
        wave(10)
        wait_for(lambda: all(i.consumed(stacks_topic) > 0 for i in (a, b, c)), timeout=60,
                 what="every instance to consume some batches", running=[snk])
        assert b.stop(signal.SIGTERM) == 0, b.log.read_text()  # leaves the group cleanly, mid-stream
        wave(10)
        wait_for(lambda: a.consumed(stacks_topic) > 0 and c.consumed(stacks_topic) > 0, timeout=30,
                 what="a and c consuming", running=[snk])
        before_kill = a.consumed(stacks_topic)
        wave(10)
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL  # dies mid-stream: its partitions move after its session
        wave(10)
        wait_for(lambda: stored() == want, timeout=100, what="exact per-node totals", running=[snk])
        time.sleep(2.0)  # a duplicate would show up by now
        assert stored() == want
        alone = wait_assigned(kafka_bootstrap, group, 1, every, fleet)
        assert c.consumed(stacks_topic) > 0
        assert c.stop(signal.SIGTERM) == 0, c.log.read_text()
    assert len(two) == 2 and len(three) == 3 and len(alone) == 1
    assert before_kill > 0
    assert sum(want.values()) == stored().total() and len(want) == len(nodes) and sent == 60
    assert '"msg": "stage symbolize stopped"' in b.log.read_text()


def test_correlators_scale_out_and_a_killed_ones_partitions_move_with_exact_gpu_time(kafka_bootstrap, store,
                                                                                    tmp_path):
    run = Run(kafka_bootstrap, store)  # this test's node, build id and sink group
    group = "fleetprof-correlate"
    inputs = [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name]
    start_at_end(kafka_bootstrap, group, inputs)
    run.send_symbols()
    t0 = (time.time_ns() // SECOND) * SECOND  # now: later than any state the group may have kept
    paths = [["main", "run", "compute"], ["main", "write_out"], ["main", "run", "hash_block"]]
    pids = list(range(700, 724))  # keys node/pid over the inputs' partitions

    def pair(i: int) -> tuple[dict, dict]:
        pid = pids[i % len(pids)]
        return (run.launch(i, t0 + i * 1_000_000, paths[i % 3], 1 + i % 4, pid=pid, maps=i < len(pids)),
                run.kernel(i, t0 + i * 1_000_000 + 500, 1_000 + i, GEMM if i % 2 else SGEMM, pid=pid))

    pairs = [pair(i) for i in range(240)]
    want = Counter()
    for lrec, krec in pairs:
        want[krec["kernel_name"]] += (krec["end_ns"] - krec["start_ns"]) * lrec["weight"]
    every = {(t, p) for t in inputs for p in range(topics.GPU_LAUNCHES.partitions)}
    with Fleet(kafka_bootstrap, "correlate", tmp_path, batch_size=20) as fleet, run.sink() as snk:
        x, y = fleet.start(), fleet.start()
        fleet.wait_serving(x, y)
        two = wait_assigned(kafka_bootstrap, group, 2, every, fleet)
        # the launches first: when x dies, launches of its partitions wait in its memory for kernels not sent yet
        run.send(*[lrec for lrec, _ in pairs[:160]])
        wait_for(lambda: x.consumed(topics.GPU_LAUNCHES.name) > 0 and y.consumed(topics.GPU_LAUNCHES.name) > 0,
                 timeout=60, what="both correlators consuming launches", running=[snk])
        run.send(*[krec for _, krec in pairs[:80]])
        assert x.stop(signal.SIGKILL) == -signal.SIGKILL
        run.send(*[krec for _, krec in pairs[80:160]], *[r for p in pairs[160:] for r in p])
        wait_for(lambda: run.stored() == want, timeout=100, what="exact GPU time after x's partitions moved",
                 running=[snk])
        time.sleep(2.0)  # a duplicate would show up by now
        assert run.stored() == want
        alone = wait_assigned(kafka_bootstrap, group, 1, every, fleet)
        assert y.stop(signal.SIGTERM) == 0, y.log.read_text()
    assert len(two) == 2 and len(alone) == 1
    _, lost = store.query_sql("SELECT count() FROM gpu_unmatched WHERE node = {node:String}", {"node": run.node})
    assert lost[0][0] == 0
    _, launches = store.query_sql("SELECT sum(launches) FROM gpu_kernel_samples WHERE node = {node:String}",
                                  {"node": run.node})
    assert int(launches[0][0]) == sum(lrec["weight"] for lrec, _ in pairs)


def test_alerters_share_gpus_through_a_join_and_a_kill_and_each_drop_alerts_exactly_once(kafka_bootstrap, tmp_path):
    """Six GPUs (two per gpu.metrics partition) go busy → low → busy. The drops are pending when a third alerter
    joins and their partitions move (the detector state follows through the alerts.state changelog); one alerter is
    SIGKILLed as the drops hold. Each GPU still gets exactly one FIRING and one RESOLVED alert, with its stable id."""
    run = uuid.uuid4().hex[:8]
    group, metrics_topic = "fleetprof-alerts", topics.GPU_METRICS.name
    start_at_end(kafka_bootstrap, group, [metrics_topic])
    nodes = nodes_over_partitions(f"al-{run}", 2, topics.GPU_METRICS.partitions)
    base = _base()

    def wave(seconds: range) -> None:
        produce(kafka_bootstrap, [m for node in nodes for m in _metrics(node, base, seconds)])

    def alerts() -> list[dict]:
        found = read_topic(kafka_bootstrap, topics.ALERTS.name, lambda m: m.key().decode().startswith(f"al-{run}-"),
                           2 * len(nodes) + 1, timeout=3)
        return [single_object.decode(m.value(), expect="Alert")[1] for m in found]

    every = {(metrics_topic, p) for p in range(topics.GPU_METRICS.partitions)}
    with Fleet(kafka_bootstrap, "alerts", tmp_path, batch_size=20) as fleet:
        a, b = fleet.start(), fleet.start()
        fleet.wait_serving(a, b)
        two = wait_assigned(kafka_bootstrap, group, 2, every, fleet)
        wave(range(0, 25))  # busy for 10 s, then low: every drop pending
        wait_for(lambda: a.consumed(metrics_topic) + b.consumed(metrics_topic) >= 25 * len(nodes), timeout=60,
                 what="the first wave consumed")
        c = fleet.start()  # joins while the drops are pending: their state must follow the partitions
        fleet.wait_serving(c)
        three = wait_assigned(kafka_bootstrap, group, 3, every, fleet)
        wave(range(25, 45))  # the drops hold for 30 s at t = 40: every GPU fires
        wait_for(lambda: c.consumed(metrics_topic) > 0, timeout=60, what="the joined alerter consuming")
        assert a.stop(signal.SIGKILL) == -signal.SIGKILL
        wave(range(45, 70))  # busy again from t = 50: resolved at t = 65
        wait_for(lambda: len(alerts()) >= 2 * len(nodes), timeout=120, what="a FIRING and a RESOLVED per GPU")
        got = alerts()  # read once more: a duplicate would show up by now
        for inst in (b, c):
            assert inst.stop(signal.SIGTERM) == 0, inst.log.read_text()
    assert len(two) == 2 and len(three) == 3
    by_gpu = Counter((r["node"], r["state"]) for r in got)
    assert by_gpu == Counter({(node, state): 1 for node in nodes for state in ("FIRING", "RESOLVED")})
    for r in got:
        assert r["alert_id"] == alert_id(r["node"], f"GPU-{r['node']}", base + 10 * SECOND)
        assert r["time_ns"] == base + (40 if r["state"] == "FIRING" else 65) * SECOND
