"""The alerter: NVML polls/s on one core and through Kafka, next to raw confluent-kafka consume of the same messages
in the same run, and the latency from a drop holding to its webhook POST on a live stream.

    .venv/bin/python bench/alerts.py [--nodes 1000] [--gpus 8] [--seconds 120] [--drop-every 10]

Starts its own broker in a temporary directory (removed at the end). A simulated fleet's gpu.metrics: one message
per node and second with `--gpus` devices and one process each; every `--drop-every`-th GPU drops from 90% to 5%
for 60 s in the middle, so each fires one alert and resolves it. Measured:
- peer, fetch: a plain consumer fetching every message (best of 3);
- detect: the stage's pure work (decode included) on one core, checked exact: one FIRING and one RESOLVED per
  dropping GPU, nothing else;
- stage through Kafka: the real TopicRunner (consumer group, transactions with alerts.state) from start to the last
  input committed;
- latency: one node polled live once a second through the broker, the stage and the webhook thread to a local HTTP
  server; the time from the moment the drop has held `--hold` seconds to the POST arriving.
Prints a table and writes bench/out/alerts.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.correlator import raw_consume  # noqa: E402
from bench.local_ports import free_ports  # noqa: E402
from fleetprof.broker import LocalBroker, create_topics  # noqa: E402
from processors.alert_webhook import AlertWebhook, webhook_thread  # noqa: E402
from processors.alerts import SECOND_NS, AlertConfig  # noqa: E402
from processors.alerts_stage import AlertsStage, build_alerts  # noqa: E402
from processors.messages import Message  # noqa: E402
from processors.runner import TopicRunner  # noqa: E402
from schemas import single_object, topics  # noqa: E402

TOPIC = topics.GPU_METRICS.name
CONFIG = AlertConfig()  # the defaults: below 20% for 30 s after 50%, resolve at 40% for 15 s


def poll_record(node: str, t_ns: int, gpus: int, util_of) -> dict:
    devices = [{"index": i, "uuid": f"GPU-{node}-{i}", "name": "H200 (simulated)", "gpu_util_pct": util_of(i),
                "mem_util_pct": 40, "mem_used_bytes": 1 << 34, "mem_total_bytes": 1 << 37, "sm_clock_mhz": 1980,
                "mem_clock_mhz": 2619, "power_mw": 500_000, "power_limit_mw": 700_000, "temperature_c": 60,
                "pcie_tx_kbps": 1000, "pcie_rx_kbps": 2000, "clock_event_reasons": 0}
               for i in range(gpus)]
    procs = [{"device_index": i, "pid": 1000 + i, "comm": "train"} for i in range(gpus)]
    return {"node": node, "time_ns": t_ns, "simulated": True, "devices": devices, "processes": procs}


def fleet(bootstrap: str, nodes: int, gpus: int, seconds: int, drop_every: int) -> tuple[int, int, int]:
    """Produce the fleet's polls; (messages, bytes, dropping GPUs)."""
    # idempotent, as the agent's: polls of a node stay in order (the detector reads them in event order)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "compression.type": "lz4",
                  "enable.idempotence": True})
    t0 = (time.time_ns() // SECOND_NS - seconds - 60) * SECOND_NS
    drop_from, drop_to = seconds // 2 - 30, seconds // 2 + 30
    dropping = sent = size = 0
    for n in range(nodes):
        node = f"bench-node-{n:05d}"
        drops = {i for i in range(gpus) if (n * gpus + i) % drop_every == 0}
        dropping += len(drops)
        for s in range(seconds):
            low = drop_from <= s < drop_to
            value = single_object.encode("GpuMetrics", poll_record(node, t0 + s * SECOND_NS, gpus,
                                                           lambda i, low=low, drops=drops: 5 if low and i in drops
                                                           else 90))
            while True:
                try:
                    p.produce(TOPIC, key=node.encode(), value=value)
                    break
                except BufferError:
                    p.poll(0.1)
            sent += 1
            size += len(value)
    p.flush(60)
    return sent, size, dropping


def detect(raw: list[tuple], batch: int = 1000) -> tuple[float, dict[str, int]]:
    """CPU seconds of decode + the stage's pure work over every message; alerts by state."""
    stage = AlertsStage(CONFIG, None, None)
    states: dict[str, int] = {}
    t = time.process_time()
    for i in range(0, len(raw), batch):
        msgs = []
        for _, part, offset, key, value in raw[i:i + batch]:
            name, rec = single_object.decode(value, expect="GpuMetrics")
            msgs.append(Message(TOPIC, part, offset, key, name, rec))
        for p in stage.process(msgs):
            if p.topic == topics.ALERTS.name:
                states[p.record["state"]] = states.get(p.record["state"], 0) + 1
    return time.process_time() - t, states


def through_kafka(kafka: dict, messages: int) -> float:
    group = f"bench-alerts-{uuid.uuid4().hex[:8]}"
    runner = TopicRunner(build_alerts(kafka, CONFIG, None, group=group), kafka, group=group, batch_size=1000,
                         poll_timeout=0.5)
    t0 = time.perf_counter()
    runner.start()
    done = 0
    try:
        while done < messages:
            done += runner.run_once()
    finally:
        runner.close()
    return time.perf_counter() - t0


def live_latency(kafka: dict, hold_s: int) -> tuple[float, int]:
    """Seconds from a live drop holding `hold_s` to its POST at a local webhook; the polls it sent."""
    arrived: list[tuple[float, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            arrived.append((time.time_ns(), body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()
    group = f"bench-live-{uuid.uuid4().hex[:8]}"
    config = AlertConfig(hold_ns=hold_s * SECOND_NS)
    runner = TopicRunner(build_alerts(kafka, config, None, group=group), kafka, group=group, poll_timeout=0.2)
    threading.Thread(target=runner.run, args=(stop,), daemon=True).start()
    webhook_thread(AlertWebhook(kafka, f"http://127.0.0.1:{server.server_address[1]}/hook", group=group + "-hook"),
                   stop)
    p = Producer({"bootstrap.servers": kafka["bootstrap.servers"]})
    node = f"bench-live-{uuid.uuid4().hex[:6]}"
    try:
        for s in range(hold_s + 60):
            low = s >= 5
            p.produce(TOPIC, key=node.encode(),
                      value=single_object.encode("GpuMetrics", poll_record(node, time.time_ns(), 1,
                                                                   lambda i, low=low: 5 if low else 90)))
            p.flush(5)
            mine = [(at, b) for at, b in arrived if b["node"] == node]
            if mine:
                at, body = mine[0]
                return (at - body["started_ns"] - hold_s * SECOND_NS) / 1e9, s + 1
            time.sleep(1.0)
        raise RuntimeError("no alert arrived")
    finally:
        stop.set()
        server.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=120, help="polls per node (one a second)")
    ap.add_argument("--drop-every", type=int, default=10, help="every N-th GPU drops")
    ap.add_argument("--hold", type=int, default=10, help="live latency run: seconds a drop must hold")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="fleetprof-bench-"))
    port, cport = free_ports(2)
    broker = LocalBroker(tmp / "kafka", port=port, controller_port=cport)
    broker.start()
    try:
        create_topics(broker.bootstrap)
        kafka = {"bootstrap.servers": broker.bootstrap}
        # first, while the topic is empty: a new group reads from the start, and a backlog is not latency
        latency_s, live = live_latency(kafka, args.hold)
        sent, size, dropping = fleet(broker.bootstrap, args.nodes, args.gpus, args.seconds, args.drop_every)
        polls = sent * args.gpus + live
        sent += live  # the live node's polls are in the topic too (its drop is shorter than the default hold)
        runs = [raw_consume(broker.bootstrap, sent, [TOPIC]) for _ in range(3)]
        raw_s, raw = min(r[0] for r in runs), runs[0][1]
        del runs
        detect_s, states = detect(raw)
        exact = states == {"FIRING": dropping, "RESOLVED": dropping}
        del raw
        kafka_s = through_kafka(kafka, sent)
        result = {
            "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()}: {os.cpu_count()} cores",
            "nodes": args.nodes, "gpus_per_node": args.gpus, "seconds": args.seconds, "messages": sent,
            "gpu_polls": polls, "message_mb": round(size / 1e6, 1), "dropping_gpus": dropping, "alerts": states,
            "exact": exact,
            "raw_fetch_s": round(raw_s, 3), "raw_fetch_msgs_per_s": round(sent / raw_s),
            "detect_cpu_s": round(detect_s, 2), "detect_gpu_polls_per_core_s": round(polls / detect_s),
            "detect_ratio_to_raw_fetch": round((sent / detect_s) / (sent / raw_s), 3),
            "stage_through_kafka_s": round(kafka_s, 2), "stage_gpu_polls_per_s": round(polls / kafka_s),
            "stage_ratio_to_raw_fetch": round(raw_s / kafka_s, 3),
            "live_latency_s": round(latency_s, 2), "live_hold_s": args.hold,
        }
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "alerts.json").write_text(json.dumps(result, indent=2) + "\n")
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
