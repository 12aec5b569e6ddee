"""Background CPU of the detail tier's TTL over hours, in scaled time: the 1 s NVML readings in daily partitions with
a 6 h row TTL (migration 0016: each hour a TTL merge rewrites the parts that hold the newly expired hour) against
hourly partitions whose parts go whole once expired (0022, and the timeline's 0021). Measured, not estimated.

    .venv/bin/python bench/ttl_merges.py [--scale 60] [--hours 16] [--nodes 10]

Time runs --scale times faster than the sink's: a scaled hour is 3600/scale s; every 10/scale s one sink batch of
device readings (nodes x 8 GPUs x 10 readings, bench/sql/ttl_merges_insert.sql) goes into a chDB table with 0022's
columns, codecs and key (bench/sql/ttl_merges_table.sql); the TTL is 6 scaled hours, the partitions a scaled day
("rows": the row TTL, ttl_only_drop_parts = 0) or a scaled hour ("parts": ttl_only_drop_parts = 1), and
merge_with_ttl_timeout a scaled hour in both. The two layouts run side by side, each in a process of its own. From
the first expiry (7 scaled hours) to the end, the CPU of each process's threads (/proc/self/task) is summed: the
inserting thread and the engine's pool (merges, TTL deletes, part drops), per reading inserted meanwhile. Not
scaled: the engine's own timers (merge selection every few seconds), the same for both layouts.
--table cpu: the same for cpu_samples (0019's engine and key, no TTL within a run: bench/sql/ttl_merges_cpu_*.sql,
~500 rows per node a batch) in daily ("daily") against hourly ("hourly") partitions, and hourly ones whose parts are
merged into one once they are all a scaled hour old ("hourly_merged"), measured from the first scaled hour on: what
bounded merge levels would save the sink at steady state; once the inserts stop, the flame graph's scan over the last
50 scaled minutes and over the whole run is timed on each (bench/sql/ttl_merges_cpu_query.sql). Its wider layouts
("daily_wide", "daily_wide_open": merge_selector_base = 100, with and without a day's final merge) price merging more
parts at a time; "daily_named" (each process with a 64-digit container id and a workload identity) against
"daily_process_ids" (the same rows, only a process id stored in place of the strings) prices a process-id design.
The most active parts are sampled every 10 scaled minutes.
Writes bench/out/ttl_merges[_cpu].json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sink_cost import thread_cpu  # noqa: E402
from fleetprof.store import open_store  # noqa: E402

SQL = ROOT / "bench" / "sql"
TTL_HOURS = 6
READINGS_PER_BATCH_PER_NODE = 8 * 10  # 8 GPUs, one reading a second over a 10 s batch


def layouts(hour_s: int, table: str = "nvml") -> dict[str, dict[str, str]]:
    """Each layout's partition key and TTL settings, with `hour_s` seconds standing for an hour."""
    if table == "cpu":
        # hourly_merged: an hour's parts merged into one once all of them are an hour old (what storage sees)
        force = f"min_age_to_force_merge_seconds = {hour_s}, min_age_to_force_merge_on_partition_only = 1"
        # daily_plain: daily partitions of a plain MergeTree, which merges without comparing each row's key to the
        # last one's to sum (rows of one key are summed by every query anyway)
        # daily_wide: daily_plain under merge_selector_base = 100 (the engine lowers the base to 2 as a partition
        # nears 50 parts, so that bounds the width), a day's parts merged into one once all of them are an hour old;
        # daily_wide_open: the same without that last merge
        # daily_named: daily_plain with a container id and a workload identity per process (the others' are empty);
        # daily_process_ids: the same rows, only a process id stored in place of the three strings
        base20, base100 = "merge_selector_base = 20", "merge_selector_base = 100"
        named = {"insert_sql": "ttl_merges_cpu_named_insert.sql"}
        return {name: {"partition": f"toStartOfInterval(ts, INTERVAL {span * hour_s} SECOND)", "hour": str(hour_s),
                       "settings": f"ttl_only_drop_parts = 1, {extra}", "engine": engine, **files}
                for name, span, extra, engine, files in (
                    ("daily", 24, base20, "SummingMergeTree(count)", {}),
                    ("hourly", 1, base20, "SummingMergeTree(count)", {}),
                    ("hourly_merged", 1, f"{base20}, {force}", "SummingMergeTree(count)", {}),
                    ("daily_plain", 24, base20, "MergeTree", {}),
                    ("daily_wide", 24, f"{base100}, {force}", "MergeTree", {}),
                    ("daily_wide_open", 24, base100, "MergeTree", {}),
                    ("daily_named", 24, base20, "MergeTree", named),
                    ("daily_process_ids", 24, base20, "MergeTree",
                     {**named, "table_sql": "ttl_merges_cpu_ids_table.sql"}))}
    return {
        "rows": {"partition": f"toStartOfInterval(ts, INTERVAL {24 * hour_s} SECOND)",
                 "settings": f"ttl_only_drop_parts = 0, merge_with_ttl_timeout = {hour_s}"},
        "parts": {"partition": f"toStartOfInterval(ts, INTERVAL {hour_s} SECOND)",
                  "settings": f"ttl_only_drop_parts = 1, merge_with_ttl_timeout = {hour_s}"},
    }


