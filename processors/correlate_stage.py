"""The correlate stage: gpu.launches + gpu.kernels → gpu.samples, exactly once with its join state.

The runner (processors/runner.py) commits each batch's input offsets in the Kafka transaction that carries its
output. Pending records live in memory, so on their own a crash would lose them. Here every call also returns the
changelog records of the state it changed (processors/correlate_changelog.py: a log record of the changes, or a
snapshot), written to the compacted correlate.state topic in that same transaction. Why that is exactly once:

1. Atomicity: a batch's GPU samples, its state changes and its input offsets commit or abort together. So the
   committed changelog, read to its end, describes the state after exactly the committed input offsets.
2. Reading to the end: `StateChangelog.read` takes the topic's high watermark (read_uncommitted: every record
   written so far, committed or not) and reads with read_committed until its position passes it. A transaction that
   committed before the read began has its records below that mark and is therefore read (librdkafka's position
   moves past commit markers), one still open is waited for, an aborted one is skipped.
3. When the state is read: before the first batch of a partition; when a batch's first offset of a partition is not
   the one after what the state has seen (the partition was processed elsewhere meanwhile: a rebalance. The agents'
   idempotent producers leave no gaps in input offsets, so any other gap, e.g. a message the runner dead-lettered,
   only costs a needless read); and after any abort (the runner re-reads from the committed offsets, so the state
   goes back to the committed one too). A record below the restored offsets is already in the state: skipped.
4. Outputs of an aborted transaction are invisible to read_committed consumers (the sink); a restarted instance
   fences its predecessor's open transaction (same transactional id), and an instance that lost its partitions in a
   rebalance cannot commit (KIP-447: the offsets carry its consumer group generation), so nothing goes out twice.
Prometheus counters move only after a commit, for the same reason.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from itertools import groupby
from operator import attrgetter

from processors import metrics
from processors.correlate import KERNEL, LAUNCH, SECOND_NS, SIDES, CorrelateConfig, Correlator, Outcome
from processors.correlate_changelog import changelog, restore, state_key
from processors.correlate_decode import BatchDecoder
from processors.correlate_samples import LaunchStacks, build_gpu_samples, split_gpu_samples
from processors.known_ids import SentDefinitions
from processors.messages import Message, Produced, dead_letter
from processors.runner import TopicStage
from processors.state_changelog import StateChangelog
from processors.symbol_feed import SymbolFeed
from processors.symbol_tables import SymbolTables
from processors.symbolize import SymbolizeStats
from schemas import topics
from schemas.wire import STAGE_OUTPUT_MAX_BYTES

log = logging.getLogger("fleetprof.correlate")
SIDE_OF = {topics.GPU_LAUNCHES.name: LAUNCH, topics.GPU_KERNELS.name: KERNEL}
_PARTITION_TOPIC = attrgetter("partition", "topic")
MAX_COMPLETE = 200_000  # mapping ids known to have every table, kept (a bound: ids are never reused)
DEFAULT_GROUP = "fleetprof-correlate"  # the runner's default group for a stage named "correlate"


class CorrelateStage(TopicStage):
    """gpu.launches + gpu.kernels → gpu.samples (and the join state → correlate.state), symbol tables from the
    symbols topic."""

    name = "correlate"
    inputs = (topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name)

    def __init__(self, tables: SymbolTables, changelog: StateChangelog | None, feed: SymbolFeed | None = None,
                 config: CorrelateConfig | None = None, group: str = DEFAULT_GROUP, resend_s: float = 3600.0) -> None:
        self.tables = tables
        self.changelog = changelog
        self.feed = feed
        self.group = group  # the consumer group the runner uses: its state is kept under this name
        self.correlator = Correlator(config)
        self.stacks = LaunchStacks()
        self.verified: set[tuple[int, int]] = set()  # (partition, side) whose offsets the state has been checked on
        self.sent = SentDefinitions(resend_s)
        self.counts: Counter[tuple] = Counter()  # metric increments of the open transaction
        self.decoder = BatchDecoder()
        # (tables' generation, mapping ids whose every table was in the cache at it): skipped by _ensure_tables
        self.complete: tuple[int, set[int]] = (-1, set())

    def decode_batch(self, raws: list, expect: dict[str, str], max_bytes: int) -> list[Message | Produced]:
        """The batch's launches and kernels decoded together (processors/correlate_decode.py: the same records or
        dead letters as one by one, several times cheaper)."""
        return self.decoder.decode(self.name, raws, expect, max_bytes)

    # --- hooks (I/O) ------------------------------------------------------------------------------------------
    def before_batch(self, messages: list[Message]) -> None:
        """Bring the join state of the batch's partitions up to date, then the symbol tables its stacks need; read
        the clock that bounds the batch's event time."""
        self.correlator.set_clock(time.time_ns())
        first: dict[tuple[int, int], int] = {}
        for (p, topic), run in groupby(messages, key=_PARTITION_TOPIC):  # a batch comes in runs per partition
            first.setdefault((p, SIDE_OF[topic]), next(run).offset)
        stale: dict[int, str] = {}
        for (p, side), offset in first.items():
            st = self.correlator.parts.get(p)
            if st is None:
                stale[p] = "assigned"
            elif st.offsets[side] < 0 and (p, side) not in self.verified:
                stale.setdefault(p, "assigned")
            elif st.offsets[side] >= 0 and offset != st.offsets[side]:
                stale.setdefault(p, "offset_gap")
        if stale:
            self._restore(stale)
        if self.feed is not None:
            self._ensure_tables(messages)

    def idle(self) -> None:
        """Read tables published since the last batch, before the launches that need them come."""
        if self.feed is not None and self.feed.read_ahead():
            metrics.SYMBOL_TABLES.labels(self.name).set(len(self.tables))

    def _ensure_tables(self, messages: list[Message]) -> None:
        """Read the symbol tables that the batch's processes' mappings name and the cache lacks (new ones, or
        evicted ones): those its matches will be symbolized with."""
        if self.tables.generation != self.complete[0] or len(self.complete[1]) > MAX_COMPLETE:
            self.complete = (self.tables.generation, set())  # a table was replaced or evicted: check every process
        complete = self.complete[1]
        wanted: set[str] = set()
        for maps in [m.record["mappings"] for m in messages if m.record.get("mappings")]:
            wanted.update(mp["build_id"] for mp in maps)
        mids: dict[int, list[dict]] = {}
        for p, node, pid, start in {(m.partition, m.record["node"], m.record["pid"], m.record["process_start_ns"])
                                    for m in messages}:
            st = self.correlator.parts.get(p)
            proc = st.procs.get((node, pid, start)) if st is not None else None
            if proc is not None and proc[3] not in complete:
                mids[proc[3]] = proc[2]
        for maps in mids.values():
            wanted.update(mp["build_id"] for mp in maps)
        missing = {b for b in wanted if b and b not in self.tables}
        if missing:
            self.feed.ensure(missing)
            missing = {b for b in missing if b not in self.tables}  # what the topic did not have either
        complete.update(mid for mid, maps in mids.items() if not any(mp["build_id"] in missing for mp in maps))
        metrics.SYMBOL_TABLES.labels(self.name).set(len(self.tables))

    def _restore(self, partitions: dict[int, str]) -> None:
        if self.changelog is None:  # no changelog (pure tests): a partition starts empty, an abort forgets
            for p in partitions:
                self.correlator.state(p)
                self.verified.update({(p, LAUNCH), (p, KERNEL)})
            return
        started = time.monotonic()
        found = self.changelog.read(set(partitions))
        for p, why in partitions.items():
            st = restore(self.correlator, p, found[p])
            self.verified.update({(p, LAUNCH), (p, KERNEL)})
            metrics.CORRELATE_RESTORES.labels(self.name, why).inc()
            log.info("join state of partition %d read back (%s): %d launches, %d kernels pending, offsets %s",
                     p, why, len(st.launches), len(st.kernels), st.offsets)
        log.info("read the join state of %d partitions in %.2f s", len(partitions), time.monotonic() - started)

    def after_commit(self) -> None:
        self.sent.commit()
        for (kind, *labels), n in self.counts.items():
            kind.labels(self.name, *labels).inc(n)
        self.counts.clear()
        for side in (LAUNCH, KERNEL):
            metrics.CORRELATE_PENDING.labels(self.name, SIDES[side]).set(
                sum(st.pending()[side] for st in self.correlator.parts.values()))

    def after_abort(self) -> None:
        """The aborted batch never happened: its definitions go out again, its counts never counted, and the
        state goes back to the committed one (read from the changelog, as after a restart)."""
        self.sent.abort()
        self.counts.clear()
        held = {p: "abort" for p in self.correlator.parts}
        self.correlator.parts.clear()
        self.verified.clear()
        if held:
            self._restore(held)

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        if self.changelog is not None:
            self.changelog.close()

    # --- the batch (pure but for the bounded caches) ---------------------------------------------------------
    def process(self, messages: list[Message]) -> list[Produced]:
        out = Outcome()
        join = self.correlator.process
        for i, m in enumerate(messages):
            join(m.partition, SIDE_OF[m.topic], m.offset, m.record, out, i)
        touched = dict.fromkeys(m.partition for m in messages)
        stats = SymbolizeStats()
        # only definitions not sent yet are built (and then pending until the commit)
        records = build_gpu_samples(out.matches, out.unmatched, self.correlator.config.window_ns, self.stacks,
                                    self.tables.get, stats, self.sent.new_ids)
        produced = [dead_letter(self.name, messages[i].topic, messages[i].partition, messages[i].offset,
                                messages[i].key, messages[i].value, reason) for i, reason in out.invalid]
        for rec in records:
            for part in _each_definition_once(split_gpu_samples(rec, STAGE_OUTPUT_MAX_BYTES)):
                produced.append(Produced(topics.GPU_SAMPLES.name, rec["node"], topics.GPU_SAMPLES.schema, part))
        slots = self.correlator.config.log_slots
        for p in touched:
            for rec in changelog(self.correlator, self.group, p):
                produced.append(Produced(topics.CORRELATE_STATE.name, state_key(rec, slots),
                                         topics.CORRELATE_STATE.schema, rec))
        self.counts[(metrics.CORRELATE_MATCHED,)] += len(out.matches)
        if out.graph_launches:
            self.counts[(metrics.CORRELATE_GRAPH_LAUNCHES,)] += out.graph_launches
        for _, _, _, side, reason, _, _ in out.unmatched:
            self.counts[(metrics.CORRELATE_UNMATCHED, SIDES[side], reason)] += 1
        if out.replayed:
            self.counts[(metrics.CORRELATE_REPLAYED,)] += out.replayed
        if out.ahead_of_clock:
            self.counts[(metrics.CORRELATE_AHEAD,)] += out.ahead_of_clock
        self.counts[(metrics.UNKNOWN_FRAMES,)] += stats.unknown_frames
        return produced


