"""The two NVML tiers (migration 0016) give the same answers: known 1 s readings stored twice, once where the 1 s tier
holds them (2 h ago) and once past its 6 h TTL (8 h ago, where only the 10 s aggregates keep them), and every answer
compared across the two: exact where the math is (min, max, last, means, busy seconds of evenly spaced readings),
the cost report within 0.5% where the polls jitter."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from fleetprof.cost_report import build_report
from fleetprof.query_client import StoreTarget
from fleetprof.store import MIGRATIONS_DIR, PARTS_DIR

DEVICE_COLUMNS = ["ts", "node", "gpu_index", "uuid", "name", "parent_uuid", "gpu_util_pct", "mem_used_bytes",
                  "power_mw", "xid_errors", "simulated", "identity"]
PROCESS_COLUMNS = ["ts", "node", "gpu_index", "pid", "comm", "container_id", "sm_util_pct", "used_memory_bytes",
                   "simulated", "identity"]
SPAN_S = 1800  # 30 minutes of readings, 180 buckets per GPU


def util(gpu: int, i: int) -> int:
    return (i * 7 + gpu * 31) % 101


def jitter_ms(gpu: int, i: int) -> int:
    # a poll a few ms late, as an agent's timer is: never a whole bucket off
    return (i * 37 + gpu * 11) % 60


def put_readings(store, start: datetime, jitter: bool) -> None:
    """Readings once a second for SPAN_S seconds from `start` on n1's GPUs 0 and 1, and pid 10 on GPU 0."""
    devices, processes = [], []
    for i in range(SPAN_S):
        for gpu in (0, 1):
            ts = start + timedelta(seconds=i, milliseconds=jitter_ms(gpu, i) if jitter else 0)
            devices.append([ts, "n1", gpu, f"GPU-{gpu}", "H100", "", util(gpu, i), 40_000_000_000 + i * 1000,
                            100_000 + util(gpu, i) * 5000, [], False, "pod-a"])
            if gpu == 0:
                processes.append([ts, "n1", 0, 10, "train", "c1", util(gpu, i) // 2, 30_000_000_000 + i, False,
                                  "pod-a"])
    store.insert("gpu_device_metrics", devices, DEVICE_COLUMNS)
    store.insert("gpu_process_metrics", processes, PROCESS_COLUMNS)


def aligned(hours: int) -> datetime:
    now = datetime.now(tz=UTC).replace(microsecond=0)
    return now - timedelta(hours=hours, seconds=now.second % 60, minutes=now.minute % 10)


@pytest.fixture(params=[False, True], ids=["even", "jittered"])
def tiers(store, request):
    recent, old = aligned(2), aligned(8)
    put_readings(store, recent, request.param)
    put_readings(store, old, request.param)
    return SimpleNamespace(store=store, recent=recent, old=old, jitter=request.param)


def by_key(columns, rows, drop=()):
    keep = [i for i, c in enumerate(columns) if c not in drop]
    return [tuple(row[i] for i in keep) for row in rows]


def test_the_part_reads_the_tier_that_holds_the_range_and_agrees_with_the_ttl():
    tier = (PARTS_DIR / "nvml_tier.sql").read_text()
    migration = (MIGRATIONS_DIR / "0016_nvml_tiers.sql").read_text()
    (hours,) = re.findall(r"now\(\) - INTERVAL (\d+) HOUR", tier)
    assert re.findall(r"MODIFY TTL toDateTime\(ts\) \+ INTERVAL (\d+) HOUR", migration) == [hours, hours]


