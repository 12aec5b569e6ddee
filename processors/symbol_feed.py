"""Reads the compacted `symbols` topic into a SymbolTables cache. I/O side of symbolization.

The cache is bounded, so a table can be evicted and needed again later: the feed remembers where each chunk of
every table it has read sits (partition, offset: a few integers per build id) and reads those chunks again.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from processors.runner import client_config
from processors.symbol_tables import BadChunk, SymbolTables
from schemas import single_object, topics

log = logging.getLogger("fleetprof.symbols")
BROKER_WAIT_S = 120.0  # how long a catch-up waits for a broker that is away before the stage gives up (and exits)
READ_AHEAD_STALL_S = 2.0  # a read-ahead (stage idle) gives up this soon on a stalled read: the next batch reads on
FRESH_CLIENT_AFTER = 6  # failed watermark asks (~0.5 s apart) before asking through a new client instead
MAX_MISSED = 100_000  # build ids remembered as asked for and not published (forgotten all at once past this)


class SymbolFeed:
    """Follows the symbols topic from the beginning; `catch_up` reads up to the current end."""

    def __init__(self, kafka: dict, tables: SymbolTables, min_interval: float = 1.0) -> None:
        cfg = client_config(kafka)
        cfg.update({"group.id": "fleetprof-symbols-reader", "enable.auto.commit": False,
                    "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                    "max.partition.fetch.bytes": 16 * 1024 * 1024})
        self.consumer = Consumer(cfg)
        self.tables = tables
        self.min_interval = min_interval
        self.chunks_read = 0
        self.bad_chunks = 0
        self._last_catch_up = 0.0
        self.refetched = 0  # tables read again after the cache had evicted them
        # build id -> chunk index -> (partition, offset) of the latest copy read
        self._where: dict[str, dict[int, tuple[int, int]]] = {}
        self._missed: set[str] = set()  # build ids a full catch-up did not find
        self._refetcher: Consumer | None = None
        self._config = cfg
        md = self.consumer.list_topics(topics.SYMBOLS.name, timeout=10)
        parts = md.topics[topics.SYMBOLS.name].partitions
        self.partitions = [TopicPartition(topics.SYMBOLS.name, p, OFFSET_BEGINNING) for p in sorted(parts)]
        self.consumer.assign(self.partitions)

    def catch_up(self, timeout: float = 10.0, force: bool = False, patient: bool = True) -> int:
        """Read every chunk published before the call (rate limited unless forced); returns chunks read.

        `timeout` bounds a stall (nothing read while the watermark says more is there), not the whole read: the
        topic holds every table the fleet ever sent, and a stage that stopped reading early would symbolize stacks
        whose tables were published before them as unknown. `patient`: wait up to BROKER_WAIT_S for a broker that
        does not answer (a batch needs the tables); otherwise ask once and raise."""
        now = time.monotonic()
        if not force and now - self._last_catch_up < self.min_interval:
            return 0
        self._last_catch_up = now
        ends = {tp.partition: self._end_offset(tp, timeout, patient) for tp in self.partitions}
        positions = {tp.partition: tp.offset for tp in self.consumer.position(self.partitions)}
        pending = {p for p, end in ends.items() if max(positions.get(p, 0), 0) < end}
        read = 0
        stall_deadline = time.monotonic() + timeout
        while pending and time.monotonic() < stall_deadline:
            for raw in self.consumer.consume(num_messages=500, timeout=0.2):
                if raw.error() is not None:
                    continue
                read += 1
                stall_deadline = time.monotonic() + timeout
                self._take(raw.value(), raw.partition(), raw.offset())
                if raw.offset() + 1 >= ends[raw.partition()]:
                    pending.discard(raw.partition())
            for tp in self.consumer.position([TopicPartition(topics.SYMBOLS.name, p) for p in list(pending)]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        if pending:
            log.warning("symbols topic: nothing read for %.0f s with partitions %s short of their end; tables on them "
                        "stay missing until the next catch-up", timeout, sorted(pending))
        self.chunks_read += read
        return read

    def read_ahead(self) -> int:
        """catch_up for a stage with nothing to process: an agent publishes a table before the records that need
        it, so reading it now takes it off their batch's path (a 100-node fleet's first window spent 1.5 s there,
        bench/RESULTS.md). Rate limited like catch_up; a broker that does not answer at once is left to the next
        batch's catch_up, which waits for it. Returns chunks read."""
        try:
            return self.catch_up(timeout=READ_AHEAD_STALL_S, patient=False)
        except KafkaException as exc:
            log.debug("symbols topic read-ahead skipped: %s", exc.args[0].str())
            return 0

    def _end_offset(self, tp: TopicPartition, timeout: float, patient: bool = True) -> int:
        """The partition's high watermark; asked again while the broker is away or the partition has no leader (a
        topic just created, a broker restarting) for up to BROKER_WAIT_S: no batch can be symbolized without it.
        After a broker restart the consumer's cached metadata can name the partition unknown for long after the
        broker is back, so a failed ask refreshes the metadata, and later ones ask through a fresh client. Not
        `patient`: one ask, whose failure raises."""
        if not patient:
            return self.consumer.get_watermark_offsets(tp, timeout=timeout)[1]
        deadline = time.monotonic() + max(timeout, BROKER_WAIT_S)
        failures = 0
        while True:
            try:
                if failures < FRESH_CLIENT_AFTER:
                    return self.consumer.get_watermark_offsets(tp, timeout=timeout)[1]
                return self._fresh_end_offset(tp, timeout)
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise
                failures += 1
                log.warning("symbols topic not answering (%s): asking again", exc.args[0].str())
                time.sleep(0.5)
                try:
                    self.consumer.list_topics(topics.SYMBOLS.name, timeout=min(timeout, 5.0))
                except KafkaException:
                    pass  # the broker is still away: the next ask says so

    def _fresh_end_offset(self, tp: TopicPartition, timeout: float) -> int:
        """The high watermark asked by a new, short-lived client (fresh metadata)."""
        client = Consumer({**self._config, "group.id": "fleetprof-symbols-watermarks"})
        try:
            return client.get_watermark_offsets(tp, timeout=timeout)[1]
        finally:
            client.close()

    def _take(self, value: bytes | None, partition: int, offset: int) -> dict | None:
        if value is None:  # a tombstone: compaction removed that chunk on purpose
            return None
        try:
            _, chunk = single_object.decode(value, expect=topics.SYMBOLS.schema)
        except single_object.DecodeError as exc:
            self.bad_chunks += 1
            log.warning("skipping undecodable symbol chunk: %s", exc)
            return None
        try:
            self.tables.add_chunk(chunk)
        except BadChunk as exc:  # one bad record on the compacted topic must not stop every reader of it
            self.bad_chunks += 1
            log.warning("skipping inconsistent symbol chunk: %s", exc)
            return None
        self._where.setdefault(chunk["build_id"], {})[chunk["chunk_index"]] = (partition, offset)
        return chunk

    def ensure(self, build_ids: set[str], timeout: float = 10.0) -> int:
        """Make the tables of `build_ids` present if they were ever published: catch up with new chunks, then read
        again those the cache evicted. Returns how many tables were read again.

        An agent publishes a table before the records that need it, so a build id never read before is on the topic
        already unless it was never sent: the first miss of each reads up to the end whatever the rate limit; only
        ids missed before (never published: an unreadable binary) wait for it."""
        unread = {b for b in build_ids if b not in self.tables and b not in self._where}
        if any(b not in self.tables for b in build_ids):
            self.catch_up(timeout, force=bool(unread - self._missed))
            if len(self._missed) > MAX_MISSED:
                self._missed.clear()
            self._missed |= {b for b in unread if b not in self.tables}
        evicted = [b for b in build_ids if b not in self.tables and b in self._where]
        if not evicted:
            return 0
        if self._refetcher is None:
            self._refetcher = Consumer({**self._config, "group.id": "fleetprof-symbols-refetch"})
        back = 0
        deadline = time.monotonic() + timeout
        for build_id in evicted:
            wanted = sorted(self._where[build_id].values())
            for partition in sorted({p for p, _ in wanted}):
                offsets = [o for p, o in wanted if p == partition]
                self._refetcher.assign([TopicPartition(topics.SYMBOLS.name, partition, offsets[0])])
                todo = set(offsets)
                while todo and time.monotonic() < deadline:
                    for raw in self._refetcher.consume(num_messages=len(todo) + 100, timeout=0.2):
                        if raw.error() is not None or raw.offset() not in todo:
                            continue
                        todo.discard(raw.offset())
                        self._take(raw.value(), raw.partition(), raw.offset())
                    if todo and max(todo) < self._refetcher.position(
                            [TopicPartition(topics.SYMBOLS.name, partition)])[0].offset:
                        break  # compacted away meanwhile: a newer copy was read by catch_up, or none exists
            if build_id in self.tables:
                back += 1
            else:
                log.warning("symbol table %s was evicted and could not be read again", build_id)
        self.refetched += back
        return back

    def close(self) -> None:
        self.consumer.close()
        if self._refetcher is not None:
            self._refetcher.close()
