"""The sink's batches: one batch over every buffered partition, its bookkeeping in sink_state, and an interrupted
batch written again whole under the same tokens, by whichever instance finds it (no broker: a stand-in consumer)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from confluent_kafka import KafkaError, TopicPartition

import processors.store_writer as sw
from processors.process_ids import process_id
from processors.store_writer import StoreRunner, batch_key
from schemas.single_object import encode

T = 1_796_000_000_000_000_000


class Raw:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes, key: bytes = b"n") -> None:
        self.t, self.p, self.o, self.v, self.k = topic, partition, offset, value, key

    def topic(self):
        return self.t

    def partition(self):
        return self.p

    def offset(self):
        return self.o

    def value(self):
        return self.v

    def key(self):
        return self.k

    def error(self):
        return None


class Consumer:
    def __init__(self) -> None:
        self.polls: list[list[Raw]] = []
        self.commits: list[list[tuple[str, int, int]]] = []
        self.assigned: list[TopicPartition] = []

    def consume(self, num_messages=1, timeout=-1):
        return self.polls.pop(0) if self.polls else []

    def commit(self, offsets=None, asynchronous=True):
        assert asynchronous, "a synchronous commit can wait forever for a coordinator librdkafka cached"
        self.commits.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def assign(self, partitions):
        self.assigned = partitions

    def close(self):
        pass


class Store:
    """Inserts recorded in order; sink_state answered from what was inserted, as the store would."""

    def __init__(self) -> None:
        self.inserts: list[tuple[str, list, str | None]] = []

    def insert(self, table, rows, column_names, dedup_token=None, column_oriented=False):
        as_rows = zip(*rows, strict=True) if column_oriented else rows
        self.inserts.append((table, [list(r) for r in as_rows], dedup_token))

    def insert_again(self, table, rows, column_names, dedup_token, column_oriented=False):
        self.insert(table, rows, column_names, dedup_token, column_oriented)
        return []  # a server's inserts are never cut by the sink's death

    def query_store(self, name, params):
        assert name == "sink_batches"
        latest: dict[tuple[str, int], list] = {}
        for table, rows, _ in self.inserts:
            for r in rows if table == "sink_state" else []:
                if (r[0], r[1]) not in latest or r[5] > latest[(r[0], r[1])][5]:
                    latest[(r[0], r[1])] = r
        return [], [tuple(r) for r in latest.values() if r[0] in params["topics"]]


def cpu(node: str, window: int, count: int) -> bytes:
    return encode("CpuSamples", {"node": node, "window_start_ns": T + window * 10**10, "window_ns": 10**10,
                                 "frames": [], "stacks": [], "simulated": True, "frequency_hz": 19,
                                 "samples": [{"pid": 7, "comm": "c", "container_id": "", "identity_id": 0,
                                              "stack_id": 5, "count": count}]})


def runner(store: Store, consumer: Consumer) -> StoreRunner:
    r = StoreRunner(store, {"bootstrap.servers": "127.0.0.1:1"}, flush_interval=1.0, max_delay=5.0)
    r.consumer.close()
    r.consumer = consumer
    return r


def test_one_batch_spans_the_buffered_partitions_with_one_insert_per_table(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = runner(store, consumer)
    consumer.polls = [[Raw("cpu.samples", 0, 10, cpu("a", 0, 3)), Raw("cpu.samples", 2, 4, cpu("b", 0, 5)),
                       Raw("cpu.samples", 0, 11, cpu("a", 1, 1))],
                      [Raw("cpu.samples", 2, 5, cpu("b", 1, 2))],
                      []]
    r.run_once()  # samples still arriving: wait for the burst's end
    clock[0] += 0.25
    r.run_once()
    assert store.inserts == []
    clock[0] += 0.25
    r.run_once()  # a poll without samples: write everything buffered as one batch
    tables = [t for t, _, _ in store.inserts]
    # a process's names once (a definition, no token; the store loads them), before the rows carrying its id
    assert tables == ["sink_state", "process_names", "cpu_samples", "profile_windows", "sink_state"]
    (_, before, _), (_, names, no_token), (_, samples, token), *_, (_, after, _) = store.inserts
    assert [n[:4] for n in names] == [[process_id("c", "", ""), "c", "", ""]] and no_token is None
    assert [r[:5] for r in before] == [["cpu.samples", 0, 10, 11, "BEFORE"], ["cpu.samples", 2, 4, 5, "BEFORE"]]
    assert [r[:5] for r in after] == [["cpu.samples", 0, 10, 11, "AFTER"], ["cpu.samples", 2, 4, 5, "AFTER"]]
    assert len({r[5] for r in before}) == 1 and after[0][5] == before[0][5] + timedelta(microseconds=1)
    assert [(s[1], s[5]) for s in samples] == [("a", 3), ("a", 1), ("b", 5), ("b", 2)]  # partition, then offset
    assert token == f"{batch_key({('cpu.samples', 0): (10, 11), ('cpu.samples', 2): (4, 5)})}:cpu_samples"
    assert consumer.commits == [[("cpu.samples", 0, 12), ("cpu.samples", 2, 6)]]


def test_offsets_are_committed_without_waiting_and_a_failed_commit_is_sent_again(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = runner(store, consumer)

    def batch(*raws: Raw) -> None:
        consumer.polls = [list(raws), []]
        r.run_once()
        r.run_once()  # the burst's end: written, its offsets sent

    batch(Raw("cpu.samples", 0, 10, cpu("a", 0, 3)), Raw("cpu.samples", 1, 4, cpu("b", 0, 1)))
    assert consumer.commits == [[("cpu.samples", 0, 11), ("cpu.samples", 1, 5)]]
    # the broker is away: the answer is an error; the batch after it is written meanwhile, nothing waits
    r._on_commit(KafkaError(KafkaError._TRANSPORT), [TopicPartition("cpu.samples", 0, 11),
                                                     TopicPartition("cpu.samples", 1, 5)])
    batch(Raw("cpu.samples", 0, 11, cpu("a", 1, 2)))
    assert len([t for t, _, _ in store.inserts if t == "cpu_samples"]) == 2
    assert consumer.commits[-1] == [("cpu.samples", 0, 12), ("cpu.samples", 1, 5)]  # the newest offset of each
    clock[0] += sw.COMMIT_FIRST_DELAY  # the failed one is due again
    r._on_commit(KafkaError(KafkaError._TRANSPORT), [TopicPartition("cpu.samples", 0, 12),
                                                     TopicPartition("cpu.samples", 1, 5)])
    sent = len(consumer.commits)
    r.run_once()
    assert len(consumer.commits) == sent  # not before its delay (doubled after a second failure)
    clock[0] += 2 * sw.COMMIT_FIRST_DELAY
    r.run_once()
    assert consumer.commits[-1] == [("cpu.samples", 0, 12), ("cpu.samples", 1, 5)]
    r._on_commit(None, [TopicPartition("cpu.samples", 0, 12), TopicPartition("cpu.samples", 1, 5)])
    assert r.to_commit == {}
    clock[0] += 60
    r.run_once()
    assert consumer.commits[-1] == [("cpu.samples", 0, 12), ("cpu.samples", 1, 5)] and len(consumer.commits) == sent + 1
    # a partition gone to another member is not committed again: its new owner resumes from sink_state
    batch(Raw("cpu.samples", 2, 7, cpu("c", 0, 1)))
    r._on_commit(KafkaError(KafkaError.ILLEGAL_GENERATION), [TopicPartition("cpu.samples", 2, 8)])
    assert r.to_commit == {} and r._commit_again_at is None


def test_samples_wait_at_most_flush_interval_and_other_topics_max_delay(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = runner(store, consumer)
    for i in range(6):  # one sample message per poll, for 1.25 s
        consumer.polls.append([Raw("cpu.samples", 0, i, cpu("a", i, 1))])
    for i in range(5):
        assert r.batches == 0, i
        r.run_once()
        clock[0] += 0.25
    assert r.batches == 1  # at 1.0 s, though samples kept coming
    ident = encode("WorkloadIdentity", {"identity_id": 9, "node": "a", "time_ns": T, "kind": "pod",
                                        "container_runtime": "", "container_id": "", "container_name": "",
                                        "pod_name": "p", "namespace": "ns", "pod_uid": "", "labels": {},
                                        "slurm_job_id": "", "slurm_step": "", "slurm_user": "",
                                        "slurm_array_job_id": "", "slurm_array_task_id": "", "slurm_account": "",
                                        "systemd_unit": "", "team": "", "simulated": True})
    r.flush_all()
    consumer.polls = [[Raw("identities", 1, 0, ident)]]
    done = r.batches
    for _ in range(20):  # 4.75 s: nobody waits for an identity
        r.run_once()
        clock[0] += 0.25
    assert r.batches == done
    r.run_once()
    assert r.batches == done + 1


def test_an_interrupted_batch_is_read_again_whole_and_written_with_its_tokens(monkeypatch):
    store, consumer = Store(), Consumer()
    stamp = datetime(2026, 12, 3, 10, 0, 0, 5, tzinfo=UTC)
    ranges = {("cpu.samples", 0): (10, 11), ("cpu.samples", 3): (7, 7)}
    store.insert("sink_state", [["cpu.samples", 0, 10, 11, "BEFORE", stamp], ["cpu.samples", 3, 7, 7, "BEFORE", stamp],
                                ["cpu.samples", 1, 0, 4, "AFTER", stamp - timedelta(seconds=1)]], [])
    r = runner(store, consumer)
    asked = []

    def read(want):
        asked.append(want)
        return {("cpu.samples", 0): [Raw("cpu.samples", 0, 10, cpu("a", 0, 3)), Raw("cpu.samples", 0, 11,
                                                                                     cpu("a", 1, 4))],
                ("cpu.samples", 3): [Raw("cpu.samples", 3, 7, cpu("b", 0, 5))]}

    monkeypatch.setattr(r, "_read_ranges", read)
    # this instance is given partitions 0 and 1; partition 3, in the same batch, went to another instance
    r._on_assign(consumer, [TopicPartition("cpu.samples", 0), TopicPartition("cpu.samples", 1)])
    assert asked == [ranges]
    assert [(tp.partition, tp.offset) for tp in consumer.assigned] == [(0, 12), (1, 5)]
    again = store.inserts[2:]  # after the BEFORE rows and the names (written again: a new instance knows none)
    assert [t for t, _, _ in store.inserts[1:]] == ["process_names", "cpu_samples", "profile_windows", "sink_state"]
    assert again[0][2] == f"{batch_key(ranges)}:cpu_samples"
    assert [s[5] for s in again[0][1]] == [3, 4, 5]
    assert [row[:5] + [row[5] - stamp] for row in again[-1][1]] == [
        ["cpu.samples", 0, 10, 11, "AFTER", timedelta(microseconds=1)],
        ["cpu.samples", 3, 7, 7, "AFTER", timedelta(microseconds=1)]]
    assert consumer.commits == []  # its partitions are not this instance's yet (partition 3 never is)
    assert r.stamps.next() >= stamp + timedelta(microseconds=2)


def test_a_one_partition_batch_keeps_the_tokens_of_the_sink_before_batches_spanned_partitions():
    assert batch_key({("cpu.samples", 4): (10, 20)}) == "cpu.samples:4:10-20"
    two = batch_key({("cpu.samples", 4): (10, 20), ("gpu.metrics", 0): (1, 2)})
    assert two == batch_key({("gpu.metrics", 0): (1, 2), ("cpu.samples", 4): (10, 20)})
    assert two.startswith("batch:") and two != batch_key({("cpu.samples", 4): (10, 21), ("gpu.metrics", 0): (1, 2)})


def default_runner(store: Store, consumer: Consumer) -> StoreRunner:
    r = StoreRunner(store, {"bootstrap.servers": "127.0.0.1:1"})
    r.consumer.close()
    r.consumer = consumer
    return r


def gpu_metrics_record() -> dict:
    from tests.fuzz.make_corpus import RECORDS

    return RECORDS["GpuMetrics"]


def nvml_poll(second: int, node: str = "a") -> bytes:
    return encode("GpuMetrics", {**gpu_metrics_record(), "node": node, "time_ns": T + second * 10**9})


def test_by_default_a_window_burst_is_one_batch_and_nvml_polls_ride_with_every_other_one(monkeypatch):
    """The defaults (flush_interval 2 s, max_delay 25 s, NVML riding after 15 s): ten seconds of NVML polls between
    windows force no batch of their own; a node window's burst, 1.5 s of sample messages, goes out once, at its end,
    without the polls of 10 s; the next burst takes them with the 10 s after: 20 polls in one insert."""
    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = default_runner(store, consumer)
    offsets = {"cpu": 0, "nvml": 0}

    def ten_seconds_of_polls() -> None:
        for _ in range(10):  # polls once a second after the last window: no batch
            consumer.polls = [[Raw("gpu.metrics", 0, offsets["nvml"], nvml_poll(offsets["nvml"]))]]
            offsets["nvml"] += 1
            for _ in range(4):
                r.run_once()
                clock[0] += 0.25

    def burst() -> None:
        for i in range(6):  # the next window's burst: samples in every poll for 1.5 s
            consumer.polls.append([Raw("cpu.samples", 1 + i % 3, offsets["cpu"], cpu(f"n{i}", 1, 1))])
            offsets["cpu"] += 1
        for _ in range(6):
            r.run_once()
            clock[0] += 0.25

    ten_seconds_of_polls()
    burst()
    assert r.batches == 0
    r.run_once()  # the burst is over: written without the polls, which have waited 11.5 s
    assert r.batches == 1
    assert "cpu_samples" in [t for t, _, _ in store.inserts]
    assert "gpu_device_metrics" not in [t for t, _, _ in store.inserts]
    assert consumer.commits == [[("cpu.samples", 1, 4), ("cpu.samples", 2, 5), ("cpu.samples", 3, 6)]]
    ten_seconds_of_polls()
    assert r.batches == 1  # 21.5 s: the polls still wait (max_delay 25 s)
    burst()
    r.run_once()
    assert r.batches == 2
    tables = [t for t, _, _ in store.inserts]
    assert tables.count("cpu_samples") == 2 and tables.count("gpu_device_metrics") == 1
    devices = next(rows for t, rows, _ in store.inserts if t == "gpu_device_metrics")
    assert len(devices) == 20 * len(gpu_metrics_record()["devices"])
    assert consumer.commits[-1] == [("cpu.samples", 1, 10), ("cpu.samples", 2, 11), ("cpu.samples", 3, 12),
                                    ("gpu.metrics", 0, 20)]


def test_nvml_polls_alone_go_out_after_max_delay_and_a_full_batch_takes_every_partition(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = default_runner(store, consumer)
    for s in range(26):  # no window comes: the polls go out alone once the first has waited max_delay
        consumer.polls = [[Raw("gpu.metrics", 0, s, nvml_poll(s))]]
        r.run_once()
        clock[0] += 1.0
    assert r.batches == 1 and consumer.commits == [[("gpu.metrics", 0, 26)]]
    # a batch is full by its bytes, whatever the topic: the polls then go with the samples at once
    r.batch_bytes = 2 * len(nvml_poll(0)) + len(cpu("a", 0, 1))
    consumer.polls = [[Raw("gpu.metrics", 0, 26, nvml_poll(26)), Raw("cpu.samples", 0, 0, cpu("a", 0, 1))]]
    r.run_once()
    assert r.batches == 1 and r.buffered_bytes == len(nvml_poll(26)) + len(cpu("a", 0, 1))
    consumer.polls = [[Raw("gpu.metrics", 0, 27, nvml_poll(27))]]
    r.run_once()
    assert r.batches == 2 and r.buffers == {} and r.buffered_bytes == 0
    assert sorted(consumer.commits[-1]) == [("cpu.samples", 0, 1), ("gpu.metrics", 0, 28)]


def test_gpu_samples_wait_for_their_rounds_cpu_samples_unless_those_went_out_already(monkeypatch):
    """The correlator's output for a window most often comes before the symbolizer's: it waits for the CPU samples
    (one batch for the window, whole when they are queryable), at most flush_interval; GPU samples that come after
    this round's CPU samples went out go at their burst's end, as CPU samples do."""
    from tests.test_sink_gpu_depth import v3_record

    clock = [100.0]
    monkeypatch.setattr(sw.time, "monotonic", lambda: clock[0])
    store, consumer = Store(), Consumer()
    r = StoreRunner(store, {"bootstrap.servers": "127.0.0.1:1"})  # the defaults: flush_interval 2 s
    r.consumer.close()
    r.consumer = consumer
    gpu = encode("GpuSamples", v3_record())

    def polls(*each: list) -> None:
        for raws in each:
            consumer.polls.append(raws)
            r.run_once()
            clock[0] += 0.25

    polls([Raw("gpu.samples", 0, 0, gpu)], [], [], [])  # 1 s of quiet after them: no batch, the CPU samples are due
    assert r.batches == 0
    polls([Raw("cpu.samples", 0, 0, cpu("n1", 0, 3))], [])  # they came: the window goes out at their burst's end
    assert r.batches == 1
    assert {t for t, _, _ in store.inserts} >= {"cpu_samples", "gpu_kernel_samples", "gpu_timeline"}
    polls([Raw("gpu.samples", 0, 1, gpu)], [])  # late GPU samples of the same round: at their burst's end
    assert r.batches == 2
    clock[0] += 10  # the next round: its GPU samples alone wait, at most flush_interval
    polls(*[[Raw("gpu.samples", 0, 2, gpu)]] + [[]] * 7)
    assert r.batches == 2
    polls([])
    assert r.batches == 3
    assert [t for t, _, _ in store.inserts].count("cpu_samples") == 1
