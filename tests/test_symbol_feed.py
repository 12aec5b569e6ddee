"""The symbol feed against a real broker: a table the bounded cache evicted is read again when a batch needs it."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException

from processors.correlate_stage import CorrelateStage
from processors.symbol_feed import SymbolFeed
from processors.symbol_tables import SymbolTables
from processors.symbolize_stage import SymbolizeStage
from schemas import topics
from tests.pipeline_helpers import build_id_for, encode, produce, symbol_chunks


def test_an_evicted_table_is_read_again_from_the_compacted_topic(kafka_bootstrap) -> None:
    run = uuid.uuid4().hex[:8]
    ids = [build_id_for(f"feed-{run}-{i}") for i in range(3)]
    produce(kafka_bootstrap, [(topics.SYMBOLS.name, f"{c['build_id']}/{c['chunk_index']}",
                               encode("SymbolChunk", c)) for b in ids for c in symbol_chunks(b)])
    tables = SymbolTables(max_symbols=len(symbol_chunks(ids[0])[0]["names"]) * 2 + 3)  # room for one table
    feed = SymbolFeed({"bootstrap.servers": kafka_bootstrap}, tables)
    try:
        feed.catch_up(force=True)
        # chunks are keyed per chunk, so they spread over partitions: which table is read last is not fixed, and the
        # topic is the whole suite's, so the last tables read may be other tests' (a small one fits beside ours)
        assert sum(b in tables for b in ids) <= 1
        gone = next(b for b in ids if b not in tables)
        assert feed.ensure({gone}) == 1
        table = tables.get(gone)
        assert table is not None and table.names == ["main", "run", "compute", "hash_block", "write_out"]
        assert [b for b in ids if b in tables] == [gone]  # the other was evicted in turn: the bound holds
        assert feed.ensure({gone}) == 0  # present: nothing read
        assert feed.ensure({build_id_for(f"never-published-{run}")}) == 0
        assert feed.refetched == 1
    finally:
        feed.close()


def _publish(bootstrap: str, build_ids: list[str]) -> None:
    produce(bootstrap, [(topics.SYMBOLS.name, f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c))
                        for b in build_ids for c in symbol_chunks(b)])


def test_a_table_published_after_the_last_catch_up_is_read_whatever_the_rate_limit(kafka_bootstrap) -> None:
    """An agent publishes a table before the stacks that need it: the first batch to miss it reads the topic to its
    end even right after another catch-up; an id never published does not make every batch read again."""
    run = uuid.uuid4().hex[:8]
    first, late, never, later = (build_id_for(f"rate-{run}-{t}") for t in ("first", "late", "never", "later"))
    _publish(kafka_bootstrap, [first])
    feed = SymbolFeed({"bootstrap.servers": kafka_bootstrap}, SymbolTables(), min_interval=3600.0)
    try:
        feed.catch_up(force=True)
        assert first in feed.tables
        _publish(kafka_bootstrap, [late])
        feed.ensure({late})  # within the rate limit's hour
        assert late in feed.tables
        feed.ensure({never})  # read to the end once: not there
        assert never not in feed.tables
        _publish(kafka_bootstrap, [later])
        feed.ensure({never})  # missed before: rate limited, nothing read
        assert later not in feed.tables
        feed.ensure({never, later})  # a new miss beside it reads again
        assert later in feed.tables and never not in feed.tables
    finally:
        feed.close()


class _FewAtATime:
    """A consumer handing out at most 4 messages a call, as fetches of a large topic on a busy broker do."""

    def __init__(self, consumer) -> None:
        self._consumer = consumer

    def consume(self, num_messages: int = 1, timeout: float = -1):
        return self._consumer.consume(num_messages=min(num_messages, 4), timeout=timeout)

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


class _SlowFeed(SymbolFeed):
    """A feed that takes `delay` seconds over each chunk of `slow` build ids (a loaded machine, a large topic)."""

    slow: set[str] = set()
    delay = 0.05

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.consumer = _FewAtATime(self.consumer)

    def _take(self, value, partition, offset):
        chunk = super()._take(value, partition, offset)
        if chunk is not None and chunk["build_id"] in self.slow:
            time.sleep(self.delay)
        return chunk


def test_a_catch_up_longer_than_its_timeout_reads_to_the_end(kafka_bootstrap) -> None:
    """The timeout bounds a stall, not the read: 60 tables at 0.05 s a chunk take ~6 s against a 1 s timeout."""
    run = uuid.uuid4().hex[:8]
    ids = [build_id_for(f"slow-{run}-{i}") for i in range(60)]
    _publish(kafka_bootstrap, ids)
    feed = _SlowFeed({"bootstrap.servers": kafka_bootstrap}, SymbolTables())
    feed.slow = set(ids)
    try:
        started = time.monotonic()
        feed.catch_up(timeout=1.0, force=True)
        assert time.monotonic() - started > 1.0  # the case the test is about: the read outlasted the timeout
        assert [b for b in ids if b not in feed.tables] == []
    finally:
        feed.close()


class _BrokerAway:
    """A consumer whose broker does not answer: every watermark ask fails at once."""

    def __init__(self, consumer) -> None:
        self._consumer = consumer
        self.asks = 0

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.asks += 1
        raise KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "All broker connections are down"))

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


@pytest.mark.parametrize("make_stage", [lambda feed: SymbolizeStage(feed.tables, feed),
                                        lambda feed: CorrelateStage(feed.tables, None, feed)],
                         ids=["symbolize", "correlate"])
def test_an_idle_stage_reads_tables_published_ahead_of_their_stacks(kafka_bootstrap, make_stage) -> None:
    """A stage that symbolizes, with nothing to process, reads a table published since its last batch, so the batch
    that needs it does not wait for the read; within the rate limit it does not ask; a broker that does not answer
    costs the idle stage one ask and no wait, and the table comes once it answers again."""
    run = uuid.uuid4().hex[:8]
    early, late = build_id_for(f"ahead-{run}-early"), build_id_for(f"ahead-{run}-late")
    feed = SymbolFeed({"bootstrap.servers": kafka_bootstrap}, SymbolTables(), min_interval=0.0)
    stage = make_stage(feed)
    try:
        feed.catch_up(force=True)
        _publish(kafka_bootstrap, [early])
        stage.idle()
        assert early in stage.tables
        _publish(kafka_bootstrap, [late])
        feed.min_interval = 3600.0
        stage.idle()  # within the rate limit of the last read: no ask
        assert late not in stage.tables
        feed.min_interval = 0.0
        real = feed.consumer
        feed.consumer = away = _BrokerAway(real)
        started = time.monotonic()
        stage.idle()
        assert time.monotonic() - started < 1.0 and away.asks == 1
        assert late not in stage.tables
        feed.consumer = real
        stage.idle()
        assert late in stage.tables
    finally:
        feed.close()
