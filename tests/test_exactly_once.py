"""A stage that dies mid-batch loses nothing and counts nothing twice once it is restarted."""

from __future__ import annotations

import threading
import time
import uuid

from processors.runner import TopicRunner
from processors.store_writer import StoreRunner
from processors.symbolize_stage import build_symbolize
from tests.pipeline_helpers import (
    Running,
    build_id_for,
    cpu_batch,
    encode,
    produce,
    read_topic,
    sink,
    stack,
    symbol_chunks,
    symbolizer,
    wait_for,
)


class Crash(BaseException):
    """Stands for the process dying at that exact point."""


class StoreDyingBeforeAfter:
    """The real store, except that the process 'dies' right after the data went in, before AFTER is recorded."""

    def __init__(self, store, node: str) -> None:
        self.store = store
        self.node = node
        self.data_inserts = 0

    def insert(self, table, rows, column_names, dedup_token=None, column_oriented=False):
        if table == "sink_state" and rows[0][4] == "AFTER" and self.data_inserts:
            raise Crash()
        self.store.insert(table, rows, column_names, dedup_token=dedup_token, column_oriented=column_oriented)
        if table == "cpu_samples" and any(r[1] == self.node for r in (zip(*rows, strict=True) if column_oriented
                                                                      else rows)):
            self.data_inserts += 1

    def __getattr__(self, name):
        return getattr(self.store, name)


class TopicRunnerDyingInTransaction(TopicRunner):
    """Produces the batch's output inside the transaction, then dies before committing it."""

    def _commit(self, out):
        self.producer.begin_transaction()
        for p in out:
            key = p.key.encode() if isinstance(p.key, str) else p.key
            self.producer.produce(p.topic, key=key, value=encode(p.schema, p.record))
        self.producer.flush(10)
        raise Crash()


def _send(bootstrap: str, run: str, node: str, windows: int) -> tuple[int, int]:
    bid = build_id_for(run)
    t0 = (time.time_ns() // 1_000_000_000) * 1_000_000_000
    items = [("symbols", f"{c['build_id']}/{c['chunk_index']}", encode("SymbolChunk", c))
             for c in symbol_chunks(bid)]
    for w in range(windows):
        batch = cpu_batch(node, bid, t0 + w * 1_000_000_000,
                          [stack(["main", "run", "compute"], 3 + w), stack(["main", "write_out"], 1, tid=2)])
        items.append(("cpu.stacks", node, encode("CpuStackBatch", batch)))
    produce(bootstrap, items)
    return windows, sum(3 + w + 1 for w in range(windows))


def _node_total(store, node: str) -> int:
    _, rows = store.query_sql("SELECT sum(count) FROM cpu_samples WHERE node = {node:String}", {"node": node})
    return int(rows[0][0] or 0)


def test_sink_dying_after_insert_before_commit_counts_once(kafka_bootstrap, store):
    run = uuid.uuid4().hex[:8]
    node = f"eos-sink-{run}"
    _, want = _send(kafka_bootstrap, run, node, windows=4)
    stop = threading.Event()
    dying = Running(StoreRunner(StoreDyingBeforeAfter(store, node), {"bootstrap.servers": kafka_bootstrap},
                                group=f"sink-{run}", stop=stop, flush_interval=0.3), stop)
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym:
        with dying:
            wait_for(lambda: dying.error is not None, what="the sink to die", running=[sym])
        assert isinstance(dying.error, Crash)
        assert _node_total(store, node) > 0  # the rows did go in before the 'crash'
        with sink(store, kafka_bootstrap, f"sink-{run}") as snk:
            wait_for(lambda: _node_total(store, node) == want, what="exact total", running=[sym, snk])
            time.sleep(1.5)
            assert _node_total(store, node) == want


def test_symbolizer_dying_inside_its_transaction_outputs_once(kafka_bootstrap, store):
    run = uuid.uuid4().hex[:8]
    node = f"eos-sym-{run}"
    windows, want = _send(kafka_bootstrap, run, node, windows=3)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    dying = Running(TopicRunnerDyingInTransaction(build_symbolize(kafka), kafka, group=f"sym-{run}"),
                    threading.Event())
    with dying:
        wait_for(lambda: dying.error is not None, what="the symbolizer to die")
    assert isinstance(dying.error, Crash)
    with symbolizer(kafka_bootstrap, f"sym-{run}") as sym, sink(store, kafka_bootstrap, f"sink-{run}") as snk:
        wait_for(lambda: _node_total(store, node) == want, what="exact total", running=[sym, snk])
        time.sleep(1.5)
        assert _node_total(store, node) == want
    committed = read_topic(kafka_bootstrap, "cpu.samples",
                           lambda m: m.key() == node.encode(), want=windows + 1, timeout=8)
    assert len(committed) == windows  # read_committed: the aborted outputs are invisible
