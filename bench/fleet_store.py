"""The store process of bench/fleet.py: the sink (processors.store_writer.StoreRunner, as `fleetprof process sink`
and `fleetprof up` run it) and a poller on the same chDB store, in one process because chDB allows one process per
data directory.

    python bench/fleet_store.py DIR --expected 1520 --nodes 1000 [--database bench] [--poll 1.0]

Kafka from FLEETPROF_KAFKA. Writes into DIR: `ready` once migrated and subscribed; `visible.jsonl`, one line per
(node, window) when its CPU samples are all queryable ([node, window start s, poll start s, previous poll start s]);
`progress.jsonl`, one line per poll (time, samples stored, query seconds); on SIGTERM it stops the sink, records
its CPU, merges every table (OPTIMIZE FINAL) and writes `store.json` (bytes on disk per table, what is stored, CPU
of the sink and poller threads and of the whole process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.sink_cost import thread_cpu  # noqa: E402
from fleetprof.store import open_store  # noqa: E402
from processors.store_writer import StoreRunner  # noqa: E402

SQL = Path(__file__).resolve().parent / "sql"
TICK = os.sysconf("SC_CLK_TCK")


def sql(name: str) -> str:
    return (SQL / f"{name}.sql").read_text()


def cpu_seconds(stat: Path) -> float:
    """utime + stime of a /proc/.../stat file (the fields after the parenthesized command name)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def threads_by_name() -> dict[str, float]:
    """CPU seconds of this process's live threads summed by name (librdkafka's rdk:*, chDB's pools, the sink), and
    under "(exited threads)" what threads that ended took: where the store process's CPU goes."""
    by_name: dict[str, float] = {}
    for (_, name), seconds in thread_cpu().items():
        by_name[name] = by_name.get(name, 0.0) + seconds
    by_name["(exited threads)"] = cpu_seconds(Path("/proc/self/stat")) - sum(by_name.values())
    return dict(sorted(((k, round(v, 2)) for k, v in by_name.items() if v >= 0.05), key=lambda kv: -kv[1]))


class Poller:
    """Polls the store for complete (node, window) CPU samples and records when each first became visible.

    A node's window is complete when its stored samples reach `expected`. Only windows from the oldest one not yet
    complete for every node are queried, so a poll reads a few windows, not the whole table."""

    def __init__(self, store, expected: int, nodes: int, interval: float, out: Path) -> None:
        self.store, self.expected, self.n_nodes, self.interval = store, expected, nodes, interval
        self.visible = open(out / "visible.jsonl", "a")  # noqa: SIM115 - open for the poller's life
        self.progress = open(out / "progress.jsonl", "a")  # noqa: SIM115
        self.complete: dict[int, set[str]] = {}  # window start s -> nodes complete
        self.done_samples = 0  # samples of complete node-windows below the floor
        self.floor = 0  # window start s: every node-window before it is complete
        self.cpu_s: float | None = None  # the poller thread's own CPU, when it stops

    def run(self, stop: threading.Event) -> None:
        try:
            self._poll(stop)
        finally:
            self.cpu_s = time.thread_time()

    def _poll(self, stop: threading.Event) -> None:
        previous = time.time()
        while not stop.wait(self.interval):
            started = time.time()
            _, rows = self.store.query_sql(sql("fleet_window_counts"),
                                           {"since": datetime.fromtimestamp(self.floor, tz=UTC)})
            query_s = time.time() - started
            partial = 0
            for node, window_s, samples in rows:
                done = self.complete.setdefault(window_s, set())
                if node in done:
                    partial += samples
                    continue
                if samples >= self.expected:
                    done.add(node)
                    self.visible.write(json.dumps([node, window_s, started, previous]) + "\n")
                partial += samples
            self.visible.flush()
            while self.complete and len(self.complete[w := min(self.complete)]) >= self.n_nodes:
                self.done_samples += len(self.complete.pop(w)) * self.expected
                self.floor = w + 1
            stored = self.done_samples + sum(s for _, w, s in rows if w >= self.floor)
            self.progress.write(json.dumps({"t": started, "stored": stored, "query_s": round(query_s, 4),
                                            "rows": len(rows)}) + "\n")
            self.progress.flush()
            previous = started


def measure_store(store, database: str) -> dict:
    """Merge every table, then bytes on disk per table and what the store holds."""
    t = time.perf_counter()
    _, tables = store.query_sql(sql("fleet_tables"), {"db": database})
    for (table,) in tables:
        store.query_sql(sql("fleet_optimize"), {"table": table}, readonly=False)
    optimize_s = time.perf_counter() - t
    _, parts = store.query_sql(sql("fleet_parts"), {"db": database})
    cols, stored = store.query_sql(sql("fleet_stored"))
    return {"optimize_s": round(optimize_s, 2),
            "tables": {t: {"bytes": int(b), "rows": int(r), "parts": int(p)} for t, b, r, p in parts},
            "stored": {c: int(v or 0) for c, v in zip(cols, stored[0], strict=True)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--expected", type=int, required=True, help="CPU samples per node and window")
    ap.add_argument("--nodes", type=int, required=True, help="nodes in the simulated fleet")
    ap.add_argument("--database", default="bench")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between polls")
    args = ap.parse_args()

    stop_sink, stop_poll, finish = threading.Event(), threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: finish.set())
    signal.signal(signal.SIGINT, lambda *_: finish.set())
    store = open_store(f"chdb://{args.dir / 'chdb'}", args.database)
    try:
        store.migrate()
        sink = StoreRunner(store, {"bootstrap.servers": os.environ["FLEETPROF_KAFKA"]}, stop=stop_sink)
        sink_cpu: list[float] = []
        failure: list[str] = []

        def run_sink() -> None:
            try:
                sink.run(stop_sink)
            except Exception as exc:  # reported in store.json; the bench then says the sink died
                failure.append(f"{type(exc).__name__}: {exc}")
                finish.set()
            finally:
                sink_cpu.append(time.thread_time())  # this thread's own CPU (chDB's pool threads not included)

        poller = Poller(store, args.expected, args.nodes, args.poll, args.dir)
        threads = [threading.Thread(target=run_sink, name="sink"),
                   threading.Thread(target=poller.run, args=(stop_poll,), name="poller")]
        for th in threads:
            th.start()
        (args.dir / "ready").write_text(str(os.getpid()))
        finish.wait()
        stop_poll.set()
        threads[1].join(30)
        stop_sink.set()
        threads[0].join(120)
        result = {"process_cpu_s": round(cpu_seconds(Path("/proc/self/stat")), 2),
                  "threads_cpu_s": threads_by_name(),
                  "sink_thread_cpu_s": round(sink_cpu[0], 2) if sink_cpu else None,
                  "poller_thread_cpu_s": None if poller.cpu_s is None else round(poller.cpu_s, 2),
                  "sink_batches": sink.batches,
                  "failure": failure[0] if failure else None}
        result.update(measure_store(store, args.database))
        result["process_cpu_with_optimize_s"] = round(cpu_seconds(Path("/proc/self/stat")), 2)
        (args.dir / "store.json").write_text(json.dumps(result, indent=2))
    finally:
        store.close()


if __name__ == "__main__":
    main()
