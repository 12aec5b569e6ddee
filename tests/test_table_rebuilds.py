"""The migrations that rebuild a table (copy, EXCHANGE TABLES, drop). 0019: cpu_samples and gpu_kernel_samples hour
first: a store holding rows before it holds the same rows and sums after it, under the new sorting key; the file run
again from any statement leaves them so; the hourly rollups are fed once by the recreated views; a time range still
prunes by the key. 0020: the timeline keeps durations, its end_ns an ALIAS giving every record's end as before. 0023:
both sample tables plain MergeTree, given the old tables' parts, with the same rows, sums and rollups."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleetprof.store import migration_files, open_store, split_statements
from tests.migration_names import migrations_from
from tests.test_cluster_sql import code
from tests.test_rollup import CPU_COLUMNS, GPU_COLUMNS, first_hour, known_rows, rollup_totals, window_totals

REBUILD = next(p for v, _, p in migration_files() if v == 19)
DURATIONS = next(p for v, _, p in migration_files() if v == 20)
PLAIN = next(p for v, _, p in migration_files() if v == 23)
TIMELINE_COLUMNS = ["ts", "node", "pid", "comm", "device", "stream", "start_ns", "end_ns", "activity", "name",
                    "stack_id", "weight", "bytes", "nvtx_range", "graph_id", "graph_node_id", "correlation_id"]
# the keys the tables have once every migration ran: 0019's hour first, 0025's process id in place of the strings
CPU_KEY = "node, toStartOfHour(ts), pid, stack_id, proc_id, ts"
GPU_KEY = "node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, proc_id, nvtx_range, ts"


def migrated_to(chdb_dir, last: int):
    """A new store with the migrations up to `last` applied."""
    store = open_store(f"chdb://{chdb_dir}", f"t_rebuild_{uuid.uuid4().hex[:8]}")
    for version, name, path in migration_files():
        if version > last:
            break
        for statement in split_statements(path.read_text()):
            store.client.command(statement)
        store.insert("schema_migrations", [[version, name, datetime.now(tz=UTC)]], ["version", "name", "applied_at"])
    return store


@pytest.fixture
def before_0019(chdb_dir):
    """A store migrated up to 0018 holding known rows in both tables (and so in their rollups)."""
    store = migrated_to(chdb_dir, 18)
    try:
        cpu, gpu = known_rows(first_hour())
        store.insert("cpu_samples", cpu, CPU_COLUMNS)
        store.insert("gpu_kernel_samples", gpu, GPU_COLUMNS)
        # the same rows twice more: parts whose rows sum under one key
        store.insert("cpu_samples", cpu[:5], CPU_COLUMNS)
        store.insert("cpu_samples", cpu[:5], CPU_COLUMNS)
        yield store
    finally:
        drop(store)


def drop(store) -> None:
    store.client.command("DROP DATABASE IF EXISTS {db:Identifier}", parameters={"db": store.database})
    store.close()


def contents(store) -> dict[str, list]:
    """Every row of both tables summed per key, and the rollups' totals per node."""
    cpu = store.query_sql("SELECT ts, node, pid, comm, container_id, stack_id, identity, sum(count) FROM cpu_samples "
                          "GROUP BY ALL ORDER BY ALL")[1]
    gpu = store.query_sql("SELECT ts, node, pid, stack_id, kernel_name, sum(duration_ns), sum(launches) "
                          "FROM gpu_kernel_samples GROUP BY ALL ORDER BY ALL")[1]
    rollups = [(node, rollup_totals(store, node)) for node in ("n1", "n2", "n3")]
    return {"cpu": cpu, "gpu": gpu, "rollups": rollups}


def table_setting(store, table: str, column: str = "sorting_key") -> str:
    """A column of system.tables for `table` (sorting_key, engine_full)."""
    _, rows = store.query_sql("SELECT {c:Identifier} FROM system.tables WHERE database = currentDatabase() "
                              "AND name = {t:String}", {"c": column, "t": table})
    return rows[0][0]


def sorting_key(store, table: str) -> str:
    return table_setting(store, table)


def died_after(store, migration: Path, start: str, last: bool = False) -> None:
    """Run `migration` up to its first (`last`: its last) statement that starts with `start`, as a migration that
    died after that statement leaves the store."""
    statements = split_statements(migration.read_text())
    stop = [i for i, statement in enumerate(statements) if code(statement).startswith(start)][-1 if last else 0]
    for statement in statements[:stop + 1]:
        store.client.command(statement)


