"""GPU-utilization drop detection per (node, GPU) over NVML polls (gpu.metrics). Pure: polls in, transitions out.

A drop is utilization below `below` for at least `hold_ns` after the GPU was busy (at or above `busy_above`). The
phases of one GPU:

    UNARMED --util>=busy_above--> ARMED --util<below--> PENDING --held hold_ns--> FIRING (alert FIRING)
                                    ^                     |  util>=below                | util>=recover_above
                                    +---------------------+                             v
    ARMED/UNARMED <--held recover_ns (alert RESOLVED)-- RECOVERING --util<recover_above--> FIRING

Hysteresis: a firing alert resolves only after utilization stays at or above `recover_above` (above `below`) for
`recover_ns`, and a new drop needs the GPU busy again first, so a GPU hovering around the threshold neither flaps
between FIRING and RESOLVED nor fires again and again. Times are the polls' own (event time), so a replayed or
delayed stream gives the same alerts as a live one.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

SECOND_NS = 1_000_000_000
UNARMED, ARMED, PENDING, FIRING, RECOVERING = "UNARMED", "ARMED", "PENDING", "FIRING", "RECOVERING"
KIND = "gpu_utilization_drop"
# Bounds on what one GPU's state keeps: it is one record of alerts.state, which must fit one Kafka message.
MAX_NAME = 1024  # characters of a node name, GPU UUID or GPU name (real ones are well under 100)
MAX_PIDS = 4096  # processes remembered per GPU for the evidence (the smallest pids when more were seen)


def invalid_metrics(record: dict) -> str | None:
    """Why a decoded GpuMetrics record cannot be watched (its names too long to keep in the state), or None."""
    if len(record["node"]) > MAX_NAME:
        return f"node name of {len(record['node'])} characters (limit {MAX_NAME})"
    for dev in record["devices"]:
        for field_name in ("uuid", "name"):
            if len(dev[field_name]) > MAX_NAME:
                return f"GPU {field_name} of {len(dev[field_name])} characters (limit {MAX_NAME})"
    return None


def _pid_union(held: list[int], seen: list[int]) -> list[int]:
    return sorted(set(held) | set(seen))[:MAX_PIDS]


@dataclass(frozen=True)
class AlertConfig:
    below: float = 20.0  # % utilization under which a GPU counts as idle
    busy_above: float = 50.0  # % a GPU must reach (again) before a drop can fire
    hold_ns: int = 30 * SECOND_NS  # how long the drop must hold before the alert fires
    recover_above: float = 40.0  # % at which a firing alert starts to resolve
    recover_ns: int = 15 * SECOND_NS  # how long recovery must hold before the alert resolves

    def __post_init__(self) -> None:
        if not 0 <= self.below <= self.recover_above <= 100 or not 0 <= self.busy_above <= 100:
            raise ValueError("thresholds must satisfy 0 <= below <= recover_above <= 100 and 0 <= busy_above <= 100")
        if self.busy_above < self.below:
            raise ValueError("busy_above must not be below the drop threshold")
        if self.hold_ns < 0 or self.recover_ns < 0:
            raise ValueError("durations must not be negative")


@dataclass
class GpuDrop:
    """One GPU's detector state (what alerts.state keeps per GPU)."""

    node: str
    uuid: str
    index: int
    name: str
    phase: str = UNARMED
    since_ns: int = 0
    started_ns: int = 0
    alert_id: str = ""
    low_sum: int = 0
    low_count: int = 0
    pids: list[int] = field(default_factory=list)
    simulated: bool = False

    def as_record(self) -> dict:
        return {"node": self.node, "uuid": self.uuid, "index": self.index, "name": self.name, "phase": self.phase,
                "since_ns": self.since_ns, "started_ns": self.started_ns, "alert_id": self.alert_id,
                "low_sum": self.low_sum, "low_count": self.low_count, "pids": list(self.pids),
                "simulated": self.simulated}

    @classmethod
    def from_record(cls, rec: dict) -> GpuDrop:
        return cls(**{**rec, "pids": list(rec["pids"])})

    @property
    def observed(self) -> float:
        """Mean utilization over the drop's readings so far."""
        return self.low_sum / self.low_count if self.low_count else 0.0


@dataclass(frozen=True)
class Transition:
    """An alert firing or resolving, before its evidence is attached."""

    state: str  # FIRING or RESOLVED
    gpu: GpuDrop  # a copy of the GPU's state at the transition
    time_ns: int
    threshold: float
    observed: float
    message: str


def alert_id(node: str, uuid: str, started_ns: int) -> str:
    """Stable across restarts and replays: the same drop of the same GPU always has the same id."""
    return hashlib.blake2b(f"{node}\0{uuid}\0{started_ns}".encode(), digest_size=8).hexdigest()


def _copy(gpu: GpuDrop) -> GpuDrop:
    return GpuDrop.from_record(gpu.as_record())


def _seconds(ns: int) -> str:
    return f"{ns / SECOND_NS:.0f} s"


