"""Steps of tests/test_dedup_records.py, each in a process of its own (chDB opens one directory per process and keeps
its deduplication log in memory until the process ends). Prints one JSON object.

    python -m tests.dedup_scenario insert DIR   # a migrated store, one token'd insert: its part and where it lies
    python -m tests.dedup_scenario resume DIR   # after the part is gone: what the sink's retry of the batch does
    python -m tests.dedup_scenario migrate DIR  # a migrated store, nothing in it
    python -m tests.dedup_scenario views DIR    # a CPU batch and an NVML poll through the views: where each lies
    python -m tests.dedup_scenario resume_views DIR  # after the views' parts are gone: the sink's retries
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

from fleetprof.dedup_records import lost_part, views_cut_short, views_reading
from fleetprof.store import open_store
from fleetprof.store_statements import store_sql
from processors.process_ids import process_id
from processors.sink import Rows
from processors.sink_columns import CPU_SAMPLE_COLUMNS, DEVICE_COLUMNS
from processors.store_writer import StoreRunner

TOKEN = "cpu.samples:0:10-11:cpu_samples"
# as the sink writes them (its names row apart: only counts are read here, and a names insert is one rename more)
ROWS = [[datetime(2026, 12, 5, 10, 0, tzinfo=UTC), "n1", 7, process_id("c", "", ""), 5, 3]]


def stored(store) -> int:
    return store.query_sql("SELECT toInt64(sum(count)) FROM cpu_samples")[1][0][0]


def insert(path: str) -> dict:
    store = open_store(f"chdb://{path}", "fleetprof")
    try:
        store.migrate()
        store.insert("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, dedup_token=TOKEN)
        _, parts = store.query_sql("SELECT name FROM system.parts WHERE database = 'fleetprof' "
                                   "AND table = 'cpu_samples' AND active")
        _, paths = store.query_store("table_data_paths", {"database": "fleetprof", "table": "cpu_samples"})
        return {"parts": [p[0] for p in parts], "data_path": paths[0][0][0], "lost": lost_part(store, "cpu_samples"),
                "stored": stored(store)}
    finally:
        store.close()


def resume(path: str) -> dict:
    store = open_store(f"chdb://{path}", "fleetprof")
    try:
        out = {"lost": lost_part(store, "cpu_samples")}
        store.insert("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, dedup_token=TOKEN)
        out["stored_with_own_token"] = stored(store)
        out["repaired"] = store.insert_again("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, TOKEN)
        out["stored_after_retry"] = stored(store)
        # a later attempt of the same batch (say the retry died after this insert): the newest record has its part
        out["lost_after_retry"] = lost_part(store, "cpu_samples")
        out["repaired_again"] = store.insert_again("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, TOKEN)
        out["stored_after_second_retry"] = stored(store)
        out["rollup"] = store.query_sql("SELECT toInt64(sum(count)) FROM cpu_samples_1h")[1][0][0]
        return out
    finally:
        store.close()


# an NVML poll of one GPU, recent (the 1 s readings keep 6 hours): the 10 s view aggregates it (GROUP BY)
NOW = datetime.now(tz=UTC).replace(microsecond=0)
DEVICE_ROWS = [[NOW, "n1", 0, "GPU-1", "H100", "", 50, 20, 1000, 2000, 1500, 1000, 300000, 700000, 60, 10, 20, 0,
                [], True, ""]]
VIEW_BATCHES = {"cpu_samples": (ROWS, CPU_SAMPLE_COLUMNS, "cpu_samples_1h"),
                "gpu_device_metrics": (DEVICE_ROWS, DEVICE_COLUMNS, "gpu_device_metrics_10s")}
COUNTS = {"cpu_samples": "toInt64(sum(count))", "cpu_samples_1h": "toInt64(sum(count))",
          "gpu_device_metrics": "toInt64(count())", "gpu_device_metrics_10s": "toInt64(sum(readings))"}


def counts(store) -> dict[str, int]:
    """Samples per source and target table, and the store's tables (no replay table may stay)."""
    out = {t: store.query_sql(f"SELECT {c} FROM {t}")[1][0][0] for t, c in COUNTS.items()}
    out["tables"] = sorted(r[0] for r in store.query_sql("SHOW TABLES")[1])
    return out


def migrate(path: str) -> dict:
    store = open_store(f"chdb://{path}", "fleetprof")
    try:
        applied = store.migrate()
        # Each table merged to one part a partition: the next step's renames are then its own parts' alone, not also
        # a merge still due when this process closed the store (schema_migrations' records: one part each).
        _, tables = store.query_sql("SELECT name FROM system.tables WHERE database = currentDatabase() "
                                    "AND engine LIKE '%MergeTree'")
        for (table,) in tables:
            store.query_sql("OPTIMIZE TABLE {t:Identifier} FINAL", {"t": table}, readonly=False)
        return {"migrations": len(applied)}
    finally:
        store.close()


def views(path: str) -> dict:
    store = open_store(f"chdb://{path}", "fleetprof")
    try:
        store.migrate()
        for table, (rows, columns, _) in VIEW_BATCHES.items():
            store.insert(table, rows, columns, dedup_token=f"{TOKEN}:{table}")
        out = {"counts": counts(store)}
        for _, _, target in VIEW_BATCHES.values():
            _, parts = store.query_sql("SELECT name FROM system.parts WHERE database = 'fleetprof' AND table = "
                                       "{t:String} AND active", {"t": target})
            _, paths = store.query_store("table_data_paths", {"database": "fleetprof", "table": target})
            out[target] = {"parts": [p[0] for p in parts], "data_path": paths[0][0][0]}
        return out
    finally:
        store.close()


def resume_views(path: str) -> dict:
    """The sink's path for a batch written again (StoreRunner._write with a stamp), table by table, twice."""
    store = open_store(f"chdb://{path}", "fleetprof")
    runner = StoreRunner(store, {"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    try:
        out = {"cut": {t: [(v, target, part) for v, _, target, part in views_cut_short(store, views_reading(store, t))]
                       for t in VIEW_BATCHES}}
        for table, (rows, columns, _) in VIEW_BATCHES.items():  # what the sink did before: the source's own token
            store.insert(table, rows, columns, dedup_token=f"{TOKEN}:{table}")
        out["own_tokens"] = counts(store)
        # what a repair cut short by a death leaves: the replay table and a view's copy over it
        store.query_sql(store_sql("replay_table_create"), {"replay": "cpu_samples_replay", "source": "cpu_samples"},
                        readonly=False)
        store.query_sql(store_sql("replay_view_create") + " SELECT * FROM fleetprof.cpu_samples_replay",
                        {"view": "cpu_samples_1h_mv_replay", "target": "cpu_samples"}, readonly=False)
        for attempt in ("retry", "retry_again"):
            for table, (rows, columns, _) in VIEW_BATCHES.items():
                token = f"{TOKEN}:{table}"
                runner._insert(table, Rows(columns, [list(r) for r in rows]), token, again=True)
            out[attempt] = counts(store)
        out["cut_after"] = {t: views_cut_short(store, views_reading(store, t)) for t in VIEW_BATCHES}
        return out
    finally:
        runner.producer.flush(0)
        store.close()


if __name__ == "__main__":
    step, where = sys.argv[1], sys.argv[2]
    steps = {"insert": insert, "resume": resume, "migrate": migrate, "views": views, "resume_views": resume_views}
    print(json.dumps(steps[step](where), default=str))
