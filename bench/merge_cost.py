"""The engine's CPU to merge each table's parts as the sink writes them, and the CPU rollup's merges under other
sorting keys: which merges a stored CPU sample pays for, measured one table at a time.

    .venv/bin/python bench/merge_cost.py [--windows 60] [--reps 3] [--keys current,stack_first,hashed]
                                         [--layouts current,strings_out_of_key,process_ids,...]

A bench/sink_cost.py run (100 nodes, the captured sink input) with every merge stopped leaves one part per window in
each table; then each table's parts are merged by OPTIMIZE ... FINAL, one table at a time, and the process's CPU
meanwhile is that merge's cost (µs per row in, and per stored CPU sample). --keys: the rollup's rows again, one part
per window as its view wrote them (bench/sql/merge_cost_rollup_insert.sql), into a copy of cpu_samples_1h (its own
SHOW CREATE TABLE) under each named sorting key, merged the same way, --reps times in a rotating order (against
the machine's drift); the sums per full key are checked equal across keys. --layouts: the same for cpu_samples'
rows under other columns and keys (LAYOUTS below: how much of a merge its string columns cost). One OPTIMIZE merges
all of a table's parts at once, where the background merges take ~10-20 at a time and again at the next level: compare
keys and tables with it, not with the pool's figures. Writes bench/out/merge_cost.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sink_cost import build_input, run  # noqa: E402
from fleetprof.store import open_store  # noqa: E402

SQL = ROOT / "bench" / "sql"
KEYS = {  # the CPU rollup's sorting keys to compare; "current" is read from the store
    "stack_first": "(node, hour, pid, stack_id, comm, container_id, identity)",
    "hashed": "(node, hour, pid, stack_id, cityHash64(comm, container_id, identity))",
}
SAMPLE_COLUMNS = ("ts DateTime CODEC(Delta, ZSTD(1)), node LowCardinality(String) CODEC(ZSTD(1)), "
                  "pid UInt32 CODEC(T64, ZSTD(1)), stack_id UInt64 CODEC(ZSTD(1)), count UInt64 CODEC(T64, ZSTD(1))")


def strings(kind: str) -> str:
    """The three process strings' column definitions, of type `kind`."""
    return ", ".join(f"{c} {kind} CODEC(ZSTD(1))" for c in ("comm", "container_id", "identity"))


NAMED = "ts, node, pid, stack_id, count, comm, container_id, identity"  # the layouts' column order
LAYOUTS = {  # cpu_samples under other columns and keys: (columns, sorting key, select list); "current" is the table's
    "strings_out_of_key": (f"{SAMPLE_COLUMNS}, {strings('LowCardinality(String)')}",
                           "(node, toStartOfHour(ts), pid, stack_id, ts)", NAMED),
    "plain_strings": (f"{SAMPLE_COLUMNS}, {strings('String')}",
                      "(node, toStartOfHour(ts), pid, stack_id, comm, container_id, identity, ts)", NAMED),
    "process_ids": (f"{SAMPLE_COLUMNS}, proc_id UInt64 CODEC(ZSTD(1))", "(node, toStartOfHour(ts), pid, stack_id, ts)",
                    "ts, node, pid, stack_id, count, cityHash64(comm, container_id, identity) AS proc_id"),
    "process_and_node_ids": (f"{SAMPLE_COLUMNS.replace('node LowCardinality(String) CODEC(ZSTD(1))', 'node UInt32')}"
                             ", proc_id UInt64 CODEC(ZSTD(1))", "(node, toStartOfHour(ts), pid, stack_id, ts)",
                             "ts, toUInt32(cityHash64(node) % 1000000) AS node, pid, stack_id, count, "
                             "cityHash64(comm, container_id, identity) AS proc_id"),
}
CHECK = ("SELECT sum(c), count(), sum(cityHash64(node, hour, pid, comm, container_id, stack_id, identity, c)) FROM "
         "(SELECT node, hour, pid, comm, container_id, stack_id, identity, sum(count) AS c FROM rollup_variant "
         "GROUP BY ALL)")


def stop_merges(store) -> None:
    """No merge runs but the one measured: a store opened again merges again (SYSTEM STOP MERGES lasts a session)."""
    store.query_sql("SYSTEM STOP MERGES", readonly=False)
    while store.query_sql("SELECT count() FROM system.merges")[1][0][0]:
        time.sleep(0.2)


