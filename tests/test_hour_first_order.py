"""Migration 0019: cpu_samples and gpu_kernel_samples rebuilt hour first. A store holding rows before it holds the
same rows and sums after it, under the new sorting key; the file run again from any statement leaves them so; the
hourly rollups are fed once by the recreated views; a time range still prunes by the key."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import migration_files, open_store, split_statements
from tests.test_rollup import CPU_COLUMNS, GPU_COLUMNS, first_hour, known_rows, rollup_totals, window_totals

REBUILD = next(p for v, _, p in migration_files() if v == 19)
CPU_KEY = "node, toStartOfHour(ts), pid, stack_id, comm, container_id, identity, ts"
GPU_KEY = ("node, toStartOfHour(ts), pid, stack_id, kernel_name, device, stream, comm, container_id, nvtx_range, "
           "identity, ts")


@pytest.fixture
def before_0019(chdb_dir):
    """A store migrated up to 0018 holding known rows in both tables (and so in their rollups)."""
    store = open_store(f"chdb://{chdb_dir}", f"t_hour_first_{uuid.uuid4().hex[:8]}")
    try:
        for version, name, path in migration_files():
            if version >= 19:
                break
            for statement in split_statements(path.read_text()):
                store.client.command(statement)
            store.insert("schema_migrations", [[version, name, datetime.now(tz=UTC)]],
                         ["version", "name", "applied_at"])
        cpu, gpu = known_rows(first_hour())
        store.insert("cpu_samples", cpu, CPU_COLUMNS)
        store.insert("gpu_kernel_samples", gpu, GPU_COLUMNS)
        # the same rows twice more: parts whose rows sum under one key
        store.insert("cpu_samples", cpu[:5], CPU_COLUMNS)
        store.insert("cpu_samples", cpu[:5], CPU_COLUMNS)
        yield store
    finally:
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


def sorting_key(store, table: str) -> str:
    _, rows = store.query_sql("SELECT sorting_key FROM system.tables WHERE database = currentDatabase() "
                              "AND name = {t:String}", {"t": table})
    return rows[0][0]


def test_the_rebuild_keeps_every_row_under_the_hour_first_key(before_0019):
    store = before_0019
    want = contents(store)
    assert len(want["cpu"]) > 100 and sum(r[-1] for r in want["cpu"]) > 500
    assert store.migrate() == ["0019_hour_first_sample_order"]
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
    statements = split_statements(REBUILD.read_text())
    code = ["\n".join(ln for ln in s.splitlines() if not ln.startswith("--")) for s in statements]
    stop = [i for i, c in enumerate(code) if c.startswith(stop_after)][-1 if stop_after.startswith("DROP") else 0]
    for statement in statements[:stop + 1]:  # a migration that died after this statement
        store.client.command(statement)
    assert store.migrate() == ["0019_hour_first_sample_order"]  # not recorded: it runs whole again
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
