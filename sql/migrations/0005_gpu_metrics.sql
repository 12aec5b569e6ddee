-- NVML readings per GPU (and MIG instance: parent_uuid is the physical GPU, empty for a whole GPU).
--
-- Engine: plain MergeTree. These are point-in-time gauges, not counts: nothing may be summed or replaced on merge.
-- ORDER BY (node, gpu_index, ts): the questions are "this GPU over time" and "all GPUs of these nodes over time".
-- Daily partitions, 30-day TTL dropping whole parts, and the deduplication window so the sink's
-- insert_deduplication_token makes a re-insert after a crash a no-op (a MergeTree would otherwise keep both copies).
--
-- Codecs: ts is ascending per GPU at a fixed poll interval, so DoubleDelta; the gauges move slowly between polls,
-- so Delta then ZSTD on clocks, power and memory, and T64 on the small percentages; Nullable because NVML reports
-- "not supported" per field and per GPU, which must not read as 0. xid_errors is almost always empty.
--
-- Cluster: sharded by node, so all of one node's GPUs (and one GPU's whole history) live on one shard; cityHash64
-- because a sharding key must be an integer, and it spreads node names evenly. The queries' window functions
-- (gpu_idle_time's next reading of a series) run on the node that runs the query, over the rows the shards return, so
-- they see every reading of a series whichever shard holds it.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_device_metrics
(
    ts                  DateTime64(3)          CODEC(DoubleDelta, ZSTD(1)),
    node                LowCardinality(String) CODEC(ZSTD(1)),
    gpu_index           UInt16                 CODEC(T64, ZSTD(1)),
    uuid                LowCardinality(String) CODEC(ZSTD(1)),
    name                LowCardinality(String) CODEC(ZSTD(1)),
    parent_uuid         LowCardinality(String) CODEC(ZSTD(1)),
    gpu_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_util_pct        Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_used_bytes      Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    mem_total_bytes     Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    sm_clock_mhz        Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    mem_clock_mhz       Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_mw            Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    power_limit_mw      Nullable(UInt32)       CODEC(Delta, ZSTD(1)),
    temperature_c       Nullable(Int16)        CODEC(Delta, ZSTD(1)),
    pcie_tx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    pcie_rx_kbps        Nullable(UInt32)       CODEC(T64, ZSTD(1)),
    clock_event_reasons Nullable(UInt64)       CODEC(ZSTD(1)),
    xid_errors          Array(UInt32)          CODEC(ZSTD(1)),
    simulated           Bool                   CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_index, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

-- NVML's per-process view of each GPU. Same engine, partitioning, TTL and deduplication reasoning as the device
-- table; pid follows gpu_index in the key so one process's history on one GPU reads contiguously.
--
-- Cluster: sharded by node like the device table, so a node's processes sit beside its GPUs.
-- @cluster sharded by cityHash64(node)
CREATE TABLE IF NOT EXISTS gpu_process_metrics
(
    ts                DateTime64(3)          CODEC(DoubleDelta, ZSTD(1)),
    node              LowCardinality(String) CODEC(ZSTD(1)),
    gpu_index         UInt16                 CODEC(T64, ZSTD(1)),
    pid               UInt32                 CODEC(T64, ZSTD(1)),
    comm              LowCardinality(String) CODEC(ZSTD(1)),
    container_id      LowCardinality(String) CODEC(ZSTD(1)),
    sm_util_pct       Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    mem_util_pct      Nullable(UInt8)        CODEC(T64, ZSTD(1)),
    used_memory_bytes Nullable(UInt64)       CODEC(Delta, ZSTD(1)),
    simulated         Bool                   CODEC(ZSTD(1))
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (node, gpu_index, pid, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;
