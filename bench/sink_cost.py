"""CPU per stored CPU sample of the sink (processors/store_writer.StoreRunner into a real chDB store), split into
the Python thread's own work and chDB's (its calls on that thread plus its pool threads), in simulated time.

    .venv/bin/python bench/sink_cost.py [--nodes 100] [--windows 6] [--input bench/out/sink_input.bin]
                                        [--no-rollups] [--alter SQL] [--alter-file FILE] [--code DIR]

Input: the sink's topics as bench/sink_capture.py captured them from the real pipeline (loadgen → symbolize,
correlate) for a few nodes; node k of the bench replays captured node k mod n under its own name, window w the
captured window w mod n shifted in time (re-encoded before anything is measured). Messages reach the sink's
consumer at simulated times: each node's GpuMetrics once a second, its CpuSamples and GpuSamples spread over
0.3-1.6 s after their window's end (loadgen sends the nodes in turn, then the symbolizer's and correlator's
transactions), partitioned by key as Kafka does. The consumer is a stand-in that hands those messages out as the
simulated clock reaches them (the runner's timer reads the same clock), so flushes fall as in real time while
the run takes only the CPU it costs. Not measured: fetching from a broker (a plain consumer's share, see
bench/fleet.py's peer) and the offset commits' round trips.

Prints, per run: CPU samples stored, µs CPU per sample for the sink thread's Python, chDB on that thread (time
inside the engine's query calls; also per statement: `INSERT INTO <table>` and the like), chDB's other threads, and
all of them; ms per node-second; batches and inserts;
the sink's share of latency (a CpuSamples message's arrival to its batch written, simulated seconds, p50/p95),
and its window's end to written (arrival there is 0.3-1.65 s after the end: the upstream part, simulated).
--code DIR runs another checkout's processors and fleetprof packages (A/B against a base).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import sys
import tempfile
import threading
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TICK = 100  # os.sysconf("SC_CLK_TCK") on Linux


class SimClock:
    """`time` as processors.store_writer sees it: monotonic() is the simulated clock, the rest is real."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


class Raw:
    """What confluent_kafka's Message offers the runner."""

    __slots__ = ("_key", "_offset", "_partition", "_topic", "_value", "arrival")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes, arrival: float):
        self._topic, self._partition, self._offset, self._key, self._value = topic, partition, offset, key, value
        self.arrival = arrival

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def error(self) -> None:
        return None


class SimConsumer:
    """Hands out messages in arrival order as the simulated clock reaches them; a poll waits
    (in simulated time) until its batch is full or its timeout has passed."""

    def __init__(self, clock: SimClock, messages: list[Raw]) -> None:
        self.clock, self.messages, self.at = clock, messages, 0
        self.committed: dict[tuple[str, int], int] = {}
        self.commits = 0

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Raw]:
        """As librdkafka's batch consume: returns once `num_messages` are there or `timeout` has passed."""
        end = self.clock.now + timeout
        out = []
        while self.at < len(self.messages) and len(out) < num_messages and self.messages[self.at].arrival <= end:
            out.append(self.messages[self.at])
            self.at += 1
        self.clock.now = max(self.clock.now, out[-1].arrival) if len(out) == num_messages else end
        return out

    def commit(self, offsets=None, asynchronous: bool = True) -> None:
        self.commits += 1
        for tp in offsets or []:
            self.committed[(tp.topic, tp.partition)] = tp.offset

    def subscribe(self, *args, **kwargs) -> None:
        pass

    def close(self) -> None:
        pass

    @property
    def done(self) -> bool:
        return self.at >= len(self.messages)


