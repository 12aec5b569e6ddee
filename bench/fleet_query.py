"""Flame-graph query latency over 24 h of a 100-node fleet (goal: at most 1 s), next to two peers in the same run:
the same flame graph read from the 10 s windows alone (the query before the hourly rollup, migration 0010) and the
bare scan-and-sum of those windows (no names, nothing shipped), the floor of any answer from the window table.

    .venv/bin/python bench/fleet_query.py [--nodes 100] [--windows 60] [--hours 24] [--runs 5] [--peer-runs 3]

How the data is made: loadgen sends `--windows` 10 s windows of `--nodes` nodes (CPU stacks at `--rate` samples/s
per node, GPU launches and kernels) through the real broker, symbolizer, correlator and sink into a chDB store in a
temporary directory, exactly as bench/pipeline.py does. The rest of the `--hours` is filled in SQL: the stored CPU
and GPU window rows are copied back in time (bench/sql/fleet_query_copy_*.sql: INSERT ... SELECT with ts shifted by
a multiple of the real span, doubling each step), so every window keeps the real per-window row shape, and the
copies go through the rollup's materialized views as the sink's inserts do. The distinct stacks are those of the
real span. Prints a table and writes bench/out/fleet_query.json.

`run_query_phase(store, since, until, node)` times the queries on any store (bench/fleet.py calls it on its own).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.local_ports import free_ports  # noqa: E402
from fleetprof.store import Store, bind_named, open_store, parse_query  # noqa: E402

SQL = Path(__file__).resolve().parent / "sql"
GOAL_S = 1.0


def sql(name: str) -> str:
    return (SQL / f"{name}.sql").read_text()


def median_time(run: Callable[[], Any], runs: int) -> tuple[float, list[float], Any]:
    """Median seconds of `runs` calls, every call's seconds, and the last call's result. One untimed call first, so
    the first timed one does not pay for loading parts' marks and the query's SQL parsing caches."""
    result = run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, result


def _sorted_rows(rows: list) -> list:
    return sorted((tuple(r[0]), r[1]) for r in rows)


def run_query_phase(store: Store, since: datetime, until: datetime, node: str, runs: int = 5,
                    peer_runs: int = 3, peers: bool = True) -> dict[str, Any]:
    """Median seconds of the flame-graph queries over [since, until) for all nodes and for `node`, and of the peers
    (with `peers`): flamegraph_cpu as the CLI and exports run it; flamegraph_ids_cpu (Arrow) + flamegraph_names_cpu as
    the web UI runs them, together and each; flamegraph_gpu. Checks that flamegraph_cpu equals the window-only peer."""
    windows_peer = parse_query("fleet_query_flamegraph_cpu_windows", sql("fleet_query_flamegraph_cpu_windows"))
    raw_scan = sql("fleet_query_raw_scan")
    out: dict[str, Any] = {"since": since.isoformat(), "until": until.isoformat(), "node": node, "runs": runs,
                           "peer_runs": peer_runs, "goal_s": GOAL_S, "scopes": {}}
    for scope, node_filter in (("all_nodes", ""), ("one_node", node)):
        params = {"since": since, "until": until, "node": node_filter}
        rows: dict[str, Any] = {}
        cases: dict[str, tuple[Callable[[], Any], int]] = {
            "flamegraph_cpu": (lambda p=params: store.query_named("flamegraph_cpu", p)[1], runs),
            "ui_cpu (ids + names)": (lambda p=params: (store.query_named_arrow("flamegraph_ids_cpu", p),
                                                       store.query_named("flamegraph_names_cpu", p)[1]), runs),
            "flamegraph_ids_cpu": (lambda p=params: store.query_named_arrow("flamegraph_ids_cpu", p), runs),
            "flamegraph_names_cpu": (lambda p=params: store.query_named("flamegraph_names_cpu", p)[1], runs),
            "flamegraph_gpu": (lambda p=params: store.query_named("flamegraph_gpu", p)[1], runs),
        }
        if peers:
            cases["peer: flamegraph_cpu from windows only"] = (
                lambda p=params: store.client.query(windows_peer.sql,
                                                    parameters=bind_named(windows_peer, p)).result_rows, peer_runs)
            cases["peer: scan + sum of windows"] = (lambda p=params: store.query_sql(raw_scan, p)[1], peer_runs)
        for name, (call, n) in cases.items():
            median, times, result = median_time(call, n)
            rows[name] = {"median_s": round(median, 3), "times_s": [round(t, 3) for t in times]}
            if name == "flamegraph_cpu":
                fg = result
                rows[name]["result_rows"] = len(result)
                rows[name]["samples"] = sum(int(r[1]) for r in result)
            elif name == "flamegraph_ids_cpu":
                rows[name]["result_rows"] = result.num_rows
            elif name == "flamegraph_gpu":
                rows[name]["result_rows"] = len(result)
                rows[name]["gpu_ns"] = sum(int(r[1]) for r in result)
            elif name.startswith("peer: flamegraph_cpu"):
                rows[name]["same_result_as_flamegraph_cpu"] = _sorted_rows(result) == _sorted_rows(fg)
            elif name.startswith("peer: scan"):
                rows[name]["stacks"], rows[name]["samples"] = int(result[0][0]), int(result[0][1])
        out["scopes"][scope] = rows
    return out


# --- building the data ----------------------------------------------------------------------------------------------


def _scalar_row(store: Store, name: str, params: dict | None = None) -> dict[str, Any]:
    columns, rows = store.query_sql(sql(name), params or {})
    return dict(zip(columns, rows[0], strict=True))


def _settled(store: Store, poll: float = 1.0, quiet: int = 4, limit: float = 1800.0,
             target: int | None = None) -> None:
    """Wait until the stored CPU samples reach `target` (if given) and neither table's sums moved for `quiet` polls."""
    last, same, started = None, 0, time.monotonic()
    while time.monotonic() - started < limit:
        time.sleep(poll)
        now = _scalar_row(store, "fleet_query_span")
        key = (now["cpu_samples"], now["gpu_ns"])
        if target is not None and int(now["cpu_samples"] or 0) < target:
            continue
        same = same + 1 if key == last else 0
        last = key
        if same >= quiet:
            return
    raise SystemExit(f"the pipeline did not settle within {limit:.0f} s: {last}")


