"""Processors killed with SIGKILL mid-batch, ten times over, on the real broker and a real chDB store: while CPU
stack batches and GPU launches/kernels flow in without pause, the test kills `fleetprof process symbolize`,
`correlate` and `sink` in turn and restarts each in the same instance slot (the same transactional id: the new one
fences its predecessor's open transaction). Each is killed once it is seen consuming: every other time at a random
moment after that, and otherwise at a moment it is seen inside a batch (a transaction of its with records in it
open on its output topics, or the sink's rows being inserted, between its BEFORE and AFTER marks). Afterwards the
store holds exactly what was sent: per-node CPU samples and GPU time per kernel, nothing unmatched, no dead letters.

That kills landed mid-batch is shown, not assumed: a read_uncommitted reader of cpu.samples and gpu.samples sees the
records of aborted transactions that a read_committed one never sees, and a restarted sink logs that it re-writes
the batch its predecessor had begun.

The processes run in their stages' default consumer groups; the test commits those at the topics' ends first and
counts only its own nodes. The sink has a chDB directory of its own, read after it stops by `fleetprof sql`.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections import Counter
from pathlib import Path

import httpx
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fleetprof.settings import DEFAULT_DATABASE
from processors.sink import SINK_INPUTS
from schemas import single_object, topics
from tests.conftest import free_ports
from tests.pipeline_helpers import cpu_batch, encode, stack, wait_for
from tests.test_correlate import GEMM, SGEMM
from tests.test_gpu_pipeline import Run, start_at_end
from tests.test_scale_out import Instance, nodes_over_partitions

SECOND = 1_000_000_000
REPO = Path(__file__).resolve().parent.parent
STAGE_INPUTS = {"symbolize": (topics.CPU_STACKS.name,),
                "correlate": (topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name),
                "sink": (topics.CPU_SAMPLES.name, topics.GPU_SAMPLES.name)}
# small batches: under a steady stream each process is then inside a batch (a transaction, or the sink's BEFORE..AFTER)
# most of the time, where a kill tests most
STAGE_BATCH = {"symbolize": 20, "correlate": 50, "sink": 500}
PATHS = [["main", "run", "compute"], ["main", "write_out"], ["main", "run", "hash_block"]]


class Process(Instance):
    """One incarnation of `fleetprof process STAGE` in instance slot `slot`, logging to a file of its own."""

    def __init__(self, bootstrap: str, stage: str, slot: int, data_dir: Path, logs: Path, incarnation: int,
                 batch_size: int) -> None:
        (self.port,) = free_ports(1)
        self.stage = stage
        self.log = logs / f"{stage}-{incarnation}.log"
        # a killed member's partitions move once its session times out: 6 s (the broker's minimum), not 45 s
        env = dict(os.environ, FLEETPROF_KAFKA=bootstrap, FLEETPROF_DATA_DIR=str(data_dir),
                   FLEETPROF_DATABASE=DEFAULT_DATABASE, FLEETPROF_INSTANCE=str(slot),
                   FLEETPROF_KAFKA_SESSION_TIMEOUT_MS="6000")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fleetprof", "process", stage, "--metrics-port", str(self.port),
                 "--batch-size", str(batch_size)],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO)

    def taken(self) -> float:
        """Messages of its inputs consumed so far (0 until its /metrics answers)."""
        try:
            return sum(self.consumed(t) for t in STAGE_INPUTS[self.stage])
        except httpx.TransportError:
            self.check_alive()
            return 0.0


class Stages:
    """The current process of each stage, each in its own slot; a killed one is replaced in the same slot."""

    def __init__(self, bootstrap: str, tmp: Path, sink_dir: Path) -> None:
        self.bootstrap, self.tmp, self.sink_dir = bootstrap, tmp, sink_dir
        base = int(uuid.uuid4().hex[:5], 16) + 2_000_000  # transactional ids of this test's own
        self.slots = {stage: base + i for i, stage in enumerate(STAGE_INPUTS)}
        self.current: dict[str, Process] = {}
        self.every: list[Process] = []

    def start(self, stage: str) -> Process:
        data_dir = self.sink_dir if stage == "sink" else self.tmp
        proc = Process(self.bootstrap, stage, self.slots[stage], data_dir, self.tmp, len(self.every),
                       STAGE_BATCH[stage])
        self.current[stage] = proc
        self.every.append(proc)
        return proc

    def logs(self, stage: str) -> list[str]:
        return [p.log.read_text() for p in self.every if p.stage == stage]

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.every:
            proc.close()


class Load(threading.Thread):
    """Sends CPU windows for `nodes` and GPU launch/kernel pairs for `run`'s node without pause until stopped, and
    counts what it sent: CPU samples per node, GPU ns per kernel (duration x launch weight), launches."""

    def __init__(self, bootstrap: str, run: Run, nodes: list[str]) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.run_, self.nodes = bootstrap, run, nodes
        now = time.time_ns() // SECOND * SECOND
        # CPU windows a second apart from an hour ago (never in the future, however fast this machine sends), GPU
        # pairs a millisecond apart from now (later than any join state the correlator group may hold)
        self.t0_cpu, self.t0_gpu = now - 3600 * SECOND, now
        self.cpu: Counter = Counter()
        self.gpu: Counter = Counter()
        self.launches = 0
        self.windows = self.pairs = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5})
        try:
            while not self.halt.is_set():
                self._tick(producer)
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _tick(self, producer: Producer) -> None:
        cpu, gpu, launches, items = Counter(), Counter(), 0, []
        for w in range(self.windows, self.windows + 2):
            for i, node in enumerate(self.nodes):
                a, b = 1 + (w + i) % 5, 1 + w % 3
                batch = cpu_batch(node, self.run_.build_id, self.t0_cpu + w * SECOND,
                                  [stack(PATHS[w % 3], a), stack(PATHS[(w + 1) % 3], b, tid=2)])
                items.append((topics.CPU_STACKS.name, node, encode("CpuStackBatch", batch)))
                cpu[node] += a + b
        for i in range(self.pairs, self.pairs + 40):
            pid = 700 + i % 24  # keys node/pid over the inputs' partitions
            lrec = self.run_.launch(i, self.t0_gpu + i * 1_000_000, PATHS[i % 3], 1 + i % 4, pid=pid, maps=i < 24)
            krec = self.run_.kernel(i, self.t0_gpu + i * 1_000_000 + 500, 1_000 + i % 97, GEMM if i % 2 else SGEMM,
                                    pid=pid)
            key = f"{self.run_.node}/{pid}"
            items.append((topics.GPU_LAUNCHES.name, key, encode("GpuLaunch", lrec)))
            items.append((topics.GPU_KERNELS.name, key, encode("GpuKernel", krec)))
            gpu[krec["kernel_name"]] += (krec["end_ns"] - krec["start_ns"]) * lrec["weight"]
            launches += lrec["weight"]
        for topic, key, value in items:
            producer.produce(topic, key=key.encode(), value=value)
        assert producer.flush(30) == 0
        self.windows += 2
        self.pairs += 40
        self.cpu += cpu
        self.gpu += gpu
        self.launches += launches
        time.sleep(0.1)  # a steady stream, not a flood the processors could never catch up with


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """High watermark of each partition of `topic`."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ends-{uuid.uuid4()}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(topics.BY_NAME[topic].partitions)}
    finally:
        c.close()


