"""Fleet simulation: `fleetprof loadgen` paced in real time for a simulated fleet, through the real processors into
chDB, with sustained rate, consumer lag, end-to-end latency, bytes per sample and CPU per stage measured in the same
run, next to a plain Kafka consumer of the same topics; then the processors and ClickHouse shards a larger fleet
needs, from the measured CPU cost.

    .venv/bin/python bench/fleet.py [--nodes 1000] [--duration 600s] [--window 10s] [--symbolizers 1]
                                    [--correlators 1] [--rate 152] [--launch-rate 2] [--query-phase]
                                    [--loadgen replay|live] [--replay-windows 3] [--partitions N]

Components, each its own process on this machine (CPU from /proc/<pid>/stat): a LocalBroker in a temporary
directory; `fleetprof loadgen` (paced; by default replaying a few pre-encoded windows per node with their times
rewritten, so that it costs a small share of the pipeline: simulate/replay.py; it encodes them and sends symbol tables
and identities before the timed phase, which starts when the bench tells it to go); `fleetprof process symbolize` ×N
and `fleetprof process correlate` ×N;
the store process (bench/fleet_store.py: StoreRunner, the sink `fleetprof process sink` and `fleetprof up` run,
plus a poller on the same chDB store, since chDB allows one process per data directory); the peer
(bench/fleet_peer.py: raw consume of the same raw topics). Lag per consumer group comes from the broker
(AdminClient: committed offsets against high watermarks). Prints a table and writes bench/out/fleet.json.
--partitions N sets FLEETPROF_PARTITIONS for the topics' creation (every multi-partition topic gets N).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from bench.fleet_report import (  # noqa: E402
    extrapolate,
    kafka_bytes_per_sample,
    lag_summary,
    latency_summary,
    throughput,
)
from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from fleetprof.durations import Duration  # noqa: E402
from schemas import topics  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
RAW = [topics.CPU_STACKS.name, topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name, topics.GPU_METRICS.name,
       topics.IDENTITIES.name]
GROUPS = {  # stage -> (consumer group, input topics)
    "symbolize": ("fleetprof-symbolize", [topics.CPU_STACKS.name]),
    "correlate": ("fleetprof-correlate", [topics.GPU_LAUNCHES.name, topics.GPU_KERNELS.name]),
    "sink": ("fleetprof-sink", [topics.CPU_SAMPLES.name, topics.GPU_METRICS.name, topics.GPU_SAMPLES.name,
                                topics.ALERTS.name, topics.IDENTITIES.name]),
    "peer": ("bench-raw-peer", RAW),
}
QUERY_PHASE = BENCH / "fleet_query.py"


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a live process, None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


class Offsets:
    """High watermarks and consumer groups' committed offsets, from the broker."""

    def __init__(self, bootstrap: str) -> None:
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        meta = self.admin.list_topics(timeout=10).topics
        names = {t for _, ts in GROUPS.values() for t in ts}
        self.partitions = [TopicPartition(t, p) for t in sorted(names) for p in sorted(meta[t].partitions)]

    def high(self) -> dict[tuple[str, int], int]:
        futures = self.admin.list_offsets({tp: OffsetSpec.latest() for tp in self.partitions}, request_timeout=10)
        return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

    def committed(self, group: str, names: list[str]) -> dict[tuple[str, int], int]:
        tps = [TopicPartition(tp.topic, tp.partition) for tp in self.partitions if tp.topic in names]
        futures = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)],
                                                         request_timeout=10)
        out = futures[group].result().topic_partitions
        return {(tp.topic, tp.partition): max(tp.offset, 0) for tp in out}

    def snapshot(self) -> dict:
        """Per group and topic: committed offsets summed, and each topic's high watermarks summed."""
        high = self.high()
        by_topic: dict[str, int] = {}
        for (t, _), v in high.items():
            by_topic[t] = by_topic.get(t, 0) + v
        groups = {}
        for stage, (group, names) in GROUPS.items():
            try:
                done = self.committed(group, names)
            except Exception:  # a group that has not committed yet reads as nothing consumed
                done = {}
            groups[stage] = {t: sum(v for (tt, _), v in done.items() if tt == t) for t in names}
        return {"high": by_topic, "committed": groups}


