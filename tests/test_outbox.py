"""The agent's outbox on its own: the bound, what it drops first, tables that must precede the records needing
them, and messages Kafka refuses for good (counted, never fatal). Through the real producer and the session's broker
where anything is sent; a KafkaLink that never started stands for Kafka being away (nothing is handed over)."""

from __future__ import annotations

import uuid

from producers.kafka_link import READY, KafkaLink
from producers.outbox import Outbox
from producers.outbox_encoder import OutboxEncoder
from producers.outbox_units import Unit
from producers.publisher import Publisher
from schemas.topics import Topic
from tests.pipeline_helpers import read_topic

AWAY = {"bootstrap.servers": "127.0.0.1:1"}


def _unit(kind: str, size: int, records: int = 1, tables: set[str] = frozenset(), needs: set[str] = frozenset(),
          topic: str = "t", tag: int = 0) -> Unit:
    return Unit(kind, [(topic, "k", bytes([tag]) * size, records)], frozenset(tables), frozenset(needs))


def _away_outbox(max_bytes: int, encoder: OutboxEncoder | None = None) -> Outbox:
    return Outbox(Publisher(AWAY), KafkaLink(AWAY, ["t"]), encoder or OutboxEncoder(), max_bytes)


def test_the_oldest_record_units_go_first_and_are_counted_per_kind() -> None:
    box = _away_outbox(1000)
    box.add([_unit("symbols", 100, tables={"b1"}), _unit("cpu", 300, records=7, needs={"b1"})])
    box.add([_unit("gpu_launches", 300, records=3, needs={"b1"}), _unit("gpu_metrics", 200)])
    assert box.pending_bytes == 900 and not any(t.units for t in box.dropped.values())
    box.add([_unit("gpu_kernels", 250, records=5)])  # 1,150 bytes: the oldest records (the CPU window) go
    assert (box.dropped["cpu"].units, box.dropped["cpu"].records, box.dropped["cpu"].bytes) == (1, 7, 300)
    assert [u.kind for u in box.held] == ["symbols", "gpu_launches", "gpu_metrics", "gpu_kernels"]
    box.add([_unit("cpu", 700, records=9)])  # the launches, the poll and the kernels make room; the newest stays
    assert [u.kind for u in box.held] == ["symbols", "cpu"] and box.pending_bytes == 800
    assert {k: t.records for k, t in box.dropped.items()} == {"symbols": 0, "cpu": 7, "gpu_launches": 3,
                                                            "gpu_kernels": 5, "gpu_metrics": 1,
                                                            "dead_letters": 0}


def test_tables_are_dropped_last_and_with_every_unit_that_needs_them() -> None:
    encoder = OutboxEncoder()
    encoder.sent_build_ids |= {"b1", "b2"}
    box = _away_outbox(1000, encoder)
    box.add([_unit("symbols", 500, tables={"b1"}), _unit("cpu", 100, needs={"b1"})])
    box.add([_unit("symbols", 300, tables={"b2"}), _unit("gpu_launches", 50, needs={"b2"})])
    box.add([_unit("gpu_kernels", 400)])  # over: the records go first, then b1's table and what needs it
    assert [(u.kind, u.tables) for u in box.held] == [("symbols", {"b2"}), ("gpu_kernels", frozenset())]
    assert box.dropped["symbols"].units == 1 and box.dropped["cpu"].units == box.dropped["gpu_launches"].units == 1
    assert encoder.sent_build_ids == {"b2"}  # b1's table goes again with the next batch that needs it


def test_a_message_kafka_refuses_is_counted_and_the_rest_delivered(kafka_bootstrap: str) -> None:
    run = uuid.uuid4().hex[:8]
    topic = Topic(f"refused-{run}", "CpuStackBatch", 1, -1)
    from fleetprof.broker import create_topics

    create_topics(kafka_bootstrap, [topic])
    config = {"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 20_000}
    link = KafkaLink(config, [topic.name])
    link.state = READY
    box = Outbox(Publisher(config), link, OutboxEncoder(), 1 << 20)
    box.add([_unit("cpu", 100, records=2, topic=topic.name, tag=1), _unit("cpu", 50_000, topic=topic.name, tag=2),
             _unit("gpu_kernels", 100, topic=topic.name, tag=3)])
    assert box.drain(30)
    assert box.unsendable["cpu"] == 1 and box.sent["cpu"].records == 3 and box.sent["gpu_kernels"].records == 1
    got = read_topic(kafka_bootstrap, topic.name, lambda m: True, want=2, timeout=30)
    assert sorted(m.value()[0] for m in got) == [1, 3]