def optimize(store, table: str) -> float:
    """The process's CPU seconds over one OPTIMIZE ... FINAL of `table`, nothing else merging (the merge runs on the
    engine's threads, not only the caller's)."""
    store.query_sql("SYSTEM START MERGES {t:Identifier}", {"t": table}, readonly=False)
    before = time.process_time()  # every thread of the process
    store.query_sql("OPTIMIZE TABLE {t:Identifier} FINAL", {"t": table}, readonly=False)
    spent = time.process_time() - before
    store.query_sql("SYSTEM STOP MERGES {t:Identifier}", {"t": table}, readonly=False)
    return spent


def parts_of(store, table: str) -> tuple[int, int, int]:
    _, rows = store.query_sql("SELECT count(), sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND "
                              "database = currentDatabase() AND table = {t:String}", {"t": table})
    return tuple(int(v or 0) for v in rows[0])


def table_merges(store, stored: int) -> dict[str, dict]:
    _, tables = store.query_sql("SELECT table FROM system.parts WHERE active AND database = currentDatabase() "
                                "GROUP BY table HAVING count() > 1 ORDER BY sum(rows) DESC")
    out = {}
    for (table,) in tables:
        parts, rows, size = parts_of(store, table)
        cpu = optimize(store, table)
        out[table] = {"parts": parts, "rows": rows, "bytes": size, "cpu_s": round(cpu, 3),
                      "us_per_row": round(cpu / rows * 1e6, 3), "us_per_stored_sample": round(cpu / stored * 1e6, 3)}
    return out


def rollup_copy(ddl: str, key: str) -> str:
    """`ddl` (cpu_samples_1h's SHOW CREATE TABLE) made CREATE TABLE rollup_variant sorted by `key`, its primary key
    the same."""
    ddl = re.sub(r"^CREATE TABLE \S+", "CREATE TABLE rollup_variant", ddl)
    ddl = re.sub(r"^PRIMARY KEY .*\n", "", ddl, flags=re.MULTILINE)
    return re.sub(r"^ORDER BY .*$", f"ORDER BY {key}", ddl, flags=re.MULTILINE)


def rotations(names: list[str], reps: int):
    """(rep, names) for each rep, the order rotated by one each time (against the machine's drift)."""
    for rep in range(reps):
        yield rep, names[rep % len(names):] + names[:rep % len(names)]


def copy_and_merge(store, table: str, create: str, insert: str, windows: list) -> tuple[int, int, float]:
    """`table` made anew by `create`, filled one part per window by `insert` (merges stopped), then merged by one
    OPTIMIZE ... FINAL: (parts, rows in, CPU seconds of the merge)."""
    store.query_sql("DROP TABLE IF EXISTS {t:Identifier} SYNC", {"t": table}, readonly=False)
    store.query_sql(create, readonly=False)
    store.query_sql("SYSTEM STOP MERGES {t:Identifier}", {"t": table}, readonly=False)
    for (ts,) in windows:
        store.query_sql(insert, {"ts": ts}, readonly=False)
    parts, rows_in, _ = parts_of(store, table)
    return parts, rows_in, optimize(store, table)


def rollup_keys(store, names: list[str], reps: int) -> dict[str, list[dict]]:
    _, current = store.query_sql("SELECT sorting_key FROM system.tables WHERE database = currentDatabase() AND "
                                 "name = 'cpu_samples_1h'")
    keys = {"current": f"({current[0][0]})", **KEYS}
    ddl = store.query_sql("SHOW CREATE TABLE cpu_samples_1h")[1][0][0]
    _, windows = store.query_sql("SELECT DISTINCT ts FROM cpu_samples ORDER BY ts")
    insert_sql = (SQL / "merge_cost_rollup_insert.sql").read_text()
    out: dict[str, list[dict]] = {name: [] for name in names}
    for rep, order in rotations(names, reps):
        for name in order:
            parts, rows_in, cpu = copy_and_merge(store, "rollup_variant", rollup_copy(ddl, keys[name]), insert_sql,
                                                 windows)
            _, rows_out, size = parts_of(store, "rollup_variant")
            check = [int(v) for v in store.query_sql(CHECK)[1][0]]
            out[name].append({"parts": parts, "rows_in": rows_in, "rows_out": rows_out, "bytes": size,
                              "cpu_s": round(cpu, 3), "us_per_row_in": round(cpu / rows_in * 1e6, 3), "check": check})
            print(f"rep {rep} {name:12s} {rows_in:,} rows in {parts} parts -> {rows_out:,} rows, {size:,} bytes: "
                  f"{cpu:.2f} s, {cpu / rows_in * 1e6:.3f} µs per row in", flush=True)
    checks = {json.dumps(r["check"]) for runs in out.values() for r in runs}
    if len(checks) != 1:
        raise SystemExit(f"the keys gave different sums: {sorted(checks)}")
    return out