class DropDetector:
    """The states of the GPUs of one input partition."""

    def __init__(self, config: AlertConfig) -> None:
        self.config = config
        self.gpus: dict[tuple[str, str], GpuDrop] = {}
        self.changed: set[tuple[str, str]] = set()  # GPUs whose state changed since the last changelog write

    def poll(self, record: dict) -> list[Transition]:
        """One GpuMetrics record (one node's poll): the alerts it fires or resolves."""
        out: list[Transition] = []
        pids_by_index: dict[int, list[int]] = {}
        for proc in record.get("processes", []):
            pids_by_index.setdefault(proc["device_index"], []).append(proc["pid"])
        for dev in record["devices"]:
            util = dev["gpu_util_pct"]
            if util is None:  # NVML could not read it (e.g. a MIG instance): no evidence either way
                continue
            key = (record["node"], dev["uuid"])
            gpu = self.gpus.get(key)
            if gpu is None:
                gpu = self.gpus[key] = GpuDrop(record["node"], dev["uuid"], dev["index"], dev["name"],
                                                simulated=bool(record.get("simulated", False)))
                self.changed.add(key)
            before = gpu.as_record()
            transition = self._step(gpu, util, record["time_ns"], _pid_union([], pids_by_index.get(dev["index"], [])))
            if transition is not None:
                out.append(transition)
            if gpu.as_record() != before:
                self.changed.add(key)
        return out

    def _step(self, gpu: GpuDrop, util: int, now: int, pids: list[int]) -> Transition | None:
        cfg = self.config
        if gpu.phase in (UNARMED, ARMED):
            if util >= cfg.busy_above:
                gpu.phase = ARMED
            if gpu.phase == ARMED and util < cfg.below:
                # the processes listed while busy are the ones whose CPU time explains the drop, even if they exit
                gpu.phase, gpu.since_ns, gpu.low_sum, gpu.low_count = PENDING, now, util, 1
                gpu.pids = _pid_union(gpu.pids, pids)
                return self._fire_if_held(gpu, now)
            if gpu.phase == ARMED and pids and util >= cfg.below:
                gpu.pids = pids  # remember the latest processes seen busy on it
            return None
        if gpu.phase == PENDING:
            if util >= cfg.below:  # the dip ended before it counted as a drop; the GPU stays armed
                gpu.phase, gpu.since_ns, gpu.low_sum, gpu.low_count = ARMED, 0, 0, 0
                gpu.pids = pids or gpu.pids
                return None
            gpu.low_sum += util
            gpu.low_count += 1
            gpu.pids = _pid_union(gpu.pids, pids)
            return self._fire_if_held(gpu, now)
        if gpu.phase == FIRING:
            if util >= cfg.recover_above:
                gpu.phase, gpu.since_ns = RECOVERING, now
                return self._resolve_if_held(gpu, util, now)
            gpu.low_sum += util
            gpu.low_count += 1
            gpu.pids = _pid_union(gpu.pids, pids)
            return None
        # RECOVERING
        if util < cfg.recover_above:  # not recovered after all: the same alert goes on
            gpu.phase, gpu.since_ns = FIRING, gpu.started_ns
            gpu.low_sum += util
            gpu.low_count += 1
            return None
        return self._resolve_if_held(gpu, util, now)

    def _fire_if_held(self, gpu: GpuDrop, now: int) -> Transition | None:
        cfg = self.config
        if now - gpu.since_ns < cfg.hold_ns:
            return None
        gpu.phase, gpu.started_ns = FIRING, gpu.since_ns
        gpu.alert_id = alert_id(gpu.node, gpu.uuid, gpu.started_ns)
        message = (f"GPU {gpu.index} ({gpu.name}) on {gpu.node}: utilization {gpu.observed:.0f}% below "
                   f"{cfg.below:g}% for {_seconds(now - gpu.started_ns)} (was at least {cfg.busy_above:g}%)")
        return Transition("FIRING", _copy(gpu), now, cfg.below, gpu.observed, message)

    def _resolve_if_held(self, gpu: GpuDrop, util: int, now: int) -> Transition | None:
        cfg = self.config
        if now - gpu.since_ns < cfg.recover_ns:
            return None
        lasted = gpu.since_ns - gpu.started_ns
        message = (f"GPU {gpu.index} ({gpu.name}) on {gpu.node}: utilization back to {util}% (at least "
                   f"{cfg.recover_above:g}% for {_seconds(now - gpu.since_ns)}) after a drop of {_seconds(lasted)} "
                   f"at {gpu.observed:.0f}%")
        resolved = Transition("RESOLVED", _copy(gpu), now, cfg.recover_above, gpu.observed, message)
        gpu.phase = ARMED if util >= cfg.busy_above else UNARMED
        gpu.since_ns = gpu.started_ns = gpu.low_sum = gpu.low_count = 0
        gpu.alert_id = ""
        gpu.pids = []
        return resolved
