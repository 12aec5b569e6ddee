"""The records a stage sees and returns, and the decoding step every runner shares."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from schemas import single_object
from schemas.cpu_batch_reader import decode_columnar


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


# A dead letter must itself fit Kafka's default 1 MB message limit, or producing it stops the runner: a larger
# message (a topic or broker configured for more) is named by its position and size instead of kept whole.
MAX_KEPT_BYTES = 900 * 1024
MAX_REASON = 2000  # characters: reasons quote values from the message


def dead_letter(stage: str, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                reason: str) -> Produced:
    """The dead letter for a message: kept whole (up to MAX_KEPT_BYTES), with the one-line reason."""
    reason = reason.splitlines()[0][:MAX_REASON] if reason and reason.strip() else "unknown"
    if value is not None and len(value) + len(key or b"") > MAX_KEPT_BYTES:
        reason += f" [the message's {len(value)} bytes are not kept: over the {MAX_KEPT_BYTES}-byte dead letter limit]"
        value = None
    if key is not None and len(key) > MAX_KEPT_BYTES:
        key = None
    record = {"stage": stage, "source_topic": topic, "source_partition": partition, "source_offset": offset,
              "key": key, "value": value, "reason": reason, "time_ns": time.time_ns()}
    return Produced("deadletter", key, "DeadLetter", record)


def decode_message(stage: str, raw, expect: dict[str, str], max_bytes: int, columnar: bool = False,
                   columns: Mapping[str, tuple[str, ...]] | None = None) -> Message | Produced:
    """A confluent_kafka Message to a decoded Message, or the dead letter saying why it is not one. columnar: CPU
    stack batches come with each process's stacks as a PackedStacks (see `cpu_batch_reader.decode_columnar`).
    columns: record name -> its arrays of records read as columns (`single_object.read_columns`)."""
    topic, partition, offset, value, key = raw.topic(), raw.partition(), raw.offset(), raw.value(), raw.key()
    if value is None:
        return dead_letter(stage, topic, partition, offset, key, value, "empty message (no value)")
    if len(value) > max_bytes:
        return dead_letter(stage, topic, partition, offset, key, value,
                           f"oversize message: {len(value)} bytes > limit {max_bytes}")
    try:
        if columnar:
            name, record = decode_columnar(value, expect=expect.get(topic))
        else:
            name, record = single_object.decode(value, expect=expect.get(topic), columns=columns)
    except single_object.DecodeError as exc:
        return dead_letter(stage, topic, partition, offset, key, value, str(exc))
    return Message(topic, partition, offset, key, name, record, value)
