"""The GPU-utilization drop detector (processors/alerts.py) and the alerts stage without Kafka: exact transitions,
hysteresis, restarts from the changelog records the stage writes."""

from __future__ import annotations

import pytest

from processors.alert_evidence import AlertEvidence
from processors.alerts import SECOND_NS, AlertConfig, DropDetector, alert_id
from processors.alerts_stage import AlertsStage
from processors.messages import Message
from schemas import single_object, topics

CONFIG = AlertConfig(below=20, busy_above=50, hold_ns=30 * SECOND_NS, recover_above=40, recover_ns=15 * SECOND_NS)
T0 = 1_800_000_000 * SECOND_NS
UUID0, UUID1 = "GPU-aaaa", "GPU-bbbb"


def poll(t: int, utils: dict[str, int | None], node: str = "n1", pids: dict[int, list[int]] | None = None) -> dict:
    """One GpuMetrics record at T0 + t seconds; utils by GPU uuid (index = its position)."""
    devices = [{"index": i, "uuid": u, "name": "H200", "gpu_util_pct": v} for i, (u, v) in enumerate(utils.items())]
    procs = [{"device_index": i, "pid": pid} for i, ps in (pids or {}).items() for pid in ps]
    return {"node": node, "time_ns": T0 + t * SECOND_NS, "simulated": False, "devices": devices, "processes": procs}


