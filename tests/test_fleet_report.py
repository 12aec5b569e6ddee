"""bench/fleet_report.py: CPU per node-second per stage, the processors' sum and ratio to the raw peer, and the goals
table the fleet bench prints, from a made-up run with round numbers."""

from __future__ import annotations

from argparse import Namespace

from rich.console import Console

from bench.fleet_report import extrapolate, goals


def _run() -> dict:
    """100 nodes x 100 s at 152 samples/s: 10,000 node-seconds, every input consumed."""
    stages = ("symbolize", "correlate", "sink", "peer")
    return {
        "config": {"rate_per_node": 152.0},
        "sent": {"total_samples": 1_520_000, "launches": 160_000},
        "cpu_s": {"symbolize-0": 4.0, "correlate-0": 3.0, "correlate-1": 2.0, "store": 7.0, "broker": 10.0,
                  "loadgen": 1.0, "peer": 1.0},
        "lag": {s: {"consumed_fraction": 1.0} for s in stages},
        "store": {"stored": {"cpu_samples": 1_520_000, "device_metric_rows": 8_000_000},
                  "tables": {"cpu_samples": {"bytes": 1_520_000, "rows": 1, "parts": 1}},
                  "poller_thread_cpu_s": 1.0, "sink_thread_cpu_s": 3.0},
        "idle_cpu_per_s": {},
        "latency": {"p95_s": 4.5, "goal_met": True},
    }


def test_processors_per_node_second_and_their_ratio_to_the_peer() -> None:
    r = _run()
    final = {"committed": {"correlate": {"gpu.launches": 160_000, "gpu.kernels": 160_000}}}
    args = Namespace(target_nodes=10_000, shard_cores=16, shard_ingest_share=0.5, shard_disk_tb=4.0,
                     retention_days=30.0)
    x = extrapolate(r, final, args)
    st = x["stages"]
    assert [st[s]["cpu_ms_per_node_s"] for s in ("symbolize", "correlate", "sink", "peer", "loadgen")] == \
        [0.4, 0.5, 0.6, 0.1, 0.1]  # the sink's: the store process less its poller
    assert x["processors_ms_per_node_s"] == 1.5 and x["processors_goal_met"]
    assert x["ratio_processors_to_peer_per_node_s"] == 15.0
    assert x["processor_cores_at_target"] == 15.0 and x["instances_at_target"] == {
        "symbolize": 4, "correlate": 5, "sink": 6}
    assert st["correlate"]["us_per_event"] == 15.62  # 5 s over 320,000 events, 2 decimals
    r["extrapolation"] = x
    console = Console(width=200, record=True)
    console.print(goals(r))
    text = console.export_text()
    assert "1.5 (0.4 + 0.5 + 0.6)" in text and "15.0 (peer 0.1)" in text and "4.5" in text
    assert text.count(" yes ") == 6 and text.count(" no ") == 0  # bytes per sample 1.0: within the 1.2 goal