def build_input(path: Path, nodes: int, windows: int, seed: int = 1) -> tuple[list[Raw], int, dict]:
    """The bench's messages with their arrival times, the CPU samples they hold, and the count per topic."""
    from schemas import single_object, topics

    cap = pickle.loads(path.read_bytes())
    rng = random.Random(seed)
    by_node: dict[str, dict[str, list[dict]]] = {}
    decoded = []
    for topic, _p, key, value in cap["messages"]:
        name, rec = single_object.decode(value)
        decoded.append((topic, key, name, rec))
        by_node.setdefault(rec.get("node", ""), {}).setdefault(topic, []).append(rec)
    src_nodes = sorted(n for n in by_node if n)
    starts = sorted({r["window_start_ns"] for t, _, _, r in decoded if t == "cpu.samples"})
    window_ns = 10_000_000_000
    # every time moved so the run's last window ends about now: the captured windows are days old, beyond the 1 s
    # NVML tier's 6 h TTL, whose parts would be dropped during a long run instead of merged as a live sink's are
    rebase = (time.time_ns() - windows * window_ns) // window_ns * window_ns - starts[0]
    first = starts[0] + rebase
    out: list[tuple[float, str, bytes | None, bytes]] = []
    samples = 0
    for topic, key, name, rec in decoded:  # identities: once, before anything else
        if topic == "identities":
            out.append((0.0, topic, key, value_of(name, rec)))
    for k in range(nodes):
        src = src_nodes[k % len(src_nodes)]
        node = f"bench-node-{k:05d}"
        for w in range(windows):
            sw = w % len(starts)
            shift = (w - sw) * window_ns + rebase
            win_end = (w + 1) * 10.0
            for topic in ("cpu.samples", "gpu.samples"):
                for rec in by_node[src].get(topic, []):
                    if rec["window_start_ns"] != starts[sw]:
                        continue
                    r = dict(rec, node=node, window_start_ns=rec["window_start_ns"] + shift)
                    if w >= len(starts):  # definitions went out with the first windows
                        r["frames"], r["stacks"] = [], []
                    if "timeline" in r:
                        r["timeline"] = [dict(t, start_ns=t["start_ns"] + shift, end_ns=t["end_ns"] + shift)
                                         for t in r["timeline"]]
                    if topic == "cpu.samples":
                        samples += sum(s["count"] for s in r["samples"])
                    out.append((win_end + 0.3 + 1.3 * k / nodes + rng.random() * 0.05, topic, node.encode(),
                                value_of(name_of(topic), r)))
            metrics = by_node[src]["gpu.metrics"]
            for s in range(10):
                rec = metrics[(sw * 10 + s) % len(metrics)]
                t_ns = first + w * window_ns + s * 1_000_000_000
                out.append((w * 10.0 + s + rng.random(), "gpu.metrics", node.encode(),
                            value_of("GpuMetrics", dict(rec, node=node, time_ns=t_ns))))
    out.sort(key=lambda m: m[0])
    offsets: dict[tuple[str, int], int] = {}
    raws = []
    per_topic: dict[str, int] = {}
    for arrival, topic, key, value in out:
        part = zlib.crc32(key or b"") % topics.BY_NAME[topic].partitions
        off = offsets.get((topic, part), 0)
        offsets[(topic, part)] = off + 1
        raws.append(Raw(topic, part, off, key, value, 1000.0 + arrival))
        per_topic[topic] = per_topic.get(topic, 0) + 1
    return raws, samples, per_topic


def name_of(topic: str) -> str:
    return {"cpu.samples": "CpuSamples", "gpu.samples": "GpuSamples", "gpu.metrics": "GpuMetrics"}[topic]


def value_of(name: str, rec: dict) -> bytes:
    from schemas import single_object
    return single_object.encode(name.rsplit(".", 1)[-1], rec)