class Reader:
    """Reads `topic` from `starts` with the given isolation level; keeps the records whose key `mine` accepts."""

    def __init__(self, bootstrap: str, topic: str, starts: dict[int, int], isolation: str, mine) -> None:
        self.mine = mine
        self.records: list[tuple[int, int, dict]] = []  # (partition, offset, record)
        self.at_end: set[int] = set()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                                  "enable.auto.commit": False, "isolation.level": isolation,
                                  "enable.partition.eof": True})
        self.consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        self.partitions = set(starts)

    def poll(self) -> None:
        for m in self.consumer.consume(1000, 0.5):
            if m.error() is not None:
                if m.error().code() == KafkaError._PARTITION_EOF:
                    self.at_end.add(m.partition())
                continue
            self.at_end.discard(m.partition())
            if m.key() is not None and self.mine(m.key().decode()):
                self.records.append((m.partition(), m.offset(), single_object.decode(m.value())[1]))

    def read_to_end(self, timeout: float = 60) -> list[tuple[int, int, dict]]:
        wait_for(lambda: self.poll() or self.at_end == self.partitions, timeout=timeout, what="a topic's end")
        return self.records

    def close(self) -> None:
        self.consumer.close()


def cpu_totals(records: list) -> Counter:
    out = Counter()
    for _, _, rec in records:
        out[rec["node"]] += sum(s["count"] for s in rec["samples"])
    return out


def gpu_totals(records: list) -> Counter:
    out = Counter()
    for _, _, rec in records:
        for s in rec["samples"]:
            out[s["kernel_name"]] += s["duration_ns"]
    return out


def committed(bootstrap: str, group: str, partitions: list[TopicPartition]) -> dict[tuple[str, int], int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group, partitions)]
    result = admin.list_consumer_group_offsets(request, request_timeout=10)[group].result(timeout=15)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


