"""The figures of bench/fleet.py from what one run recorded: throughput, lag, latency, the extrapolation to a larger
fleet, and the rich tables that show them."""

from __future__ import annotations

import math
from collections import defaultdict

from rich.table import Table

GOAL_LATENCY_AFTER_WINDOW_S = 5.0  # issue 6: p95 from sample taken to queryable <= window + 5 s
GOAL_BYTES_PER_SAMPLE = 1.0
GOAL_BYTES_PER_SAMPLE_DAY = 1.2  # issue 18: every table, amortized over a day of the fleet bench's data
GOAL_PROCESSORS_MS_PER_NODE_S = 1.5  # issue 18: symbolize + correlate + sink CPU per node-second
GOAL_PROCESSORS_TO_PEER = 15.0  # issue 18: processors' CPU at most 15x a raw consumer's of the same input
DEFINITION_TABLES = ("frames", "stacks", "workload_identities")
RAW_TOPICS = ("cpu.stacks", "gpu.launches", "gpu.kernels", "gpu.metrics", "identities")  # what agents send


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile; inf entries (never seen) count as the largest."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p * len(ordered)) - 1)]


def _r(x: float, nd: int = 2) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else round(x, nd)


def throughput(report: dict, progress: list[dict], peer: dict, t_start: float, t_loadgen_end: float,
               t_end: float) -> dict:
    """Samples/s offered, stored (sustained while loadgen ran, and over the whole run) and fetched by the peer."""
    sent_rate = report["total_samples"] / max(1e-9, t_loadgen_end - t_start)
    during = [p for p in progress if p["t"] <= t_loadgen_end]
    started = next((p for p in during if p["stored"] > 0), None)
    sustained = None
    if started is not None and during[-1]["t"] > started["t"]:
        sustained = (during[-1]["stored"] - started["stored"]) / (during[-1]["t"] - started["t"])
    stored = progress[-1]["stored"] if progress else 0
    per_batch = report["total_samples"] / max(1, report["batches"])
    fetched = peer["messages"].get("cpu.stacks", 0)
    peer_rate = None
    if peer.get("first_s") and peer.get("last_s") and peer["last_s"] > peer["first_s"]:
        peer_rate = fetched * per_batch / (peer["last_s"] - peer["first_s"])
    return {
        "loadgen_sent_samples_per_s": round(sent_rate),
        "pipeline_sustained_samples_per_s": _r(sustained, 0),
        "pipeline_whole_run_samples_per_s": round(stored / max(1e-9, t_end - t_start)),
        "stored_samples": stored, "stored_fraction": round(stored / max(1, report["total_samples"]), 4),
        "peer_samples_per_s": _r(peer_rate, 0),
        "peer_fetched_fraction": round(fetched / max(1, report["batches"]), 4),
        "ratio_pipeline_to_peer": _r(sustained / peer_rate, 3) if sustained and peer_rate else None,
        "poll_query_s_p50": _r(percentile([p["query_s"] for p in progress], 0.5), 3),
        "poll_query_s_max": _r(max((p["query_s"] for p in progress), default=math.nan), 3),
        "stored_over_time": [[round(p["t"] - t_start, 1), p["stored"]] for p in progress[::10]],
    }


