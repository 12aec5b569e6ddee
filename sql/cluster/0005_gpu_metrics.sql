-- Generated from sql/migrations/0005_gpu_metrics.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: sharded by node, so all of one node's GPUs (and one GPU's whole history) live on one shard; cityHash64
-- because a sharding key must be an integer, and it spreads node names evenly. The queries' window functions
-- (gpu_idle_time's next reading of a series) run on the node that runs the query, over the rows the shards return, so
-- they see every reading of a series whichever shard holds it.
CREATE TABLE IF NOT EXISTS gpu_device_metrics_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/gpu_device_metrics_local', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, gpu_index, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_device_metrics ON CLUSTER '{cluster}'
(
    ts                  DateTime64(3),
    node                LowCardinality(String),
    gpu_index           UInt16,
    uuid                LowCardinality(String),
    name                LowCardinality(String),
    parent_uuid         LowCardinality(String),
    gpu_util_pct        Nullable(UInt8),
    mem_util_pct        Nullable(UInt8),
    mem_used_bytes      Nullable(UInt64),
    mem_total_bytes     Nullable(UInt64),
    sm_clock_mhz        Nullable(UInt32),
    mem_clock_mhz       Nullable(UInt32),
    power_mw            Nullable(UInt32),
    power_limit_mw      Nullable(UInt32),
    temperature_c       Nullable(Int16),
    pcie_tx_kbps        Nullable(UInt32),
    pcie_rx_kbps        Nullable(UInt32),
    clock_event_reasons Nullable(UInt64),
    xid_errors          Array(UInt32),
    simulated           Bool
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_device_metrics_local, cityHash64(node));

-- Cluster: sharded by node like the device table, so a node's processes sit beside its GPUs.
CREATE TABLE IF NOT EXISTS gpu_process_metrics_local ON CLUSTER '{cluster}'
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
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/gpu_process_metrics_local', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, gpu_index, pid, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_process_metrics ON CLUSTER '{cluster}'
(
    ts                DateTime64(3),
    node              LowCardinality(String),
    gpu_index         UInt16,
    pid               UInt32,
    comm              LowCardinality(String),
    container_id      LowCardinality(String),
    sm_util_pct       Nullable(UInt8),
    mem_util_pct      Nullable(UInt8),
    used_memory_bytes Nullable(UInt64),
    simulated         Bool
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_process_metrics_local, cityHash64(node));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (5, '0005_gpu_metrics', now());
