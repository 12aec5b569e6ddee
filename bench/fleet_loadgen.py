"""What the fleet bench's load generator costs: loadgen's CPU per node-second (live encoding or replay of
pre-encoded windows) and its send delay, against a local broker, with nothing else running.

    .venv/bin/python bench/fleet_loadgen.py [--nodes 100] [--duration 60s] [--window 10s] [--replay 3] [--pace]
                                            [--root DIR] [--runs 1]

--root runs another checkout's loadgen (A/B against the base code: the same harness, the other code). CPU is
loadgen's own (getrusage in its process, every thread, librdkafka's included) from the end of the first
progress report (after its set-up and first window) to the end of the final flush, per node-second sent after
that point. Send delay: each node-window's last cpu.stacks produce time (the Kafka message timestamp) minus the
window's end, read back from the topic. All data is simulated (`fleetprof loadgen`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_peer import node_window  # noqa: E402
from bench.fleet_report import percentile  # noqa: E402
from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from fleetprof.durations import Duration  # noqa: E402

WRAPPER = """
import json, resource, sys
a = json.loads(sys.argv[1])
if a["replay"]:
    from simulate.replay import run_loadgen
else:  # also a checkout from before the replay mode
    from simulate.loadgen import run_loadgen
mark = {}
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
def progress(done, total):
    if not mark:
        mark.update(cpu=cpu(), done=done)
extra = {"replay": a["replay"]} if a["replay"] else {}
r = run_loadgen({"bootstrap.servers": a["bootstrap"]}, nodes=a["nodes"], rate=152.0, duration=a["duration"],
                window=a["window"], seed=1, pace=a["pace"], progress=progress, **extra)
print(json.dumps({"cpu_total": cpu(), "cpu_mark": mark["cpu"], "done_mark": mark["done"],
                  "node_windows": len(r.nodes) * r.windows, "samples": r.total_samples,
                  "cpu_send_s": getattr(r, "cpu_send_s", None), "cpu_prepare_s": getattr(r, "cpu_prepare_s", None),
                  "bytes": r.bytes, "messages": sum(r.messages_by_topic.values())}))
"""


def send_delays(bootstrap: str, window: float) -> list[float]:
    """Per node-window: last cpu.stacks produce time minus the window's end, seconds."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe(["cpu.stacks"])
    last: dict[tuple[str, int], int] = {}
    idle = 0
    while idle < 5:
        batch = c.consume(1000, 1.0)
        idle = 0 if batch else idle + 1
        for m in batch:
            if m.error() is None:
                key = node_window(m.value())
                last[key] = max(last.get(key, 0), m.timestamp()[1])
    c.close()
    return [ts / 1000 - (start / 1e9 + window) for (_, start), ts in last.items()]


def one_run(args: argparse.Namespace, root: Path, duration: float, window: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-loadgen-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    try:
        create_topics(broker.bootstrap)
        spec = {"bootstrap": broker.bootstrap, "nodes": args.nodes, "duration": duration, "window": window,
                "pace": args.pace, "replay": args.replay}
        env = dict(os.environ, PYTHONPATH=str(root))
        done = subprocess.run(["nice", "-n", str(args.nice), sys.executable, "-c", WRAPPER, json.dumps(spec)],
                              cwd=root, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        delays = send_delays(broker.bootstrap, window) if args.pace else []
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    node_s = (r["node_windows"] - r["done_mark"]) * window
    out = {"root": str(root), "nodes": args.nodes, "replay": args.replay, "paced": args.pace,
           "cpu_ms_per_node_s": round((r["cpu_total"] - r["cpu_mark"]) / node_s * 1000, 4),
           "cpu_total_s": round(r["cpu_total"], 2), "cpu_measured_s": round(r["cpu_total"] - r["cpu_mark"], 2),
           "node_s_measured": node_s, "cpu_prepare_s": r["cpu_prepare_s"], "messages": r["messages"],
           "bytes": r["bytes"]}
    if delays:
        out.update(send_delay_p50_s=round(percentile(delays, 0.5), 3),
                   send_delay_p95_s=round(percentile(delays, 0.95), 3),
                   send_delay_max_s=round(max(delays), 3), node_windows_seen=len(delays))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--duration", default="60s")
    ap.add_argument("--window", default="10s")
    ap.add_argument("--replay", type=int, default=0, help="pre-encoded windows per node (0: live encoding)")
    ap.add_argument("--pace", action="store_true", help="real time (else as fast as it can)")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose loadgen runs")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--nice", type=int, default=10)
    args = ap.parse_args()
    duration = Duration().convert(args.duration, None, None)
    window = Duration().convert(args.window, None, None)
    for _ in range(args.runs):
        print(json.dumps(one_run(args, args.root.resolve(), duration, window)), flush=True)


if __name__ == "__main__":
    main()