def sink_passed(bootstrap: str, group: str, last: dict[tuple[str, int], int]) -> bool:
    """Whether `group` has committed past offset `last[(topic, partition)]` of every partition named."""
    offsets = committed(bootstrap, group, [TopicPartition(t, p) for t, p in last])
    return all(offsets.get(tp, -1) > off for tp, off in last.items())


def store_sql(data_dir: Path, statement: str, **params: str) -> list[dict]:
    """One read-only statement against the chDB store in `data_dir`, through `fleetprof sql` in a subprocess."""
    (port,) = free_ports(1)  # an API address nobody answers at: the command opens the directory itself
    env = dict(os.environ, FLEETPROF_DATA_DIR=str(data_dir), FLEETPROF_DATABASE=DEFAULT_DATABASE,
               FLEETPROF_API=f"127.0.0.1:{port}")
    args = [sys.executable, "-m", "fleetprof", "sql", statement, "--format", "json"]
    for name, value in params.items():
        args += ["--param", f"{name}={value}"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stored_cpu(data_dir: Path, prefix: str, table: str = "cpu_samples") -> Counter:
    """Samples per node in `table`: the 10 s windows, or the hourly rollup their view feeds."""
    rows = store_sql(data_dir, "SELECT node, toInt64(sum(count)) AS n FROM {t:Identifier} "
                               "WHERE startsWith(node, {p:String}) GROUP BY node", t=table, p=prefix)
    return Counter({r["node"]: int(r["n"]) for r in rows})


def stored_gpu(data_dir: Path, node: str, table: str = "gpu_kernel_samples") -> tuple[Counter, int]:
    rows = store_sql(data_dir, "SELECT kernel_name, toInt64(sum(duration_ns)) AS ns, toInt64(sum(launches)) AS n "
                               "FROM {t:Identifier} WHERE node = {node:String} GROUP BY kernel_name", t=table,
                     node=node)
    return Counter({r["kernel_name"]: int(r["ns"]) for r in rows}), sum(int(r["n"]) for r in rows)


def stored_unmatched(data_dir: Path, node: str) -> int:
    rows = store_sql(data_dir, "SELECT toInt64(count()) AS n FROM gpu_unmatched WHERE node = {node:String}",
                     node=node)
    return int(rows[0]["n"])


def drain(bootstrap: str, starts: dict[str, dict[int, int]], prefix: str, node: str, load: Load,
          sink: Process) -> None:
    """Wait until the committed cpu.samples of the nodes under `prefix` and gpu.samples of `node` hold exactly what
    `load` sent (nothing more, read to the topics' ends), and then until the sink has committed past all of them."""
    cpu_out = Reader(bootstrap, topics.CPU_SAMPLES.name, starts[topics.CPU_SAMPLES.name], "read_committed",
                     lambda key: key.startswith(prefix))
    gpu_out = Reader(bootstrap, topics.GPU_SAMPLES.name, starts[topics.GPU_SAMPLES.name], "read_committed",
                     lambda key: key == node)
    try:
        wait_for(lambda: cpu_out.poll() or cpu_totals(cpu_out.records) == load.cpu, timeout=150,
                 what="the symbolized samples of every node")
        wait_for(lambda: gpu_out.poll() or gpu_totals(gpu_out.records) == load.gpu, timeout=150,
                 what="the GPU time of every kernel")
        for reader in (cpu_out, gpu_out):
            reader.read_to_end()  # anything after (a duplicate) is read too
    finally:
        cpu_out.close()
        gpu_out.close()
    assert cpu_totals(cpu_out.records) == load.cpu
    assert gpu_totals(gpu_out.records) == load.gpu
    last: dict[tuple[str, int], int] = {}
    for topic, reader in ((topics.CPU_SAMPLES.name, cpu_out), (topics.GPU_SAMPLES.name, gpu_out)):
        for partition, offset, _ in reader.records:
            last[(topic, partition)] = max(offset, last.get((topic, partition), -1))
    wait_for(lambda: sink.check_alive() or sink_passed(bootstrap, "fleetprof-sink", last), timeout=150,
             what="the sink committing past the last output record")


def aborted(bootstrap: str, topic: str, starts: dict[str, dict[int, int]], mine) -> int:
    """Records of `topic` since `starts` that a read_uncommitted reader sees and a read_committed one does not."""
    seen = []
    for isolation in ("read_uncommitted", "read_committed"):
        reader = Reader(bootstrap, topic, starts[topic], isolation, mine)
        try:
            seen.append(len(reader.read_to_end()))
        finally:
            reader.close()
    return seen[0] - seen[1]


def dead_letters_for(bootstrap: str, starts: dict[int, int], tag: str) -> list[dict]:
    """Dead letters (committed or not) whose source key carries `tag`."""
    reader = Reader(bootstrap, topics.DEADLETTER.name, starts, "read_uncommitted", lambda key: True)
    try:
        found = reader.read_to_end()
    finally:
        reader.close()
    return [rec for _, _, rec in found if tag in (rec["key"] or b"").decode(errors="replace")]


def wait_consuming(proc: Process, timeout: float = 90) -> float:
    """Until two looks at its /metrics a moment apart show it taking messages; returns the count."""
    deadline = time.monotonic() + timeout
    before = proc.taken()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = proc.taken()
        if now > before:
            return now
        before = now
    raise AssertionError(f"{proc.log.name} consumed nothing in {timeout} s:\n{proc.log.read_text()}")


class Transactions:
    """Whether a transaction with records in it is open on some partition of the given topics: the last stable
    offset a read_committed client is told stops below the high watermark a read_uncommitted one is told."""

    def __init__(self, bootstrap: str, partitions: list[TopicPartition]) -> None:
        self.partitions = partitions
        self.committed, self.written = (
            Consumer({"bootstrap.servers": bootstrap, "group.id": f"lso-{uuid.uuid4()}", "isolation.level": level})
            for level in ("read_committed", "read_uncommitted"))

    def open(self) -> bool:
        # partition by partition, the high watermark and right after it the stable offset: read as two lists, each
        # partition's pair stood a whole round of the topic's partitions apart, longer than a short transaction is
        # open on a loaded machine. High first: records appended between the two reads cannot make stable < high.
        for tp in self.partitions:
            high = self.written.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if self.committed.get_watermark_offsets(tp, timeout=10, cached=False)[1] < high:
                return True
        return False

    def close(self) -> None:
        self.committed.close()
        self.written.close()


def writing(data_dir: Path) -> bool:
    """Whether the sink is inserting rows into a data table right now: the part it writes sits in a tmp_insert_*
    directory of the table until the insert completes. Data rows go in only between a batch's BEFORE and AFTER."""
    tables = data_dir / "chdb" / "data" / DEFAULT_DATABASE
    for table in ("cpu_samples", "gpu_kernel_samples"):
        try:
            if any(name.startswith("tmp_insert") for name in os.listdir(tables / table)):
                return True
        except FileNotFoundError:
            pass
    return False


def stopped(pid: int) -> bool:
    """Whether every thread of `pid` has stopped (state T): SIGSTOP takes effect after kill() returns."""
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that has just ended
        if state != "T":
            return False
    return True


def kill_inside(proc: Process, inside, settle: float, timeout: float = 60) -> None:
    """SIGKILL `proc` in the middle of a batch, for certain: when `inside()` says it is, freeze it (SIGSTOP), and
    kill it if `inside()` still holds after `settle` seconds standing still (what was already on its way by then,
    such as a commit the broker is completing, has landed); otherwise let it go on (SIGCONT) and look again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.check_alive()
        if inside():
            proc.proc.send_signal(signal.SIGSTOP)
            wait_for(lambda: stopped(proc.proc.pid), timeout=10, what=f"{proc.log.name} to stop")
            until = time.monotonic() + settle
            while inside() and time.monotonic() < until:
                time.sleep(0.05)
            if inside():
                assert proc.stop(signal.SIGKILL) == -signal.SIGKILL
                return
            proc.proc.send_signal(signal.SIGCONT)
        time.sleep(0.002)  # leave the CPU to the process watched
    raise AssertionError(f"{proc.log.name} never seen inside a batch in {timeout} s")


def test_processors_killed_mid_batch_ten_times_store_exactly_what_was_sent(kafka_bootstrap, tmp_path):
    run = Run(kafka_bootstrap, None)  # this test's GPU node and build id
    prefix = f"kill-{run.id}-"
    nodes = nodes_over_partitions(prefix.rstrip("-"), 1, topics.CPU_STACKS.partitions)
    start_at_end(kafka_bootstrap, "fleetprof-symbolize", list(STAGE_INPUTS["symbolize"]))
    start_at_end(kafka_bootstrap, "fleetprof-correlate", list(STAGE_INPUTS["correlate"]))
    start_at_end(kafka_bootstrap, "fleetprof-sink", list(SINK_INPUTS))
    out_starts = {t: ends(kafka_bootstrap, t)
                  for t in (topics.CPU_SAMPLES.name, topics.GPU_SAMPLES.name, topics.CORRELATE_STATE.name)}
    dead_start = ends(kafka_bootstrap, topics.DEADLETTER.name)
    run.send_symbols()
    sink_dir = tmp_path / "sink"
    sink_dir.mkdir()
    rng = random.Random(run.id)
    load = Load(kafka_bootstrap, run, nodes)
    kills: list[tuple[str, str, float]] = []
    started = time.monotonic()
    # where a symbolizer's transaction writes (any node's partition) and the correlator's (run.node's partition:
    # librdkafka's default partitioner is CRC32 of the key)
    txns = {"symbolize": Transactions(kafka_bootstrap, [TopicPartition(topics.CPU_SAMPLES.name, p)
                                                        for p in range(topics.CPU_SAMPLES.partitions)]),
            "correlate": Transactions(kafka_bootstrap, [TopicPartition(
                topics.GPU_SAMPLES.name, zlib.crc32(run.node.encode()) % topics.GPU_SAMPLES.partitions)])}
    with Stages(kafka_bootstrap, tmp_path, sink_dir) as stages:
        for stage in STAGE_INPUTS:
            stages.start(stage)
        load.start()
        try:
            for i in range(10):
                stage = list(STAGE_INPUTS)[i % 3]
                victim = stages.current[stage]
                taken = wait_consuming(victim)
                if (i // 3) % 2 == 1:  # at a random moment of its work
                    how = "random"
                    time.sleep(rng.uniform(0.0, 0.3))
                    assert victim.stop(signal.SIGKILL) == -signal.SIGKILL
                elif stage == "sink":  # while its rows go into a table: after the batch's BEFORE mark, before AFTER
                    how = "inside"
                    kill_inside(victim, lambda: writing(sink_dir), settle=0.0)
                else:  # while a transaction of its with records in it is open (and not being committed)
                    how = "inside"
                    kill_inside(victim, txns[stage].open, settle=1.0)
                kills.append((stage, how, taken))
                stages.start(stage)  # the same slot: fences the transaction its predecessor left open
                assert load.error is None, load.error
        finally:
            load.halt.set()
            load.join(60)
            for t in txns.values():
                t.close()
        assert load.error is None, load.error
        kill_s = time.monotonic() - started

        drain(kafka_bootstrap, out_starts, prefix, run.node, load, stages.current["sink"])
        for stage in STAGE_INPUTS:
            proc = stages.current[stage]
            assert proc.stop(signal.SIGTERM) == 0, proc.log.read_text()
        drain_s = time.monotonic() - started - kill_s
        sink_logs = stages.logs("sink")

    assert stored_cpu(sink_dir, prefix) == load.cpu
    gpu_ns, launches = stored_gpu(sink_dir, run.node)
    assert gpu_ns == load.gpu and launches == load.launches
    # and the hourly rollups the window tables' views feed (a kill inside a batch can fall inside a view's insert)
    assert stored_cpu(sink_dir, prefix, "cpu_samples_1h") == load.cpu
    assert stored_gpu(sink_dir, run.node, "gpu_kernel_samples_1h") == (load.gpu, load.launches)
    assert stored_unmatched(sink_dir, run.node) == 0
    assert dead_letters_for(kafka_bootstrap, dead_start, run.id) == []

    # the kills landed inside batches: aborted transactions behind them, and a batch the sink had to re-write
    aborted_cpu = aborted(kafka_bootstrap, topics.CPU_SAMPLES.name, out_starts, lambda key: key.startswith(prefix))
    aborted_gpu = (aborted(kafka_bootstrap, topics.GPU_SAMPLES.name, out_starts, lambda key: key == run.node)
                   + aborted(kafka_bootstrap, topics.CORRELATE_STATE.name, out_starts,
                             lambda key: key.startswith("fleetprof-correlate/")))
    rewrites = sum(log.count("after an interrupted batch") for log in sink_logs)
    print(f"\n{len(kills)} kills in {kill_s:.1f} s ({kills}), drained in {drain_s:.1f} s; sent {load.windows} CPU "
          f"windows x {len(nodes)} nodes and {load.pairs} GPU pairs; aborted records: symbolizer {aborted_cpu}, "
          f"correlator {aborted_gpu}; sink re-writes: {rewrites}")
    assert [s for s, _, _ in kills] == ["symbolize", "correlate", "sink"] * 3 + ["symbolize"]
    inside = Counter(stage for stage, how, _ in kills if how == "inside")
    assert inside == {"symbolize": 2, "correlate": 2, "sink": 2}
    # each kill inside left at least one record aborted, or one batch to re-write
    assert aborted_cpu >= inside["symbolize"] and aborted_gpu >= inside["correlate"] and rewrites >= inside["sink"]
