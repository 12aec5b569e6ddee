"""Migration 0024: the 10 s NVML aggregates keep a bucket's newest reading as max((ts, values...)) in `latest`
instead of an argMax state. Buckets written before it give the same newest reading through the column's default,
buckets written after it store only the tuple, and the file run again from any statement leaves the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import migration_files
from tests.migration_names import migrations_from
from tests.test_nvml_hourly_partitions import put
from tests.test_nvml_tiers import DEVICE_COLUMNS
from tests.test_table_rebuilds import died_after, drop, migrated_to

MIGRATION = next(p for v, _, p in migration_files() if v == 24)
# each bucket's newest reading: ts and two of its values, per GPU and per process
NEWEST = ("SELECT 'device', node, bucket, l.ts, l.power_mw, l.mem_used_bytes FROM (SELECT node, bucket, {d} AS l "
          "FROM gpu_device_metrics_10s GROUP BY node, gpu_index, uuid, parent_uuid, bucket) UNION ALL "
          "SELECT 'process', node, bucket, l.ts, toUInt32(l.used_memory_bytes % 1000000), l.sm_util_pct "
          "FROM (SELECT node, bucket, {p} AS l FROM gpu_process_metrics_10s GROUP BY node, gpu_index, pid, bucket)")
STATE = "CAST(tuple(max(last_ts), argMaxMerge(last).{}, argMaxMerge(last).{}), 'Tuple(ts DateTime64(3), {} {}, {} {})')"
BEFORE = NEWEST.format(d=STATE.format("power_mw", "mem_used_bytes", "power_mw", "Nullable(UInt32)", "mem_used_bytes",
                                      "Nullable(UInt64)"),
                       p=STATE.format("used_memory_bytes", "sm_util_pct", "used_memory_bytes", "Nullable(UInt64)",
                                      "sm_util_pct", "Nullable(UInt8)"))
AFTER = NEWEST.format(d="max(latest)", p="max(latest)")


def newest(store, sql: str) -> list[tuple]:
    return sorted(tuple(row) for row in store.query_sql(sql)[1])


def expected(node: str, *puts: tuple[datetime, int]) -> list[tuple]:
    """What `put` wrote for each (start, seconds), bucket by bucket: the newest second's GPU power (100,000 + i) and
    used memory (40e9), and the process's used memory (30e9 + i, its last six digits) and SM utilization (25)."""
    newest_of = {}
    for start, seconds in puts:
        for i in range(seconds):
            ts = start + timedelta(seconds=i)
            bucket = ts.replace(second=ts.second - ts.second % 10)
            if bucket not in newest_of or newest_of[bucket][0] < ts:
                newest_of[bucket] = (ts, i)
    out = []
    for bucket, (ts, i) in newest_of.items():
        out += [("device", node, bucket, ts, 100_000 + i, 40_000_000_000),
                ("process", node, bucket, ts, (30_000_000_000 + i) % 1_000_000, 25)]
    return sorted(out)


@pytest.fixture
def before_0024(chdb_dir):
    """A store before 0024 holding 35 s of n1's readings, in two inserts (so a bucket in two partial rows)."""
    store = migrated_to(chdb_dir, 23)
    try:
        start = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=30)
        start = start.replace(second=start.second - start.second % 10) + timedelta(seconds=3)
        put(store, "n1", start, 20)
        put(store, "n1", start + timedelta(seconds=20), 15)
        store.n1 = expected("n1", (start, 20), (start + timedelta(seconds=20), 15))
        assert newest(store, BEFORE) == store.n1
        yield store
    finally:
        drop(store)


def check_after(store) -> None:
    # old buckets: the same newest reading, read through the default from the argMax state
    assert newest(store, AFTER) == store.n1
    # new buckets: the views write the tuple and leave `last` an empty state
    later = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=10)
    put(store, "n2", later, 12)
    both = sorted(store.n1 + expected("n2", (later, 12)))
    assert newest(store, AFTER) == both
    _, states = store.query_sql("SELECT count(), countIf(finalizeAggregation(last).power_mw IS NULL) "
                                "FROM gpu_device_metrics_10s WHERE node = 'n2'")
    assert states[0][0] > 0 and states[0][0] == states[0][1]
    # a merge writes the default into the old rows' parts: still the same answers
    for table in ("gpu_device_metrics_10s", "gpu_process_metrics_10s"):
        store.query_sql("OPTIMIZE TABLE {t:Identifier} FINAL", {"t": table}, readonly=False)
    assert newest(store, AFTER) == both


def test_the_newest_reading_of_every_bucket_is_kept(before_0024):
    assert before_0024.migrate() == migrations_from(24)
    check_after(before_0024)


@pytest.mark.parametrize("stop_after", ["ALTER TABLE gpu_device_metrics_10s", "DROP VIEW IF EXISTS gpu_device",
                                        "CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_device",
                                        "DROP VIEW IF EXISTS gpu_process"])
def test_the_file_run_again_after_stopping_anywhere_leaves_the_same(before_0024, stop_after):
    died_after(before_0024, MIGRATION, stop_after)
    assert before_0024.migrate() == migrations_from(24)
    check_after(before_0024)


def test_of_two_readings_at_one_time_the_larger_values_win(store):
    """argMax kept whichever of two equal-time readings came first; max over (ts, values) keeps the larger."""
    ts = datetime.now(tz=UTC).replace(microsecond=0) - timedelta(minutes=5)
    for power in (7, 9, 8):
        store.insert("gpu_device_metrics", [[ts, "n", 0, "GPU-0", "H100", "", 50, 1, power, [], False, ""]],
                     DEVICE_COLUMNS)
    _, rows = store.query_sql("SELECT max(latest).power_mw FROM gpu_device_metrics_10s WHERE node = 'n'")
    assert rows == [(9,)]
