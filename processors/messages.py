"""The records a stage sees and returns, and the decoding step every runner shares."""

from __future__ import annotations

import time
from dataclasses import dataclass

from schemas import codec


@dataclass
class Message:
    """One decoded input message with its position."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    name: str  # record name, e.g. fleetprof.CpuStackBatch
    record: dict
    value: bytes = b""  # the bytes as received, for a dead letter that keeps the message whole


@dataclass
class Produced:
    """One record a stage wants written to a topic."""

    topic: str
    key: bytes | str | None
    schema: str
    record: dict
    source: Message | None = None  # the input it came from, so an unsendable output can be dead-lettered


def dead_letter(stage: str, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                reason: str) -> Produced:
    """The dead letter for a message: kept whole, with the one-line reason."""
    record = {"stage": stage, "source_topic": topic, "source_partition": partition, "source_offset": offset,
              "key": key, "value": value, "reason": reason.splitlines()[0] if reason else "unknown",
              "time_ns": time.time_ns()}
    return Produced("deadletter", key, "DeadLetter", record)


def decode_message(stage: str, raw, expect: dict[str, str], max_bytes: int,
                   columnar: bool = False) -> Message | Produced:
    """A confluent_kafka Message to a decoded Message, or the dead letter saying why it is not one. columnar: CPU
    stack batches come with each process's stacks as a PackedStacks (see `codec.decode`)."""
    topic, partition, offset, value, key = raw.topic(), raw.partition(), raw.offset(), raw.value(), raw.key()
    if value is None:
        return dead_letter(stage, topic, partition, offset, key, value, "empty message (no value)")
    if len(value) > max_bytes:
        return dead_letter(stage, topic, partition, offset, key, value,
                           f"oversize message: {len(value)} bytes > limit {max_bytes}")
    try:
        name, record = codec.decode(value, expect=expect.get(topic), columnar=columnar)
    except codec.DecodeError as exc:
        return dead_letter(stage, topic, partition, offset, key, value, str(exc))
    return Message(topic, partition, offset, key, name, record, value)
