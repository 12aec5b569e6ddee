"""What the sink's reload of the process names dictionary (migration 0025) costs as process_names grows, next to
the peer it rides with: writing one window's new names (a batch of `--new` rows) into the same table.

    .venv/bin/python bench/process_names_reload.py [--sizes 10000,100000,1000000] [--new 50] [--runs 5]

The sink reloads the whole HASHED dictionary after each batch that wrote names it had not written before, so its
cost per batch grows with the names kept (90 days of processes), not with the batch. A store in a temporary
directory, migrated; process_names filled to each size with distinct 64-digit container ids (the worst case: every
process a new container); then, per size, `--runs` times: insert `--new` new names (timed), reload (timed). Prints
a table and writes bench/out/process_names_reload.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetprof.store import open_store  # noqa: E402
from processors.process_ids import PROCESS_NAME_COLUMNS, process_id  # noqa: E402

FILL = Path(__file__).with_name("sql") / "process_names_fill.sql"


def names(first: int, n: int, seen: datetime) -> list[list]:
    rows = []
    for i in range(first, first + n):
        comm, container, identity = f"worker-{i % 300}", f"{i:064x}", f"{i % 5000:016x}"
        rows.append([process_id(comm, container, identity), comm, container, identity, seen])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000", help="process_names sizes, comma-separated")
    ap.add_argument("--new", type=int, default=50, help="new names written per batch")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "process_names_reload.json")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    seen = datetime.now(tz=UTC).replace(microsecond=0)
    results = []
    with tempfile.TemporaryDirectory(prefix="fleetprof-names-bench-") as tmp:
        store = open_store(f"chdb://{tmp}", "fleetprof")
        try:
            store.migrate()
            held, fresh = 0, 10**9
            for size in sizes:
                store.query_sql(FILL.read_text(), {"first": held, "n": size - held}, readonly=False)
                held = size
                store.reload_process_names()
                inserts, reloads = [], []
                for _ in range(args.runs):
                    batch = names(fresh, args.new, seen)
                    fresh += args.new
                    t0 = time.perf_counter()
                    store.insert("process_names", batch, PROCESS_NAME_COLUMNS)  # the store reloads after it
                    inserts.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    store.reload_process_names()
                    reloads.append(time.perf_counter() - t0)
                _, loaded = store.query_sql("SELECT element_count FROM system.dictionaries "
                                            "WHERE database = currentDatabase() AND name = 'process_names_by_id'")
                row = {"names": size, "loaded": loaded[0][0], "insert_with_reload_s": statistics.median(inserts),
                       "reload_s": statistics.median(reloads)}
                row["insert_alone_s"] = max(0.0, row["insert_with_reload_s"] - row["reload_s"])
                results.append(row)
                print(f"{size:>9,} names ({row['loaded']:,} loaded): reload {row['reload_s'] * 1000:8.1f} ms, "
                      f"insert of {args.new} new names without it {row['insert_alone_s'] * 1000:6.1f} ms "
                      f"(median of {args.runs})", flush=True)
        finally:
            store.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"new": args.new, "runs": args.runs, "results": results}, indent=2))


if __name__ == "__main__":
    main()
