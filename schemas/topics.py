"""Every Kafka topic: its record schema, partition count, retention and cleanup policy.

Partition counts are set when a topic is created (fleetprof/broker.py `create_topics`) and cap how many instances of
a stage can share its input: a consumer group never has more busy members than partitions. The defaults are sized
for a fleet of 10,000 nodes at the fleet bench's per-node load (bench/RESULTS.md: 152 CPU samples/s, 8 GPUs x 2
sampled launches/s, NVML once a second):
- cpu.stacks, gpu.launches, gpu.kernels: 48. 10,000 nodes send ~1,000 CPU batches/s and 160,000 launches/s plus as
  many kernels; at ~0.5 ms CPU per node-second per stage that is ~5 symbolizer and ~5 correlator cores, and 48
  leaves room to run 3-4x that many instances (a slower release, a backlog to drain, a bigger fleet) and keeps each
  partition at ~3,300 messages/s. gpu.launches and gpu.kernels must have the same count: partition p of both goes to
  one correlator instance, which joins them.
- gpu.metrics, cpu.samples, gpu.samples: 24 (the alerter's and the sink's inputs: 10,000 NVML polls/s, and the
  processors' aggregated output, a few sink instances).
- correlate.state, alerts.state: 12 (compacted changelogs, read back whole on a restore: fewer, bigger partitions
  read faster). symbols, identities: 3 (compacted, small; with the symbols topic on 6 partitions the symbolizer
  stored an agent's first windows seconds later in the end-to-end tests, cause not found yet, so both keep their
  old 3).
  alerts, deadletter: 1 (rare; one partition keeps them in order).
More partitions cost the broker memory and open files, and every consumer a fetch session over all of them; a
laptop or a test broker wants fewer. Overrides, read when a topic is created or its count is asked for:
FLEETPROF_PARTITIONS=N sets every topic that has more than one partition by default; FLEETPROF_PARTITIONS_<TOPIC>
(the name upper-cased, '.' as '_', e.g. FLEETPROF_PARTITIONS_GPU_LAUNCHES=96) sets one and wins over the first. An
existing topic keeps the count it was created with (Kafka can add partitions, `kafka-topics --alter`, but that moves
keys to other partitions: the correlator's join and the sink's offsets expect a key to stay where it is).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

HOUR_MS = 3_600_000
PARTITIONS_ENV = "FLEETPROF_PARTITIONS"
MAX_PARTITIONS = 10_000


@dataclass(frozen=True)
class Topic:
    name: str
    schema: str  # record name in schemas/*.avsc
    default_partitions: int
    retention_ms: int
    compacted: bool = False
    doc: str = ""

    @property
    def partitions(self) -> int:
        """The partition count a new topic gets: the default unless the environment overrides it."""
        return partition_count(self)

    @property
    def env_name(self) -> str:
        """The variable that overrides this topic's partition count."""
        return f"{PARTITIONS_ENV}_{self.name.upper().replace('.', '_')}"

    def config(self) -> dict[str, str]:
        cfg = {"retention.ms": str(self.retention_ms), "compression.type": "producer"}
        if self.compacted:
            cfg["cleanup.policy"] = "compact"
        return cfg


def _count(var: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{var}={text!r} is not a whole number of partitions") from None
    if not 1 <= value <= MAX_PARTITIONS:
        raise ValueError(f"{var}={text!r} must be from 1 to {MAX_PARTITIONS}")
    return value


def partition_count(topic: Topic, env: Mapping[str, str] | None = None) -> int:
    """`topic`'s partition count: FLEETPROF_PARTITIONS_<TOPIC>, else FLEETPROF_PARTITIONS for a topic with more than
    one partition by default, else the default. A bad value raises ValueError naming its variable."""
    env = os.environ if env is None else env
    text = env.get(topic.env_name, "").strip()
    if text:
        return _count(topic.env_name, text)
    text = env.get(PARTITIONS_ENV, "").strip()
    if text and topic.default_partitions > 1:
        return _count(PARTITIONS_ENV, text)
    return topic.default_partitions


CPU_STACKS = Topic("cpu.stacks", "CpuStackBatch", 48, 24 * HOUR_MS, doc="raw CPU stack batches, key node")
GPU_LAUNCHES = Topic("gpu.launches", "GpuLaunch", 48, 24 * HOUR_MS, doc="sampled kernel launches, key node/pid")
GPU_KERNELS = Topic("gpu.kernels", "GpuKernel", 48, 24 * HOUR_MS, doc="kernel activity records, key node/pid")
GPU_METRICS = Topic("gpu.metrics", "GpuMetrics", 24, 24 * HOUR_MS, doc="NVML polls, key node")
SYMBOLS = Topic("symbols", "SymbolChunk", 3, -1, compacted=True, doc="symbol tables, key build_id/chunk")
IDENTITIES = Topic("identities", "WorkloadIdentity", 3, -1, compacted=True,
                   doc="workload identities (pod, container, Slurm job) the other records reference, key identity id")
CPU_SAMPLES = Topic("cpu.samples", "CpuSamples", 24, 24 * HOUR_MS, doc="symbolized CPU samples, key node")
GPU_SAMPLES = Topic("gpu.samples", "GpuSamples", 24, 24 * HOUR_MS, doc="GPU kernel time by launching stack, key node")
CORRELATE_STATE = Topic("correlate.state", "CorrelatorState", 12, -1, compacted=True,
                        doc="the correlator's pending join state (changelog), key group/partition/bucket/chunk")
ALERTS_STATE = Topic("alerts.state", "AlerterState", 12, -1, compacted=True,
                     doc="the alerter's per-GPU detector state (changelog), key group/partition/offset|gpu/...")
ALERTS = Topic("alerts", "Alert", 1, 7 * 24 * HOUR_MS, doc="GPU alerts, key node/gpu")
DEADLETTER = Topic("deadletter", "DeadLetter", 1, 7 * 24 * HOUR_MS, doc="undecodable or failed messages")

ALL: tuple[Topic, ...] = (
    CPU_STACKS, GPU_LAUNCHES, GPU_KERNELS, GPU_METRICS, SYMBOLS, IDENTITIES, CPU_SAMPLES, GPU_SAMPLES, CORRELATE_STATE,
    ALERTS_STATE, ALERTS, DEADLETTER,
)
BY_NAME = {t.name: t for t in ALL}
JOINED = (GPU_LAUNCHES, GPU_KERNELS)  # co-partitioned: the correlator joins partition p of one with p of the other


def partition_counts(env: Mapping[str, str] | None = None) -> dict[str, int]:
    """Every topic's partition count, checked once: a bad value, or gpu.launches and gpu.kernels apart, raises
    ValueError naming the variables."""
    counts = {t.name: partition_count(t, env) for t in ALL}
    a, b = JOINED
    if counts[a.name] != counts[b.name]:
        raise ValueError(f"{a.name} has {counts[a.name]} partitions and {b.name} {counts[b.name]}: the correlator "
                         f"joins them partition by partition, so they need the same count ({a.env_name}, "
                         f"{b.env_name}, or {PARTITIONS_ENV} for both)")
    return counts
