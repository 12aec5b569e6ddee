"""Every Kafka topic: its record schema, partition count, retention and cleanup policy."""

from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Topic:
    name: str
    schema: str  # record name in schemas/*.avsc
    partitions: int
    retention_ms: int
    compacted: bool = False
    doc: str = ""

    def config(self) -> dict[str, str]:
        cfg = {"retention.ms": str(self.retention_ms), "compression.type": "producer"}
        if self.compacted:
            cfg["cleanup.policy"] = "compact"
        return cfg


CPU_STACKS = Topic("cpu.stacks", "CpuStackBatch", 6, 24 * HOUR_MS, doc="raw CPU stack batches, key node")
GPU_LAUNCHES = Topic("gpu.launches", "GpuLaunch", 6, 24 * HOUR_MS, doc="sampled kernel launches, key node/pid")
GPU_KERNELS = Topic("gpu.kernels", "GpuKernel", 6, 24 * HOUR_MS, doc="kernel activity records, key node/pid")
GPU_METRICS = Topic("gpu.metrics", "GpuMetrics", 3, 24 * HOUR_MS, doc="NVML polls, key node")
SYMBOLS = Topic("symbols", "SymbolChunk", 3, -1, compacted=True, doc="symbol tables, key build_id/chunk")
IDENTITIES = Topic("identities", "WorkloadIdentity", 3, -1, compacted=True,
                   doc="workload identities (pod, container, Slurm job) the other records reference, key identity id")
CPU_SAMPLES = Topic("cpu.samples", "CpuSamples", 6, 24 * HOUR_MS, doc="symbolized CPU samples, key node")
GPU_SAMPLES = Topic("gpu.samples", "GpuSamples", 6, 24 * HOUR_MS, doc="GPU kernel time by launching stack, key node")
CORRELATE_STATE = Topic("correlate.state", "CorrelatorState", 6, -1, compacted=True,
                        doc="the correlator's pending join state (changelog), key group/partition/bucket/chunk")
ALERTS_STATE = Topic("alerts.state", "AlerterState", 3, -1, compacted=True,
                     doc="the alerter's per-GPU detector state (changelog), key group/partition/offset|gpu/...")
ALERTS = Topic("alerts", "Alert", 1, 7 * 24 * HOUR_MS, doc="GPU alerts, key node/gpu")
DEADLETTER = Topic("deadletter", "DeadLetter", 1, 7 * 24 * HOUR_MS, doc="undecodable or failed messages")

ALL: tuple[Topic, ...] = (
    CPU_STACKS, GPU_LAUNCHES, GPU_KERNELS, GPU_METRICS, SYMBOLS, IDENTITIES, CPU_SAMPLES, GPU_SAMPLES, CORRELATE_STATE,
    ALERTS_STATE, ALERTS, DEADLETTER,
)
BY_NAME = {t.name: t for t in ALL}