def sample_layouts(store, names: list[str], reps: int) -> dict[str, list[dict]]:
    """cpu_samples' rows, one part per window as the sink wrote them, into a table per layout, each merged by one
    OPTIMIZE ... FINAL, `reps` times in a rotating order; the stored counts are checked equal across layouts."""
    ddl = store.query_sql("SHOW CREATE TABLE cpu_samples")[1][0][0]
    _, windows = store.query_sql("SELECT DISTINCT ts FROM cpu_samples ORDER BY ts")
    out: dict[str, list[dict]] = {name: [] for name in names}
    for rep, order in rotations(names, reps):
        for name in order:
            if name == "current":
                create = re.sub(r"^CREATE TABLE \S+", "CREATE TABLE layout_variant", ddl)
                select = "*"
            else:  # the layouts' own expressions, not values: they cannot be bound
                columns, key, select = LAYOUTS[name]
                create = (SQL / "merge_cost_layout_table.sql").read_text().format(columns=columns, key=key)
            insert = (SQL / "merge_cost_layout_insert.sql").read_text().format(select=select)
            parts, rows, cpu = copy_and_merge(store, "layout_variant", create, insert, windows)
            _, _, size = parts_of(store, "layout_variant")
            total = int(store.query_sql("SELECT sum(count) FROM layout_variant")[1][0][0])
            out[name].append({"parts": parts, "rows": rows, "bytes": size, "cpu_s": round(cpu, 3),
                              "us_per_row": round(cpu / rows * 1e6, 3), "samples": total})
            print(f"rep {rep} {name:20s} {rows:,} rows in {parts} parts -> {size:,} bytes: {cpu:.2f} s, "
                  f"{cpu / rows * 1e6:.3f} µs per row", flush=True)
    if len({r["samples"] for runs in out.values() for r in runs}) != 1:
        raise SystemExit("the layouts hold different sample counts")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=60)
    ap.add_argument("--input", type=Path, default=ROOT / "bench" / "out" / "sink_input.bin")
    ap.add_argument("--keys", default="", help=f"comma-separated: current,{','.join(KEYS)} (none: tables only)")
    ap.add_argument("--layouts", default="", help=f"comma-separated: current,{','.join(LAYOUTS)} (cpu_samples' rows)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "merge_cost.json")
    args = ap.parse_args()
    sink_args = argparse.Namespace(nodes=args.nodes, windows=args.windows, no_rollups=False, flush_interval=None,
                                   max_delay=None, alter=["SYSTEM STOP MERGES"])
    raws, samples, _ = build_input(args.input, args.nodes, args.windows)
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-mergecost-"))
    try:
        sink = run(sink_args, raws, samples, keep=tmp)
        stored = sink["samples_stored"]
        store = open_store(f"chdb://{tmp / 'chdb'}", "bench")
        try:
            stop_merges(store)
            names = [k for k in args.keys.split(",") if k]
            variants = rollup_keys(store, names, args.reps) if names else {}  # before the tables' own merges
            layout_names = [k for k in args.layouts.split(",") if k]
            layouts = sample_layouts(store, layout_names, args.reps) if layout_names else {}
            tables = table_merges(store, stored)
        finally:
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{args.nodes} nodes x {args.windows} windows, {stored:,} CPU samples stored; OPTIMIZE FINAL per table:")
    for table, t in tables.items():
        print(f"  {table:26s} {t['parts']:4d} parts {t['rows']:10,} rows {t['cpu_s']:7.2f} s "
              f"{t['us_per_row']:7.3f} µs/row {t['us_per_stored_sample']:6.3f} µs per stored CPU sample")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"nodes": args.nodes, "windows": args.windows, "samples_stored": stored,
                                    "tables": tables, "rollup_keys": variants, "sample_layouts": layouts}, indent=1))


if __name__ == "__main__":
    main()