def _each_definition_once(parts: list[dict]) -> list[dict]:
    """The parts of one record with each stack and frame definition in the first part that carries it only."""
    if len(parts) == 1:
        return parts
    stacks: set[int] = set()
    frames: set[int] = set()
    out = []
    for part in parts:
        kept = [s for s in part["stacks"] if s["stack_id"] not in stacks]
        fdefs = [f for f in part["frames"] if f["frame_id"] not in frames]
        stacks.update(s["stack_id"] for s in kept)
        frames.update(f["frame_id"] for f in fdefs)
        out.append({**part, "stacks": kept, "frames": fdefs})
    return out


def config_from_env(env: dict[str, str] | None = None) -> CorrelateConfig:
    """FLEETPROF_CORRELATE_HORIZON_S, _WINDOW_S, _MAX_PENDING, _MAX_PROCESSES, _MAX_AHEAD_S; a bad value names its
    variable."""
    env = os.environ if env is None else env
    values: dict[str, int] = {}
    for var, field, scale in (("FLEETPROF_CORRELATE_HORIZON_S", "horizon_ns", SECOND_NS),
                              ("FLEETPROF_CORRELATE_WINDOW_S", "window_ns", SECOND_NS),
                              ("FLEETPROF_CORRELATE_MAX_PENDING", "max_pending", 1),
                              ("FLEETPROF_CORRELATE_MAX_PROCESSES", "max_processes", 1),
                              ("FLEETPROF_CORRELATE_MAX_AHEAD_S", "max_ahead_ns", SECOND_NS)):
        text = env.get(var, "").strip()
        if not text:
            continue
        try:
            value = round(float(text) * scale)
        except ValueError:
            raise ValueError(f"{var}={text!r} is not a number") from None
        if value < 1:
            raise ValueError(f"{var}={text!r} must be positive")
        values[field] = value
    return CorrelateConfig(**values)


def build_correlate(kafka: dict, group: str = DEFAULT_GROUP, config: CorrelateConfig | None = None) -> CorrelateStage:
    config = config or config_from_env()  # first: a bad setting stops the start with its name
    tables = SymbolTables()
    feed = SymbolFeed(kafka, tables)
    feed.catch_up(force=True)
    return CorrelateStage(tables, StateChangelog(kafka, group), feed, config=config, group=group)
