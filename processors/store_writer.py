"""The runner of topic-to-ClickHouse stages: exactly once without transactions in ClickHouse.

Per partition, each batch is a fixed offset range [lo, hi]. Before writing, the range is recorded in `sink_state`
as BEFORE; the rows go in with insert_deduplication_token = topic:partition:lo-hi:table; then the range is marked
AFTER and the Kafka offset committed. After a crash a BEFORE range is re-read exactly and re-inserted with the
same tokens, which ClickHouse drops as duplicates; an AFTER range is skipped. This is the scheme of ClickHouse's
own Kafka Connect sink, with the state kept in a table of the same store.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processors import metrics
from processors.known_ids import KnownIds
from processors.messages import Message, Produced, dead_letter, decode_message
from processors.runner import (
    DEFAULT_MAX_MESSAGE_BYTES,
    client_config,
    consumer_config,
    expected_schemas,
    skip_consumer_error,
)
from processors.sink import DEFINITION_TABLES, SINK_INPUTS, Rows, rows_for
from schemas import single_object

log = logging.getLogger("fleetprof.sink")
STATE_COLUMNS = ["topic", "partition", "min_offset", "max_offset", "state", "updated"]
# commit errors meaning the partition went to another member: retrying cannot succeed, and need not
_NOT_OURS = (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
             KafkaError._ASSIGNMENT_LOST)


class StoreRunner:
    """Consumes result topics and writes them into the store, each message exactly once."""

    def __init__(self, store, kafka: dict, *, name: str = "sink", inputs: tuple[str, ...] = SINK_INPUTS,
                 batch_messages: int = 2000, flush_interval: float = 1.0, poll_timeout: float = 0.2,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, group: str | None = None,
                 stop: threading.Event | None = None) -> None:
        self.store = store
        self.name = name
        self.inputs = inputs
        self.batch_messages = batch_messages
        self.flush_interval = flush_interval
        self.poll_timeout = poll_timeout
        self.max_message_bytes = max_message_bytes
        self.expect = expected_schemas(inputs)
        self.stop = stop or threading.Event()
        self.consumer = Consumer(consumer_config(kafka, group or f"fleetprof-{name}"))
        pcfg = client_config(kafka, **{"enable.idempotence": True, "acks": "all"})
        self.producer = Producer(pcfg)
        self.buffers: dict[tuple[str, int], list] = {}
        self.first_seen: dict[tuple[str, int], float] = {}
        self.redo: dict[tuple[str, int], tuple[int, int]] = {}
        self.known_frames = KnownIds()
        self.known_stacks = KnownIds()
        self.batches = 0

    # --- group membership -------------------------------------------------------------------------------------
    def start(self) -> None:
        self.consumer.subscribe(list(self.inputs), on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        states: dict[tuple[str, int], tuple[int, int, str]] = {}
        for topic in {p.topic for p in partitions}:
            _, rows = self._retry(lambda t=topic: self.store.query_named("sink_state", {"topic": t}))
            for partition, lo, hi, state in rows:
                states[(topic, partition)] = (lo, hi, state)
        for p in partitions:
            st = states.get((p.topic, p.partition))
            if st is None:
                continue
            lo, hi, state = st
            if state == "AFTER":
                p.offset = hi + 1
            else:
                p.offset = lo
                self.redo[(p.topic, p.partition)] = (lo, hi)
                log.info("re-writing %s[%d] offsets %d-%d after an interrupted batch", p.topic, p.partition, lo, hi)
        consumer.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for p in partitions:
            tp = (p.topic, p.partition)
            self.buffers.pop(tp, None)
            self.first_seen.pop(tp, None)
            self.redo.pop(tp, None)

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
        for raw in raws:
            tp = (raw.topic(), raw.partition())
            self.buffers.setdefault(tp, []).append(raw)
            self.first_seen.setdefault(tp, now)
        for tp in list(self.buffers):
            self._flush_if_ready(tp, now)
        return len(raws)

    def flush_all(self) -> None:
        for tp in list(self.buffers):
            self._flush_if_ready(tp, float("inf"))

    def _flush_if_ready(self, tp: tuple[str, int], now: float) -> None:
        buf = self.buffers.get(tp)
        if not buf:
            return
        if tp in self.redo:
            lo, hi = self.redo[tp]
            batch = [m for m in buf if lo <= m.offset() <= hi]
            if not batch or batch[-1].offset() != hi:
                return  # the interrupted range must be rebuilt exactly before anything else
        elif len(buf) >= self.batch_messages or now - self.first_seen[tp] >= self.flush_interval:
            batch = buf[: self.batch_messages]
        else:
            return
        self._write(tp, batch)
        self.redo.pop(tp, None)
        rest = [m for m in buf if m.offset() > batch[-1].offset()]
        if rest:
            self.buffers[tp] = rest
            self.first_seen[tp] = now if now != float("inf") else time.monotonic()
        else:
            self.buffers.pop(tp, None)
            self.first_seen.pop(tp, None)

    # --- one batch --------------------------------------------------------------------------------------------
    def _write(self, tp: tuple[str, int], raws: list) -> None:
        started = time.monotonic()
        topic, partition = tp
        lo, hi = raws[0].offset(), raws[-1].offset()
        decoded: list[Message] = []
        dead: list[Produced] = []
        for raw in raws:
            metrics.MESSAGES_IN.labels(self.name, topic).inc()
            item = decode_message(self.name, raw, self.expect, self.max_message_bytes)
            (decoded if isinstance(item, Message) else dead).append(item)
        tables = self._rows(decoded, dead)
        self._state(topic, partition, lo, hi, "BEFORE")
        self._dead_letters(dead)
        for table, rows in tables.items():
            self._insert(table, rows, f"{topic}:{partition}:{lo}-{hi}:{table}")
        self._state(topic, partition, lo, hi, "AFTER")
        self._commit_offset(TopicPartition(topic, partition, hi + 1))
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

    def _insert(self, table: str, rows: Rows, token: str) -> None:
        if table in DEFINITION_TABLES:
            known = self.known_frames if table == "frames" else self.known_stacks
            fresh = known.unseen([r[0] for r in rows.rows])
            data = [r for r in rows.rows if r[0] in fresh]
            fresh_ids = {r[0] for r in data}
            data = list({r[0]: r for r in data}.values())
            if data:
                self._retry(lambda: self.store.insert(table, data, rows.columns))
            known.add(fresh_ids)
            metrics.ROWS_OUT.labels(self.name, table).inc(len(data))
        elif rows.rows:
            self._retry(lambda: self.store.insert(table, rows.rows, rows.columns, dedup_token=token))
            metrics.ROWS_OUT.labels(self.name, table).inc(len(rows.rows))

    def _state(self, topic: str, partition: int, lo: int, hi: int, state: str) -> None:
        row = [topic, partition, lo, hi, state, datetime.now(tz=UTC)]
        self._retry(lambda: self.store.insert("sink_state", [row], STATE_COLUMNS))

    def _dead_letters(self, dead: list[Produced]) -> None:
        for d in dead:
            log.warning("dead letter: %s[%d]@%d: %s", d.record["source_topic"], d.record["source_partition"],
                        d.record["source_offset"], d.record["reason"])
            key = d.key.encode() if isinstance(d.key, str) else d.key
            self.producer.produce("deadletter", key=key, value=single_object.encode(d.schema, d.record))
            metrics.DEAD_LETTERS.labels(self.name, d.record["source_topic"]).inc()
        if dead and self.producer.flush(30) > 0:
            raise RuntimeError("dead letters could not be delivered; not committing the batch")

    def _commit_offset(self, tp: TopicPartition) -> None:
        """Commit the consumed offset, again while the broker or the group coordinator is away (a restart). The range
        is marked AFTER in sink_state already, and an assignment resumes from there, so a commit given up (stopping,
        or the partition gone to another member) costs no row and doubles none; the commit keeps the lag right."""
        delay = 0.2
        while True:
            try:
                self.consumer.commit(offsets=[tp], asynchronous=False)
                return
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    raise
                if self.stop.is_set() or err.code() in _NOT_OURS:  # sink_state says where to resume: AFTER hi
                    log.info("offset commit for %s[%d] given up (%s); its range is marked done", tp.topic,
                             tp.partition, err)
                    return
                log.warning("offset commit for %s[%d] failed (%s); retrying in %.1fs", tp.topic, tp.partition, err,
                            delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

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