def test_the_rebuild_keeps_every_row_under_the_hour_first_key(before_0019):
    store = before_0019
    want = contents(store)
    assert len(want["cpu"]) > 100 and sum(r[-1] for r in want["cpu"]) > 500
    assert store.migrate() == migrations_from(19)
    assert contents(store) == want
    assert sorting_key(store, "cpu_samples") == CPU_KEY
    assert sorting_key(store, "gpu_kernel_samples") == GPU_KEY
    _, left = store.query_sql("SELECT name FROM system.tables WHERE database = currentDatabase() AND name LIKE '%0019'")
    assert left == []
    # the views feed the rollups from the new tables, once
    cpu, _ = known_rows(first_hour())
    store.insert("cpu_samples", cpu[:1], CPU_COLUMNS)
    assert rollup_totals(store, cpu[0][1]) == window_totals(store, cpu[0][1])
    assert window_totals(store, cpu[0][1])[0] == dict(want["rollups"])[cpu[0][1]][0] + cpu[0][6]


@pytest.mark.parametrize("stop_after", ["INSERT INTO cpu_samples_0019", "EXCHANGE TABLES cpu_samples AND",
                                        "DROP TABLE IF EXISTS cpu_samples_0019 SYNC", "CREATE MATERIALIZED VIEW"])
def test_the_file_run_again_after_stopping_anywhere_leaves_the_same_rows(before_0019, stop_after):
    store = before_0019
    want = contents(store)
    # the copy is dropped twice (before it is made, after the exchange): stop after the second drop; the view made
    # twice (cpu_samples', then gpu_kernel_samples'): after the first
    died_after(store, REBUILD, stop_after, last=stop_after.startswith("DROP"))
    # 0019 runs whole again
    assert store.migrate() == migrations_from(19)
    assert contents(store) == want
    assert sorting_key(store, "cpu_samples") == CPU_KEY


def test_a_time_range_still_prunes_by_the_key(before_0019):
    store = before_0019
    store.migrate()
    h = first_hour()
    plan = "\n".join(r[0] for r in store.query_sql(
        "EXPLAIN indexes = 1 SELECT sum(count) FROM cpu_samples WHERE node = 'n1' AND ts >= {a:DateTime} "
        "AND ts < {b:DateTime}", {"a": h, "b": h + timedelta(minutes=10)})[1])
    # the index reads the range through toStartOfHour(ts), the key's second column (EXPLAIN names it by its column)
    primary = plan[plan.index("PrimaryKey"):].split("Parts")[0]
    keys, condition = primary.split("Condition:")
    assert keys.split() == ["PrimaryKey", "Keys:", "node", "ts"], plan
    assert "ts in (-Inf" in condition and "ts in [" in condition and "node in ['n1', 'n1']" in condition, plan


# --- 0020: the timeline's durations ----------------------------------------------------------------------------------


def timeline_rows() -> list[list]:
    """Records of two nodes: kernels of microseconds to a 5 s one (past a UInt32 of ns), a copy, a zero-length set,
    half an hour ago (inside the timeline's 6 h TTL, 0021)."""
    t = datetime.now(tz=UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)
    s = int(t.timestamp()) * 10**9
    rows = []
    for i, (dur, activity, name) in enumerate([(3_100, "KERNEL", "gemm"), (5 * 10**9, "KERNEL", "long_reduce"),
                                               (250_000, "MEMCPY", "[memcpy HtoD]"), (0, "MEMSET", "[memset]")]):
        for node in ("n1", "n2"):
            start = s + i * 1_000_003 + (node == "n2") * 17
            rows.append([t, node, 10, "train", 0, 7, start, start + dur, activity, name, 100 + i, 1 + i, 64 * i,
                         "step", 0, 0, 40 + i])
    return rows


TIMELINE_READ = ("SELECT node, start_ns, end_ns, end_ns - start_ns, activity, name, weight, correlation_id "
                 "FROM gpu_timeline ORDER BY node, start_ns")


@pytest.fixture
def before_0020(chdb_dir):
    store = migrated_to(chdb_dir, 19)
    try:
        store.insert("gpu_timeline", timeline_rows(), TIMELINE_COLUMNS)
        yield store
    finally:
        drop(store)


