"""Migration 0021: the timeline is detail kept 6 hours, like the 1 s NVML readings. Records past the TTL go (those in
the store when it is applied, and those a late sink writes), records inside it stay whole, the window tables keep the
same GPU time, and the web UI's note (timeline.DETAIL_KEEP_S) names the migration's TTL."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from fleetprof.store import MIGRATIONS_DIR, PARTS_DIR
from fleetprof.webui import timeline
from tests.test_table_rebuilds import drop, migrated_to
from tests.test_webui_timeline import TIMELINE_COLUMNS

MIGRATION = MIGRATIONS_DIR / "0021_timeline_detail_tier.sql"
NS = 10**9


def records(at: datetime, node: str, count: int) -> list[list]:
    s = int(at.timestamp()) * NS
    return [[at, node, 10, "train", 0, 7, s + i * 1_000_000, 5_000, "KERNEL", "gemm", 100, 1, 0, "", 0, 0, i + 1]
            for i in range(count)]


def test_the_ttl_is_the_web_ui_s_and_the_nvml_detail_tier_s():
    (hours,) = re.findall(r"MODIFY TTL ts \+ INTERVAL (\d+) HOUR", MIGRATION.read_text())
    assert int(hours) * 3600 == timeline.DETAIL_KEEP_S
    (nvml,) = re.findall(r"now\(\) - INTERVAL (\d+) HOUR", (PARTS_DIR / "nvml_tier.sql").read_text())
    assert nvml == hours


def test_records_past_the_ttl_go_and_recent_ones_stay(chdb_dir):
    store = migrated_to(chdb_dir, 20)
    try:
        now = datetime.now(tz=UTC).replace(microsecond=0)
        old, recent = now - timedelta(hours=7), now - timedelta(hours=1)
        store.insert("gpu_timeline", records(old, "n1", 40) + records(recent, "n2", 30), TIMELINE_COLUMNS)
        before = store.query_sql("SELECT node, count() FROM gpu_timeline GROUP BY node ORDER BY node")[1]
        assert before == [("n1", 40), ("n2", 30)]
        assert store.migrate() == ["0021_timeline_detail_tier"]
        # a sink behind by hours still writes an expired window: it does not outlive a merge either
        store.insert("gpu_timeline", records(old - timedelta(minutes=5), "n3", 10), TIMELINE_COLUMNS)
        store.query_sql("OPTIMIZE TABLE gpu_timeline FINAL", readonly=False)
        _, rows = store.query_sql("SELECT node, count(), sum(end_ns - start_ns), min(correlation_id), "
                                  "max(correlation_id) FROM gpu_timeline GROUP BY node ORDER BY node")
        assert rows == [("n2", 30, 30 * 5_000, 1, 30)]
    finally:
        drop(store)


def test_a_new_store_has_the_ttl(chdb_dir):
    from fleetprof.store import open_store

    store = open_store(f"chdb://{chdb_dir}", f"t_tier_{uuid.uuid4().hex[:8]}")
    try:
        store.migrate()
        _, rows = store.query_sql("SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
                                  "AND name = 'gpu_timeline'")
        assert "TTL ts + toIntervalHour(6)" in rows[0][0] and "ttl_only_drop_parts = 0" in rows[0][0]
    finally:
        drop(store)