def thread_cpu() -> dict[tuple[int, str], float]:
    """CPU seconds of every thread of this process, by (thread id, name)."""
    out: dict[tuple[int, str], float] = {}
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        out[(int(stat.parent.name), name)] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def run(args: argparse.Namespace, raws: list[Raw], samples: int, keep: Path | None = None) -> dict:
    """One run; `keep`: a directory the store is left in (chdb://keep/chdb, database bench) instead of removed."""
    from clickhouse_connect.driver._backend import chdb_backend

    import processors.store_writer as sw
    from fleetprof.store import open_store
    from processors.gc_policy import tune_collector

    engine = {"s": 0.0, "calls": 0}
    by_statement: dict[str, list[float]] = {}  # "INSERT INTO <table>" or the statement's first words: [s, calls]
    original = chdb_backend.ChdbBackend._query_locked

    def timed(self, sql, *a, **kw):  # chDB's work on the calling thread
        if threading.current_thread().name != "sink":
            return original(self, sql, *a, **kw)
        t = time.thread_time()
        try:
            return original(self, sql, *a, **kw)
        finally:
            spent = time.thread_time() - t
            engine["s"] += spent
            engine["calls"] += 1
            text = sql.decode(errors="replace") if isinstance(sql, bytes) else str(sql)
            key = " ".join(text.split()[:3]).strip("`")
            entry = by_statement.setdefault(key, [0.0, 0])
            entry[0] += spent
            entry[1] += 1

    chdb_backend.ChdbBackend._query_locked = timed
    clock = SimClock()
    sw.time = clock
    tmp = keep or Path(tempfile.mkdtemp(prefix="fleetprof-sinkcost-"))
    store = open_store(f"chdb://{tmp / 'chdb'}", "bench")
    result: dict = {}
    try:
        store.migrate()
        if args.no_rollups:
            for statement in ("DROP VIEW IF EXISTS cpu_samples_1h_mv", "DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv"):
                store.query_sql(statement, readonly=False)
        for statement in args.alter:  # a variant of the schema or its settings, to measure before migrating to it
            store.query_sql(statement, readonly=False)
        try:  # clickhouse-connect imports pandas at its first insert: not the sink's cost per sample
            import pandas  # noqa: F401
        except ImportError:
            pass
        store.insert("sink_state", [["bench.warmup", 0, 0, 0, "AFTER", datetime.now(tz=UTC)]],
                     ["topic", "partition", "min_offset", "max_offset", "state", "updated"])
        consumer = SimConsumer(clock, raws)
        extra = {} if args.flush_interval is None else {"flush_interval": args.flush_interval}
        if args.max_delay is not None:
            extra["max_delay"] = args.max_delay
        if getattr(args, "batch_mib", None) is not None:
            extra["batch_bytes"] = args.batch_mib << 20
        runner = sw.StoreRunner(store, {"bootstrap.servers": "127.0.0.1:1"}, **extra)
        tune_collector()  # as the runner's start() does (not called here: the consumer is a stand-in)
        runner.consumer.close()
        runner.consumer = consumer
        written: dict[tuple[str, int, int], float] = {}
        write = runner._write
        bookkeeping = {"s": 0.0}  # this harness's own CPU on the sink thread: not the sink's

        def record(*a, **kw):  # when each CpuSamples message's batch is written (simulated)
            write(*a, **kw)
            t = time.thread_time()
            msgs = [m for raws in a[0].values() for m in raws] if isinstance(a[0], dict) else a[1]
            for m in msgs:
                if m.topic() == "cpu.samples":
                    window_end = 1000.0 + (m.arrival - 1000.0) // 10 * 10  # arrivals: 0.3-1.65 s after it
                    written[(m.topic(), m.partition(), m.offset())] = (clock.now - m.arrival, clock.now - window_end)
            bookkeeping["s"] += time.thread_time() - t

        runner._write = record
        box: list = []

        def drive() -> None:
            before = thread_cpu()
            t0 = time.thread_time()
            while not consumer.done:
                runner.run_once()
            for _ in range(50):  # let the last timers run out
                runner.run_once()
            runner.flush_all()
            box.append((time.thread_time() - t0 - bookkeeping["s"], before, threading.get_native_id()))

        th = threading.Thread(target=drive, name="sink")
        th.start()
        th.join()
        sink_s, before, sink_tid = box[0]
        after = thread_cpu()
        others: dict[str, float] = {}
        for (tid, name), v in after.items():
            if tid != sink_tid:
                key = "main" if tid == os.getpid() else name
                others[key] = others.get(key, 0.0) + v - before.get((tid, name), 0.0)
        rdk = sum(v for k, v in others.items() if k.startswith("rdk:"))
        main = others.pop("main", 0.0)
        pool = sum(v for k, v in others.items() if not k.startswith("rdk:"))
        _, rows = store.query_sql("SELECT sum(count) FROM cpu_samples")
        stored = int(rows[0][0] or 0)
        lat = sorted(w for w, _ in written.values())
        after_end = sorted(e for _, e in written.values())
        py = sink_s - engine["s"]
        result = {
            "nodes": args.nodes, "windows": args.windows, "rollups": not args.no_rollups,
            "samples_sent": samples, "samples_stored": stored, "batches": runner.batches,
            "engine_calls": engine["calls"], "merges": merge_report(store),
            "us_per_sample": {"python": round(py / stored * 1e6, 3),
                              "engine_sink_thread": round(engine["s"] / stored * 1e6, 3),
                              "engine_pool": round(pool / stored * 1e6, 3),
                              "all": round((sink_s + pool) / stored * 1e6, 3)},
            "ms_per_node_s": round((sink_s + pool) / (args.nodes * args.windows * 10) * 1e3, 3),
            "cpu_s": {"sink_thread": round(sink_s, 2), "bench_bookkeeping": round(bookkeeping["s"], 2),
                      "engine_in_sink_thread": round(engine["s"], 2),
                      "pool": round(pool, 2), "rdkafka_idle": round(rdk, 2), "main_idle": round(main, 2)},
            "engine_sink_thread_by_statement": {  # µs per stored CPU sample, and calls
                k: [round(v / stored * 1e6, 3), c]
                for k, (v, c) in sorted(by_statement.items(), key=lambda kv: -kv[1][0]) if v / stored * 1e6 >= 0.005},
            "top_pool_threads": dict(sorted(((k, round(v, 2)) for k, v in others.items() if v > 0.05),
                                            key=lambda kv: -kv[1])[:8]),
            "sink_latency_s": {"p50": round(lat[len(lat) // 2], 3), "p95": round(lat[int(len(lat) * 0.95)], 3),
                               "max": round(lat[-1], 3)} if lat else None,
            "window_end_to_written_s": {"p50": round(after_end[len(after_end) // 2], 3),
                                        "p95": round(after_end[int(len(after_end) * 0.95)], 3),
                                        "max": round(after_end[-1], 3)} if after_end else None,
        }
    finally:
        store.close()
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def merge_report(store) -> dict:
    """The engine's merge counters, and per table its active parts and rows × level (how often its rows were merged
    again, roughly: a merged part's level is one more than its sources' highest): chDB keeps no part_log."""
    _, events = store.query_sql("SELECT event, value FROM system.events WHERE event IN ('Merge', 'MergedRows', "
                                "'MergedUncompressedBytes', 'MergesTimeMilliseconds', 'InsertedRows')")
    _, tables = store.query_sql("SELECT table, count(), sum(rows), max(level), sum(rows * level) FROM system.parts "
                                "WHERE active AND database = currentDatabase() GROUP BY table "
                                "ORDER BY sum(rows * level) DESC")
    return {"events": dict(events),
            "tables": {t: {"parts": n, "rows": r, "max_level": lv, "rows_x_level": rl} for t, n, r, lv, rl in tables}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=6)
    ap.add_argument("--input", type=Path, default=ROOT / "bench" / "out" / "sink_input.bin")
    ap.add_argument("--no-rollups", action="store_true", help="drop the hourly rollups' materialized views first")
    ap.add_argument("--flush-interval", type=float, default=None, help="the runner's flush_interval (its default)")
    ap.add_argument("--max-delay", type=float, default=None, help="the runner's max_delay (its default)")
    ap.add_argument("--batch-mib", type=int, default=None, help="the runner's batch_bytes in MiB (its default)")
    ap.add_argument("--alter", action="append", default=[], metavar="SQL",
                    help="a statement run after the migrations (a table setting or codec to try); repeatable")
    ap.add_argument("--alter-file", type=Path, action="append", default=[], metavar="SQL_FILE",
                    help="statements to run after the migrations, split as a migration file is (a layout to try, "
                         "before a migration is written); repeatable, after --alter")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose sink and store run")
    args = ap.parse_args()
    sys.path.insert(0, str(args.code.resolve()))  # before any import of the project: the checkout that runs
    from fleetprof.store import split_statements  # the migrations' own splitter, from that checkout

    args.alter += [statement for path in args.alter_file for statement in split_statements(path.read_text())]
    raws, samples, per_topic = build_input(args.input, args.nodes, args.windows)
    result = run(args, raws, samples)
    result["code"] = str(args.code)
    result["messages"] = per_topic
    print(json.dumps(result))


if __name__ == "__main__":
    main()
