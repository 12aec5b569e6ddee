"""Reads the compacted `symbols` topic into a SymbolTables cache. I/O side of symbolization."""

from __future__ import annotations

import logging
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from processors.runner import client_config
from processors.symbol_tables import SymbolTables
from schemas import codec, topics

log = logging.getLogger("fleetprof.symbols")


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
        md = self.consumer.list_topics(topics.SYMBOLS.name, timeout=10)
        parts = md.topics[topics.SYMBOLS.name].partitions
        self.partitions = [TopicPartition(topics.SYMBOLS.name, p, OFFSET_BEGINNING) for p in sorted(parts)]
        self.consumer.assign(self.partitions)

    def catch_up(self, timeout: float = 10.0, force: bool = False) -> int:
        """Read every chunk published so far (rate limited unless forced); returns chunks read."""
        now = time.monotonic()
        if not force and now - self._last_catch_up < self.min_interval:
            return 0
        self._last_catch_up = now
        ends = {tp.partition: self.consumer.get_watermark_offsets(tp, timeout=timeout)[1]
                for tp in self.partitions}
        positions = {tp.partition: tp.offset for tp in self.consumer.position(self.partitions)}
        pending = {p for p, end in ends.items() if max(positions.get(p, 0), 0) < end}
        read = 0
        deadline = now + timeout
        while pending and time.monotonic() < deadline:
            for raw in self.consumer.consume(num_messages=500, timeout=0.2):
                if raw.error() is not None:
                    continue
                read += 1
                self._take(raw.value())
                if raw.offset() + 1 >= ends[raw.partition()]:
                    pending.discard(raw.partition())
            for tp in self.consumer.position([TopicPartition(topics.SYMBOLS.name, p) for p in list(pending)]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        self.chunks_read += read
        return read

    def _take(self, value: bytes | None) -> None:
        if value is None:  # a tombstone: compaction removed that chunk on purpose
            return
        try:
            _, chunk = codec.decode(value, expect=topics.SYMBOLS.schema)
        except codec.DecodeError as exc:
            self.bad_chunks += 1
            log.warning("skipping undecodable symbol chunk: %s", exc)
            return
        self.tables.add_chunk(chunk)

    def close(self) -> None:
        self.consumer.close()