def test_the_timeline_keeps_each_record_s_end_through_its_duration(before_0020):
    store = before_0020
    _, want = store.query_sql(TIMELINE_READ)
    assert len(want) == 8 and max(r[3] for r in want) == 5 * 10**9
    assert store.migrate() == migrations_from(20)
    assert store.query_sql(TIMELINE_READ)[1] == want
    _, kinds = store.query_sql("SELECT name, default_kind FROM system.columns WHERE database = currentDatabase() "
                               "AND table = 'gpu_timeline' AND name IN ('end_ns', 'duration_ns') ORDER BY name")
    assert kinds == [("duration_ns", ""), ("end_ns", "ALIAS")]
    # the queries that read a range by end_ns still find the records
    _, overlapping = store.query_sql("SELECT count() FROM gpu_timeline WHERE end_ns > {t:UInt64}",
                                     {"t": want[0][1] + 5 * 10**9 - 1})
    assert overlapping == [(2,)]  # the 5 s kernel of each node


@pytest.mark.parametrize("stop_after", ["INSERT INTO gpu_timeline_0020", "EXCHANGE TABLES", "DROP TABLE IF EXISTS"])
def test_the_timeline_rebuild_run_again_after_stopping_anywhere_keeps_every_record(before_0020, stop_after):
    store = before_0020
    want = store.query_sql(TIMELINE_READ)[1]
    died_after(store, DURATIONS, stop_after, last=True)
    assert store.migrate() == migrations_from(20)
    assert store.query_sql(TIMELINE_READ)[1] == want


def test_a_rebuild_does_not_run_over_an_unfinished_sink_batch(before_0019, monkeypatch):
    """A sink stopped inside a batch left it BEFORE in sink_state; the sink that resumes it writes it again whole,
    and a rebuilt table has no record of what that batch inserted: the rebuild refuses (one line naming the batch)
    until the batch is finished, or the operator says to go on."""
    from fleetprof.rebuild_guard import ALLOW_ENV
    from fleetprof.store import StoreError
    from processors.store_writer import STATE_COLUMNS

    store = before_0019
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    want = contents(store)
    stamp = datetime.now(tz=UTC)
    store.insert("sink_state", [["gpu.samples", 1, 10, 20, "AFTER", stamp],  # finished batches do not matter
                                ["cpu.samples", 3, 100, 199, "BEFORE", stamp]], STATE_COLUMNS)
    with pytest.raises(StoreError, match=r"migration 0019_hour_first_sample_order rebuilds tables and a sink batch "
                                         r"is unfinished \(cpu\.samples partition 3 offsets 100-199\)") as refused:
        store.migrate()
    assert "\n" not in str(refused.value) and ALLOW_ENV in str(refused.value)
    assert sorting_key(store, "cpu_samples") != CPU_KEY and contents(store) == want  # nothing of it ran
    # the batch finished (the old sink resumed it): the rebuild runs
    store.insert("sink_state", [["cpu.samples", 3, 100, 199, "AFTER", stamp + timedelta(microseconds=1)]],
                 STATE_COLUMNS)
    assert store.migrate() == migrations_from(19)
    assert sorting_key(store, "cpu_samples") == CPU_KEY and contents(store) == want


def test_the_operator_may_rebuild_over_an_unfinished_batch_knowingly(before_0019, monkeypatch):
    from fleetprof.rebuild_guard import ALLOW_ENV
    from processors.store_writer import STATE_COLUMNS

    store = before_0019
    store.insert("sink_state", [["cpu.samples", 0, 5, 9, "BEFORE", datetime.now(tz=UTC)]], STATE_COLUMNS)
    monkeypatch.setenv(ALLOW_ENV, "1")
    assert store.migrate() == migrations_from(19)


