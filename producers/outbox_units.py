"""What the outbox holds: units of messages of one kind, kept or dropped together."""

from __future__ import annotations

from dataclasses import dataclass, field

Message = tuple[str, str, bytes, int]  # topic, key, value, records it carries
KINDS = ("symbols", "cpu", "gpu_launches", "gpu_kernels", "gpu_metrics", "dead_letters")


@dataclass
class Unit:
    """Messages of one kind that are kept or dropped together."""

    kind: str
    messages: list[Message]
    tables: frozenset[str] = frozenset()  # symbols: the build ids whose tables these are
    needs: frozenset[str] = frozenset()  # records: the build ids of the tables they need
    size: int = field(init=False)
    records: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = sum(len(m[2]) for m in self.messages)
        self.records = sum(m[3] for m in self.messages)
