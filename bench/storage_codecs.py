"""Bytes a row of each column would take under other codecs, on a store that bench/storage_day.py kept: each
candidate codec given to every column of a copy of the table, the table's rows copied into it and merged
(OPTIMIZE ... FINAL), system.columns read. How migration 0026's codecs were chosen.

    .venv/bin/python bench/storage_codecs.py --reuse DIR [--table cpu_samples ...] [--codec "T64, ZSTD(1)" ...]

Prints, per table and column: bytes per row now, under each candidate (ERR where the codec does not apply to the
column's type) and the smallest; then what the smallest of each column would save per CPU sample of the store
(bytes per row x rows / CPU samples, over the run: bench/storage_day.py scales tables to a day). Writes
bench/out/storage_codecs.json.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_query import sql  # noqa: E402
from fleetprof.store import Store, open_store  # noqa: E402

TABLES = ("cpu_samples", "gpu_kernel_samples", "gpu_timeline", "gpu_device_metrics", "gpu_process_metrics",
          "gpu_device_metrics_10s", "gpu_process_metrics_10s")
CODECS = ("ZSTD(1)", "T64, ZSTD(1)", "Delta, ZSTD(1)", "GCD, T64, ZSTD(1)", "Delta, T64, ZSTD(1)",
          "GCD, Delta, T64, ZSTD(1)", "DoubleDelta, ZSTD(1)", "ZSTD(3)")
# types not tried: strings go through their own dictionaries, not these codecs; an argMax state is opaque bytes
_SKIP = ("LowCardinality", "String", "Enum", "Bool", "AggregateFunction(argMax")


def columns(store: Store, table: str) -> list[tuple[str, str, str, int]]:
    return [tuple(r) for r in store.query_sql(sql("storage_codecs_columns"), {"table": table})[1]]


def tried(type_: str) -> bool:
    return not any(k in type_ for k in _SKIP)


def sweep(store: Store, table: str, codecs: tuple[str, ...]) -> dict[str, dict[str, float | str]]:
    """Per column: bytes per row under its codec now ('now', in a copy of wide parts too) and under each candidate."""
    if not re.fullmatch(r"\w+", table):
        raise SystemExit(f"not a table name: {table!r}")
    rows = int(store.query_sql("SELECT count() FROM {t:Identifier}", {"t": table})[1][0][0])
    out = {name: {"codec": codec} for name, type_, codec, _ in columns(store, table) if tried(type_)}
    copy = f"{table}_codec_sweep"
    for codec in ("now", *codecs):
        store.query_sql("DROP TABLE IF EXISTS {t:Identifier}", {"t": copy}, readonly=False)
        # names and codecs are the bench's own text (its tables, candidates or --codec), formatted in: CREATE ... AS
        # and MODIFY COLUMN take no bound identifiers
        create = sql("storage_codecs_copy").format(copy=copy, table=table)
        store.query_sql(create, readonly=False)
        store.query_sql("ALTER TABLE {t:Identifier} MODIFY SETTING min_bytes_for_wide_part = 0, "
                        "min_rows_for_wide_part = 0", {"t": copy}, readonly=False)
        for name in out if codec != "now" else ():
            alter = sql("storage_codecs_codec").format(copy=copy, column=name, codec=codec)
            try:
                store.query_sql(alter, readonly=False)
            except Exception:  # noqa: BLE001 - a codec the type does not take (T64 of a float, Delta of a tuple)
                out[name][codec] = "ERR"
        store.query_sql(sql("storage_codecs_fill"), {"copy": copy, "table": table}, readonly=False)
        store.query_sql(sql("fleet_optimize"), {"table": copy}, readonly=False)
        for name, _, _, size in columns(store, copy):
            if name in out and codec not in out[name]:
                out[name][codec] = round(size / rows, 3)
        store.query_sql("DROP TABLE {t:Identifier}", {"t": copy}, readonly=False)
    for cell in out.values():
        cell["rows"] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reuse", type=Path, required=True, help="a store bench/storage_day.py --keep left here")
    ap.add_argument("--table", action="append", default=None, help=f"tables to sweep (default: {', '.join(TABLES)})")
    ap.add_argument("--codec", action="append", default=None, help="candidate codecs (default: eight common ones)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "storage_codecs.json")
    args = ap.parse_args()
    codecs = tuple(args.codec or CODECS)
    if not all(re.fullmatch(r"[\w(), ]+", codec) for codec in codecs):
        raise SystemExit("a codec is names, numbers, commas and parentheses: ZSTD(1), T64, Delta(4), ...")
    store = open_store(f"chdb://{args.reuse / 'chdb'}", "bench")
    try:
        samples = int(store.query_sql("SELECT sum(count) FROM cpu_samples")[1][0][0])
        result = {table: sweep(store, table, codecs) for table in (args.table or TABLES)}
    finally:
        store.close()
    saved = 0.0
    for table, cells in result.items():
        print(f"\n{table}: bytes per row ({next(iter(cells.values()))['rows']} rows)")
        print(f"  {'column':22} {'now':>7}  " + "  ".join(f"{c:>14.14}" for c in codecs) + "  smallest")
        for name, cell in cells.items():
            sizes = {c: cell[c] for c in codecs if isinstance(cell.get(c), float)}
            best = min(sizes, key=sizes.get) if sizes else None
            if best is None or sizes[best] >= cell["now"]:
                best = "now"
            else:
                saved += (cell["now"] - sizes[best]) * cell["rows"] / samples
            print(f"  {name:22} {cell['now']:>7}  " + "  ".join(f"{cell.get(c, ''):>14}" for c in codecs)
                  + f"  {best}")
    print(f"\nthe smallest codec of every column: -{saved:.4f} bytes per CPU sample of this store's run "
          f"({samples} CPU samples)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cpu_samples": samples, "codecs": codecs, "tables": result}, indent=2))


if __name__ == "__main__":
    main()
