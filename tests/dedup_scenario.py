"""Steps of tests/test_dedup_records.py, each in a process of its own (chDB opens one directory per process and keeps
its deduplication log in memory until the process ends). Prints one JSON object.

    python -m tests.dedup_scenario insert DIR   # a migrated store, one token'd insert: its part and where it lies
    python -m tests.dedup_scenario resume DIR   # after the part is gone: what the sink's retry of the batch does
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

from fleetprof.store import open_store
from processors.sink_columns import CPU_SAMPLE_COLUMNS
from processors.store_writer import StoreRunner

TOKEN = "cpu.samples:0:10-11:cpu_samples"
ROWS = [[datetime(2026, 12, 5, 10, 0, tzinfo=UTC), "n1", 7, "c", "", 5, 3, ""]]


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
        return {"parts": [p[0] for p in parts], "data_path": paths[0][0][0], "lost": store.lost_insert("cpu_samples"),
                "stored": stored(store)}
    finally:
        store.close()


def resume(path: str) -> dict:
    store = open_store(f"chdb://{path}", "fleetprof")
    runner = StoreRunner(store, {"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    try:
        out = {"lost": store.lost_insert("cpu_samples")}
        store.insert("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, dedup_token=TOKEN)
        out["stored_with_own_token"] = stored(store)
        token = runner._resumed_token("cpu_samples", TOKEN)
        out["token"] = token
        store.insert("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, dedup_token=token)
        out["stored_after_retry"] = stored(store)
        # a later attempt of the same batch (say the retry died after this insert): the newest record has its part
        out["lost_after_retry"] = store.lost_insert("cpu_samples")
        token = runner._resumed_token("cpu_samples", TOKEN)
        out["token_again"] = token
        store.insert("cpu_samples", ROWS, CPU_SAMPLE_COLUMNS, dedup_token=token)
        out["stored_after_second_retry"] = stored(store)
        return out
    finally:
        runner.producer.flush(0)
        store.close()


if __name__ == "__main__":
    step, where = sys.argv[1], sys.argv[2]
    print(json.dumps({"insert": insert, "resume": resume}[step](where), default=str))
