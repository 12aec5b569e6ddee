"""Migration 0022: the 1 s NVML readings in hourly partitions whose 6 h TTL drops whole parts. Readings past the TTL
go, recent ones stay whole, the 10 s aggregates hold every reading once (the copy feeds no view, the views made
again feed from the new tables), also when the file runs again after stopping anywhere."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import PARTS_DIR, migration_files
from tests.migration_names import migrations_from
from tests.test_nvml_tiers import DEVICE_COLUMNS, PROCESS_COLUMNS
from tests.test_table_rebuilds import died_after, drop, migrated_to, table_setting

MIGRATION = next(p for v, _, p in migration_files() if v == 22)
TABLES = ("gpu_device_metrics", "gpu_process_metrics")
ONE_S = ("SELECT 'device', node, count(), sum(power_mw) FROM gpu_device_metrics GROUP BY node UNION ALL "
         "SELECT 'process', node, count(), sum(used_memory_bytes) FROM gpu_process_metrics GROUP BY node")
TEN_S = ("SELECT 'device', node, sum(readings), sum(power_sum) FROM gpu_device_metrics_10s GROUP BY node UNION ALL "
         "SELECT 'process', node, sum(readings), sum(used_memory_sum) FROM gpu_process_metrics_10s GROUP BY node")


def put(store, node: str, start: datetime, seconds: int) -> None:
    """A reading a second of GPU 0 and of pid 10 on it, as the sink writes them."""
    devices, processes = [], []
    for i in range(seconds):
        ts = start + timedelta(seconds=i)
        devices.append([ts, node, 0, "GPU-0", "H100", "", 50, 40_000_000_000, 100_000 + i, [], False, ""])
        processes.append([ts, node, 0, 10, "train", "c1", 25, 30_000_000_000 + i, False, ""])
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    store.insert("gpu_process_metrics", processes, PROCESS_COLUMNS)


def sums(store, sql: str) -> list[tuple]:
    return sorted(tuple(row) for row in store.query_sql(sql)[1])


def want(node: str, seconds: int) -> list[tuple]:
    return [("device", node, seconds, sum(100_000 + i for i in range(seconds))),
            ("process", node, seconds, sum(30_000_000_000 + i for i in range(seconds)))]


@pytest.fixture
def before_0022(chdb_dir):
    """A store before 0022 with 40 s of n1's readings 7 hours ago and 30 s of n2's an hour ago: the 1 s tables
    hold n2's only once 0016's TTL ran, the 10 s aggregates both."""
    store = migrated_to(chdb_dir, 21)
    try:
        now = datetime.now(tz=UTC).replace(microsecond=0)
        put(store, "n1", now - timedelta(hours=7), 40)
        put(store, "n2", now - timedelta(hours=1), 30)
        assert sums(store, TEN_S) == sorted(want("n1", 40) + want("n2", 30))
        yield store
    finally:
        drop(store)


def check_after(store) -> None:
    assert sums(store, ONE_S) == sorted(want("n2", 30))
    assert sums(store, TEN_S) == sorted(want("n1", 40) + want("n2", 30))  # nothing fed twice
    for table in TABLES:
        full = table_setting(store, table, "engine_full")
        assert "PARTITION BY toStartOfHour(ts)" in full and "ttl_only_drop_parts = 1" in full, table
    # the views feed the aggregates from the new tables, once
    put(store, "n3", datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=5), 20)
    assert sums(store, ONE_S) == sorted(want("n2", 30) + want("n3", 20))
    assert sums(store, TEN_S) == sorted(want("n1", 40) + want("n2", 30) + want("n3", 20))


def test_the_ttl_is_the_tier_s():
    text = MIGRATION.read_text()
    (hours,) = re.findall(r"now\(\) - INTERVAL (\d+) HOUR", (PARTS_DIR / "nvml_tier.sql").read_text())
    assert re.findall(r"^TTL toDateTime\(ts\) \+ INTERVAL (\d+) HOUR$", text, re.MULTILINE) == [hours, hours]


def test_recent_readings_stay_and_the_aggregates_hold_every_one_once(before_0022):
    assert before_0022.migrate() == migrations_from(22)
    check_after(before_0022)


@pytest.mark.parametrize("stop_after", ["DROP VIEW IF EXISTS gpu_device_metrics_10s_mv",
                                        "INSERT INTO gpu_device_metrics_0022", "EXCHANGE TABLES gpu_device_metrics",
                                        "CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_device_metrics_10s_mv",
                                        "EXCHANGE TABLES gpu_process_metrics"])
def test_the_file_run_again_after_stopping_anywhere_leaves_the_same(before_0022, stop_after):
    store = before_0022
    died_after(store, MIGRATION, stop_after)
    assert store.migrate() == migrations_from(22)
    check_after(store)


def test_a_batch_of_readings_days_apart_is_written(store):
    """One sink batch may hold polls of more hours than the 100 partitions ClickHouse lets an insert make by default
    (a node days late, a clock days off): refused, it would fail on every retry and stall the sink. Every reading
    reaches the 10 s tier, those inside the TTL the 1 s one (those past it go once the TTL drops their parts)."""
    now = datetime.now(tz=UTC).replace(microsecond=0)
    rows = [[now - timedelta(hours=i, minutes=30), "late", 0, "GPU-0", "H100", "", 50, 1, 1, [], False, ""]
            for i in range(150)]
    for _ in range(2):  # and its retry after a crash before the commit: its parts in every hour dropped whole
        store.insert("gpu_device_metrics", rows, DEVICE_COLUMNS, dedup_token="gpu.metrics:0:1-2:gpu_device_metrics")
    _, kept = store.query_sql("SELECT count() FROM gpu_device_metrics WHERE node = 'late' "
                              "AND ts > now() - INTERVAL 6 HOUR")
    _, tens = store.query_sql("SELECT sum(readings) FROM gpu_device_metrics_10s WHERE node = 'late'")
    assert kept == [(6,)] and tens == [(150,)]