def run(series: list[int | None], config: AlertConfig = CONFIG, pids: dict | None = None) -> list:
    """Feed one GPU's utilization, one reading per second; (second, state, observed) of every transition."""
    det = DropDetector(config)
    out = []
    for t, util in enumerate(series):
        for tr in det.poll(poll(t, {UUID0: util}, pids=pids)):
            out.append(((tr.time_ns - T0) // SECOND_NS, tr.state, tr.observed))
    return out


def test_a_drop_held_for_the_minimum_duration_fires_once_and_resolves_once():
    series = [90] * 10 + [4, 6] * 20 + [80] * 20  # low from 10 s to 49 s, back up at 50 s
    assert run(series) == [
        (40, "FIRING", (4 * 16 + 6 * 15) / 31),  # 31 readings (10..40 s) held 30 s
        (65, "RESOLVED", 5.0),  # recovery from 50 s held 15 s; observed over the drop's 40 readings
    ]


def test_a_dip_shorter_than_the_minimum_never_fires():
    assert run([90] * 5 + [3] * 30 + [90] * 5 + [3] * 30 + [90] * 5) == []


def test_a_gpu_that_was_never_busy_never_alerts():
    assert run([30] * 5 + [0] * 100) == []


def test_hysteresis_no_resolve_below_recover_threshold_and_no_refire_without_busy():
    series = ([90] * 5 + [5] * 31  # fires at 35 s
              + [30, 35] * 20  # above `below` but under `recover_above`: still firing
              + [45, 30] * 10  # touches recovery, never holds it: no flapping
              + [45] * 16  # held 15 s: resolves
              + [45] * 5 + [5] * 60)  # low again, but never busy since: no new alert
    assert [(t, s) for t, s, _ in run(series)] == [(35, "FIRING"), (111, "RESOLVED")]


def test_a_second_drop_after_being_busy_again_is_a_new_alert():
    det = DropDetector(CONFIG)
    fired = []
    series = [90] * 3 + [5] * 31 + [90] * 16 + [5] * 31
    for t, util in enumerate(series):
        fired += det.poll(poll(t, {UUID0: util}))
    assert [tr.state for tr in fired] == ["FIRING", "RESOLVED", "FIRING"]
    assert fired[0].gpu.alert_id == fired[1].gpu.alert_id == alert_id("n1", UUID0, T0 + 3 * SECOND_NS)
    assert fired[2].gpu.alert_id == alert_id("n1", UUID0, T0 + 50 * SECOND_NS) != fired[0].gpu.alert_id


def test_unreadable_utilization_neither_arms_nor_breaks_a_drop():
    assert [(t, s) for t, s, _ in run([None] * 5 + [90] * 2 + [5, None] * 16)] == [(37, "FIRING")]


def test_gpus_are_independent_and_evidence_pids_come_from_nvml():
    det = DropDetector(CONFIG)
    fired = []
    for t in range(50):
        utils = {UUID0: 90 if t < 5 else 2, UUID1: 90}
        # 100 left while the GPU was still busy; 102 left as the drop began (its stacks explain it)
        on_gpu0 = [100, 101, 102] if t < 3 else [101, 102] if t < 5 else [101]
        fired += det.poll(poll(t, utils, pids={0: on_gpu0, 1: [200]}))
    assert [(tr.gpu.uuid, tr.state, tr.gpu.pids) for tr in fired] == [(UUID0, "FIRING", [101, 102])]
    assert fired[0].message == "GPU 0 (H200) on n1: utilization 2% below 20% for 30 s (was at least 50%)"


def test_bad_thresholds_are_refused():
    with pytest.raises(ValueError):
        AlertConfig(below=50, recover_above=40)
    with pytest.raises(ValueError):
        AlertConfig(below=20, busy_above=10)


# --- the stage: changelog records rebuild the state exactly ---------------------------------------------------------


def messages(records: list[dict], first_offset: int = 0, partition: int = 0) -> list[Message]:
    return [Message(topics.GPU_METRICS.name, partition, first_offset + i, b"n1", "fleetprof.GpuMetrics", r)
            for i, r in enumerate(records)]


class Changelog:
    """The latest record per key of what the stage wrote to alerts.state, as the compacted topic keeps it."""

    def __init__(self) -> None:
        self.latest: dict[str, dict] = {}

    def keep(self, produced) -> list:
        alerts = []
        for p in produced:
            if p.topic == topics.ALERTS_STATE.name:
                # through the real codec, as the topic would carry it
                self.latest[p.key] = single_object.decode(single_object.encode(p.schema, p.record), expect=p.schema)[1]
            else:
                alerts.append(p.record)
        return alerts

    def read(self, partitions: set[int]) -> dict[int, list[dict]]:
        return {p: [r for r in self.latest.values() if r["partition"] == p] for p in partitions}

    def close(self) -> None:
        pass


def test_a_restarted_stage_continues_a_pending_drop_and_resolves_the_same_alert_once():
    series = [90] * 10 + [5] * 40 + [80] * 20
    records = [poll(t, {UUID0: u}, pids={0: [7]}) for t, u in enumerate(series)]
    log = Changelog()
    stage = AlertsStage(CONFIG, log, None)
    batches = [records[:25], records[25:45], records[45:]]  # restarts mid-drop (pending) and while firing
    alerts, offset = [], 0
    for batch in batches:
        stage = AlertsStage(CONFIG, log, None)  # a new process: only the changelog survives
        msgs = messages(batch, offset)
        stage.before_batch(msgs)
        alerts += log.keep(stage.process(msgs))
        offset += len(batch)
    assert [(a["state"], a["time_ns"]) for a in alerts] == [("FIRING", T0 + 40 * SECOND_NS),
                                                           ("RESOLVED", T0 + 65 * SECOND_NS)]
    assert alerts[0]["alert_id"] == alerts[1]["alert_id"]
    assert alerts[0]["evidence"] == [] and "no evidence source" in alerts[0]["message"]


def test_a_redelivered_batch_after_restore_sends_nothing_twice():
    records = [poll(t, {UUID0: u}) for t, u in enumerate([90] * 5 + [5] * 40)]
    log = Changelog()
    stage = AlertsStage(CONFIG, log, None)
    msgs = messages(records)
    stage.before_batch(msgs)
    assert [a["state"] for a in log.keep(stage.process(msgs))] == ["FIRING"]
    again = AlertsStage(CONFIG, log, None)
    again.before_batch(msgs[30:])  # offsets the state has seen: read back, then skipped
    assert log.keep(again.process(msgs[30:])) == []


def test_evidence_is_the_query_answer_for_the_gpus_processes_over_the_drop():
    asked = []

    def query(name, params):
        asked.append((name, params))
        return ["pid", "comm", "functions", "count"], [[7, "train", ["main", "load;batch"], 12]]

    stage = AlertsStage(CONFIG, None, AlertEvidence(query, limit=5))
    msgs = messages([poll(t, {UUID0: u}, pids={0: [7, 3]}) for t, u in enumerate([90] * 2 + [5] * 31)])
    alert = [p.record for p in stage.process(msgs) if p.topic == topics.ALERTS.name][0]
    assert alert["evidence"] == [{"pid": 7, "comm": "train", "folded_stack": "main;load:batch", "count": 12}]
    name, params = asked[0]
    assert name == "alert_evidence" and params["pids"] == "[3, 7]" and params["node"] == "n1"
    assert params["since"].timestamp() == (T0 + 2 * SECOND_NS) / 1e9
    assert params["until"].timestamp() == (T0 + 32 * SECOND_NS) / 1e9
    assert params["limit"] == 5


def test_a_failing_evidence_query_still_sends_the_alert_and_says_why():
    def query(name, params):
        raise RuntimeError("store unavailable: connection refused\nmore")

    stage = AlertsStage(CONFIG, None, AlertEvidence(query))
    msgs = messages([poll(t, {UUID0: u}, pids={0: [7]}) for t, u in enumerate([90] * 2 + [5] * 31)])
    alert = [p.record for p in stage.process(msgs) if p.topic == topics.ALERTS.name][0]
    assert alert["evidence"] == []
    assert alert["message"].endswith("[evidence unavailable: store unavailable: connection refused]")
