"""The symbol feed against a real broker: a table the bounded cache evicted is read again when a batch needs it."""

from __future__ import annotations

import uuid

from processors.symbol_feed import SymbolFeed
from processors.symbol_tables import SymbolTables
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
        # chunks are keyed per chunk, so they spread over partitions: which table is read last is not fixed
        assert len(tables) == 1
        gone = next(b for b in ids if b not in tables)
        assert feed.ensure({gone}) == 1
        table = tables.get(gone)
        assert table is not None and table.names == ["main", "run", "compute", "hash_block", "write_out"]
        assert len(tables) == 1  # the other was evicted in turn: the bound holds
        assert feed.ensure({gone}) == 0  # present: nothing read
        assert feed.ensure({build_id_for(f"never-published-{run}")}) == 0
        assert feed.refetched == 1
    finally:
        feed.close()