class Fleet:
    """The processes of one run and their CPU."""

    def __init__(self, tmp: Path, bootstrap: str) -> None:
        self.tmp, self.bootstrap = tmp, bootstrap
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, FLEETPROF_KAFKA=bootstrap, FLEETPROF_DATA_DIR=str(tmp))

    def spawn(self, name: str, argv: list[str], stdout=subprocess.DEVNULL, **env: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child's for its life
        proc = subprocess.Popen(argv, env=dict(self.env, **env), cwd=ROOT, stdout=stdout, stderr=log,
                                stdin=subprocess.DEVNULL)
        log.close()
        self.procs[name] = proc
        return proc

    def cpu(self, broker_pid: int | None) -> dict[str, float]:
        out = {name: cpu_seconds(p.pid) for name, p in self.procs.items()}
        out["broker"] = cpu_seconds(broker_pid) if broker_pid else None
        return {k: v for k, v in out.items() if v is not None}

    def stop(self, names: list[str], timeout: float = 60) -> None:
        for n in names:
            p = self.procs.get(n)
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for n in names:
            p = self.procs.get(n)
            if p is None:
                continue
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def read_jsonl(path: Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_groups(offsets: Offsets, stages: list[str], timeout: float) -> float:
    """Seconds until every stage's consumer group is stable with members (processors started and joined)."""
    t0 = time.monotonic()
    names = [GROUPS[s][0] for s in stages]
    while time.monotonic() - t0 < timeout:
        futures = offsets.admin.describe_consumer_groups(names, request_timeout=10)
        try:
            ok = all(f.result().members and f.result().state.name == "STABLE" for f in futures.values())
        except Exception:
            ok = False
        if ok:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise SystemExit(f"consumer groups {names} not stable within {timeout:.0f} s (see the logs in the temp dir)")


def stage_lags(snap: dict) -> dict[str, int]:
    return {stage: sum(snap["high"][t] - c for t, c in per.items()) for stage, per in snap["committed"].items()}


def drained(snap: dict, partitions: dict[str, int]) -> bool:
    """Every raw input consumed, and the sink within one transaction marker per partition of its inputs."""
    lag = stage_lags(snap)
    sink_slack = sum(partitions[t] for t in GROUPS["sink"][1])
    return lag["symbolize"] == 0 and lag["correlate"] == 0 and lag["sink"] <= sink_slack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--duration", default="600s", help="loadgen's run, e.g. 60s, 10m")
    ap.add_argument("--window", default="10s", help="reporting window per node batch")
    ap.add_argument("--symbolizers", type=int, default=1)
    ap.add_argument("--correlators", type=int, default=1)
    ap.add_argument("--rate", type=float, default=152.0, help="CPU samples/s per node (19 Hz x 8 busy CPUs)")
    ap.add_argument("--launch-rate", type=float, default=2.0,
                    help="sampled launches/s per GPU (8 per node); each stands for 5,000/rate launches")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between the latency poller's queries")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between lag and CPU samples")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds to measure every process idle first")
    ap.add_argument("--max-run", type=float, default=0,
                    help="stop loadgen after this many seconds if it has not finished (default: duration + 120)")
    ap.add_argument("--drain", type=float, default=60.0, help="seconds to wait after loadgen for the lag to clear")
    ap.add_argument("--target-nodes", type=int, default=10_000, help="fleet size to extrapolate to")
    ap.add_argument("--shard-cores", type=int, default=16, help="cores per ClickHouse shard (extrapolation)")
    ap.add_argument("--shard-ingest-share", type=float, default=0.5,
                    help="share of a shard's cores ingest may use; the rest is for queries (extrapolation)")
    ap.add_argument("--shard-disk-tb", type=float, default=4.0, help="disk per shard, TB (extrapolation)")
    ap.add_argument("--retention-days", type=float, default=30.0, help="the tables' TTL")
    ap.add_argument("--out", type=Path, default=BENCH / "out" / "fleet.json")
    ap.add_argument("--query-phase", action="store_true",
                    help="afterwards run bench/fleet_query.py (flame-graph query latency), if it exists")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--loadgen", choices=["replay", "live"], default="replay",
                    help="replay: pre-encoded windows, times rewritten (cheap); live: every window encoded as sent")
    ap.add_argument("--replay-windows", type=int, default=3, help="distinct pre-encoded windows per node (replay)")
    ap.add_argument("--partitions", type=int, default=0,
                    help="partitions of every multi-partition topic (sets FLEETPROF_PARTITIONS for create_topics "
                         "and the processes); 0: the defaults of schemas/topics.py")
    args = ap.parse_args()
    duration = Duration().convert(args.duration, None, None)
    window = Duration().convert(args.window, None, None)
    windows = max(1, math.ceil(duration / window - 1e-9))
    expected = round(args.rate * window)
    console = Console(stderr=True, width=140)

    if args.partitions:
        os.environ["FLEETPROF_PARTITIONS"] = str(args.partitions)
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-fleet-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    fleet = Fleet(tmp, broker.bootstrap)
    timeline: list[dict] = []
    offsets = None
    try:
        create_topics(broker.bootstrap)
        offsets = Offsets(broker.bootstrap)
        partitions: dict[str, int] = {}  # as created (FLEETPROF_PARTITIONS may have changed the defaults)
        for tp in offsets.partitions:
            partitions[tp.topic] = partitions.get(tp.topic, 0) + 1
        py = sys.executable
        fleet.spawn("store", [py, str(BENCH / "fleet_store.py"), str(tmp), "--expected", str(expected),
                              "--nodes", str(args.nodes),
                              "--poll", str(args.poll)])
        for i in range(args.symbolizers):
            fleet.spawn(f"symbolize-{i}", [py, "-m", "fleetprof", "process", "symbolize"], FLEETPROF_INSTANCE=str(i))
        for i in range(args.correlators):
            fleet.spawn(f"correlate-{i}", [py, "-m", "fleetprof", "process", "correlate"], FLEETPROF_INSTANCE=str(i))
        fleet.spawn("peer", [py, str(BENCH / "fleet_peer.py"), str(tmp / "peer.json")])
        report_path, ready, go = tmp / "loadgen.json", tmp / "loadgen.ready", tmp / "loadgen.go"
        replay = ["--replay", str(args.replay_windows)] if args.loadgen == "replay" else []
        with open(report_path, "wb") as out:  # it sets up (symbols, identities, the replay's windows), then waits
            fleet.spawn("loadgen", [py, "-m", "fleetprof", "loadgen", "--nodes", str(args.nodes), "--rate",
                                    str(args.rate), "--duration", f"{duration}s", "--window", f"{window}s",
                                    "--launch-rate", str(args.launch_rate), "--seed", "1", "--format", "json",
                                    *replay, "--ready-file", str(ready), "--go-file", str(go)], stdout=out)
        loadgen = fleet.procs["loadgen"]
        console.print(f"[bold]fleet[/] {args.nodes} nodes × {windows} windows of {window:g} s; waiting for the "
                      f"processors to join their groups…")
        join_s = wait_groups(offsets, ["symbolize", "correlate", "sink", "peer"], 180)
        while not (tmp / "ready").exists() or not ready.exists():
            if loadgen.poll() is not None:
                raise SystemExit(f"loadgen failed during set-up (see {tmp / 'loadgen.log'})")
            time.sleep(0.5)

        broker_pid = broker.pid()
        idle0, t_idle = fleet.cpu(broker_pid), time.time()
        time.sleep(args.idle)  # every process running, nothing sent: their idle CPU, apart from the work
        cpu0 = fleet.cpu(broker_pid)
        idle = {k: round((cpu0[k] - idle0[k]) / (time.time() - t_idle), 4) for k in cpu0 if k in idle0}
        cpu0 = fleet.cpu(broker_pid)  # loadgen's set-up is not the run's
        reaped = resource.getrusage(resource.RUSAGE_CHILDREN)  # children that already exited (the broker's set-up)
        go.touch()
        t_start = time.time()
        t_loadgen_end, loadgen_cpu, cut = None, 0.0, False
        max_run = args.max_run if args.max_run else duration + 120
        last_print = 0.0
        while True:
            time.sleep(args.every)
            now = time.time()
            snap = offsets.snapshot()
            progress = read_jsonl(tmp / "progress.jsonl")
            row = {"t": round(now - t_start, 1), "lag": stage_lags(snap), "cpu": fleet.cpu(broker_pid),
                   "stored": progress[-1]["stored"] if progress else 0, "offsets": snap}
            timeline.append(row)
            if now - last_print >= 30:
                last_print = now
                console.print(f"t={row['t']:.0f}s stored {row['stored']:,} samples; lag "
                              + ", ".join(f"{k} {v:,}" for k, v in row["lag"].items()))
            if fleet.procs["store"].poll() is not None:
                raise SystemExit(f"the store process exited (see {tmp / 'store.log'})")
            if t_loadgen_end is None and loadgen.poll() is None and now - t_start >= max_run:
                # the machine cannot generate the fleet in real time: stop here and count what was sent
                console.print(f"loadgen still running after {max_run:.0f} s: stopping it")
                loadgen.send_signal(signal.SIGTERM)
                loadgen.wait(60)
                cut = True
            if t_loadgen_end is None and loadgen.poll() is not None:
                t_loadgen_end = now
                usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # loadgen: the only child reaped since the go
                loadgen_cpu = (usage.ru_utime + usage.ru_stime - reaped.ru_utime - reaped.ru_stime
                               - cpu0.get("loadgen", 0.0))
                if loadgen.returncode != 0 and not cut:
                    raise SystemExit(f"loadgen failed (see {tmp / 'loadgen.log'})")
                console.print(f"loadgen done after {now - t_start:.0f} s; draining up to {args.drain:.0f} s")
            if t_loadgen_end is not None and (drained(snap, partitions) or now - t_loadgen_end >= args.drain):
                break
        t_end = time.time()
        cpu1 = fleet.cpu(broker_pid)
        final = timeline[-1]["offsets"]
        processors = [n for n in fleet.procs if n.startswith(("symbolize", "correlate"))]
        fleet.stop(processors + ["peer"])
        fleet.stop(["store"], timeout=1800)  # it merges every table before it exits
        store = json.loads((tmp / "store.json").read_text())
        peer = json.loads((tmp / "peer.json").read_text())
        report = sent_report(report_path, final, peer, args.nodes, expected, window, cut)

        cpu = {k: round(cpu1.get(k, 0.0) - cpu0.get(k, 0.0), 2) for k in cpu1}
        cpu["loadgen"] = round(loadgen_cpu if t_loadgen_end else cpu1.get("loadgen", 0.0) - cpu0.get("loadgen", 0.0), 2)
        if report.get("cpu_send_s") is not None:  # its own count from the first window to the final flush
            cpu["loadgen"] = round(report["cpu_send_s"], 2)
        visible = read_jsonl(tmp / "visible.jsonl")
        progress = read_jsonl(tmp / "progress.jsonl")
        result = {
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
            "load_average_at_end": os.getloadavg(),
            "config": {"nodes": args.nodes, "duration_s": duration, "window_s": window, "windows": windows,
                       "rate_per_node": args.rate, "launch_rate_per_gpu": args.launch_rate, "gpus_per_node": 8,
                       "symbolizers": args.symbolizers, "correlators": args.correlators, "poll_s": args.poll,
                       "loadgen": args.loadgen,
                       "replay_windows": args.replay_windows if args.loadgen == "replay" else 0,
                       "partitions": partitions},
            "join_s": round(join_s, 1), "run_s": round(t_end - t_start, 1),
            "loadgen_s": round((t_loadgen_end or t_end) - t_start, 1), "loadgen_stopped_at_max_run": cut,
            "sent": {k: report[k] for k in ("total_samples", "batches", "launches", "launch_weight", "kernels",
                                            "metrics", "messages_by_topic", "bytes_by_topic", "generate_s",
                                            "windows")},
            "loadgen": {k: report.get(k) for k in ("replay_windows", "prepare_s", "cpu_prepare_s", "cpu_send_s")},
            "throughput": throughput(report, progress, peer, t_start, t_loadgen_end or t_end, t_end),
            "lag": lag_summary(timeline, final, args.every, GROUPS),
            "latency": latency_summary(visible, peer, window, args.nodes, report["windows"],
                                       report["first_window_start_ns"]),
            "store": store,
            "cpu_s": cpu,
            "idle_cpu_per_s": idle,
        }
        result["extrapolation"] = extrapolate(result, final, args)
        result["kafka_bytes_per_cpu_sample"] = kafka_bytes_per_sample(result["sent"])
        if args.query_phase:
            result["query_phase"] = query_phase(console)
        args.out.parent.mkdir(exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print_tables(result)
    finally:
        fleet.stop(list(fleet.procs), timeout=30)
        del offsets  # its admin client would log the broker going away
        broker.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def sent_report(path: Path, final: dict, peer: dict, nodes: int, expected: int, window: float, cut: bool) -> dict:
    """loadgen's own report; when it was stopped early, what the broker and the peer saw it send (one cpu.stacks
    batch per node-window: a 10 s window of 152 samples/s is far below the message size limit)."""
    if not cut:
        return json.loads(path.read_text())
    high = final["high"]
    starts = sorted({int(k.split()[1]) for k in peer["sent_ms"]})
    return {"total_samples": high[topics.CPU_STACKS.name] * expected, "batches": high[topics.CPU_STACKS.name],
            "launches": high[topics.GPU_LAUNCHES.name], "launch_weight": None, "kernels": high[topics.GPU_KERNELS.name],
            "metrics": high[topics.GPU_METRICS.name], "messages_by_topic": peer["messages"],
            "bytes_by_topic": peer["bytes"], "generate_s": None, "windows": len(starts),
            "window_ns": round(window * 1e9), "first_window_start_ns": starts[0] * 1_000_000_000 if starts else 0,
            "node_windows": len(peer["sent_ms"])}


def query_phase(console: Console) -> dict:
    """Run bench/fleet_query.py, when someone has written it, as the last phase."""
    if not QUERY_PHASE.exists():
        console.print(f"[yellow]--query-phase: {QUERY_PHASE.name} does not exist; skipped[/]")
        return {"ran": False, "reason": f"{QUERY_PHASE.name} not present"}
    t = time.perf_counter()
    done = subprocess.run([sys.executable, str(QUERY_PHASE)], cwd=ROOT, capture_output=True, text=True)
    return {"ran": True, "returncode": done.returncode, "seconds": round(time.perf_counter() - t, 1),
            "stdout_tail": done.stdout[-4000:], "stderr_tail": done.stderr[-2000:]}


def print_tables(r: dict) -> None:
    from bench.fleet_report import render

    console = Console(width=140)
    for table in render(r):
        console.print(table)


if __name__ == "__main__":
    main()
