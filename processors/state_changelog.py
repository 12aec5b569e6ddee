"""Reading a stateful stage's changelog topic back to its end (correlate.state, alerts.state).

A stage writes its state changes to a compacted topic in the same Kafka transaction as its output and input
offsets; reading that topic to its end after a restart, rebalance or abort gives exactly the committed state.
Reading to the end: take the topic's high watermark (read_uncommitted: every record written so far, committed or
not) and read with read_committed until the position passes it. A transaction that committed before the read began
has its records below that mark and is read; one still open is waited for; an aborted one is skipped.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from processors.runner import client_config
from schemas import single_object, topics


class StateChangelog:
    """Reads a stage's compacted state topic back (the I/O half of a restore): follows the topic with one consumer
    per stage, so a read after the first one fetches only what was written since. Keys start with `group/partition/`
    and records carry `group` and `partition` fields."""

    def __init__(self, kafka: dict, group: str, topic: str = topics.CORRELATE_STATE.name,
                 timeout: float = 60.0) -> None:
        self.kafka = kafka
        self.group = group
        self.topic = topic
        self.schema = topics.BY_NAME[topic].schema
        self.timeout = timeout
        self._prefix = f"{group}/".encode()
        self._latest: dict[bytes, bytes] = {}  # key -> value of the latest record of this group's keys
        self._ends: Consumer | None = None
        self._reader: Consumer | None = None
        self._parts: list[int] = []

    def _open(self) -> None:
        base = client_config(self.kafka, **{"group.id": f"fleetprof-state-reader-{uuid.uuid4().hex[:8]}",
                                            "enable.auto.commit": False, "enable.partition.eof": False})
        self._ends = Consumer({**base, "isolation.level": "read_uncommitted"})
        self._reader = Consumer({**base, "isolation.level": "read_committed",
                                 "max.partition.fetch.bytes": 16 * 1024 * 1024})
        meta = self._ends.list_topics(self.topic, timeout=self.timeout).topics[self.topic]
        self._parts = sorted(meta.partitions)
        self._reader.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self._parts])

    def read(self, partitions: set[int]) -> dict[int, list[dict]]:
        """The latest committed record of every key of the group's `partitions`, per partition."""
        if self._reader is None:
            self._open()
        # read_uncommitted: the end of every record written so far, committed or not (see the module's docstring)
        marks = {p: self._ends.get_watermark_offsets(TopicPartition(self.topic, p), timeout=self.timeout)[1]
                 for p in self._parts}
        deadline = time.monotonic() + self.timeout
        todo = self._behind(marks)
        while todo:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.topic} not read to its end within {self.timeout:.0f} s (partitions "
                                   f"{sorted(todo)}); an open transaction should have timed out by then")
            for raw in self._reader.consume(num_messages=1000, timeout=0.2):
                key = raw.key()
                if raw.error() is None and key is not None and key.startswith(self._prefix):
                    self._latest[key] = raw.value()
            todo = self._behind(marks)
        out: dict[int, list[dict]] = {p: [] for p in partitions}
        for key, value in self._latest.items():
            head = key[len(self._prefix):].split(b"/", 1)[0]
            if not head.isdigit() or int(head) not in out or value is None:
                continue
            try:
                _, rec = single_object.decode(value, expect=self.schema)
            except single_object.DecodeError as exc:
                raise RuntimeError(f"undecodable state under key {key!r}: {exc}") from None
            if rec["group"] == self.group:
                out[rec["partition"]].append(rec)
        return out

    def _behind(self, marks: dict[int, int]) -> set[int]:
        """Partitions whose position has not passed their mark (librdkafka's moves past commit markers)."""
        positions = self._reader.position([TopicPartition(self.topic, p) for p in marks])
        return {tp.partition for tp in positions if max(tp.offset, 0) < marks[tp.partition]}

    def close(self) -> None:
        for consumer in (self._ends, self._reader):
            if consumer is not None:
                consumer.close()
        self._ends = self._reader = None
