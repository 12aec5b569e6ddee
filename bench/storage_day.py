"""Stored bytes per CPU sample, every table, amortized over a day of the fleet bench's per-node load (152 CPU
samples/s, 8 GPUs x 2 sampled launches/s, NVML once a second), and at steady state over the 30-day retention.

    .venv/bin/python bench/storage_day.py [--nodes 10] [--windows 120] [--keep DIR] [--reuse DIR]

How: `fleetprof loadgen`'s simulated fleet goes through the real broker, symbolizer, correlator and sink into a chDB
store (bench/fleet_query.run_pipeline, unpaced); every MergeTree table is merged with OPTIMIZE TABLE ... FINAL and
its active parts' bytes_on_disk summed (system.parts). The span S of the stored windows is then scaled to a day, table
by table, by what the table keeps:
  * rows that grow with time and outlive a day (the window tables, the hourly rollups, the 10 s NVML aggregates,
    gpu_unmatched, profile_windows): bytes x 86,400 / S. For the hourly rollups that is an upper bound (an hour's
    rows are its distinct keys, fewer than 3600 / S times a short run's);
  * the detail tier, the 1 s NVML tables (migration 0016) and the timeline (0021): bytes x min(TTL + an hour of
    TTL-merge delay, a day) / S;
  * definitions (frames, stacks, workload_identities) and bookkeeping: as stored, once.
Steady state: each table's bytes per day x its retention in days (at most 30), over the CPU samples of 30 days.
Writes bench/out/storage_day.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_query import run_pipeline, sql  # noqa: E402
from fleetprof.store import Store, open_store  # noqa: E402

DAY_S = 86_400
# what each table keeps, in days; tables not named grow with time for the 30 days. The detail tier: the 1 s NVML
# tables (0016, where their 10 s aggregates exist; 30 days before) and the timeline (0021; 7 days before), 6 h of TTL
# and up to an hour until a TTL merge deletes the rows.
DETAIL_DAYS = 7 / 24
RETENTION_DAYS = {"gpu_timeline": DETAIL_DAYS}
NVML_1S = ("gpu_device_metrics", "gpu_process_metrics")
ONCE = {"frames", "stacks", "workload_identities", "sink_state", "schema_migrations", "alerts"}


def measure(store: Store) -> tuple[dict[str, dict[str, int]], dict]:
    """Bytes and rows per table after OPTIMIZE FINAL, and the stored span and CPU samples."""
    _, tables = store.query_sql(sql("fleet_tables"), {"db": store.database})
    for (table,) in tables:
        store.query_sql(sql("fleet_optimize"), {"table": table}, readonly=False)
    _, rows = store.query_sql(sql("fleet_parts"), {"db": store.database})
    columns, span = store.query_sql(sql("fleet_query_span"))
    return ({t: {"bytes": int(b), "rows": int(r)} for t, b, r, _ in rows}, dict(zip(columns, span[0], strict=True)))


def amortize(parts: dict[str, dict[str, int]], samples: int, span_s: float) -> dict[str, dict[str, float]]:
    """Per table: bytes per CPU sample in the run, over a day, and at steady state over 30 days."""
    out = {}
    retention = dict(RETENTION_DAYS)
    if "gpu_device_metrics_10s" in parts:
        retention.update(dict.fromkeys(NVML_1S, DETAIL_DAYS))
    for table, part in parts.items():
        per_run = part["bytes"] / samples
        if table in ONCE:
            day = part["bytes"] / (samples * DAY_S / span_s)
            steady = part["bytes"] / (samples * 30 * DAY_S / span_s)
        else:
            keep = min(retention.get(table, 30.0), 30.0)
            per_day = part["bytes"] * DAY_S / span_s
            day = min(keep, 1.0) * per_day / (samples * DAY_S / span_s)
            steady = keep * per_day / (samples * 30 * DAY_S / span_s)
        out[table] = {"rows": part["rows"], "bytes": part["bytes"], "per_sample_run": round(per_run, 4),
                      "per_sample_day": round(day, 4), "per_sample_30d": round(steady, 4)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--windows", type=int, default=120, help="10 s windows sent through the real pipeline")
    ap.add_argument("--keep", type=Path, default=None, help="build the store in this directory and keep it")
    ap.add_argument("--reuse", type=Path, default=None, help="measure the store an earlier --keep run left here")
    ap.add_argument("--no-migrate", action="store_true", help="with --reuse: measure the store's schema as it is")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "storage_day.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetprof-storage-") as tmpdir:
        if args.reuse is not None:
            store, made = open_store(f"chdb://{args.reuse / 'chdb'}", "bench"), {"reused": str(args.reuse)}
            if not args.no_migrate:  # a store of an older schema gets the newer migrations (0016 fills its aggregates)
                store.migrate()
        else:
            tmp = args.keep or Path(tmpdir)
            tmp.mkdir(parents=True, exist_ok=True)
            store, made = run_pipeline(tmp, args.nodes, args.windows, 152.0)
        try:
            parts, span = measure(store)
        finally:
            store.close()
    span_s = (span["last_window"] - span["first_window"]).total_seconds() + 10
    samples = int(span["cpu_samples"])
    tables = amortize(parts, samples, span_s)
    totals = {k: round(sum(t[k] for t in tables.values()), 4)
              for k in ("per_sample_run", "per_sample_day", "per_sample_30d")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "made": made, "span_s": span_s, "cpu_samples": samples,
              "tables": tables, "totals": totals}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(f"{samples} CPU samples over {span_s:.0f} s")
    print(f"{'table':26} {'rows':>10} {'bytes':>11} {'B/sample run':>13} {'day':>8} {'30 days':>8}")
    for table, t in sorted(tables.items(), key=lambda kv: -kv[1]["per_sample_day"]):
        print(f"{table:26} {t['rows']:>10} {t['bytes']:>11} {t['per_sample_run']:>13.4f} {t['per_sample_day']:>8.4f}"
              f" {t['per_sample_30d']:>8.4f}")
    print(f"{'all':26} {'':>10} {'':>11} {totals['per_sample_run']:>13.4f} {totals['per_sample_day']:>8.4f}"
          f" {totals['per_sample_30d']:>8.4f}")
    hours = {t.replace(minute=0, second=0, microsecond=0) for t in (span["first_window"], span["last_window"])}
    if len(hours) > 1:  # the windows end when the run starts: one started before hh:20 crosses an hour
        print(f"note: the windows span {len(hours)} UTC hours; the hour-first tables (0019) and the hourly rollups "
              f"split every key there, which a day does 24 times, not {len(hours) - 1} in {span_s / 60:.0f} "
              "minutes: the day figures overstate them (start a default run between hh:20 and hh:59)")


if __name__ == "__main__":
    main()
