-- Generated from sql/migrations/0008_gpu_correlation.sql by `python -m fleetprof.cluster_sql`: do not edit.
-- The migration says why the columns, codecs, keys, partitions, TTL and settings are what they are;
-- sql/cluster/README.md says how a cluster differs from one node.
--
-- Cluster: frames is one replicated table on every node (0002), so the ALTER runs once, without ON CLUSTER: a
-- replicated table's ALTER goes through Keeper to every replica.
ALTER TABLE frames
    MODIFY COLUMN kind Enum8('NATIVE' = 1, 'KERNEL' = 2, 'INTERPRETED' = 3, 'UNKNOWN' = 4, 'GPU_KERNEL' = 5)
    CODEC(ZSTD(1));

-- Cluster: sharded by node like the NVML tables (0005): the counts of one node's processes; every row of one sorting
-- key (it starts with node) lands on one shard and sums there.
CREATE TABLE IF NOT EXISTS gpu_unmatched_local ON CLUSTER '{cluster}'
(
    ts          DateTime                                                        CODEC(DoubleDelta, ZSTD(1)),
    node        LowCardinality(String)                                          CODEC(ZSTD(1)),
    pid         UInt32                                                          CODEC(T64, ZSTD(1)),
    side        Enum8('LAUNCH' = 1, 'KERNEL' = 2)                               CODEC(ZSTD(1)),
    reason      Enum8('EXPIRED' = 1, 'LATE' = 2, 'EVICTED' = 3, 'SUPERSEDED' = 4) CODEC(ZSTD(1)),
    events      UInt64                                                          CODEC(T64, ZSTD(1)),
    duration_ns UInt64                                                          CODEC(T64, ZSTD(1)),
    launches    UInt64                                                          CODEC(T64, ZSTD(1))
)
ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/{database}/gpu_unmatched_local', '{replica}',
                                    (events, duration_ns, launches))
PARTITION BY toDate(ts)
ORDER BY (node, ts, pid, side, reason)
TTL ts + INTERVAL 30 DAY
SETTINGS replicated_deduplication_window = 10000, ttl_only_drop_parts = 1;

CREATE TABLE IF NOT EXISTS gpu_unmatched ON CLUSTER '{cluster}'
(
    ts          DateTime,
    node        LowCardinality(String),
    pid         UInt32,
    side        Enum8('LAUNCH' = 1, 'KERNEL' = 2),
    reason      Enum8('EXPIRED' = 1, 'LATE' = 2, 'EVICTED' = 3, 'SUPERSEDED' = 4),
    events      UInt64,
    duration_ns UInt64,
    launches    UInt64
)
ENGINE = Distributed('{cluster}', currentDatabase(), gpu_unmatched_local, cityHash64(node));

INSERT INTO schema_migrations (version, name, applied_at) VALUES (8, '0008_gpu_correlation', now());