def run_pipeline(tmp: Path, nodes: int, windows: int, rate: float) -> tuple[Store, dict[str, Any]]:
    """loadgen → broker → symbolize + correlate (processes) → sink (this process) → chDB, as bench/pipeline.py."""
    from fleetprof.broker import LocalBroker, create_topics
    from processors.store_writer import StoreRunner
    from simulate.loadgen import run_loadgen

    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    procs: list[subprocess.Popen] = []
    store = None
    stop = threading.Event()
    thread: threading.Thread | None = None
    try:
        create_topics(broker.bootstrap)
        kafka = {"bootstrap.servers": broker.bootstrap}
        t0 = time.perf_counter()
        report = run_loadgen(kafka, nodes=nodes, rate=rate, duration=10.0 * windows, window=10.0, seed=1,
                             pace=False, gpu=True)
        loadgen_s = time.perf_counter() - t0
        store = open_store(f"chdb://{tmp / 'chdb'}", "bench")
        store.migrate()
        env = dict(os.environ, FLEETPROF_KAFKA=broker.bootstrap, FLEETPROF_DATA_DIR=str(tmp))
        t0 = time.perf_counter()
        for stage in ("symbolize", "correlate"):
            procs.append(subprocess.Popen([sys.executable, "-m", "fleetprof", "process", stage], env=env, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=open(tmp / f"{stage}.log", "wb")))
        sink = StoreRunner(store, kafka, stop=stop)
        thread = threading.Thread(target=sink.run, args=(stop,), daemon=True)
        thread.start()
        _settled(store, target=report.total_samples)
        stop.set()
        thread.join(60)
        pipeline_s = time.perf_counter() - t0
        return store, {"loadgen_s": round(loadgen_s, 1), "pipeline_s": round(pipeline_s, 1),
                       "sent_samples": report.total_samples, "sent_gpu_ns": report.gpu_ns, "node": report.nodes[0],
                       "first_window_s": report.first_window_start_ns // 1_000_000_000,
                       "end_s": report.end_ns // 1_000_000_000}
    except BaseException:
        stop.set()  # the sink first: it writes to the store until it stops
        if thread is not None:
            thread.join(60)
        if store is not None:
            store.close()
        raise
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
        broker.stop()


def fill(store: Store, first: datetime, end: datetime, hours: float, log: Callable[[str], None]) -> list[dict]:
    """Copy the window rows of [first, end) back in time until [end - hours, end) is covered, doubling each step."""
    span = int((end - first).total_seconds())
    want = int(hours * 3600)
    have, steps = span, []
    while have < want:
        n = min(have, want - have)
        # the oldest n seconds of what is there, placed just before it
        params = {"from": end - timedelta(seconds=have), "to": end - timedelta(seconds=have - n), "shift": -n}
        t0 = time.perf_counter()
        for statement in ("fleet_query_copy_cpu", "fleet_query_copy_gpu"):
            store.query_sql(sql(statement), params, readonly=False)
        steps.append({"copied_s": n, "shift_s": -have, "seconds": round(time.perf_counter() - t0, 1)})
        have += n
        log(f"filled {have / 3600:.1f} h of {hours:g} h ({steps[-1]['seconds']} s)")
    return steps


def settle_merges(store: Store, limit: float) -> float:
    """Wait (up to `limit` s) for the background merges after the fill, as a day-old store has them done."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        _, rows = store.query_sql(sql("fleet_query_merges"), {"db": store.database})
        if not rows[0][0]:
            break
        time.sleep(2)
    return time.perf_counter() - t0


def storage(store: Store) -> dict[str, dict[str, int]]:
    _, rows = store.query_sql(sql("fleet_parts"), {"db": store.database})
    return {table: {"bytes": int(b), "rows": int(r), "parts": int(p)} for table, b, r, p in rows}


def print_table(result: dict[str, Any]) -> None:
    phase = result["queries"]
    print(f"\n{'query':42} {'all nodes (s)':>14} {'one node (s)':>14}")
    for name in phase["scopes"]["all_nodes"]:
        a = phase["scopes"]["all_nodes"][name]["median_s"]
        o = phase["scopes"]["one_node"][name]["median_s"]
        print(f"{name:42} {a:14.3f} {o:14.3f}")


def requery(args: argparse.Namespace) -> None:
    """Time the queries again on a kept store (e.g. once the machine is quiet) and replace the output's timings."""
    if args.keep is None or not (args.keep / "chdb").is_dir() or not args.out.is_file():
        raise SystemExit("--requery needs --keep DIR of an earlier run and that run's --out file")
    result = json.loads(args.out.read_text())
    old = result["queries"]
    store = open_store(f"chdb://{args.keep / 'chdb'}", "bench")
    try:
        result["queries"] = run_query_phase(store, datetime.fromisoformat(old["since"]),
                                            datetime.fromisoformat(old["until"]), old["node"], runs=args.runs,
                                            peer_runs=args.peer_runs)
    finally:
        store.close()
    result["queries_timed"] = {"date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg()}
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print_table(result)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--windows", type=int, default=60, help="10 s windows sent through the real pipeline")
    ap.add_argument("--rate", type=float, default=152.0, help="CPU samples/s per node (19 Hz x 8 busy CPUs)")
    ap.add_argument("--hours", type=float, default=24.0, help="hours of data the queries cover")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per query (the median is reported)")
    ap.add_argument("--peer-runs", type=int, default=3, help="timed runs per peer")
    ap.add_argument("--merge-wait", type=float, default=600.0, help="longest wait for merges after the fill, s")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "fleet_query.json")
    ap.add_argument("--keep", type=Path, default=None,
                    help="build the data in this directory and keep it (to look at the queries afterwards)")
    ap.add_argument("--requery", action="store_true",
                    help="only time the queries again, on the data a run with --keep left there (updates --out)")
    args = ap.parse_args()
    if args.requery:
        requery(args)
        return
    if args.nodes < 1 or args.windows < 1 or args.hours * 360 < args.windows or args.runs < 1 or args.peer_runs < 1:
        raise SystemExit("need --nodes, --windows, --runs, --peer-runs >= 1 and --hours covering --windows")

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    with tempfile.TemporaryDirectory(prefix="fleetprof-query-bench-") as tmpdir:
        tmp = Path(tmpdir)
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = args.keep
        log(f"pipeline: {args.nodes} nodes x {args.windows} windows of 10 s")
        store, made = run_pipeline(tmp, args.nodes, args.windows, args.rate)
        try:
            real = _scalar_row(store, "fleet_query_span")
            first = datetime.fromtimestamp(made["first_window_s"], tz=UTC)
            end = datetime.fromtimestamp(made["end_s"], tz=UTC)
            log(f"stored {real['cpu_samples']} samples in {real['cpu_rows']} rows; filling {args.hours:g} h")
            t0 = time.perf_counter()
            steps = fill(store, first, end, args.hours, log)
            fill_s = time.perf_counter() - t0
            merge_s = settle_merges(store, args.merge_wait)
            log(f"merges settled in {merge_s:.0f} s")
            span = _scalar_row(store, "fleet_query_span")
            since = end - timedelta(hours=args.hours)
            node = made["node"]
            log("timing queries")
            phase = run_query_phase(store, since, end, node, runs=args.runs, peer_runs=args.peer_runs)
            covered = phase["scopes"]["all_nodes"]["flamegraph_cpu"]["samples"]
            if covered != span["cpu_samples"]:  # the range must hold every stored sample: no gap left by the fill
                raise SystemExit(f"the {args.hours:g} h range holds {covered} of {span['cpu_samples']} samples")
            result = {
                "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores (shared)",
                "data": {"nodes": args.nodes, "real_windows": args.windows, "rate_per_node": args.rate,
                         "hours": args.hours, **made,
                         "real_span": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in real.items()},
                         "filled": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in span.items()},
                         "fill_steps": steps, "fill_s": round(fill_s, 1), "merge_wait_s": round(merge_s, 1),
                         "storage": storage(store)},
                "queries": phase,
            }
        finally:
            store.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    filled = result["data"]["filled"]
    print(f"\n{args.hours:g} h x {args.nodes} nodes: {filled['cpu_rows']:,} CPU rows "
          f"({filled['cpu_samples']:,} samples), "
          f"{filled['cpu_rollup_rows']:,} hourly rows; {filled['gpu_rows']:,} GPU rows, "
          f"{filled['gpu_rollup_rows']:,} hourly; {filled['cpu_stacks']:,} distinct CPU stacks")
    for table, s in result["data"]["storage"].items():
        print(f"  {table:28} {s['rows']:>14,} rows {s['bytes'] / 1e6:>10.1f} MB {s['parts']:>5} parts")
    print_table(result)


if __name__ == "__main__":
    main()
