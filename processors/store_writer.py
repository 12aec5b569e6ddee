"""The runner of topic-to-ClickHouse stages: exactly once without transactions in ClickHouse.

A batch is a fixed offset range [lo, hi] of each partition it spans (every partition with buffered messages: one
INSERT per table for all of them). Before writing, the ranges are recorded in `sink_state` as BEFORE under one
stamp; the rows go in with insert_deduplication_token = the ranges' key (batch_key) and the table; then the ranges
are marked AFTER and the Kafka offsets committed. After a crash, the partitions left BEFORE under one stamp are one
batch: whichever instance is assigned any of them re-reads all of its ranges exactly (outside the group) and
re-inserts them with the same tokens, which ClickHouse drops as duplicates; an AFTER range is skipped. This is the
scheme of ClickHouse's own Kafka Connect sink, with the state kept in a table of the same store, over several
partitions per batch.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors import metrics
from processors.gc_policy import batch_in_hand, tune_collector
from processors.known_ids import KnownIds
from processors.messages import Message, Produced, dead_letter, decode_message
from processors.runner import (
    DEFAULT_MAX_MESSAGE_BYTES,
    client_config,
    consumer_config,
    expected_schemas,
    skip_consumer_error,
)
from processors.sink import DEFINITION_TABLES, READ_AS_COLUMNS, SINK_INPUTS, Rows, rows_for
from schemas import single_object, topics

log = logging.getLogger("fleetprof.sink")
# Topics whose rows someone waits to query (a window's flame graph): written once a poll brings no more of them
LATENCY_TOPICS = frozenset({topics.CPU_SAMPLES.name, topics.GPU_SAMPLES.name})
# A window's GPU samples (the correlator's one transaction per burst) most often come before its CPU samples (the
# symbolizer's): unless this round's CPU samples went out already (a batch with CPU samples within CPU_ROUND_S),
# they wait for them, at most flush_interval, so that the window is one batch, whole once its CPU samples are
# queryable, not two: each batch is a part per table for the engine to write and merge (bench/RESULTS.md).
CPU_ROUND_S = 5.0  # half the agents' 10 s window: the CPU samples of the round before are not this round's
# NVML polls come once a second per node and their inserts cost the engine per insert as much as per row (half of its
# time on the sink thread, for a tenth of the rows: bench/RESULTS.md). A partition of these topics joins a batch once
# its oldest message has waited this long (at most max_delay): at the agents' 10 s windows its polls go with every
# other window's burst, two windows' readings per insert, queryable at most ~25 s after the poll instead of ~15.
RIDE_AFTER_S = {topics.GPU_METRICS.name: 15.0}
STATE_COLUMNS = ["topic", "partition", "min_offset", "max_offset", "state", "updated"]
# commit errors meaning the partition went to another member: retrying cannot succeed, and need not
_NOT_OURS = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
             KafkaError._ASSIGNMENT_LOST)
COMMIT_FIRST_DELAY, COMMIT_MAX_DELAY = 0.2, 5.0  # seconds before a failed offset commit is sent again


def _bytes(raws) -> int:
    """The message bytes of `raws` (what batch_bytes counts)."""
    return sum(len(raw.value() or b"") for raw in raws)


def batch_key(ranges: dict[tuple[str, int], tuple[int, int]]) -> str:
    """The deduplication token's stem for a batch of these offset ranges: the same ranges, the same tokens, whoever
    writes them. One partition's batch keeps the form of the sink before batches spanned partitions, so a batch
    that sink left interrupted is written again under its own tokens."""
    if len(ranges) == 1:
        ((topic, partition), (lo, hi)), = ranges.items()
        return f"{topic}:{partition}:{lo}-{hi}"
    text = ",".join(f"{t}:{p}:{lo}-{hi}" for (t, p), (lo, hi) in sorted(ranges.items()))
    return f"batch:{hashlib.sha256(text.encode()).hexdigest()[:32]}"


class Stamps:
    """Batch stamps (sink_state.updated): microseconds, rising, and above every stamp seen in the store (another
    instance's clock may run ahead of this one). The partitions in BEFORE under one stamp are one batch; AFTER
    takes the stamp plus a microsecond, so each new stamp is at least two above the last."""

    def __init__(self) -> None:
        self.last = datetime(1970, 1, 1, tzinfo=UTC)

    def seen(self, stamp: datetime | None) -> None:
        if stamp is not None and stamp.astimezone(UTC) > self.last:
            self.last = stamp.astimezone(UTC)

    def next(self) -> datetime:
        self.last = max(datetime.now(tz=UTC), self.last + timedelta(microseconds=2))
        return self.last


class StoreRunner:
    """Consumes result topics and writes them into the store, each message exactly once."""

    def __init__(self, store, kafka: dict, *, name: str = "sink", inputs: tuple[str, ...] = SINK_INPUTS,
                 batch_messages: int = 2000, batch_bytes: int = 64 << 20, flush_interval: float = 2.0,
                 max_delay: float = 25.0, poll_timeout: float = 0.2, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 group: str | None = None, stop: threading.Event | None = None) -> None:
        """batch_messages: the most messages one poll takes; batch_bytes: buffered message bytes that make a batch
        full (whatever the topic: a CpuSamples message is ~25 times an NVML poll's bytes); flush_interval: the
        longest a message of a LATENCY_TOPICS topic waits (a batch goes out sooner, once a poll brings no more of
        them); max_delay: the longest any other message waits.

        The defaults make a node window's burst one batch and let alerts and identities ride with the next burst,
        NVML polls with every other one (RIDE_AFTER_S; agents send a window every 10 s, and 25 s, not 20, so that a
        poll just after a burst does not go out alone just before the one it waits for), instead of forcing
        batches of their own: 19 -> 6 batches over 6 windows of 100 nodes in bench/sink_cost.py, 27.2 -> 18.4 us of
        CPU per stored sample (fewer parts to write and merge), a window's end to written unchanged (the burst's
        end decides it)."""
        self.store = store
        self.kafka = kafka
        self.name = name
        self.inputs = inputs
        self.batch_messages = batch_messages
        self.batch_bytes = batch_bytes
        self.flush_interval = flush_interval
        self.max_delay = max_delay
        self.poll_timeout = poll_timeout
        self.max_message_bytes = max_message_bytes
        self.expect = expected_schemas(inputs)
        self.stop = stop or threading.Event()
        self.consumer = Consumer(consumer_config(kafka, group or f"fleetprof-{name}", on_commit=self._on_commit))
        pcfg = client_config(kafka, **{"enable.idempotence": True, "acks": "all"})
        self.producer = Producer(pcfg)
        self.buffers: dict[tuple[str, int], list] = {}
        self.first_seen: dict[tuple[str, int], float] = {}
        self.buffered_bytes = 0
        self.known = {table: KnownIds() for table in DEFINITION_TABLES}  # definitions already written
        self.stamps = Stamps()
        self.batches = 0
        self._cpu_written_at = -CPU_ROUND_S  # when a batch last held CPU samples (monotonic)
        # offsets to commit, sent without waiting (see _commit_offsets); a failed commit is sent again from run_once
        self.to_commit: dict[tuple[str, int], int] = {}
        self._commit_again_at: float | None = None  # when to send a failed commit again; None: none failed
        self._commit_delay = COMMIT_FIRST_DELAY

    # --- group membership -------------------------------------------------------------------------------------
    def start(self) -> None:
        tune_collector()
        self.consumer.subscribe(list(self.inputs), on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        _, rows = self._retry(lambda: self.store.query_store("sink_batches", {"topics": list(self.inputs)}))
        states = {(topic, part): (lo, hi, state, updated) for topic, part, lo, hi, state, updated in rows}
        self.stamps.seen(max((st[3] for st in states.values()), default=None))
        interrupted: set[datetime] = set()
        for p in partitions:
            st = states.get((p.topic, p.partition))
            if st is None:
                continue
            lo, hi, state, updated = st
            p.offset = hi + 1  # an interrupted batch is written whole (below) before anything after it
            if state != "AFTER":
                interrupted.add(updated)
        for stamp in sorted(interrupted):
            ranges = {tp: (st[0], st[1]) for tp, st in states.items() if st[2] != "AFTER" and st[3] == stamp}
            log.info("re-writing %s after an interrupted batch",
                     ", ".join(f"{t}[{p}] offsets {lo}-{hi}" for (t, p), (lo, hi) in sorted(ranges.items())))
            self._write(self._read_ranges(ranges), stamp=stamp)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self.buffered_bytes -= _bytes(self.buffers.pop(tp, ()))
            self.first_seen.pop(tp, None)
            self.to_commit.pop(tp, None)  # its new owner resumes from sink_state

    def _read_ranges(self, ranges: dict[tuple[str, int], tuple[int, int]]) -> dict[tuple[str, int], list]:
        """The messages of exactly these offset ranges, read outside the group: a batch may span partitions that
        another instance holds now, and is written again whole by whichever instance finds it interrupted."""
        reader = Consumer(consumer_config(self.kafka, f"fleetprof-{self.name}-reread", **{"enable.auto.offset.store":
                                                                                           False}))
        try:
            reader.assign([TopicPartition(t, p, lo) for (t, p), (lo, _) in ranges.items()])
            got: dict[tuple[str, int], list] = {tp: [] for tp in ranges}
            todo = set(ranges)
            while todo:
                if self.stop.is_set():
                    raise RuntimeError("stopping while re-reading an interrupted batch")
                for m in reader.consume(num_messages=self.batch_messages, timeout=self.poll_timeout):
                    if skip_consumer_error(m):
                        continue
                    tp = (m.topic(), m.partition())
                    lo, hi = ranges[tp]
                    if tp in todo and lo <= m.offset() <= hi:
                        got[tp].append(m)
                        if m.offset() == hi:
                            todo.discard(tp)
                            reader.pause([TopicPartition(*tp)])
            return got
        finally:
            reader.close()

    # --- main loop --------------------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        if stop is not None:
            self.stop = stop
        self.start()
        try:
            while not self.stop.is_set():
                self.run_once()
            self.flush_all()
        finally:
            self.close()

    def run_once(self) -> int:
        raws = [m for m in self.consumer.consume(num_messages=self.batch_messages, timeout=self.poll_timeout)
                if not skip_consumer_error(m)]
        now = time.monotonic()
        if self._commit_again_at is not None and now >= self._commit_again_at:
            self._send_commit()
        fresh = False  # this poll brought messages someone waits to query
        for raw in raws:
            tp = (raw.topic(), raw.partition())
            self.buffers.setdefault(tp, []).append(raw)
            self.buffered_bytes += _bytes((raw,))
            self.first_seen.setdefault(tp, now)
            fresh = fresh or tp[0] in LATENCY_TOPICS
        if self._due(now, fresh):
            with batch_in_hand():  # the batch's columns and rows are gone when _flush returns
                self._flush(now, everything=self.buffered_bytes >= self.batch_bytes)
        return len(raws)

    def _due(self, now: float, fresh: bool) -> bool:
        """Whether to write what is buffered now: a full batch; messages of LATENCY_TOPICS once a poll brings no
        more of them (the end of a burst: every node sends at its window's end; GPU samples once this round's CPU
        samples came too, see CPU_ROUND_S) or after flush_interval; any
        message after max_delay. One batch holds every buffered partition but those of RIDE_AFTER_S still waiting:
        each insert costs the engine a part (milliseconds of CPU whatever its size), so fewer, larger batches are
        what makes the sink cheap."""
        if not self.buffers:
            return False
        if self.buffered_bytes >= self.batch_bytes:
            return True
        cpu_came = now - self._cpu_written_at < CPU_ROUND_S
        for tp, first in self.first_seen.items():
            waited = now - first
            if tp[0] in LATENCY_TOPICS and waited >= self.flush_interval:
                return True
            if tp[0] in LATENCY_TOPICS and not fresh and (tp[0] == topics.CPU_SAMPLES.name or cpu_came):
                return True
            if waited >= self.max_delay:
                return True
        return False

    def flush_all(self) -> None:
        if self.buffers:
            self._flush(time.monotonic(), everything=True)

    def _flush(self, now: float, everything: bool) -> None:
        """Write the buffered partitions as one batch: all of them if `everything` (a full batch, or stopping),
        else all but those of RIDE_AFTER_S whose oldest message has waited less than its time."""
        if everything:
            batch, self.buffers, self.first_seen, self.buffered_bytes = self.buffers, {}, {}, 0
        else:
            batch = {tp: self.buffers.pop(tp) for tp, first in list(self.first_seen.items())
                     if now - first >= min(RIDE_AFTER_S.get(tp[0], 0.0), self.max_delay)}
            for tp, raws in batch.items():
                del self.first_seen[tp]
                self.buffered_bytes -= _bytes(raws)
        if any(topic == topics.CPU_SAMPLES.name for topic, _ in batch):
            self._cpu_written_at = time.monotonic()
        self._write(batch)

    # --- one batch --------------------------------------------------------------------------------------------
    def _write(self, batch: dict[tuple[str, int], list], stamp: datetime | None = None) -> None:
        """Write one batch: BEFORE for every partition's range, the rows with tokens that name the ranges, AFTER,
        then the offsets. `stamp`: an interrupted batch's, whose BEFORE rows are in the store already; its offsets
        are not committed here (its partitions are not assigned yet, some maybe never to this instance)."""
        started = time.monotonic()
        tps = sorted(tp for tp, raws in batch.items() if raws)
        if not tps:
            return
        ranges = {tp: (batch[tp][0].offset(), batch[tp][-1].offset()) for tp in tps}
        decoded: list[Message] = []
        dead: list[Produced] = []
        for tp in tps:  # in partition then offset order: a batch written again is built exactly as the first time
            metrics.MESSAGES_IN.labels(self.name, tp[0]).inc(len(batch[tp]))
            for raw in batch[tp]:
                item = decode_message(self.name, raw, self.expect, self.max_message_bytes, columns=READ_AS_COLUMNS)
                (decoded if isinstance(item, Message) else dead).append(item)
        tables = self._rows(decoded, dead)
        key = batch_key(ranges)
        resumed = stamp
        if stamp is None:
            stamp = self.stamps.next()
            self._state(ranges, "BEFORE", stamp)
        self._dead_letters(dead)
        for table, rows in tables.items():
            token = f"{key}:{table}"
            self._insert(table, rows, token, again=resumed is not None)
        # AFTER one microsecond past BEFORE, never now: written again for a batch that another instance resumed
        # from and went on with, it must not outrank that instance's newer state of the partition
        self._state(ranges, "AFTER", stamp + timedelta(microseconds=1))
        if resumed is None:
            self._commit_offsets([TopicPartition(t, p, hi + 1) for (t, p), (_, hi) in ranges.items()])
        self.batches += 1
        metrics.COMMITS.labels(self.name).inc()
        metrics.BATCH_SECONDS.labels(self.name).observe(time.monotonic() - started)

    def _rows(self, decoded: list[Message], dead: list[Produced]) -> dict[str, Rows]:
        # whole seconds, like the DateTime column; a retried batch's definitions may differ here: they are
        # duplicates the ReplacingMergeTree collapses, as re-sent definitions always are
        written_at = datetime.now(UTC).replace(microsecond=0)
        try:
            return rows_for(decoded, written_at)
        except Exception:
            log.exception("row building failed on a batch of %d; isolating", len(decoded))
        good = []
        for m in decoded:
            try:
                rows_for([m])
                good.append(m)
            except Exception as exc:
                dead.append(dead_letter(self.name, m.topic, m.partition, m.offset, m.key,
                                        m.value, f"row building failed: {exc!r}"))
        return rows_for(good, written_at)

    def _insert(self, table: str, rows: Rows, token: str, again: bool = False) -> None:
        """`again`: an interrupted batch's rows, which the store writes so that whatever part of them the death
        left in the table and its views' targets, each holds them once (Store.insert_again)."""
        if table in DEFINITION_TABLES:
            known = self.known[table]
            fresh = known.unseen([r[0] for r in rows.rows])
            data = [r for r in rows.rows if r[0] in fresh]
            fresh_ids = {r[0] for r in data}
            data = list({r[0]: r for r in data}.values())
            if data:
                # process_names: the store loads its dictionary again before returning (migration 0025), so the
                # rows written next name their processes at once
                self._retry(lambda: self.store.insert(table, data, rows.columns))
            known.add(fresh_ids)
            metrics.ROWS_OUT.labels(self.name, table).inc(len(data))
        elif len(rows):
            by_column = rows.by_column is not None
            data = rows.by_column if by_column else rows.rows
            if not again:
                self._retry(lambda: self.store.insert(table, data, rows.columns, dedup_token=token,
                                                      column_oriented=by_column))
            else:
                for repaired in self._retry(lambda: self.store.insert_again(table, data, rows.columns, token,
                                                                            column_oriented=by_column)):
                    log.warning("%s: the interrupted insert left a deduplication record without its part in %s; "
                                "its rows went there again, once", table, repaired)
            metrics.ROWS_OUT.labels(self.name, table).inc(len(rows))

    def _state(self, ranges: dict[tuple[str, int], tuple[int, int]], state: str, stamp: datetime) -> None:
        rows = [[t, p, lo, hi, state, stamp] for (t, p), (lo, hi) in ranges.items()]
        self._retry(lambda: self.store.insert("sink_state", rows, STATE_COLUMNS))

    def _dead_letters(self, dead: list[Produced]) -> None:
        for d in dead:
            log.warning("dead letter: %s[%d]@%d: %s", d.record["source_topic"], d.record["source_partition"],
                        d.record["source_offset"], d.record["reason"])
            key = d.key.encode() if isinstance(d.key, str) else d.key
            self.producer.produce("deadletter", key=key, value=single_object.encode(d.schema, d.record))
            metrics.DEAD_LETTERS.labels(self.name, d.record["source_topic"]).inc()
        if dead and self.producer.flush(30) > 0:
            raise RuntimeError("dead letters could not be delivered; not committing the batch")

    def _commit_offsets(self, tps: list[TopicPartition]) -> None:
        """Commit the consumed offsets without waiting for the answer. The ranges are marked AFTER in sink_state
        already and an assignment resumes from there, so a commit that fails or never comes back costs no row and
        doubles none; the commit keeps the lag right. A synchronous commit could wait forever for a group coordinator
        librdkafka cached across a broker restart (its issues 5456 and 5511: the sink then stopped writing, its
        consumer dropped from the group). A failed one is sent again (_on_commit) until it is done or the partition
        is another member's."""
        for tp in tps:
            self.to_commit[(tp.topic, tp.partition)] = tp.offset
        self._send_commit()

    def _send_commit(self) -> None:
        self._commit_again_at = None
        if not self.to_commit:
            return
        try:
            self.consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in self.to_commit.items()],
                                 asynchronous=True)
        except KafkaException as exc:  # not sent at all
            if exc.args[0].code() in _NOT_OURS:
                log.info("offset commit given up (%s); the ranges are marked done", exc.args[0])
                self.to_commit.clear()
            else:
                self._commit_failed(exc.args[0])

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """A commit's answer (librdkafka calls it from consume, on the sink's thread)."""
        if err is not None and err.code() in _NOT_OURS:  # the group moved on: its new owner resumes from sink_state
            log.info("offset commit given up (%s); the ranges are marked done", err)
            for p in partitions:
                self.to_commit.pop((p.topic, p.partition), None)
            return
        failed = None
        for p in partitions:
            tp = (p.topic, p.partition)
            if err is None and p.error is None:
                if self.to_commit.get(tp, -1) <= p.offset:  # done, unless a later batch's offset waits
                    self.to_commit.pop(tp, None)
            else:
                failed = err or p.error
        if failed is not None:
            self._commit_failed(failed)
        elif not self.to_commit:
            self._commit_delay = COMMIT_FIRST_DELAY

    def _commit_failed(self, err: KafkaError) -> None:
        if err.fatal():
            raise KafkaException(err)
        log.warning("offset commit failed (%s); sent again in %.1fs", err, self._commit_delay)
        self._commit_again_at = time.monotonic() + self._commit_delay
        self._commit_delay = min(self._commit_delay * 2, COMMIT_MAX_DELAY)

    def _retry(self, action, first_delay: float = 0.2, max_delay: float = 5.0):
        """Run a store action until it succeeds; the batch waits, nothing is skipped."""
        delay = first_delay
        while True:
            try:
                return action()
            except Exception as exc:
                if self.stop.is_set():
                    raise
                metrics.STORE_RETRIES.labels(self.name).inc()
                log.warning("store write failed (%s: %s); retrying in %.1fs", type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "", delay)
                time.sleep(delay)
                delay = min(delay * 2, max_delay)

    def close(self) -> None:
        try:
            self.consumer.close()
        finally:
            self.producer.flush(10)