def _slope(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return None if den == 0 else sum((t - mx) * (v - my) for t, v in points) / den


def lag_summary(timeline: list[dict], final: dict, every: float, groups: dict[str, tuple[str, list[str]]]) -> dict:
    """Per consumer group: lag in messages over time (from the broker), its growth and where it ended."""
    out = {}
    span = max(1e-9, timeline[-1]["t"]) if timeline else 1.0
    for stage, (group, names) in groups.items():
        series = [(row["t"], row["lag"][stage]) for row in timeline]
        produced = sum(final["high"][t] for t in names)
        end = series[-1][1] if series else None
        out[stage] = {
            "group": group, "topics": names, "max": max((v for _, v in series), default=None), "end": end,
            "growth_msgs_per_s": _r(_slope(series), 1),
            "behind_s_at_end": _r(end / (produced / span), 1) if end is not None and produced else None,
            "consumed_fraction": round(sum(final["committed"][stage].values()) / max(1, produced), 4),
            "series": [[t, v] for t, v in series],
        }
    out["sample_every_s"] = every
    out["cpu_series"] = [[row["t"], row["cpu"]] for row in timeline]
    out["stored_series"] = [[row["t"], row["stored"]] for row in timeline]
    return out


def latency_summary(visible: list, peer: dict, window: float, nodes: int, windows: int, first_ns: int) -> dict:
    """Per (node, window): the first poll that saw all its CPU samples minus the window's end; a node-window never
    seen complete counts as infinitely late. Split into loadgen's send delay (last produce time of the node's
    batches for the window) and the pipeline's part (visible minus that)."""
    first_s = first_ns // 1_000_000_000
    lat: dict[int, list[float]] = defaultdict(list)
    send, pipe, resolution = [], [], []
    sent = peer.get("sent_ms", {})
    for node, w, seen, previous in visible:
        end = w + window
        lat[w].append(seen - end)
        resolution.append(seen - previous)
        s = sent.get(f"{node} {w}")
        if s is not None:
            send.append(s[1] / 1000 - end)
            pipe.append(seen - s[1] / 1000)
    all_lat: list[float] = [x for v in lat.values() for x in v]
    sent_per_window: dict[int, int] = defaultdict(int)
    for key in sent:
        sent_per_window[int(key.split()[1])] += 1
    total = len(sent) if sent else nodes * windows  # node-windows loadgen sent (all, unless it was stopped early)
    missing = total - len(all_lat)
    all_lat += [math.inf] * max(0, missing)
    per_window = []
    for k in range(windows):
        w = first_s + round(k * window)
        v = lat.get(w, [])
        vv = v + [math.inf] * ((sent_per_window.get(w, nodes) if sent else nodes) - len(v))
        per_window.append({"window": k, "start_s": w, "visible_nodes": len(v), "p50_s": _r(percentile(vv, 0.5)),
                           "p95_s": _r(percentile(vv, 0.95)), "all_nodes_s": _r(max(vv)) if vv else None})
    p95 = percentile(all_lat, 0.95)
    return {
        "method": "poller in the store process: every poll_s, per (node, window) sum(count) of cpu_samples from the "
                  "oldest window not yet complete for every node; a node-window's latency is the start of the first "
                  "poll that saw all its samples minus the window's end (an upper bound, by at most one poll "
                  "interval plus the query's time)",
        "node_windows": total, "visible": len(all_lat) - max(0, missing), "never_visible": max(0, missing),
        "p50_s": _r(percentile(all_lat, 0.5)), "p95_s": _r(p95), "p99_s": _r(percentile(all_lat, 0.99)),
        "max_s": _r(max(all_lat)) if all_lat else None,
        "p95_of_visible_s": _r(percentile([x for x in all_lat if x != math.inf], 0.95)),
        "p95_sample_to_queryable_s": _r(p95 + window), "goal_p95_after_window_s": GOAL_LATENCY_AFTER_WINDOW_S,
        "goal_met": bool(p95 <= GOAL_LATENCY_AFTER_WINDOW_S),
        "send_delay_p50_s": _r(percentile(send, 0.5)), "send_delay_p95_s": _r(percentile(send, 0.95)),
        "pipeline_p50_s": _r(percentile(pipe, 0.5)), "pipeline_p95_s": _r(percentile(pipe, 0.95)),
        "poll_interval_mean_s": _r(sum(resolution) / len(resolution)) if resolution else None,
        "per_window": per_window,
    }


KINDS = {  # tables per kind of sample, and what counts one sample of that kind
    "cpu": ("cpu_samples", "cpu_samples_1h", "frames", "stacks"),
    "gpu_kernels": ("gpu_kernel_samples", "gpu_kernel_samples_1h", "gpu_unmatched"),
    "nvml": ("gpu_device_metrics", "gpu_process_metrics"),
}


def bytes_per_sample(store: dict, launches_stored: float) -> dict:
    """Bytes on disk per CPU sample stored (every table), and per kind: CPU tables per CPU sample, GPU kernel tables
    per sampled launch, NVML tables per GPU reading (one device row per GPU and second)."""
    samples = max(1, store["stored"]["cpu_samples"])
    units = {"cpu": samples, "gpu_kernels": max(1.0, launches_stored),
             "nvml": max(1, store["stored"]["device_metric_rows"])}
    by_kind = {}
    for kind, names in KINDS.items():
        b = sum(store["tables"].get(t, {}).get("bytes", 0) for t in names)
        by_kind[kind] = {"bytes": b, "units": round(units[kind]), "bytes_per_unit": round(b / units[kind], 4)}
    tables = {t: {**v, "bytes_per_cpu_sample": round(v["bytes"] / samples, 4)} for t, v in store["tables"].items()}
    total = sum(v["bytes"] for v in store["tables"].values())
    data = sum(v["bytes"] for t, v in store["tables"].items() if t not in DEFINITION_TABLES)
    return {"cpu_samples_stored": store["stored"]["cpu_samples"], "tables": tables, "total_bytes": total,
            "bytes_per_cpu_sample_all_tables": round(total / samples, 4),
            "bytes_per_cpu_sample_without_definitions": round(data / samples, 4),
            "by_kind": by_kind, "goal": GOAL_BYTES_PER_SAMPLE, "goal_met": total / samples <= GOAL_BYTES_PER_SAMPLE}


def kafka_bytes_per_sample(sent: dict) -> dict:
    """Message bytes loadgen sent per CPU sample sent: per topic, the raw topics together (identities included), and
    with the symbol tables (sent once per build id: their share falls with the run's length)."""
    samples = max(1, sent["total_samples"])
    by_topic = sent["bytes_by_topic"]
    raw = sum(by_topic.get(t, 0) for t in RAW_TOPICS)
    return {"topics": {t: round(b / samples, 4) for t, b in sorted(by_topic.items())},
            "raw_per_cpu_sample": round(raw / samples, 4),
            "all_per_cpu_sample": round(sum(by_topic.values()) / samples, 4)}


def extrapolate(r: dict, final: dict, args) -> dict:
    """Cores per stage for args.target_nodes from CPU seconds per node-second of input each stage processed here.

    A stage's node-seconds: the share of its input it committed (from the broker) x the fleet's node-seconds sent;
    the sink's share is the CPU samples stored. The broker's is every node-second sent (its fetches for lagging
    consumers were fewer, so its figure is a lower bound)."""
    c = r["config"]
    node_s = r["sent"]["total_samples"] / c["rate_per_node"]  # node-seconds loadgen sent
    cpu = r["cpu_s"]
    lag = r["lag"]
    store = r["store"]
    stored = store["stored"]["cpu_samples"]
    sent = r["sent"]
    share = {"symbolize": lag["symbolize"]["consumed_fraction"], "correlate": lag["correlate"]["consumed_fraction"],
             "sink": stored / max(1, sent["total_samples"]), "broker": 1.0, "loadgen": 1.0,
             "peer": lag["peer"]["consumed_fraction"]}
    poller = store.get("poller_thread_cpu_s") or 0.0
    sink_thread = store.get("sink_thread_cpu_s") or 0.0
    spent = {
        "symbolize": sum(v for k, v in cpu.items() if k.startswith("symbolize")),
        "correlate": sum(v for k, v in cpu.items() if k.startswith("correlate")),
        "sink": max(0.0, cpu.get("store", 0.0) - poller),
        "broker": cpu.get("broker", 0.0), "loadgen": cpu.get("loadgen", 0.0), "peer": cpu.get("peer", 0.0),
    }
    target = args.target_nodes
    idle_raw = r.get("idle_cpu_per_s", {})
    idle = {"symbolize": sum(v for k, v in idle_raw.items() if k.startswith("symbolize")),
            "correlate": sum(v for k, v in idle_raw.items() if k.startswith("correlate")),
            **{k: idle_raw.get(k2) for k, k2 in (("sink", "store"), ("broker", "broker"), ("peer", "peer"))}}
    stages = {}
    for name, s in spent.items():
        done = share[name] * node_s
        per = s / done if done else None
        stages[name] = {"cpu_s": round(s, 2), "input_share": round(share[name], 4), "node_s": round(done),
                        "cpu_ms_per_node_s": _r(per * 1000 if per else None, 3),
                        "cores_at_target": _r(per * target if per else None, 1),
                        "idle_cores": idle.get(name)}
    samples_done = share["symbolize"] * sent["total_samples"]
    events = final["committed"]["correlate"]
    stages["symbolize"]["us_per_sample"] = _r(spent["symbolize"] / samples_done * 1e6 if samples_done else None, 3)
    n_events = sum(events.values())
    stages["correlate"]["us_per_event"] = _r(spent["correlate"] / n_events * 1e6 if n_events else None, 2)
    stages["sink"]["us_per_sample"] = _r(spent["sink"] / stored * 1e6 if stored else None, 3)
    processors = sum(stages[s]["cores_at_target"] or 0 for s in ("symbolize", "correlate", "sink"))
    processors_ms = sum(stages[s]["cpu_ms_per_node_s"] or 0 for s in ("symbolize", "correlate", "sink"))
    peer_ms = stages["peer"]["cpu_ms_per_node_s"]
    peer = stages["peer"]["cores_at_target"]

    # ClickHouse: the store process's CPU (sink thread included: in chDB the insert runs on it) is an upper bound on
    # what the server spends ingesting; shards by that and by disk over the retention
    ch_cores = stages["sink"]["cores_at_target"] or 0
    sink_share = sink_thread / max(1e-9, spent["sink"] + poller) if spent["sink"] else None
    bps = bytes_per_sample(store, sent["launches"] * share["correlate"])
    samples_per_s = target * c["rate_per_node"]
    disk_tb = bps["bytes_per_cpu_sample_all_tables"] * samples_per_s * 86_400 * args.retention_days / 1e12
    shards_cpu = math.ceil(ch_cores / (args.shard_cores * args.shard_ingest_share)) if ch_cores else None
    shards_disk = math.ceil(disk_tb / args.shard_disk_tb)
    return {
        "target_nodes": target, "stages": stages,
        "processor_cores_at_target": round(processors, 1),
        "processors_ms_per_node_s": round(processors_ms, 3),
        "goal_processors_ms_per_node_s": GOAL_PROCESSORS_MS_PER_NODE_S,
        "processors_goal_met": processors_ms <= GOAL_PROCESSORS_MS_PER_NODE_S,
        "ratio_processors_to_peer_per_node_s": _r(processors_ms / peer_ms, 1) if peer_ms else None,
        "goal_ratio_processors_to_peer": GOAL_PROCESSORS_TO_PEER,
        "peer_cores_at_target": peer,
        "ratio_processors_to_peer_cpu": _r(processors / peer, 1) if peer else None,
        "instances_at_target": {s: math.ceil(stages[s]["cores_at_target"] or 0)
                                for s in ("symbolize", "correlate", "sink")},
        "store_process_sink_thread_share": _r(sink_share, 3),
        "clickhouse": {"ingest_cores_upper_bound": round(ch_cores, 1), "samples_per_s": samples_per_s,
                       "disk_tb_over_retention": round(disk_tb, 2), "retention_days": args.retention_days,
                       "shard_cores": args.shard_cores, "shard_ingest_share": args.shard_ingest_share,
                       "shard_disk_tb": args.shard_disk_tb, "shards_for_cpu": shards_cpu,
                       "shards_for_disk": shards_disk, "shards": max(shards_cpu or 1, shards_disk, 1)},
        "bytes": bps,
    }


def render(r: dict) -> list[Table]:
    c, t, lat, x = r["config"], r["throughput"], r["latency"], r["extrapolation"]
    head = Table(title=f"Fleet: {c['nodes']} nodes × {c['windows']} windows of {c['window_s']:g} s, "
                       f"{c['rate_per_node']:g} samples/s/node, {c['launch_rate_per_gpu']:g} sampled launches/s/GPU")
    head.add_column("what")
    head.add_column("figure", justify="right")
    rows = [("offered CPU samples/s (nodes × rate)", round(c["nodes"] * c["rate_per_node"])),
            ("loadgen sent samples/s", t["loadgen_sent_samples_per_s"]),
            ("pipeline sustained samples/s (stored, while loadgen ran)", t["pipeline_sustained_samples_per_s"]),
            ("peer: raw consume, samples/s", t["peer_samples_per_s"]),
            ("ratio pipeline / peer", t["ratio_pipeline_to_peer"]),
            ("stored / sent samples", t["stored_fraction"]),
            ("loadgen run s (paced; duration + its own lag)", r["loadgen_s"])]
    for stage in ("symbolize", "correlate", "sink", "peer"):
        g = r["lag"][stage]
        rows.append((f"lag {stage}: max / end msgs (growth msgs/s, behind s)",
                     f"{g['max']:,} / {g['end']:,} ({g['growth_msgs_per_s']}, {g['behind_s_at_end']})"))
    for k, v in rows:
        head.add_row(k, "–" if v is None else f"{v:,}" if isinstance(v, int | float) else str(v))

    lt = Table(title="End-to-end latency, window end → all of a node's window queryable")
    for col in ("node-windows visible", "never", "p50 s", "p95 s", "p99 s", "max s", "p95 of visible",
                "send p95", "pipeline p95", "goal p95 ≤ 5 s"):
        lt.add_column(col, justify="right")

    def s(v: float | None) -> str:
        return "never" if v is None else f"{v:g}"

    lt.add_row(f"{lat['visible']:,}/{lat['node_windows']:,}", str(lat["never_visible"]), s(lat["p50_s"]),
               s(lat["p95_s"]), s(lat["p99_s"]), s(lat["max_s"]), s(lat["p95_of_visible_s"]),
               s(lat["send_delay_p95_s"]), s(lat["pipeline_p95_s"]), "met" if lat["goal_met"] else "not met")

    bt = Table(title="ClickHouse bytes after OPTIMIZE FINAL")
    for col in ("table", "rows", "parts", "bytes", "bytes / CPU sample"):
        bt.add_column(col, justify="right")
    b = x["bytes"]
    for name, v in sorted(b["tables"].items()):
        bt.add_row(name, f"{v['rows']:,}", str(v["parts"]), f"{v['bytes']:,}", f"{v['bytes_per_cpu_sample']:.4f}")
    bt.add_row("all", "", "", f"{b['total_bytes']:,}", f"{b['bytes_per_cpu_sample_all_tables']:.4f}")
    kafka = kafka_bytes_per_sample(r["sent"])
    for topic, v in kafka["topics"].items():
        bt.add_row(f"Kafka {topic}", "", "", "", f"{v:.4f}")
    bt.add_row("Kafka raw topics (identities included)", "", "", "", f"{kafka['raw_per_cpu_sample']:.4f}")
    for kind, v in b["by_kind"].items():
        bt.add_row(f"{kind} tables per {kind} sample", f"{v['units']:,} samples", "", f"{v['bytes']:,}",
                   f"{v['bytes_per_unit']:.4f}")

    ct = Table(title=f"CPU per stage (measured) → {x['target_nodes']:,} nodes")
    for col in ("stage", "CPU s", "input share", "ms CPU / node-s", "cores at target"):
        ct.add_column(col, justify="right")
    for name, s in x["stages"].items():
        ct.add_row(name, f"{s['cpu_s']:,}", f"{s['input_share']:.3f}", str(s["cpu_ms_per_node_s"]),
                   str(s["cores_at_target"]))
    ch = x["clickhouse"]
    ct.add_row("processors (symbolize+correlate+sink)", "", "", f"{x['processors_ms_per_node_s']:g} (goal ≤ "
               f"{x['goal_processors_ms_per_node_s']:g})", str(x["processor_cores_at_target"]))
    ct.add_row("processors / peer (CPU per node-s)", "", "", f"{x['ratio_processors_to_peer_per_node_s']} (goal ≤ "
               f"{x['goal_ratio_processors_to_peer']:g})", "")
    ct.add_row("ClickHouse shards (cpu, disk)", "", "", "", f"{ch['shards']} ({ch['shards_for_cpu']}, "
               f"{ch['shards_for_disk']})")
    return [head, lt, bt, ct, goals(r)]


def goals(r: dict) -> Table:
    """Issue 18's goals against this run's figures, one row each (for pasting into bench/RESULTS.md)."""
    x, lat, st = r["extrapolation"], r["latency"], r["extrapolation"]["stages"]
    gt = Table(title="Goals (issue 18)")
    for col in ("what", "measured", "goal", "met"):
        gt.add_column(col, justify="right")

    def met(ok: bool | None) -> str:
        return "–" if ok is None else "yes" if ok else "no"

    ratio = x.get("ratio_processors_to_peer_per_node_s")
    gt.add_row("processors ms CPU / node-s (symbolize + correlate + sink)",
               f"{x['processors_ms_per_node_s']:g} ({st['symbolize']['cpu_ms_per_node_s']} + "
               f"{st['correlate']['cpu_ms_per_node_s']} + {st['sink']['cpu_ms_per_node_s']})",
               f"≤ {GOAL_PROCESSORS_MS_PER_NODE_S:g}", met(x["processors_goal_met"]))
    gt.add_row("processors / raw peer consumer (CPU per node-s)", f"{ratio} (peer {st['peer']['cpu_ms_per_node_s']})",
               f"≤ {GOAL_PROCESSORS_TO_PEER:g}×", met(None if ratio is None else ratio <= GOAL_PROCESSORS_TO_PEER))
    gt.add_row("p95 window end → queryable, s", str(lat["p95_s"]), f"≤ {GOAL_LATENCY_AFTER_WINDOW_S:g}",
               met(lat["goal_met"]))
    gt.add_row("loadgen ms CPU / node-s (not the pipeline's)", str(st["loadgen"]["cpu_ms_per_node_s"]), "≤ 0.1",
               met(None if st["loadgen"]["cpu_ms_per_node_s"] is None else st["loadgen"]["cpu_ms_per_node_s"] <= 0.1))
    gt.add_row(f"processor cores at {x['target_nodes']:,} nodes", str(x["processor_cores_at_target"]),
               f"≤ {GOAL_PROCESSORS_MS_PER_NODE_S * x['target_nodes'] / 1000:g}",
               met(x["processor_cores_at_target"] <= GOAL_PROCESSORS_MS_PER_NODE_S * x["target_nodes"] / 1000))
    gt.add_row(f"instances at {x['target_nodes']:,} nodes (symbolize, correlate, sink)",
               ", ".join(str(v) for v in x["instances_at_target"].values()), "", "")
    b = x["bytes"]["bytes_per_cpu_sample_all_tables"]
    gt.add_row("bytes / CPU sample, every table (this run; issue 18 amortizes over a day)", f"{b:g}",
               f"≤ {GOAL_BYTES_PER_SAMPLE_DAY:g}", met(b <= GOAL_BYTES_PER_SAMPLE_DAY))
    return gt
