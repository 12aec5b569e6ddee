"""The symbolize stage: cpu.stacks → cpu.samples, symbolize_batch (processors/symbolize.py) given its side inputs."""

from __future__ import annotations

from processors import metrics
from processors.debuginfod import DebuginfodSource
from processors.known_ids import SentDefinitions
from processors.messages import Message, Produced
from processors.runner import TopicStage
from processors.symbol_feed import SymbolFeed
from processors.symbol_tables import SymbolTables
from processors.symbolize import FrameMemo, SymbolizeStats, split_samples
from processors.symbolize_cache import StackCache, Symbolized, symbolize_cached
from schemas import cpu_samples_writer, topics
from schemas.wire import STAGE_OUTPUT_MAX_BYTES

assert cpu_samples_writer  # imported for its fast CpuSamples writer, which the runner's encode then uses

# Symbolized output is larger than its input (frame names); keep each message well under Kafka's default 1 MB.


class SymbolizeStage(TopicStage):
    """cpu.stacks → cpu.samples, with symbol tables from the symbols topic, and from debuginfod (when given) for
    build ids whose table is missing or leaves frames unknown (a stripped binary's .dynsym, or no symbols)."""

    name = "symbolize"
    inputs = (topics.CPU_STACKS.name,)
    columnar_input = True  # symbolize_batch works on address columns: skip building a dict per stack

    def __init__(self, tables: SymbolTables, feed: SymbolFeed | None = None, resend_s: float = 3600.0,
                 debuginfod: DebuginfodSource | None = None) -> None:
        self.tables = tables
        self.feed = feed
        self.debuginfod = debuginfod
        self.memo = FrameMemo()
        self.cache = StackCache()  # stacks repeat window after window: each row is symbolized once
        # Stack and frame definitions already committed to cpu.samples are not sent again (they dominate the
        # output); each is re-sent after resend_s, which keeps its last_seen fresh in the store.
        self.sent = SentDefinitions(resend_s)

    def before_batch(self, messages: list[Message]) -> None:
        """Read newly published symbol tables when the batch names a build id not yet known; then ask debuginfod
        for the user-space ones still missing."""
        if self.feed is None and self.debuginfod is None:
            return
        kernel, user = set(), set()
        for m in messages:
            if m.record.get("kernel_build_id"):
                kernel.add(m.record["kernel_build_id"])
            for proc in m.record["processes"]:
                user.update(mp["build_id"] for mp in proc["mappings"] if mp["build_id"])
        if self.feed is not None and any(b not in self.tables for b in kernel | user):
            # new tables from the topic, and those the bounded cache evicted read again
            read = self.feed.chunks_read + self.feed.refetched
            self.feed.ensure({b for b in kernel | user if b not in self.tables})
            if self.feed.chunks_read + self.feed.refetched > read:
                self._tables_read()
        if self.debuginfod is not None:
            self.debuginfod.new_batch()
            # never the kernel: a vmlinux debuginfo has link-time addresses, the kallsyms table KASLR'd ones
            self._ask_debuginfod({b for b in user - kernel if b not in self.tables})
        metrics.SYMBOL_TABLES.labels(self.name).set(len(self.tables))

    def idle(self) -> None:
        """Read tables published since the last batch, before the stacks that need them come."""
        if self.feed is not None and self.feed.read_ahead():
            self._tables_read()
            metrics.SYMBOL_TABLES.labels(self.name).set(len(self.tables))

    def _tables_read(self) -> None:
        """The feed brought tables: one may replace a table debuginfod gave, under the same build id."""
        if self.debuginfod is not None and self.debuginfod.forget_replaced(self.tables):
            self._forget()

    def _ask_debuginfod(self, build_ids: set[str]) -> bool:
        """True when debuginfod replaced a table: the memo's frame ids by symbol index are then stale."""
        if self.debuginfod is None or not build_ids or not self.debuginfod.improve(build_ids, self.tables):
            return False
        self._forget()
        return True

    def _forget(self) -> None:
        self.memo = FrameMemo()
        self.cache.clear()

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        if self.debuginfod is not None:
            self.debuginfod.close()

    def _symbolize(self, record: dict) -> tuple[Symbolized, SymbolizeStats]:
        stats = SymbolizeStats()
        return symbolize_cached(record, self.tables.get, self.tables.generation, self.memo, self.cache, stats), stats

    def process(self, messages: list[Message]) -> list[Produced]:
        out = []
        for m in messages:
            res, stats = self._symbolize(m.record)
            # Only symbolizing tells which tables leave frames unknown (a stripped binary's .dynsym, or none), so
            # that look-up happens here, between two pure calls; the source bounds it (once per build id, a time
            # budget per batch) and never raises.
            if stats.unknown_build_ids and self._ask_debuginfod(stats.unknown_build_ids):
                res, stats = self._symbolize(m.record)
            metrics.UNKNOWN_FRAMES.labels(self.name).inc(stats.unknown_frames)
            # what goes out carries only definitions not sent before: that is what must fit, and what is sized
            kept, frames = self.sent.unsent_ids(list(res.stacks), res.stacks.__getitem__)
            if len(res.samples) <= 1 or res.estimated_bytes(kept, frames) <= STAGE_OUTPUT_MAX_BYTES:
                self.sent.pend(kept, frames)
                parts = [res.record(kept, frames)]  # split_samples would keep it whole
            else:
                parts = [self.sent.new_only(part) for part in split_samples(res.record(), STAGE_OUTPUT_MAX_BYTES)]
            out.extend(Produced(topics.CPU_SAMPLES.name, m.record["node"], topics.CPU_SAMPLES.schema, part, m)
                       for part in parts)
        return out

    def after_commit(self) -> None:
        self.sent.commit()

    def after_abort(self) -> None:
        # the aborted output never happened: its definitions must go out again with the retried batch
        self.sent.abort()


def build_symbolize(kafka: dict) -> SymbolizeStage:
    debuginfod = DebuginfodSource.from_env()  # first: a bad DEBUGINFOD_* setting stops the start with its name
    tables = SymbolTables()
    feed = SymbolFeed(kafka, tables)
    feed.catch_up(force=True)
    return SymbolizeStage(tables, feed, debuginfod=debuginfod)
