-- Generated from sql/migrations/0014_gpu_copies_ranges_timeline.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
ALTER TABLE gpu_kernel_samples_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range);

ALTER TABLE gpu_kernel_samples ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String);

ALTER TABLE gpu_kernel_samples_1h_local ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String) CODEC(ZSTD(1)),
    MODIFY ORDER BY (node, hour, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range);

ALTER TABLE gpu_kernel_samples_1h ON CLUSTER '{cluster}'
    ADD COLUMN IF NOT EXISTS nvtx_range LowCardinality(String);

DROP VIEW IF EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}';

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_kernel_samples_1h_mv ON CLUSTER '{cluster}' TO gpu_kernel_samples_1h_local AS
SELECT toStartOfHour(ts, 'UTC') AS hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name,
       nvtx_range, sum(duration_ns) AS duration_ns, sum(launches) AS launches
FROM gpu_kernel_samples_local
GROUP BY hour, node, pid, comm, container_id, device, stream, stack_id, kernel_name, nvtx_range;

-- Cluster: sharded by stack_id like gpu_kernel_samples (0004), whose rows these are.
CREATE TABLE IF NOT EXISTS gpu_copy_samples_local ON CLUSTER '{cluster}'
(
    ts           DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node         LowCardinality(String) CODEC(ZSTD(1)),
    pid          UInt32                 CODEC(T64, ZSTD(1)),
    comm         LowCardinality(String) CODEC(ZSTD(1)),
    container_id LowCardinality(String) CODEC(ZSTD(1)),
    device       UInt16                 CODEC(T64, ZSTD(1)),
    stream       UInt32                 CODEC(T64, ZSTD(1)),
    stack_id     UInt64                 CODEC(ZSTD(1)),
    kernel_name  LowCardinality(String) CODEC(ZSTD(1)),
    memory_kinds LowCardinality(String) CODEC(ZSTD(1)),
    nvtx_range   LowCardinality(String) CODEC(ZSTD(1)),
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    bytes        UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/gpu_copy_samples_local', '{replica}',
                                    (duration_ns, bytes, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name, memory_kinds, nvtx_range)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_copy_samples ON CLUSTER '{cluster}'
(
    ts           DateTime,
    node         LowCardinality(String),
    pid          UInt32,
    comm         LowCardinality(String),
    container_id LowCardinality(String),
    device       UInt16,
    stream       UInt32,
    stack_id     UInt64,
    kernel_name  LowCardinality(String),
    memory_kinds LowCardinality(String),
    nvtx_range   LowCardinality(String),
    duration_ns  UInt64,
    bytes        UInt64,
    launches     UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_copy_samples_local, stack_id);

-- Cluster: sharded by node: one node's timeline is read together.
CREATE TABLE IF NOT EXISTS gpu_timeline_local ON CLUSTER '{cluster}'
(
    ts            DateTime               CODEC(DoubleDelta, ZSTD(1)),
    node          LowCardinality(String) CODEC(ZSTD(1)),
    pid           UInt32                 CODEC(T64, ZSTD(1)),
    comm          LowCardinality(String) CODEC(ZSTD(1)),
    device        UInt16                 CODEC(T64, ZSTD(1)),
    stream        UInt32                 CODEC(T64, ZSTD(1)),
    start_ns      UInt64                 CODEC(Delta, ZSTD(1)),
    end_ns        UInt64                 CODEC(Delta, ZSTD(1)),
    activity      Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3) CODEC(ZSTD(1)),
    name          LowCardinality(String) CODEC(ZSTD(1)),
    stack_id      UInt64                 CODEC(ZSTD(1)),
    weight        UInt32                 CODEC(T64, ZSTD(1)),
    bytes         UInt64                 CODEC(T64, ZSTD(1)),
    nvtx_range    LowCardinality(String) CODEC(ZSTD(1)),
    graph_id      UInt32                 CODEC(T64, ZSTD(1)),
    graph_node_id UInt64                 CODEC(ZSTD(1)),
    correlation_id UInt32                CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/gpu_timeline_local', '{replica}')
PARTITION BY toDate(ts)
ORDER BY (node, device, stream, start_ns)
TTL ts + INTERVAL 7 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_timeline ON CLUSTER '{cluster}'
(
    ts             DateTime,
    node           LowCardinality(String),
    pid            UInt32,
    comm           LowCardinality(String),
    device         UInt16,
    stream         UInt32,
    start_ns       UInt64,
    end_ns         UInt64,
    activity       Enum8('KERNEL' = 1, 'MEMCPY' = 2, 'MEMSET' = 3),
    name           LowCardinality(String),
    stack_id       UInt64,
    weight         UInt32,
    bytes          UInt64,
    nvtx_range     LowCardinality(String),
    graph_id       UInt32,
    graph_node_id  UInt64,
    correlation_id UInt32
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_timeline_local, cityHash64(node));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (14, '0014_gpu_copies_ranges_timeline', now());
