"""Migration 0021: the timeline is detail kept 6 hours, like the 1 s NVML readings, in hourly partitions. Records
past the TTL go (those in the store when it is applied, and those a late sink writes), records inside it stay whole,
also when the file runs again after stopping anywhere, and the web UI's note (timeline.DETAIL_KEEP_S) names the
migration's TTL."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from fleetprof.store import PARTS_DIR, migration_files
from fleetprof.webui import timeline
from tests.migration_names import migrations_from
from tests.test_table_rebuilds import died_after, drop, migrated_to, table_setting
from tests.test_webui_timeline import TIMELINE_COLUMNS

MIGRATION = next(p for v, _, p in migration_files() if v == 21)
NS = 10**9
READ = ("SELECT node, count(), sum(duration_ns), min(correlation_id), max(correlation_id) FROM gpu_timeline "
        "GROUP BY node ORDER BY node")


def records(at: datetime, node: str, count: int) -> list[list]:
    s = int(at.timestamp()) * NS
    return [[at, node, 10, "train", 0, 7, s + i * 1_000_000, 5_000 + i, "KERNEL", "gemm", 100, 1, 0, "", 0, 0, i + 1]
            for i in range(count)]


@pytest.fixture
def before_0021(chdb_dir):
    """A store before 0021 holding records of n1 7 hours ago and of n2 (an hour ago) and n3 (just now)."""
    store = migrated_to(chdb_dir, 20)
    try:
        now = datetime.now(tz=UTC).replace(microsecond=0)
        store.insert("gpu_timeline", records(now - timedelta(hours=7), "n1", 40)
                     + records(now - timedelta(hours=1), "n2", 30) + records(now, "n3", 20), TIMELINE_COLUMNS)
        assert [r[:2] for r in store.query_sql(READ)[1]] == [("n1", 40), ("n2", 30), ("n3", 20)]
        yield store
    finally:
        drop(store)


RECENT = [("n2", 30, 30 * 5_000 + 435, 1, 30), ("n3", 20, 20 * 5_000 + 190, 1, 20)]


def test_the_ttl_is_the_web_ui_s_and_the_nvml_detail_tier_s():
    (hours,) = re.findall(r"^TTL ts \+ INTERVAL (\d+) HOUR$", MIGRATION.read_text(), re.MULTILINE)
    assert int(hours) * 3600 == timeline.DETAIL_KEEP_S
    (nvml,) = re.findall(r"now\(\) - INTERVAL (\d+) HOUR", (PARTS_DIR / "nvml_tier.sql").read_text())
    assert nvml == hours


def test_records_past_the_ttl_go_and_recent_ones_stay(before_0021):
    store = before_0021
    assert store.migrate() == migrations_from(21)
    assert store.query_sql(READ)[1] == RECENT
    full = table_setting(store, "gpu_timeline", "engine_full")
    assert "PARTITION BY toStartOfHour(ts)" in full and "TTL ts + toIntervalHour(6)" in full
    assert "ttl_only_drop_parts = 1" in full
    # a sink behind by hours still writes an expired window: its records go (at the insert, or the next TTL merge)
    store.insert("gpu_timeline", records(datetime.now(tz=UTC).replace(microsecond=0) - timedelta(hours=8), "n4", 10),
                 TIMELINE_COLUMNS)
    store.query_sql("OPTIMIZE TABLE gpu_timeline FINAL", readonly=False)
    assert store.query_sql(READ)[1] == RECENT


@pytest.mark.parametrize("stop_after", ["INSERT INTO gpu_timeline_0021", "EXCHANGE TABLES", "DROP TABLE IF EXISTS"])
def test_the_file_run_again_after_stopping_anywhere_keeps_the_recent_records(before_0021, stop_after):
    store = before_0021
    died_after(store, MIGRATION, stop_after, last=True)
    assert store.migrate() == migrations_from(21)
    assert store.query_sql(READ)[1] == RECENT
    assert "PARTITION BY toStartOfHour(ts)" in table_setting(store, "gpu_timeline", "engine_full")
