"""The alerts stage: gpu.metrics → alerts, exactly once with its detector state.

Each batch's alerts, the detector state of the GPUs it changed (compacted topic alerts.state) and its input offsets
commit in one Kafka transaction (the runner's), as the correlator does with its join state. So after a restart,
a rebalance or an abort the state read back from alerts.state is exactly the state after the committed offsets:
a drop that was pending keeps its start, a firing alert resolves later under the same id, and no alert is sent twice.
The state is small (one record per GPU, rewritten only when it changes, plus each partition's next offset).

Evidence (the top CPU stacks of the GPU's processes during the drop) comes from the store through
processors/alert_evidence.py when an alert fires or resolves.
"""

from __future__ import annotations

import logging
from collections import Counter

from processors import metrics
from processors.alert_evidence import AlertEvidence
from processors.alerts import KIND, AlertConfig, DropDetector, GpuDrop, Transition, invalid_metrics
from processors.messages import Message, Produced, dead_letter
from processors.runner import TopicStage
from processors.state_changelog import StateChangelog
from schemas import topics

log = logging.getLogger("fleetprof.alerts")
DEFAULT_GROUP = "fleetprof-alerts"  # the runner's default group for a stage named "alerts"



def offset_key(group: str, partition: int) -> str:
    return f"{group}/{partition}/offset"


def gpu_key(group: str, partition: int, node: str, uuid: str) -> str:
    return f"{group}/{partition}/gpu/{node}/{uuid}"


def alert_record(t: Transition, evidence: list[dict], note: str) -> dict:
    """The Alert record of a transition."""
    return {"alert_id": t.gpu.alert_id, "kind": KIND, "state": t.state, "node": t.gpu.node,
            "gpu_index": t.gpu.index, "gpu_uuid": t.gpu.uuid, "started_ns": t.gpu.started_ns, "time_ns": t.time_ns,
            "threshold": t.threshold, "observed": t.observed,
            "message": t.message + (f" [{note}]" if note else "") + (" [SIMULATED GPU]" if t.gpu.simulated else ""),
            "evidence": evidence}


class AlertsStage(TopicStage):
    """gpu.metrics → alerts (and the detector state → alerts.state)."""

    name = "alerts"
    inputs = (topics.GPU_METRICS.name,)

    def __init__(self, config: AlertConfig, changelog: StateChangelog | None, evidence: AlertEvidence | None,
                 group: str = DEFAULT_GROUP) -> None:
        self.config = config
        self.changelog = changelog
        self.evidence = evidence
        self.group = group  # the consumer group the runner uses: its state is kept under this name
        self.detectors: dict[int, DropDetector] = {}
        self.next_offset: dict[int, int] = {}  # per partition: the next offset the state has not seen (-1: none)
        self.counts: Counter[str] = Counter()  # alerts of the open transaction, counted once it commits

    # --- hooks (I/O) ------------------------------------------------------------------------------------------
    def before_batch(self, messages: list[Message]) -> None:
        """Read the state of partitions seen for the first time, or whose offsets moved on elsewhere meanwhile."""
        first: dict[int, int] = {}
        for m in messages:
            first.setdefault(m.partition, m.offset)
        stale = {}
        for p, offset in first.items():
            if p not in self.detectors:
                stale[p] = "assigned"
            elif self.next_offset[p] >= 0 and offset != self.next_offset[p]:
                stale[p] = "offset_gap"
        if stale:
            self._restore(stale)

    def _restore(self, partitions: dict[int, str]) -> None:
        found = self.changelog.read(set(partitions)) if self.changelog is not None else {p: [] for p in partitions}
        for p, why in partitions.items():
            detector = DropDetector(self.config)
            next_offset = -1
            for rec in found[p]:
                next_offset = max(next_offset, rec["next_offset"])
                if rec["gpu"] is not None:
                    gpu = GpuDrop.from_record(rec["gpu"])
                    detector.gpus[(gpu.node, gpu.uuid)] = gpu
            self.detectors[p], self.next_offset[p] = detector, next_offset
            metrics.ALERT_RESTORES.labels(self.name, why).inc()
            firing = sum(g.phase in ("FIRING", "RECOVERING") for g in detector.gpus.values())
            log.info("detector state of partition %d read back (%s): %d GPUs, %d alerts open, next offset %d",
                     p, why, len(detector.gpus), firing, next_offset)

    def after_commit(self) -> None:
        for state, n in self.counts.items():
            metrics.ALERTS_SENT.labels(self.name, state).inc(n)
        self.counts.clear()

    def after_abort(self) -> None:
        """The aborted batch never happened: its alerts never counted and the state goes back to the committed one."""
        self.counts.clear()
        held = {p: "abort" for p in self.detectors}
        self.detectors.clear()
        self.next_offset.clear()
        if held:
            self._restore(held)

    def close(self) -> None:
        if self.changelog is not None:
            self.changelog.close()

    # --- the batch --------------------------------------------------------------------------------------------
    def process(self, messages: list[Message]) -> list[Produced]:
        out: list[Produced] = []
        touched: dict[int, None] = {}
        for m in messages:
            if m.partition not in self.detectors:  # pure use without before_batch (tests): start empty
                self.detectors[m.partition], self.next_offset[m.partition] = DropDetector(self.config), -1
            if m.offset < self.next_offset[m.partition]:
                continue  # already in the restored state
            reason = invalid_metrics(m.record)
            if reason is not None:
                out.append(dead_letter(self.name, m.topic, m.partition, m.offset, m.key, m.value, reason))
            else:
                for t in self.detectors[m.partition].poll(m.record):
                    out.append(self._alert(t, m))
            self.next_offset[m.partition] = m.offset + 1
            touched[m.partition] = None
        for p in touched:
            out.extend(self._changelog(p))
        return out

    def _alert(self, t: Transition, source: Message) -> Produced:
        # FIRING: the drop so far; RESOLVED: the whole drop, up to where recovery began
        until = t.time_ns if t.state == "FIRING" else t.gpu.since_ns
        evidence, note = ([], "no evidence source") if self.evidence is None else \
            self.evidence.top_stacks(t.gpu.node, t.gpu.pids, t.gpu.started_ns, max(until, t.gpu.started_ns + 1))
        self.counts[t.state] += 1
        log.info("alert %s %s: %s", t.gpu.alert_id, t.state, t.message)
        return Produced(topics.ALERTS.name, f"{t.gpu.node}/{t.gpu.uuid}", topics.ALERTS.schema,
                        alert_record(t, evidence, note), source)

    def _changelog(self, partition: int) -> list[Produced]:
        detector = self.detectors[partition]
        next_offset = self.next_offset[partition]
        schema = topics.ALERTS_STATE.schema
        out = [Produced(topics.ALERTS_STATE.name, offset_key(self.group, partition), schema,
                        {"group": self.group, "partition": partition, "next_offset": next_offset, "gpu": None})]
        for node, uuid in sorted(detector.changed):
            gpu = detector.gpus[(node, uuid)]
            out.append(Produced(topics.ALERTS_STATE.name, gpu_key(self.group, partition, node, uuid), schema,
                                {"group": self.group, "partition": partition, "next_offset": next_offset,
                                 "gpu": gpu.as_record()}))
        detector.changed.clear()
        return out


def build_alerts(kafka: dict, config: AlertConfig, evidence: AlertEvidence | None,
                 group: str = DEFAULT_GROUP) -> AlertsStage:
    log.info("alerts stage: %s", config)
    return AlertsStage(config, StateChangelog(kafka, group, topic=topics.ALERTS_STATE.name), evidence, group=group)
