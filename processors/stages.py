"""The explicit list of stages, and the wiring that gives each pure function its side inputs."""

from __future__ import annotations

import logging

from processors import metrics
from processors.known_ids import KnownIds
from processors.messages import Message, Produced
from processors.symbol_feed import SymbolFeed
from processors.symbol_tables import SymbolTables
from processors.symbolize import FrameMemo, SymbolizeStats, split_samples, symbolize_batch
from schemas import topics

log = logging.getLogger("fleetprof.stages")
# Symbolized output is larger than its input (frame names); keep each message well under Kafka's default 1 MB.
MAX_OUTPUT_BYTES = 600 * 1024


class SymbolizeStage:
    """cpu.stacks → cpu.samples, with symbol tables from the symbols topic."""

    name = "symbolize"
    inputs = (topics.CPU_STACKS.name,)
    columnar_input = True  # symbolize_batch works on address columns: skip building a dict per stack

    def __init__(self, tables: SymbolTables, feed: SymbolFeed | None = None, resend_s: float = 3600.0) -> None:
        self.tables = tables
        self.feed = feed
        self.memo = FrameMemo()
        # Stack and frame definitions already committed to cpu.samples are not sent again (they dominate the
        # output); each is re-sent after resend_s, which keeps its last_seen fresh in the store.
        self.sent_stacks = KnownIds(refresh_s=resend_s)
        self.sent_frames = KnownIds(refresh_s=resend_s)
        self.pending_stacks: set[int] = set()
        self.pending_frames: set[int] = set()

    def before_batch(self, messages: list[Message]) -> None:
        """Read newly published symbol tables when the batch names a build id not yet known."""
        if self.feed is None:
            return
        needed = set()
        for m in messages:
            if m.record.get("kernel_build_id"):
                needed.add(m.record["kernel_build_id"])
            for proc in m.record["processes"]:
                needed.update(mp["build_id"] for mp in proc["mappings"] if mp["build_id"])
        if any(b not in self.tables for b in needed):
            self.feed.catch_up()
        metrics.SYMBOL_TABLES.labels(self.name).set(len(self.tables))

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()

    def process(self, messages: list[Message]) -> list[Produced]:
        out = []
        for m in messages:
            stats = SymbolizeStats()
            rec = symbolize_batch(m.record, self.tables.get, self.memo, stats)
            metrics.UNKNOWN_FRAMES.labels(self.name).inc(stats.unknown_frames)
            for part in split_samples(rec, MAX_OUTPUT_BYTES):
                part = self._new_definitions_only(part)
                out.append(Produced(topics.CPU_SAMPLES.name, m.record["node"], topics.CPU_SAMPLES.schema, part, m))
        return out

    def _new_definitions_only(self, rec: dict) -> dict:
        stacks = self.sent_stacks.unseen([s["stack_id"] for s in rec["stacks"]]) - self.pending_stacks
        kept = [s for s in rec["stacks"] if s["stack_id"] in stacks]
        frames = self.sent_frames.unseen([f for s in kept for f in s["frame_ids"]]) - self.pending_frames
        self.pending_stacks |= stacks
        self.pending_frames |= frames
        return {**rec, "stacks": kept, "frames": [f for f in rec["frames"] if f["frame_id"] in frames]}

    def after_commit(self) -> None:
        self.sent_stacks.add(self.pending_stacks)
        self.sent_frames.add(self.pending_frames)
        self.pending_stacks, self.pending_frames = set(), set()

    def after_abort(self) -> None:
        # the aborted output never happened: its definitions must go out again with the retried batch
        self.pending_stacks, self.pending_frames = set(), set()


def build_symbolize(kafka: dict) -> SymbolizeStage:
    tables = SymbolTables()
    feed = SymbolFeed(kafka, tables)
    feed.catch_up(force=True)
    return SymbolizeStage(tables, feed)


# Topic-to-topic stages by name; the sink (topic-to-ClickHouse) is run by processors/store_writer.py.
TOPIC_STAGES = {"symbolize": build_symbolize}