def test_a_cluster_file_that_rebuilds_tables_stops_over_an_unfinished_sink_batch(before_0019):
    """The cluster's migrations run through clickhouse-client, not `fleetprof db migrate`: each file that rebuilds
    tables begins with a statement that fails while a sink batch is unfinished (clickhouse-client stops the file
    there), and passes once it is finished. Run here on a single node's sink_state, the table it reads."""
    from fleetprof import cluster_sql
    from processors.store_writer import STATE_COLUMNS

    files = {path.name: path.read_text() for path in sorted(cluster_sql.CLUSTER_DIR.glob("0*.sql"))}
    guarded = {name for name, text in files.items() if code(split_statements(text)[0]) ==
               code(cluster_sql.REBUILD_GUARD)}
    assert guarded == {name for name, text in files.items() if "EXCHANGE TABLES" in text}
    assert {name[:4] for name in guarded} == {"0019", "0020", "0021", "0022", "0023", "0025"}
    guard = code(cluster_sql.REBUILD_GUARD)
    store = before_0019
    assert store.query_sql(guard) == (["unfinished_sink_batches"], [(0,)])  # no sink ever wrote: it passes
    stamp = datetime.now(tz=UTC)
    store.insert("sink_state", [["gpu.samples", 1, 10, 20, "AFTER", stamp],
                                ["cpu.samples", 3, 100, 199, "BEFORE", stamp]], STATE_COLUMNS)
    with pytest.raises(Exception, match="fleetprof: a sink batch is unfinished, which this rebuild would store twice"):
        store.query_sql(guard)
    store.insert("sink_state", [["cpu.samples", 3, 100, 199, "AFTER", stamp + timedelta(microseconds=1)]],
                 STATE_COLUMNS)
    assert store.query_sql(guard) == (["unfinished_sink_batches"], [(0,)])


# --- 0023: plain MergeTree sample tables ------------------------------------------------------------------------------


@pytest.fixture
def before_0023(chdb_dir):
    """A store migrated up to 0022 holding known rows in both sample tables, some keys in two parts each."""
    store = migrated_to(chdb_dir, 22)
    try:
        cpu, gpu = known_rows(first_hour())
        for rows in (cpu, cpu[:5]):
            store.insert("cpu_samples", rows, CPU_COLUMNS)
        for rows in (gpu, gpu[:3]):
            store.insert("gpu_kernel_samples", rows, GPU_COLUMNS)
        yield store
    finally:
        drop(store)


def stored_rows(store) -> int:
    _, rows = store.query_sql("SELECT (SELECT count() FROM cpu_samples) + (SELECT count() FROM gpu_kernel_samples)")
    return rows[0][0]


def test_the_sample_tables_become_plain_merge_trees_with_every_row(before_0023):
    store = before_0023
    store.client.command("OPTIMIZE TABLE cpu_samples FINAL")  # the old engine folds the keys written twice
    want, rows = contents(store), stored_rows(store)
    assert table_setting(store, "cpu_samples", "engine") == "SummingMergeTree"
    assert store.migrate() == migrations_from(23)
    assert contents(store) == want and stored_rows(store) == rows  # the old table's parts, as they were
    for table, key in (("cpu_samples", CPU_KEY), ("gpu_kernel_samples", GPU_KEY)):
        assert table_setting(store, table, "engine") == "MergeTree"
        assert sorting_key(store, table) == key
        assert "ttl_only_drop_parts = 1" in table_setting(store, table, "engine_full")
    _, left = store.query_sql("SELECT name FROM system.tables WHERE database = currentDatabase() AND name LIKE '%0023'")
    assert left == []
    # the rows of one key written in two parts stay two rows when merged now, and every query still sums them
    cpu, gpu = known_rows(first_hour())
    store.insert("cpu_samples", cpu[:1], CPU_COLUMNS)
    store.client.command("OPTIMIZE TABLE cpu_samples FINAL")
    assert stored_rows(store) == rows + 1
    node = cpu[0][1]
    assert window_totals(store, node)[0] == dict(want["rollups"])[node][0] + cpu[0][6]
    # the views feed the rollups from the new tables, once
    store.insert("gpu_kernel_samples", gpu[:1], GPU_COLUMNS)
    assert rollup_totals(store, node) == window_totals(store, node)


@pytest.mark.parametrize("stop_after", ["ALTER TABLE cpu_samples_0023", "EXCHANGE TABLES cpu_samples AND",
                                        "DROP TABLE IF EXISTS cpu_samples_0023 SYNC", "CREATE MATERIALIZED VIEW",
                                        "ALTER TABLE gpu_kernel_samples_0023", "EXCHANGE TABLES gpu_kernel_samples"])
def test_0023_run_again_after_stopping_anywhere_leaves_the_same_rows(before_0023, stop_after):
    store = before_0023
    want, rows = contents(store), stored_rows(store)
    died_after(store, PLAIN, stop_after, last=stop_after.startswith("DROP"))
    assert store.migrate() == migrations_from(23)
    assert contents(store) == want and stored_rows(store) == rows
    assert {table_setting(store, t, "engine") for t in ("cpu_samples", "gpu_kernel_samples")} == {"MergeTree"}
