"""Migration 0026: codecs chosen by measurement. Each column it names takes its codec; the rows written before it
(parts in the old codecs) and after it read back the same, also once merges rewrote old and new parts together; the
file run again changes nothing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import migration_files, split_statements
from tests.migration_names import migrations_from
from tests.test_cluster_sql import code
from tests.test_nvml_hourly_partitions import put
from tests.test_process_ids import CPU, GPU, _rows
from tests.test_table_rebuilds import TIMELINE_COLUMNS, drop, migrated_to, timeline_rows

CODECS = next(p for v, _, p in migration_files() if v == 26)
_TABLE = re.compile(r"^ALTER TABLE (\w+)")
_CLAUSE = re.compile(r"MODIFY COLUMN (\w+) (CODEC\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))")
# what each table holds of a node, read so that a value changed, lost or read twice changes the answer
READS = {
    "cpu_samples": "SELECT ts, pid, comm, container_id, identity, stack_id, sum(count) FROM cpu_samples "
                   "WHERE node = {node:String} GROUP BY ALL ORDER BY ALL",
    "gpu_kernel_samples": "SELECT ts, pid, comm, stack_id, kernel_name, sum(duration_ns), sum(launches) "
                          "FROM gpu_kernel_samples WHERE node = {node:String} GROUP BY ALL ORDER BY ALL",
    "gpu_timeline": "SELECT pid, start_ns - min(start_ns) OVER (), duration_ns, name, weight, correlation_id "
                    "FROM gpu_timeline WHERE node = {node:String} ORDER BY start_ns",
    "gpu_device_metrics": "SELECT ts, gpu_util_pct, mem_used_bytes, power_mw FROM gpu_device_metrics "
                          "WHERE node = {node:String} ORDER BY ts",
    "gpu_process_metrics": "SELECT ts, pid, sm_util_pct, used_memory_bytes FROM gpu_process_metrics "
                           "WHERE node = {node:String} ORDER BY ts",
    "gpu_device_metrics_10s": "SELECT bucket, sum(readings), min(mem_used_min), max(mem_used_max), max(latest) "
                              "FROM gpu_device_metrics_10s WHERE node = {node:String} GROUP BY bucket ORDER BY bucket",
    "gpu_process_metrics_10s": "SELECT bucket, pid, sum(readings), min(used_memory_min), max(used_memory_max), "
                               "max(latest) FROM gpu_process_metrics_10s WHERE node = {node:String} "
                               "GROUP BY bucket, pid ORDER BY bucket, pid",
}


def named_codecs() -> dict[tuple[str, str], str]:
    """(table, column) -> the codec 0026 gives it, as system.columns spells it."""
    named = {}
    for statement in split_statements(CODECS.read_text()):
        table = _TABLE.match(code(statement)).group(1)
        for column, codec in _CLAUSE.findall(statement):
            named[(table, column)] = codec
    return named


def stored_codecs(store) -> dict[tuple[str, str], str]:
    _, rows = store.query_sql("SELECT table, name, compression_codec FROM system.columns "
                              "WHERE database = currentDatabase()")
    return {(t, c): codec for t, c, codec in rows}


def write(store, node: str, start: datetime) -> None:
    """A node's samples, kernel samples, timeline records and 35 s of NVML readings, as the sink writes them."""
    cpu, gpu = _rows()
    store.insert("cpu_samples", [[r[0], node, *r[2:]] for r in cpu], CPU)
    store.insert("gpu_kernel_samples", [[r[0], node, *r[2:]] for r in gpu], GPU)
    # the timeline keeps durations since 0020: each record's end given as its length
    records = [[r[0], node, *r[2:7], r[7] - r[6], *r[8:]] for r in timeline_rows() if r[1] == "n1"]
    store.insert("gpu_timeline", records, [c if c != "end_ns" else "duration_ns" for c in TIMELINE_COLUMNS])
    put(store, node, start, 20)
    put(store, node, start + timedelta(seconds=20), 15)


def held(store, node: str) -> dict[str, list]:
    return {table: store.query_sql(sql, {"node": node})[1] for table, sql in READS.items()}


@pytest.fixture
def before_0026(chdb_dir):
    store = migrated_to(chdb_dir, 25)
    try:
        yield store
    finally:
        drop(store)


def test_the_named_columns_take_their_codecs_and_every_row_reads_the_same(before_0026):
    store = before_0026
    named = named_codecs()
    assert {t for t, _ in named} == set(READS) and len(named) == CODECS.read_text().count("MODIFY COLUMN ")
    start = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=30)
    start = start.replace(second=start.second - start.second % 10) + timedelta(seconds=3)
    write(store, "n1", start)
    before = held(store, "n1")
    assert all(before.values()), before
    was = stored_codecs(store)
    assert all(was[key] != codec for key, codec in named.items())

    assert store.migrate() == migrations_from(26)
    now = stored_codecs(store)
    assert {key: now[key] for key in named} == named
    # a column the file does not name keeps its codec
    assert {key: c for key, c in now.items() if key not in named} == {key: c for key, c in was.items()
                                                                       if key not in named}
    assert held(store, "n1") == before

    # parts in the new codecs beside the old ones, then merged into one: the same values either way
    write(store, "n2", start)
    assert held(store, "n2") == before
    for table in READS:
        store.client.command("OPTIMIZE TABLE {t:Identifier} FINAL", parameters={"t": table})
    assert held(store, "n1") == before and held(store, "n2") == before

    for statement in split_statements(CODECS.read_text()):  # run again: nothing changes
        store.client.command(statement)
    assert stored_codecs(store) == now
    assert held(store, "n1") == before