def test_old_readings_live_only_in_the_aggregates(tiers):
    _, rows = tiers.store.query_sql("SELECT min(ts) FROM gpu_device_metrics")
    assert rows[0][0] >= tiers.recent  # the 8 h old 1 s rows were past the TTL when inserted
    _, rows = tiers.store.query_sql("SELECT count(), sum(readings) FROM gpu_device_metrics_10s FINAL")
    assert rows == [(2 * 2 * SPAN_S // 10, 2 * 2 * SPAN_S)]


def test_aggregates_are_exact_min_mean_max_last(tiers):
    # the 10 s aggregates of the recent half against the same statistics computed from its 1 s rows
    _, want = tiers.store.query_sql(
        "SELECT gpu_index, toDateTime(intDiv(toUnixTimestamp(ts), 10) * 10, 'UTC') AS b, count(), min(gpu_util_pct),"
        " max(gpu_util_pct), sum(gpu_util_pct), argMax(gpu_util_pct, ts), argMax(power_mw, ts), max(ts)"
        " FROM gpu_device_metrics GROUP BY gpu_index, b ORDER BY gpu_index, b")
    _, got = tiers.store.query_sql(
        "SELECT gpu_index, bucket, sum(readings), min(gpu_util_min), max(gpu_util_max), sum(gpu_util_sum),"
        " max(latest).gpu_util_pct, max(latest).power_mw, max(last_ts)"
        " FROM gpu_device_metrics_10s WHERE bucket >= {t:DateTime} GROUP BY gpu_index, bucket"
        " ORDER BY gpu_index, bucket", {"t": tiers.recent})
    assert len(got) == 2 * SPAN_S // 10
    assert got == want


def shifted(rows, columns, delta):
    """The rows with their ts moved by delta, to compare the old copy with the recent one."""
    i = columns.index("ts")
    return [tuple(v + delta if j == i else v for j, v in enumerate(row)) for row in rows]


def test_gpu_metrics_past_the_ttl_are_each_buckets_last_reading(tiers):
    store, delta = tiers.store, tiers.recent - tiers.old
    columns, recent = store.query_named("gpu_metrics", {"since": tiers.recent,
                                                        "until": tiers.recent + timedelta(seconds=SPAN_S)})
    _, old = store.query_named("gpu_metrics", {"since": tiers.old, "until": tiers.old + timedelta(seconds=SPAN_S)})
    assert len(recent) == 2 * SPAN_S and len(old) == 2 * SPAN_S // 10
    ts = columns.index("ts")
    last = [row for row in recent if (row[ts] - tiers.recent).seconds % 10 == 9]
    assert shifted(old, columns, delta) == last


def test_idle_time_and_workload_hours_agree_across_tiers(tiers):
    store = tiers.store
    answers = []
    for start in (tiers.recent, tiers.old):
        window = {"since": start, "until": start + timedelta(seconds=SPAN_S)}
        columns, idle = store.query_named("gpu_idle_time", window)
        _, workloads = store.query_named("gpu_utilization_by_workload", {**window, "by": "pod"})
        _, pct = store.query_named("gpu_utilization_percentiles", window)
        answers.append((by_key(columns, idle, drop=("readings",)), workloads, pct))
    (idle_1s, work_1s, pct_1s), (idle_10s, work_10s, pct_10s) = answers
    assert [r[:7] for r in idle_1s] == [r[:7] for r in idle_10s]  # level, node, GPU, uuid, pid, comm, container
    for a, b in zip(idle_1s, idle_10s, strict=True):
        for x, y in zip(a[7:], b[7:], strict=True):  # covered, busy, idle, unknown seconds
            if tiers.jitter:
                assert x == pytest.approx(y, rel=0.005, abs=0.05)
            else:
                assert x == pytest.approx(y, rel=1e-12, abs=1e-9)  # exact but for float rounding
    # the percentiles' min, max and mean are exact from the aggregates
    assert [(r[0], r[1], r[5], r[6], r[10]) for r in pct_1s] == [(r[0], r[1], r[5], pytest.approx(r[6]), r[10])
                                                                  for r in pct_10s]
    # per workload: the same GPUs and seconds (readings differ: the 10 s tier's are buckets)
    assert [r[:2] for r in work_1s] == [r[:2] for r in work_10s]
    for a, b in zip(work_1s, work_10s, strict=True):
        assert b[3:] == pytest.approx(a[3:], rel=0.005 if tiers.jitter else 1e-12)


def test_cost_report_within_half_a_percent_of_the_1s_data(tiers):
    target = StoreTarget(tiers.store)
    reports = [build_report(target, since=start, until=start + timedelta(seconds=SPAN_S), price=2.0, by="gpu")
               for start in (tiers.recent, tiers.old)]
    one, ten = reports
    assert one.total.gpu == pytest.approx(2 * SPAN_S / 3600, rel=0.005)
    for a, b in ((one.total, ten.total), *zip(one.groups, ten.groups, strict=True)):
        assert a.key == b.key
        for x, y in ((a.gpu, b.gpu), (a.busy, b.busy), (a.idle, b.idle)):
            assert y == pytest.approx(x, rel=0.005)
            if not tiers.jitter:
                assert y == pytest.approx(x, rel=1e-9)


def test_the_migration_fills_the_aggregates_from_stored_readings_once(chdb_dir):
    import uuid

    from fleetprof.store import migration_files, open_store, split_statements

    before = open_store(f"chdb://{chdb_dir}", f"t_nvml_backfill_{uuid.uuid4().hex[:8]}")
    try:
        for version, name, path in [f for f in migration_files() if f[0] < 16]:
            for statement in split_statements(path.read_text()):
                before.client.command(statement)
            before.insert("schema_migrations", [[version, name, datetime.now(tz=UTC)]],
                          ["version", "name", "applied_at"])
        start = aligned(2)
        put_readings(before, start, jitter=False)
        (path,) = [p for v, _, p in migration_files() if v == 16]
        for _ in range(2):  # the file, and again (a migration stopped midway is run again): nothing twice
            for statement in split_statements(path.read_text()):
                before.client.command(statement)
            counts = "SELECT sum(readings), sum(gpu_util_sum) FROM gpu_device_metrics_10s"
            want = before.query_sql("SELECT count(), sum(gpu_util_pct) FROM gpu_device_metrics")[1]
            assert before.query_sql(counts)[1] == want == [(2 * SPAN_S, sum(util(g, i) for g in (0, 1)
                                                                           for i in range(SPAN_S)))]
        before.insert("schema_migrations", [[16, "0016_nvml_tiers", datetime.now(tz=UTC)]],
                      ["version", "name", "applied_at"])
        # the later migrations keep them, and from then on the views feed the aggregates
        assert before.migrate()[0] == "0017_merge_selector"
        assert before.query_sql(counts)[1] == want
        put_readings(before, start + timedelta(seconds=SPAN_S), jitter=False)
        assert before.query_sql(counts)[1][0][0] == 4 * SPAN_S
        assert before.query_sql("SELECT sum(readings) FROM gpu_process_metrics_10s")[1] == [(2 * SPAN_S,)]
    finally:
        before.client.command("DROP DATABASE IF EXISTS {db:Identifier}", parameters={"db": before.database})
        before.close()


def test_a_batch_inserted_again_with_its_token_counts_once_in_the_aggregates(store):
    # the sink re-inserts a batch after a crash with the same insert_deduplication_token: the 1 s table drops it, and
    # so must the views' inserts into the aggregates (as the hourly rollups' do, 0010)
    start = aligned(1)
    rows = [[start + timedelta(seconds=i), "n1", 0, "GPU-0", "H100", "", 50, 1, 1, [], False, ""] for i in range(20)]
    for _ in range(2):
        store.insert("gpu_device_metrics", rows, DEVICE_COLUMNS, dedup_token="gpu.metrics/0/0-19/gpu_device_metrics")
    assert store.query_sql("SELECT count() FROM gpu_device_metrics")[1] == [(20,)]
    assert store.query_sql("SELECT sum(readings), sum(gpu_util_sum) FROM gpu_device_metrics_10s")[1] == [(20, 1000)]
