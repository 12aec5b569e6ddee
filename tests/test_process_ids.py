"""Process ids (migration 0025): the sample tables and their rollups store proc_id, process_names the strings, and
comm, container_id and identity read back through the dictionary as before. The sink's Python id and the migration's
SQL id agree; a store holding rows before 0025 holds the same rows, names and sums after it; rows written after it,
by the sink or with their strings, read back their own names at once."""

from __future__ import annotations

from datetime import timedelta

from fleetprof.store import migration_files, split_statements
from processors.process_ids import PROCESS_ID_SQL, process_id
from tests.test_rollup import first_hour
from tests.test_table_rebuilds import drop, migrated_to

PROCESS_IDS = next(p for v, _, p in migration_files() if v == 25)
CPU = ["ts", "node", "pid", "comm", "container_id", "stack_id", "count", "identity"]
GPU = ["ts", "node", "pid", "comm", "container_id", "device", "stream", "stack_id", "kernel_name", "duration_ns",
       "launches", "nvtx_range", "identity"]
# names as the agent sends them: empty ones, a container id, a workload identity, non-ASCII, a NUL-free pair that a
# plain concatenation without separators would confuse ("ab" + "c" against "a" + "bc")
PROCESSES = [("python3", "", ""), ("train", "a" * 64, "00000000000000ff"), ("", "", ""), ("Ünïcode", "c1", ""),
             ("ab", "c", ""), ("a", "bc", "")]
NAMED = ("SELECT comm, container_id, identity, sum(count) FROM {table:Identifier} "
         "GROUP BY comm, container_id, identity ORDER BY comm, container_id, identity")
GPU_NAMED = ("SELECT comm, container_id, identity, kernel_name, sum(duration_ns), sum(launches) "
             "FROM {table:Identifier} "
             "GROUP BY comm, container_id, identity, kernel_name ORDER BY comm, container_id, identity, kernel_name")


def _rows():
    h = first_hour()
    cpu, gpu = [], []
    for i, (comm, container, identity) in enumerate(PROCESSES):
        for window in range(4):
            ts = h + timedelta(seconds=10 * window + 3600 * (window % 2))
            cpu.append([ts, "n1", 100 + i, comm, container, 7 + window % 2, 1 + i * 3 + window, identity])
            gpu.append([ts, "n1", 100 + i, comm, container, 0, 7, 9, f"k{window % 2}", 1000 * (i + 1) + window,
                        1 + window, "", identity])
    return cpu, gpu


def _named(store) -> dict[str, list[tuple]]:
    return {t: store.query_sql(GPU_NAMED if "gpu" in t else NAMED, {"table": t})[1]
            for t in ("cpu_samples", "cpu_samples_1h", "gpu_kernel_samples", "gpu_kernel_samples_1h")}


def test_the_sinks_id_is_the_migrations_id(store):
    query = ("SELECT " + PROCESS_ID_SQL + " FROM (SELECT {c:String} AS comm, {k:String} AS container_id, "
             "{i:String} AS identity)")
    for comm, container, identity in PROCESSES:
        _, rows = store.query_sql(query, {"c": comm, "k": container, "i": identity})
        assert rows == [(process_id(comm, container, identity),)], (comm, container, identity)
    assert len({process_id(*p) for p in PROCESSES}) == len(PROCESSES)


def test_a_store_before_0025_keeps_its_rows_names_and_sums(chdb_dir):
    store = migrated_to(chdb_dir, 24)
    try:
        cpu, gpu = _rows()
        store.insert("cpu_samples", cpu, CPU)
        store.insert("gpu_kernel_samples", gpu, GPU)
        before = _named(store)
        assert all(before.values()) and len(before["cpu_samples"]) == len(PROCESSES)
        statements = split_statements(PROCESS_IDS.read_text())
        for statement in statements:
            store.client.command(statement)
        assert _named(store) == before
        _, ids = store.query_sql("SELECT DISTINCT pid, proc_id FROM cpu_samples ORDER BY pid")
        assert ids == [(100 + i, process_id(*p)) for i, p in enumerate(PROCESSES)]
        _, stored = store.query_sql("SELECT name FROM system.columns WHERE database = currentDatabase() "
                                    "AND table = 'cpu_samples' AND default_kind != 'ALIAS' ORDER BY position")
        assert [r[0] for r in stored] == ["ts", "node", "pid", "proc_id", "stack_id", "count"]
        # run again from any statement: the same rows, names and sums (the names table takes its rows again)
        for start in (0, statements.index("DROP TABLE IF EXISTS gpu_kernel_samples_0025 SYNC")):
            for statement in statements[start:]:
                store.client.command(statement)
            assert _named(store) == before
    finally:
        drop(store)


def test_rows_written_after_it_read_their_names_at_once(store):
    """The sink writes a process's names (the store loads them), then the rows: a query right after names them.
    Rows given with their strings (a tool, an older writer) are stored the same way."""
    cpu, gpu = _rows()
    store.insert("cpu_samples", cpu[:12], CPU)  # with strings: names written and loaded by the store
    first = _named(store)["cpu_samples"]
    assert {r[0] for r in first} == {p[0] for p in PROCESSES[:3]}
    h = first_hour()
    fresh = process_id("new-process", "", "")
    store.insert("process_names", [[fresh, "new-process", "", "", h]], ["proc_id", "comm", "container_id",
                                                                        "identity", "last_seen"])
    store.insert("cpu_samples", [[h, "n2", 5, fresh, 7, 11]], ["ts", "node", "pid", "proc_id", "stack_id", "count"])
    _, rows = store.query_sql("SELECT comm, sum(count) FROM cpu_samples WHERE node = 'n2' GROUP BY comm")
    assert rows == [("new-process", 11)]
    _, rows = store.query_sql("SELECT comm, sum(count) FROM cpu_samples_1h WHERE comm = 'new-process' GROUP BY comm")
    assert rows == [("new-process", 11)]
