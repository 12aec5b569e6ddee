"""What the queries would pay if the sample tables kept a process id in place of the process's strings (comm,
container_id, identity), the strings stored once per process: the ways to get a name back, against today's
LowCardinality column as the peer, in one chDB session.

    .venv/bin/python bench/process_ids_query.py [--rows 20000000] [--processes 2500] [--reps 3]

A table of `--rows` sample rows over `--processes` processes (300 distinct commands) holds both a LowCardinality comm
(today) and a proc_id; a names table maps proc_id to the strings. Timed, best of --reps: grouping by command and
filtering on one, through the stored column (the peer), a dictionary on the names table (DIRECT: a source query per
block; HASHED and FLAT: loaded in memory), `proc_id IN (SELECT ...)`, and grouping by proc_id first and joining the
names after (DIRECT, ~100x slower than the rest, once). Every way's answer is checked equal to the peer's. Writes
bench/out/process_ids_query.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from chdb import session

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetprof.store import split_statements  # noqa: E402

SETUP = """
CREATE DATABASE IF NOT EXISTS b;
CREATE TABLE b.names (proc_id UInt64, comm String, container_id String, identity String)
ENGINE = ReplacingMergeTree ORDER BY proc_id;
INSERT INTO b.names SELECT number, concat('comm', toString(number % 300)), concat('c', toString(number)),
       concat('pod/', toString(number % 700)) FROM numbers({processes:UInt64});
CREATE DICTIONARY b.names_direct (proc_id UInt64, comm String, container_id String, identity String)
PRIMARY KEY proc_id SOURCE(CLICKHOUSE(TABLE 'names' DB 'b')) LAYOUT(DIRECT());
CREATE DICTIONARY b.names_hashed (proc_id UInt64, comm String, container_id String, identity String)
PRIMARY KEY proc_id SOURCE(CLICKHOUSE(TABLE 'names' DB 'b')) LAYOUT(HASHED()) LIFETIME(MIN 0 MAX 1);
CREATE DICTIONARY b.names_flat (proc_id UInt64, comm String, container_id String, identity String)
PRIMARY KEY proc_id SOURCE(CLICKHOUSE(TABLE 'names' DB 'b')) LAYOUT(FLAT()) LIFETIME(MIN 0 MAX 1);
CREATE TABLE b.samples (ts DateTime, pid UInt32, proc_id UInt64, count UInt64, comm LowCardinality(String))
ENGINE = MergeTree ORDER BY (pid, ts);
INSERT INTO b.samples SELECT toDateTime(1700000000 + number % 86400), (number * 7919) % {processes:UInt64},
       (number * 7919) % {processes:UInt64}, 1 + number % 5,
       concat('comm', toString(((number * 7919) % {processes:UInt64}) % 300))
FROM numbers({rows:UInt64});
"""
GROUP = {  # sample count per command, the busiest first
    "stored LowCardinality comm (peer)": "SELECT comm AS c, sum(count) AS n FROM b.samples GROUP BY c ORDER BY c",
    "dictGet, DIRECT": "SELECT dictGet('b.names_direct', 'comm', proc_id) AS c, sum(count) AS n FROM b.samples "
                       "GROUP BY c ORDER BY c",
    "dictGet, HASHED": "SELECT dictGet('b.names_hashed', 'comm', proc_id) AS c, sum(count) AS n FROM b.samples "
                       "GROUP BY c ORDER BY c",
    "dictGet, FLAT": "SELECT dictGet('b.names_flat', 'comm', proc_id) AS c, sum(count) AS n FROM b.samples "
                     "GROUP BY c ORDER BY c",
    "group by proc_id, join the names": "SELECT m.comm AS c, sum(s.n) AS n FROM (SELECT proc_id, sum(count) AS n "
                                        "FROM b.samples GROUP BY proc_id) AS s JOIN b.names AS m USING proc_id "
                                        "GROUP BY c ORDER BY c",
}
FILTER = {  # the samples of one command
    "stored LowCardinality comm (peer)": "SELECT sum(count) FROM b.samples WHERE comm = 'comm7'",
    "dictGet, DIRECT": "SELECT sum(count) FROM b.samples WHERE dictGet('b.names_direct', 'comm', proc_id) = 'comm7'",
    "dictGet, HASHED": "SELECT sum(count) FROM b.samples WHERE dictGet('b.names_hashed', 'comm', proc_id) = 'comm7'",
    "proc_id IN (names of the command)": "SELECT sum(count) FROM b.samples WHERE proc_id IN "
                                         "(SELECT proc_id FROM b.names WHERE comm = 'comm7')",
}


def timed(s: session.Session, sql: str, reps: int) -> tuple[float, str]:
    best, answer = float("inf"), ""
    for _ in range(reps):
        start = time.perf_counter()
        answer = str(s.query(sql, "CSV"))
        best = min(best, time.perf_counter() - start)
    return best, answer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--processes", type=int, default=2500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "process_ids_query.json")
    args = ap.parse_args()
    s = session.Session()
    s.query("SET use_query_condition_cache = 0")  # else a filter's later repetitions skip the granules it ruled out
    sizes = {"rows": args.rows, "processes": args.processes}
    for statement in split_statements(SETUP):
        s.query(statement, "CSV", params=sizes)
    out: dict[str, dict[str, float]] = {}
    for what, queries in (("group by command", GROUP), ("filter one command", FILTER)):
        _, peer_answer = timed(s, next(iter(queries.values())), 1)  # also warms the table's files
        out[what] = {}
        for name, sql in queries.items():
            spent, answer = timed(s, sql, 1 if "DIRECT" in name else args.reps)  # ~100x the others: once
            if answer != peer_answer:
                raise SystemExit(f"{what}, {name}: a different answer from the stored column's")
            out[what][name] = round(spent, 4)
        peer_s = next(iter(out[what].values()))
        for name, spent in out[what].items():
            print(f"{what:20s} {name:36s} {spent:8.3f} s  {spent / peer_s:7.2f}x the peer", flush=True)
    s.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": args.rows, "processes": args.processes, "seconds": out}, indent=1))


if __name__ == "__main__":
    main()
