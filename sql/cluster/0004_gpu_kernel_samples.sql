-- Generated from sql/migrations/0004_gpu_kernel_samples.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: sharded by the launching stack's stack_id, like cpu_samples (0003), so a GPU stack's rows and its
-- definition (0002) share a shard; all rows of one sorting key land on one shard and sum there, and a re-inserted
-- batch is dropped shard by shard as in cpu_samples.
CREATE TABLE IF NOT EXISTS gpu_kernel_samples_local ON CLUSTER '{cluster}'
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
    duration_ns  UInt64                 CODEC(T64, ZSTD(1)),
    launches     UInt64                 CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/gpu_kernel_samples_local', '{replica}',
                                    (duration_ns, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, comm, container_id, device, stream, stack_id, kernel_name)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_kernel_samples ON CLUSTER '{cluster}'
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
    duration_ns  UInt64,
    launches     UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_kernel_samples_local, stack_id);

INSERT INTO schema_migrations (version, name, applied_at) VALUES (4, '0004_gpu_kernel_samples', now());