def child(layout: str, scale: int, hours: float, nodes: int, kind: str = "nvml") -> dict:
    hour_s = 3600 // scale
    batch_s, span_ms = 10 / scale, max(1, 1000 // scale)
    prefix, per_node, warm_hours = (("ttl_merges_cpu", 500, 1) if kind == "cpu"
                                    else ("ttl_merges", READINGS_PER_BATCH_PER_NODE, TTL_HOURS + 1))
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-ttl-"))
    store = open_store(f"chdb://{tmp / 'chdb'}", "bench")
    try:
        # partition, TTL and settings are the layout's expressions, not values: they cannot be bound
        chosen = layouts(hour_s, kind)[layout]
        table = (SQL / chosen.get("table_sql", f"{prefix}_table.sql")).read_text().format(
            ttl=f"INTERVAL {TTL_HOURS * hour_s} SECOND", **chosen)
        store.query_sql(table, readonly=False)
        insert = (SQL / chosen.get("insert_sql", f"{prefix}_insert.sql")).read_text()
        rows = nodes * per_node
        params = {"rows": rows} if kind == "cpu" else {"rows": rows, "span_ms": span_ms}
        start = time.monotonic()
        warm_at, end_at = start + warm_hours * hour_s, start + hours * hour_s
        before, events_before, inserted, late = None, None, 0, 0
        next_at, batches, most_parts = start, 0, 0
        while (now := time.monotonic()) < end_at:
            if before is None and now >= warm_at:
                before, events_before, inserted = thread_cpu(), events(store), 0
            store.query_sql(insert, params, readonly=False)
            inserted += rows
            batches += 1
            if batches % 60 == 0:  # every 10 scaled minutes: the most parts a query has had to read
                most_parts = max(most_parts, active_parts(store))
            next_at += batch_s
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                late += 1
        after, events_after = thread_cpu(), events(store)
        me = threading_native_id()
        insert_s = after.get(me, 0.0) - before.get(me, 0.0)
        pool = {k: v - before.get(k, 0.0) for k, v in after.items() if k[0] != me[0]}
        merge_s = sum(v for (_, name), v in pool.items() if name.startswith("MergeMutate"))
        _, kept = store.query_sql("SELECT count(), min(ts) FROM readings")
        _, parts = store.query_sql("SELECT count(), sum(bytes_on_disk) FROM system.parts "
                                   "WHERE database = currentDatabase() AND table = 'readings' AND active")
        oldest_h = (time.time() - kept[0][1].timestamp()) / hour_s if kept[0][0] else 0.0
        queries = query_times(store, hour_s, hours) if kind == "cpu" else {}
        return {
            "layout": layout, "scale": scale, "hours": hours, "nodes": nodes, "late_batches": late,
            "readings_measured": inserted,
            "us_per_reading": {"insert_thread": round(insert_s / inserted * 1e6, 3),
                               "pool": round(sum(pool.values()) / inserted * 1e6, 3),
                               "pool_merges": round(merge_s / inserted * 1e6, 3)},
            "events": {k: events_after.get(k, 0) - events_before.get(k, 0) for k in events_after},
            "end": {"readings_kept": kept[0][0], "oldest_kept_scaled_hours": round(oldest_h, 2),
                    "active_parts": parts[0][0], "most_active_parts": max(most_parts, parts[0][0]),
                    "bytes_on_disk": parts[0][1]},
            "query_s": queries,
        }
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def active_parts(store) -> int:
    _, rows = store.query_sql("SELECT count() FROM system.parts WHERE database = currentDatabase() "
                              "AND table = 'readings' AND active")
    return rows[0][0]


def query_times(store, hour_s: int, hours: float, runs: int = 5) -> dict[str, float]:
    """Median seconds of the flame graph's scan of the table (bench/sql/ttl_merges_cpu_query.sql) once the inserts
    stop: the last 50 scaled minutes (the ragged edge a query reads from the windows, the hourly rollup answering
    whole hours) and the whole run, all nodes and one."""
    sql = (SQL / "ttl_merges_cpu_query.sql").read_text()
    spans = {"edge_50min": 50 * hour_s * 1000 // 60, "whole_run": int(hours * hour_s * 1000)}
    out = {}
    for span, range_ms in spans.items():
        for node in ("", "node-3"):
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                store.query_sql(sql, {"range_ms": range_ms, "node": node})
                times.append(time.perf_counter() - t)
            out[f"{span}_{'one_node' if node else 'all_nodes'}"] = round(sorted(times)[runs // 2], 4)
    return out


def threading_native_id() -> tuple[int, str]:
    """(thread id, name) of the calling thread as thread_cpu keys it."""
    tid = threading.get_native_id()
    name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
    return tid, name


def events(store) -> dict[str, int]:
    _, rows = store.query_sql("SELECT event, value FROM system.events WHERE event IN ('Merge', 'MergedRows', "
                              "'MergedUncompressedBytes', 'InsertedRows')")
    return {k: int(v) for k, v in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=60, help="how many times faster than real time (3600 divisible)")
    ap.add_argument("--hours", type=float, default=16.0, help="scaled hours to run (the first 7 are warm-up)")
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--table", choices=("nvml", "cpu"), default="nvml")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--layouts", help="comma-separated layouts to run side by side (default: all of the table's)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    warm_hours = 1 if args.table == "cpu" else TTL_HOURS + 1
    if 3600 % args.scale or args.hours <= warm_hours:
        ap.error(f"--scale must divide 3600 and --hours exceed the {warm_hours} warm-up hours")
    if args.child:
        print(json.dumps(child(args.child, args.scale, args.hours, args.nodes, args.table)))
        return
    known = layouts(3600 // args.scale, args.table)
    chosen = args.layouts.split(",") if args.layouts else list(known)
    if not set(chosen) <= known.keys():
        ap.error(f"--layouts: {args.table} has {', '.join(known)}")
    path = args.out or ROOT / "bench" / "out" / ("ttl_merges_cpu.json" if args.table == "cpu" else "ttl_merges.json")
    procs = {layout: subprocess.Popen(
        [sys.executable, __file__, "--child", layout, "--scale", str(args.scale), "--hours", str(args.hours),
         "--nodes", str(args.nodes), "--table", args.table], stdout=subprocess.PIPE, text=True, cwd=ROOT)
        for layout in chosen}
    results = {}
    for layout, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"ttl_merges: the {layout} layout's run failed (exit {proc.returncode})")
        results[layout] = json.loads(out.strip().splitlines()[-1])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str))
    print(f"{'layout':13} {'readings':>10} {'insert us':>10} {'pool us':>9} {'merges us':>10} {'merged rows':>12} "
          f"{'kept':>9} {'oldest h':>9} {'parts':>6} {'most':>5} {'MB':>7} {'late':>5}")
    for layout, r in results.items():
        u, e, end = r["us_per_reading"], r["events"], r["end"]
        print(f"{layout:13} {r['readings_measured']:>10} {u['insert_thread']:>10} {u['pool']:>9} "
              f"{u['pool_merges']:>10} {e.get('MergedRows', 0):>12} {end['readings_kept']:>9} "
              f"{end['oldest_kept_scaled_hours']:>9} {end['active_parts']:>6} {end['most_active_parts']:>5} "
              f"{end['bytes_on_disk'] / 1e6:>7.1f} "
              f"{r['late_batches']:>5}")
    for layout, r in results.items():
        if r.get("query_s"):
            print(f"{layout:13} query seconds (median): {r['query_s']}")


if __name__ == "__main__":
    main()
